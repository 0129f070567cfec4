// kplegd's metrics registry. prometheus-cpp's core library (Debian's prometheus-cpp-dev 1.0)
// keeps the families and their values and writes the text exposition format (0.0.4); this
// wrapper adds what kplegd needs and prometheus-cpp 1.0 has not:
//  - a child looked up by its label values in label-name order, once, and kept as a reference
//    by the component that updates it: the hot path is then one prometheus-cpp update;
//  - hooks that run before every scrape, to copy in totals kept elsewhere, and Counter::set
//    for those totals (prometheus-cpp's counters only increment: set() adds the difference);
//  - Gauge::set_to_current_time to the nanosecond (prometheus-cpp's truncates to seconds);
//  - checks of definitions prometheus-cpp lacks: no "le" label on a histogram, no newline or
//    backslash in a help text (it writes help texts unescaped).
// Its exposition differs from the hand-written writer it replaced in form only (promtool
// accepts it): families by type (counters, gauges, histograms), a family's series in hash
// order, labels sorted by name, _count and _sum before the buckets, and no HELP/TYPE lines for
// a labelled family without series. Costs: docs/design.md, "Metrics".
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace kpleg::metrics {

class Counter {
 public:
  explicit Counter(prometheus::Counter& c) : c_(c) {}
  void inc(double v = 1);
  // For scrape hooks mirroring a total kept elsewhere, which only grows: adds the difference
  // (a lower value is ignored). Hooks run one at a time, so two sets do not race.
  void set(double v);
  double value() const;

 private:
  prometheus::Counter& c_;
};

class Gauge {
 public:
  explicit Gauge(prometheus::Gauge& g) : g_(g) {}
  void set(double v);
  void inc(double v = 1);
  void dec(double v = 1);
  void set_to_current_time();  // Unix time in seconds, to the nanosecond
  double value() const;

 private:
  prometheus::Gauge& g_;
};

class Histogram {
 public:
  explicit Histogram(prometheus::Histogram& h) : h_(h) {}
  void observe(double v);

 private:
  prometheus::Histogram& h_;
};

enum class MetricType { kCounter, kGauge, kHistogram };

namespace detail {
template <typename T>
struct PrometheusType;
template <>
struct PrometheusType<Counter> {
  using type = prometheus::Counter;
};
template <>
struct PrometheusType<Gauge> {
  using type = prometheus::Gauge;
};
template <>
struct PrometheusType<Histogram> {
  using type = prometheus::Histogram;
};
}  // namespace detail

// One metric family: T is Counter, Gauge or Histogram.
template <typename T>
class Family {
 public:
  using Prometheus = prometheus::Family<typename detail::PrometheusType<T>::type>;
  Family(Prometheus& family, std::vector<std::string> label_names, std::vector<double> bounds);

  // The child for these label values (in label-name order), created on first use. The
  // reference stays valid as long as the registry: look it up once, keep it.
  T& with(const std::vector<std::string>& label_values);
  T& get() { return with({}); }

 private:
  Prometheus& family_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // a histogram's
  std::mutex mu_;
  std::map<std::vector<std::string>, T> children_;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registering a name twice, or an invalid metric or label name, throws std::invalid_argument:
  // metric definitions are code, not input.
  Family<Counter>& counter(const std::string& name, const std::string& help,
                           std::vector<std::string> label_names = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help,
                       std::vector<std::string> label_names = {});
  Family<Histogram>& histogram(const std::string& name, const std::string& help,
                               std::vector<double> bounds,
                               std::vector<std::string> label_names = {});

  // Runs at the start of every render(), to copy in values kept elsewhere. A collector may
  // update children but must not register families.
  void add_collector(std::function<void()> collect);

  // The whole registry in the text exposition format.
  std::string render() const;

 private:
  template <typename T, typename Builder>
  Family<T>& add(Builder builder, std::vector<std::unique_ptr<Family<T>>>& families,
                 const std::string& name, const std::string& help,
                 std::vector<std::string> label_names, std::vector<double> bounds = {});

  std::unique_ptr<prometheus::Registry> registry_;
  mutable std::mutex mu_;  // the lists below; one render() at a time
  std::vector<std::function<void()>> collectors_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
};

}  // namespace kpleg::metrics

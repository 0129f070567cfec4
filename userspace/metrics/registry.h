// A small metrics registry rendering the Prometheus text exposition format (0.0.4).
//
// Families are registered once (name, help, label names); a child for one set of label values
// is looked up once and kept as a reference by the component that updates it, so the hot path
// is a single atomic operation. Values fed from elsewhere (CRI call counters, the event bus)
// are copied in by collectors that run at scrape time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace kpleg::metrics {

class Counter {
 public:
  void inc(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  // For collectors mirroring a counter kept elsewhere (it must only grow).
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  void dec(double v = 1) { value_.fetch_sub(v, std::memory_order_relaxed); }
  void set_to_current_time();  // Unix time in seconds
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: upper bounds, strictly increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (not cumulative), +Inf last
  std::atomic<double> sum_{0};
};

// Prometheus' client default buckets (seconds), as the kubelet's PLEG histograms use.
std::vector<double> default_buckets();
// start, start*factor, ... (count bounds).
std::vector<double> exponential_buckets(double start, double factor, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, std::vector<std::string> label_names,
             MetricType type);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  void render(std::string& out) const;

 protected:
  void check_arity(const std::vector<std::string>& values) const;
  virtual void render_children(std::string& out) const = 0;
  std::string labels_text(const std::vector<std::string>& values, std::string_view extra_name = {},
                          std::string_view extra_value = {}) const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const MetricType type_;
  mutable std::mutex mu_;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names, MetricType type,
         std::function<std::unique_ptr<T>()> make)
      : FamilyBase(std::move(name), std::move(help), std::move(label_names), type),
        make_(std::move(make)) {}

  // The child for these label values (in label-name order), created on first use. The
  // reference stays valid as long as the registry: look it up once, keep it.
  T& with(const std::vector<std::string>& label_values) {
    check_arity(label_values);
    std::lock_guard l(mu_);
    auto& slot = children_[label_values];
    if (!slot) slot = make_();
    return *slot;
  }
  T& get() { return with({}); }

 private:
  void render_children(std::string& out) const override;

  std::function<std::unique_ptr<T>()> make_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;  // sorted: stable output
};

template <>
void Family<Counter>::render_children(std::string& out) const;
template <>
void Family<Gauge>::render_children(std::string& out) const;
template <>
void Family<Histogram>::render_children(std::string& out) const;

class Registry {
 public:
  // Registering a name twice, or an invalid metric or label name, throws std::invalid_argument:
  // metric definitions are code, not input.
  Family<Counter>& counter(std::string name, std::string help,
                           std::vector<std::string> label_names = {});
  Family<Gauge>& gauge(std::string name, std::string help,
                       std::vector<std::string> label_names = {});
  Family<Histogram>& histogram(std::string name, std::string help, std::vector<double> bounds,
                               std::vector<std::string> label_names = {});

  // Runs at the start of every render(), to copy in values kept elsewhere. A collector may
  // update children but must not register families.
  void add_collector(std::function<void()> collect);

  // The whole registry in the text exposition format.
  std::string render() const;

 private:
  void add(std::unique_ptr<FamilyBase> family);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;  // registration order
  std::vector<std::function<void()>> collectors_;
};

// Text-format escaping, exposed for tests.
std::string escape_label_value(std::string_view v);
std::string escape_help(std::string_view v);
std::string format_value(double v);

}  // namespace kpleg::metrics

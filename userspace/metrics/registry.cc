#include "metrics/registry.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace kpleg::metrics {
namespace {

// prometheus-cpp checks a metric name when its family is registered but a label name only when
// a child is added, and neither "le" on a histogram nor help texts it cannot write.
void check_definition(const std::string& name, const std::string& help,
                      const std::vector<std::string>& label_names, MetricType type) {
  if (!prometheus::CheckMetricName(name))
    throw std::invalid_argument("invalid metric name: " + name);
  if (help.find_first_of("\\\n") != std::string::npos)
    throw std::invalid_argument("the help text of " + name + " has a backslash or newline");
  for (const auto& l : label_names) {
    if (!prometheus::CheckLabelName(l))
      throw std::invalid_argument("invalid label name " + l + " in " + name);
    if (type == MetricType::kHistogram && l == "le")
      throw std::invalid_argument("histogram " + name + " cannot have a label named le");
  }
}

}  // namespace

void Counter::inc(double v) { c_.Increment(v); }

void Counter::set(double v) {
  const double now = c_.Value();
  if (v > now) c_.Increment(v - now);
}

double Counter::value() const { return c_.Value(); }

void Gauge::set(double v) { g_.Set(v); }
void Gauge::inc(double v) { g_.Increment(v); }
void Gauge::dec(double v) { g_.Decrement(v); }
double Gauge::value() const { return g_.Value(); }

void Gauge::set_to_current_time() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  g_.Set(static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9);
}

void Histogram::observe(double v) { h_.Observe(v); }

// ---- families ----

template <typename T>
Family<T>::Family(Prometheus& family, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : family_(family), label_names_(std::move(label_names)), bounds_(std::move(bounds)) {}

template <typename T>
T& Family<T>::with(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names_.size())
    throw std::invalid_argument(family_.GetName() + " has " + std::to_string(label_names_.size()) +
                                " labels, got " + std::to_string(label_values.size()) + " values");
  std::lock_guard l(mu_);
  if (auto it = children_.find(label_values); it != children_.end()) return it->second;
  prometheus::Labels labels;
  for (size_t i = 0; i < label_values.size(); ++i) labels.emplace(label_names_[i], label_values[i]);
  auto& child = [&]() -> auto& {
    if constexpr (std::is_same_v<T, Histogram>)
      return family_.Add(labels, bounds_);
    else
      return family_.Add(labels);
  }
  ();
  return children_.try_emplace(label_values, child).first->second;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ----

Registry::Registry()
    : registry_(
          std::make_unique<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}

Registry::~Registry() = default;

template <typename T, typename Builder>
Family<T>& Registry::add(Builder builder, std::vector<std::unique_ptr<Family<T>>>& families,
                         const std::string& name, const std::string& help,
                         std::vector<std::string> label_names, std::vector<double> bounds) {
  const bool unlabelled = label_names.empty();
  Family<T>* family;
  {
    std::lock_guard l(mu_);
    // Throws std::invalid_argument for a name registered before, of any type.
    auto& registered = builder.Name(name).Help(help).Register(*registry_);
    family = families
                 .emplace_back(std::make_unique<Family<T>>(registered, std::move(label_names),
                                                           std::move(bounds)))
                 .get();
  }
  if (unlabelled) family->get();  // present (as 0) from the first scrape
  return *family;
}

Family<Counter>& Registry::counter(const std::string& name, const std::string& help,
                                   std::vector<std::string> label_names) {
  check_definition(name, help, label_names, MetricType::kCounter);
  return add<Counter>(prometheus::BuildCounter(), counters_, name, help, std::move(label_names));
}

Family<Gauge>& Registry::gauge(const std::string& name, const std::string& help,
                               std::vector<std::string> label_names) {
  check_definition(name, help, label_names, MetricType::kGauge);
  return add<Gauge>(prometheus::BuildGauge(), gauges_, name, help, std::move(label_names));
}

Family<Histogram>& Registry::histogram(const std::string& name, const std::string& help,
                                       std::vector<double> bounds,
                                       std::vector<std::string> label_names) {
  check_definition(name, help, label_names, MetricType::kHistogram);
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
      throw std::invalid_argument("the buckets of " + name +
                                  " must be finite and strictly increasing");
  }
  return add<Histogram>(prometheus::BuildHistogram(), histograms_, name, help,
                        std::move(label_names), std::move(bounds));
}

void Registry::add_collector(std::function<void()> collect) {
  std::lock_guard l(mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::render() const {
  std::lock_guard l(mu_);
  for (const auto& c : collectors_) c();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace kpleg::metrics

#include "metrics/registry.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace kpleg::metrics {
namespace {

bool valid_metric_name(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool valid_label_name(std::string_view n) {
  if (n.empty() || n.starts_with("__")) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integral values (nearly all counters) print without an exponent up to 2^53.
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0)
    return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

void Gauge::set_to_current_time() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  set(static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9);
}

// ---- Histogram ----

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (std::isnan(bounds_[i]) || std::isinf(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1]))
      throw std::invalid_argument("histogram bounds must be finite and strictly increasing");
  }
}

void Histogram::observe(double v) {
  // Prometheus buckets are "less than or equal": the first bound >= v.
  size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // _count is the +Inf bucket, so the two always agree even while observations race.
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> default_buckets() { return {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}; }

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

// ---- families ----

FamilyBase::FamilyBase(std::string name, std::string help, std::vector<std::string> label_names,
                       MetricType type)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      type_(type) {
  if (!valid_metric_name(name_)) throw std::invalid_argument("invalid metric name: " + name_);
  for (const auto& l : label_names_) {
    if (!valid_label_name(l))
      throw std::invalid_argument("invalid label name " + l + " in " + name_);
    if (type_ == MetricType::kHistogram && l == "le")
      throw std::invalid_argument("histogram " + name_ + " cannot have a label named le");
  }
}

void FamilyBase::check_arity(const std::vector<std::string>& values) const {
  if (values.size() != label_names_.size())
    throw std::invalid_argument(
        fmt::format("{} has {} labels, got {} values", name_, label_names_.size(), values.size()));
}

std::string FamilyBase::labels_text(const std::vector<std::string>& values,
                                    std::string_view extra_name,
                                    std::string_view extra_value) const {
  if (values.empty() && extra_name.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += label_names_[i];
    out += "=\"";
    out += escape_label_value(values[i]);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!values.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
  return out;
}

void FamilyBase::render(std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name_, escape_help(help_), name_,
                     type_name(type_));
  render_children(out);
}

template <>
void Family<Counter>::render_children(std::string& out) const {
  std::lock_guard l(mu_);
  for (const auto& [values, c] : children_)
    out += fmt::format("{}{} {}\n", name_, labels_text(values), format_value(c->value()));
}

template <>
void Family<Gauge>::render_children(std::string& out) const {
  std::lock_guard l(mu_);
  for (const auto& [values, g] : children_)
    out += fmt::format("{}{} {}\n", name_, labels_text(values), format_value(g->value()));
}

template <>
void Family<Histogram>::render_children(std::string& out) const {
  std::lock_guard l(mu_);
  for (const auto& [values, h] : children_) {
    Histogram::Snapshot s = h->snapshot();
    for (size_t i = 0; i < s.cumulative.size(); ++i) {
      std::string le = i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf";
      out += fmt::format("{}_bucket{} {}\n", name_, labels_text(values, "le", le), s.cumulative[i]);
    }
    out += fmt::format("{}_sum{} {}\n", name_, labels_text(values), format_value(s.sum));
    out += fmt::format("{}_count{} {}\n", name_, labels_text(values), s.count);
  }
}

// ---- registry ----

void Registry::add(std::unique_ptr<FamilyBase> family) {
  std::lock_guard l(mu_);
  for (const auto& f : families_)
    if (f->name() == family->name())
      throw std::invalid_argument("metric registered twice: " + family->name());
  families_.push_back(std::move(family));
}

Family<Counter>& Registry::counter(std::string name, std::string help,
                                   std::vector<std::string> label_names) {
  bool unlabelled = label_names.empty();
  auto f = std::make_unique<Family<Counter>>(std::move(name), std::move(help),
                                             std::move(label_names), MetricType::kCounter,
                                             [] { return std::make_unique<Counter>(); });
  auto& ref = *f;
  add(std::move(f));
  if (unlabelled) ref.get();  // present (as 0) from the first scrape
  return ref;
}

Family<Gauge>& Registry::gauge(std::string name, std::string help,
                               std::vector<std::string> label_names) {
  bool unlabelled = label_names.empty();
  auto f =
      std::make_unique<Family<Gauge>>(std::move(name), std::move(help), std::move(label_names),
                                      MetricType::kGauge, [] { return std::make_unique<Gauge>(); });
  auto& ref = *f;
  add(std::move(f));
  if (unlabelled) ref.get();
  return ref;
}

Family<Histogram>& Registry::histogram(std::string name, std::string help,
                                       std::vector<double> bounds,
                                       std::vector<std::string> label_names) {
  bool unlabelled = label_names.empty();
  Histogram probe(bounds);  // validates the bounds before anything is registered
  auto f = std::make_unique<Family<Histogram>>(
      std::move(name), std::move(help), std::move(label_names), MetricType::kHistogram,
      [bounds = std::move(bounds)] { return std::make_unique<Histogram>(bounds); });
  auto& ref = *f;
  add(std::move(f));
  if (unlabelled) ref.get();
  return ref;
}

void Registry::add_collector(std::function<void()> collect) {
  std::lock_guard l(mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::render() const {
  std::lock_guard l(mu_);
  for (const auto& c : collectors_) c();
  std::string out;
  out.reserve(16384);
  for (const auto& f : families_) f->render(out);
  return out;
}

}  // namespace kpleg::metrics

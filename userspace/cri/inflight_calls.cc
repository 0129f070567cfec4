#include "cri/inflight_calls.h"

#include <fmt/format.h>

#include <algorithm>

namespace kpleg::cri {

const char* to_string(CallOrigin origin) {
  switch (origin) {
    case CallOrigin::kDaemon: return "kplegd";
    case CallOrigin::kEndpoint: return "endpoint";
  }
  return "?";
}

namespace {

std::string human_age(std::chrono::milliseconds age) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(age).count();
  if (s >= 3600) return fmt::format("{}h{}m{}s", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}m{}s", s / 60, s % 60);
  if (s >= 1) return fmt::format("{}s", s);
  return fmt::format("{}ms", age.count());
}

}  // namespace

std::string describe(const InflightCall& call) {
  const CallSubject& s = call.subject;
  std::string what = call.method;
  if (!s.pod.name.empty() || !s.pod.uid.empty()) {
    what += " for " + (s.pod.namespace_.empty() ? std::string() : s.pod.namespace_ + "/") +
            (s.pod.name.empty() ? "pod" : s.pod.name);
    if (!s.pod.uid.empty()) what += " (uid " + s.pod.uid + ")";
    if (!s.container_name.empty()) what += ", container " + s.container_name;
    if (!s.id.empty()) what += " [" + s.id.substr(0, 12) + "]";
  } else if (!s.id.empty()) {
    what += " for " + s.id.substr(0, 12) + " (no pod known for it)";
  }
  what += fmt::format(" in flight for {} ({})", human_age(call.age),
                      call.origin == CallOrigin::kDaemon ? "made by kplegd"
                                                         : "through the CRI endpoint");
  return what;
}

InflightCalls::Ticket& InflightCalls::Ticket::operator=(Ticket&& o) noexcept {
  if (this != &o) {
    end();
    owner_ = o.owner_;
    serial_ = o.serial_;
    o.owner_ = nullptr;
  }
  return *this;
}

void InflightCalls::Ticket::end() {
  if (owner_ != nullptr) owner_->finish(serial_);
  owner_ = nullptr;
}

InflightCalls::Ticket InflightCalls::begin(std::string_view method, CallOrigin origin,
                                           CallSubject subject) {
  const auto now = Clock::now();
  std::lock_guard lk(mu_);
  const uint64_t serial = next_serial_++;
  calls_.emplace_hint(calls_.end(), serial,
                      Entry{std::string(method), origin, std::move(subject), now});
  return Ticket(this, serial);
}

void InflightCalls::finish(uint64_t serial) {
  std::lock_guard lk(mu_);
  auto it = calls_.find(serial);
  if (it == calls_.end()) return;
  // Remembered only when it ends, so that the hot path of begin() stays one insert.
  seen_.try_emplace({it->second.method, it->second.origin}, true);
  calls_.erase(it);
}

void InflightCalls::set_resolver(Resolver resolver) {
  std::lock_guard lk(mu_);
  resolver_ = std::move(resolver);
}

std::vector<InflightCall> InflightCalls::older_than(std::chrono::milliseconds min_age) const {
  std::vector<InflightCall> out;
  std::vector<size_t> unresolved;  // indexes into out whose pod the resolver is asked for
  Resolver resolver;
  const auto now = Clock::now();
  {
    std::lock_guard lk(mu_);
    resolver = resolver_;
    for (const auto& [serial, e] : calls_) {
      auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.started);
      // Serials grow with start time: once one is too young, so are all after it.
      if (age < min_age) break;
      const auto& s = e.subject;
      if (resolver && s.pod.name.empty() && !(s.id.empty() && s.pod.uid.empty()) &&
          now >= e.resolve_after)
        unresolved.push_back(out.size());
      out.push_back(InflightCall{serial, e.method, e.origin, e.subject, age});
    }
  }
  if (unresolved.empty()) return out;
  // Outside the lock (the resolver reads the daemon's state); each call is resolved once, its
  // answer kept on its entry, so that a stuck call costs a lookup once, not at every health
  // check, scrape or Stats while it hangs. A miss is asked again after kResolveRetry (the pod
  // may not be known yet).
  std::vector<std::optional<CallSubject>> found(unresolved.size());
  for (size_t i = 0; i < unresolved.size(); ++i) {
    auto& c = out[unresolved[i]];
    found[i] = resolver(c.subject);
    if (const auto& known = found[i]) {
      c.subject.pod = known->pod;
      if (c.subject.container_name.empty()) c.subject.container_name = known->container_name;
    }
  }
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < unresolved.size(); ++i) {
    const auto& c = out[unresolved[i]];
    auto it = calls_.find(c.serial);
    if (it == calls_.end()) continue;  // ended meanwhile
    if (found[i]) {
      it->second.subject = c.subject;
      it->second.resolve_after = Clock::time_point::max();  // known: never asked again
    } else {
      it->second.resolve_after = now + kResolveRetry;
    }
  }
  return out;
}

std::vector<MethodInflight> InflightCalls::by_method() const {
  const auto now = Clock::now();
  std::map<std::pair<std::string, CallOrigin>, MethodInflight> m;
  std::lock_guard lk(mu_);
  for (const auto& [key, _] : seen_) m[key] = MethodInflight{key.first, key.second, 0, {}};
  for (const auto& [serial, e] : calls_) {
    auto& mi = m[{e.method, e.origin}];
    mi.method = e.method;
    mi.origin = e.origin;
    // The first one met is the oldest (ordered by serial).
    if (mi.count++ == 0)
      mi.oldest = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.started);
  }
  std::vector<MethodInflight> out;
  out.reserve(m.size());
  for (auto& [_, mi] : m) out.push_back(std::move(mi));
  return out;
}

std::optional<std::chrono::milliseconds> InflightCalls::until_one_reaches(
    std::chrono::milliseconds age) const {
  const auto now = Clock::now();
  std::lock_guard lk(mu_);
  for (const auto& [serial, e] : calls_) {
    auto a = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.started);
    if (a < age) return age - a;
  }
  return std::nullopt;
}

size_t InflightCalls::size() const {
  std::lock_guard lk(mu_);
  return calls_.size();
}

}  // namespace kpleg::cri

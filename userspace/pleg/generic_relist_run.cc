// GenericRelist's thread, statistics and health (generic_relist.h).
#include <spdlog/spdlog.h>

#include <cinttypes>
#include <cstdio>

#include "common/thread_name.h"
#include "pleg/generic_relist.h"

namespace kpleg::pleg {
namespace {

// Go's time.Duration style, as the kubelet's health message prints it: 850ms, 12.5s, 3m12.5s.
std::string format_duration(int64_t ns) {
  char buf[64];
  if (ns < 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%" PRId64 "ms", ns / 1'000'000);
    return buf;
  }
  int64_t ms = ns / 1'000'000;
  int64_t h = ms / 3'600'000, m = ms / 60'000 % 60;
  double s = double(ms % 60'000) / 1000.0;
  if (h > 0) {
    std::snprintf(buf, sizeof buf, "%" PRId64 "h%" PRId64 "m%gs", h, m, s);
  } else if (m > 0) {
    std::snprintf(buf, sizeof buf, "%" PRId64 "m%gs", m, s);
  } else {
    std::snprintf(buf, sizeof buf, "%gs", s);
  }
  return buf;
}

}  // namespace

Status GenericRelist::finish_relist(int64_t start_mono, Status result) {
  const int64_t end_mono = options_.monotonic_ns();
  RelistStats copy;
  {
    std::lock_guard lock(state_mu_);
    stats_.last_end_ns = options_.realtime_ns();
    stats_.last_duration_ns = end_mono - start_mono;
    if (result.ok()) {
      if (stats_.consecutive_failures > 0)
        spdlog::info("relist: runtime lists succeed again after {} failed relist(s)",
                     stats_.consecutive_failures);
      stats_.consecutive_failures = 0;
    } else {
      ++stats_.failed_relists;
      if (++stats_.consecutive_failures == 1) spdlog::warn("{}", result.error().message);
      stats_.last_error = result.error().message;
    }
    copy = stats_;
  }
  if (options_.on_relist) options_.on_relist(copy);
  return result;
}

void GenericRelist::start() {
  std::lock_guard lifecycle(lifecycle_mu_);
  std::lock_guard lock(loop_mu_);
  if (running_) return;
  stop_requested_ = false;
  running_ = true;
  loop_ = named_thread("kpleg-relist", [this] { run_loop(); });
}

void GenericRelist::stop() {
  std::lock_guard lifecycle(lifecycle_mu_);
  {
    std::lock_guard lock(loop_mu_);
    if (!running_) return;
    stop_requested_ = true;
  }
  loop_cv_.notify_all();
  loop_.join();
  std::lock_guard lock(loop_mu_);
  running_ = false;
}

bool GenericRelist::running() const {
  std::lock_guard lock(loop_mu_);
  return running_;
}

void GenericRelist::run_loop() {
  std::unique_lock lock(loop_mu_);
  while (!stop_requested_) {
    lock.unlock();
    (void)relist_once();  // a failure is in stats() and health(); the loop goes on
    lock.lock();
    // The period runs from the end of this relist, as wait.Until's does, so a slow relist
    // never queues up the next one.
    loop_cv_.wait_for(lock, options_.period, [this] { return stop_requested_; });
  }
}

RelistStats GenericRelist::stats() const {
  std::lock_guard lock(state_mu_);
  return stats_;
}

RelistHealth GenericRelist::health() const { return health(options_.monotonic_ns()); }

RelistHealth GenericRelist::health(int64_t now_mono_ns) const {
  std::lock_guard lock(state_mu_);
  RelistHealth h;
  for (const auto& [uid, p] : pending_) h.pending_inspections.push_back(p);
  if (!succeeded_once_) {
    h.reason = "relist has yet to succeed";
    if (!stats_.last_error.empty()) h.reason += " (last error: " + stats_.last_error + ")";
    return h;
  }
  const int64_t elapsed = now_mono_ns - last_success_mono_;
  const int64_t threshold = std::chrono::nanoseconds(options_.health_threshold).count();
  if (elapsed > threshold) {
    h.reason = "relist was last successful " + format_duration(elapsed) + " ago; threshold is " +
               format_duration(threshold);
    if (!stats_.last_error.empty()) h.reason += " (last error: " + stats_.last_error + ")";
    return h;
  }
  h.healthy = true;
  return h;
}

std::vector<PodRecord> GenericRelist::pods() const {
  return pods_at([] { return uint64_t(0); }).second;
}

std::pair<uint64_t, std::vector<PodRecord>> GenericRelist::pods_at(
    const std::function<uint64_t()>& seq_now) const {
  std::lock_guard lock(state_mu_);
  std::vector<PodRecord> out;
  out.reserve(confirmed_.size());
  for (const auto& [uid, pod] : confirmed_) out.push_back(*pod);
  return {seq_now(), std::move(out)};
}

}  // namespace kpleg::pleg

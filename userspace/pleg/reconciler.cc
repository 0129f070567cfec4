#include "pleg/reconciler.h"
#include "common/thread_name.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace kpleg::pleg {

Reconciler::Reconciler(cri::CriClient& cri, Tracker& tracker, std::chrono::milliseconds period,
                       std::chrono::milliseconds min_spacing)
    : cri_(cri), tracker_(tracker), period_(period), min_spacing_(min_spacing) {}

Reconciler::~Reconciler() { stop(); }

Status Reconciler::start(std::chrono::milliseconds wait) {
  thread_ = named_thread("kpleg-reconcile", [this] {
    auto st = run_once("start", true);
    {
      std::lock_guard lk(mu_);
      last_end_ = std::chrono::steady_clock::now();
      initial_finished_ = true;
      initial_status_ = st;
    }
    cv_.notify_all();
    loop();
  });
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, wait, [&] { return initial_finished_ || stopping_; }))
    return Error{ETIMEDOUT, fmt::format("the runtime's full list has not answered within {} ms "
                                        "(a large node or a loaded runtime?)",
                                        wait.count())};
  return initial_status_;
}

void Reconciler::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Reconciler::request(const std::string& reason) {
  {
    std::lock_guard lk(mu_);
    if (!requested_)
      requested_ = reason;
    else
      ++stats_.coalesced;
    ++stats_.requested;
  }
  cv_.notify_all();
}

ReconcilerStats Reconciler::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

Status Reconciler::run_once(const std::string& reason, bool initial) {
  auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    stats_.running_since = t0;
  }
  auto view = list_runtime(cri_);
  std::lock_guard lk(mu_);
  stats_.running_since.reset();
  ++stats_.runs;
  stats_.last_reason = reason;
  stats_.last_duration = std::chrono::steady_clock::now() - t0;
  if (!view) {
    ++stats_.failures;
    stats_.last_error = view.error().message;
    if (stopping_)  // the daemon cancelled its calls to stop
      spdlog::debug("reconcile ({}) ended by the shutdown: {}", reason, view.error().message);
    else
      spdlog::warn("reconcile ({}) failed: {}", reason, view.error().message);
    if (on_run_) on_run_(stats_, false);
    return view.error();
  }
  // Until one sync succeeded, the tracker has no baseline: that first view is the start-up sync.
  bool as_initial = initial || !initial_done_;
  tracker_.reconcile(*view, as_initial);
  if (on_view_) on_view_(*view);
  initial_done_ = true;
  stats_.last_success = std::chrono::system_clock::now();
  stats_.last_success_mono = std::chrono::steady_clock::now();
  stats_.last_error.clear();
  spdlog::debug("reconcile ({}): {} containers and sandboxes", reason, view->size());
  if (on_run_) on_run_(stats_, true);
  return {};
}

void Reconciler::loop() {
  std::unique_lock lk(mu_);
  auto next = std::chrono::steady_clock::now() + period_;
  while (!stopping_) {
    // After a failure, try again sooner than the period (the runtime may be back any moment).
    auto due = stats_.last_error.empty()
                   ? next
                   : std::min(next, std::chrono::steady_clock::now() + std::chrono::seconds(1));
    cv_.wait_until(lk, due, [&] { return stopping_ || requested_.has_value(); });
    if (stopping_) break;
    if (requested_ && last_end_) {
      // Asked for: not before min_spacing_ after the last run; asks meanwhile join this one.
      cv_.wait_until(lk, *last_end_ + min_spacing_, [&] { return stopping_; });
      if (stopping_) break;
    }
    std::string reason = requested_ ? *requested_ : "period";
    requested_.reset();
    if (std::chrono::steady_clock::now() >= next) next = std::chrono::steady_clock::now() + period_;
    lk.unlock();
    (void)run_once(reason, false);
    lk.lock();
    last_end_ = std::chrono::steady_clock::now();
  }
}

}  // namespace kpleg::pleg

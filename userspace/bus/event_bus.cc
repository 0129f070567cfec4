#include "bus/event_bus.h"

#include <functional>

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <vector>

#include <fmt/format.h>

namespace kpleg::bus {
namespace detail {

struct Subscriber {
  Subscriber(uint64_t id_, EventFilter filter_, size_t capacity_, std::function<void()> ready)
      : id(id_), filter(std::move(filter_)), capacity(capacity_), on_ready(std::move(ready)) {}

  const uint64_t id;
  const EventFilter filter;
  const size_t capacity;
  const std::function<void()> on_ready;  // see EventBus::subscribe; run with no lock held

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<EventPtr> backlog;  // RESYNC + retained events, taken first
  std::deque<EventPtr> live;     // bounded by capacity
  size_t max_queued = 0;
  bool cut_off = false;
  bool woken = false;  // wake() was called: the next next() returns kTimeout at once
  std::string close_reason;
  std::function<void()> on_cut_off;  // under mu; run under mu when the cut-off happens
  // Also readable without `mu`, so the bus can prune closed subscribers cheaply.
  std::atomic<bool> closed{false};

  // Publisher side, under the bus lock. Returns the number of events discarded when this
  // event overflowed the queue (the subscriber is then cut off), 0 otherwise. `ready`: the
  // subscriber's reader is to be told (its queue was empty, or it was cut off now).
  size_t offer(const EventPtr& ev, bool& ready) {
    size_t discarded = 0;
    ready = false;
    {
      std::lock_guard l(mu);
      if (closed.load(std::memory_order_relaxed)) return 0;
      ready = true;
      if (live.size() >= capacity) {
        discarded = live.size() + backlog.size() + 1;
        cut_off = true;
        close_reason = fmt::format("subscriber too slow: queue of {} events full", capacity);
        // Free the memory now: a stuck consumer must not pin its queue until it goes away.
        std::deque<EventPtr>().swap(live);
        std::deque<EventPtr>().swap(backlog);
        closed.store(true, std::memory_order_relaxed);
        if (on_cut_off) on_cut_off();
      } else {
        live.push_back(ev);
        max_queued = std::max(max_queued, live.size());
        if (live.size() > 1 || !backlog.empty()) {  // the reader is awake already
          ready = false;
          return 0;
        }
      }
    }
    cv.notify_all();
    return discarded;
  }

  // Returns false when it was already closed.
  bool close(std::string reason) {
    {
      std::lock_guard l(mu);
      if (closed.load(std::memory_order_relaxed)) return false;
      close_reason = std::move(reason);
      std::deque<EventPtr>().swap(live);
      std::deque<EventPtr>().swap(backlog);
      closed.store(true, std::memory_order_relaxed);
    }
    cv.notify_all();
    return true;
  }
};

struct BusCore {
  explicit BusCore(EventBusOptions o) : options(std::move(o)) {}

  EventBusOptions options;
  mutable std::mutex mu;
  uint64_t last_seq = 0;
  uint64_t next_subscriber_id = 1;
  std::deque<EventPtr> history;
  std::vector<std::shared_ptr<Subscriber>> subscribers;
  uint64_t cut_off_total = 0;
  uint64_t discarded_total = 0;
  bool closed = false;
  std::string close_reason;

  // Under mu. Cancelled subscribers are dropped lazily so that cancel() never takes the bus
  // lock (a consumer cancelling from a callback can then never deadlock against publish).
  void prune() {
    std::erase_if(subscribers, [](const std::shared_ptr<Subscriber>& s) {
      return s->closed.load(std::memory_order_relaxed);
    });
  }
};

}  // namespace detail

namespace {

std::string random_instance_id() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof(bytes)) {
    // getrandom cannot fail on Linux >= 3.17 with these arguments; keep a usable fallback.
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  std::string id;
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

EventPtr make_resync(uint64_t continue_after, std::string reason) {
  pleg::PodLifecycleEvent ev;
  ev.type = pleg::EventType::kResync;
  ev.seq = continue_after;
  ev.reason = std::move(reason);
  ev.emit_ts_ns = pleg::realtime_now_ns();
  return std::make_shared<const pleg::PodLifecycleEvent>(std::move(ev));
}

}  // namespace

bool EventFilter::matches(const pleg::PodLifecycleEvent& ev) const {
  if (ev.type == pleg::EventType::kResync) return true;
  if (!pod_uid.empty() && ev.pod_uid != pod_uid) return false;
  if (!pod_namespace.empty() && ev.pod_namespace != pod_namespace) return false;
  return true;
}

// ---- Subscription ----

Subscription::Subscription(std::shared_ptr<detail::Subscriber> s) : sub_(std::move(s)) {}
Subscription::Subscription(Subscription&&) noexcept = default;
Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    cancel();
    sub_ = std::move(other.sub_);
  }
  return *this;
}
Subscription::~Subscription() { cancel(); }

namespace {

// The next event of a subscriber, its lock held.
Subscription::Next take_locked(detail::Subscriber& s) {
  if (s.closed.load(std::memory_order_relaxed)) return {Subscription::Status::kClosed, nullptr};
  auto& q = !s.backlog.empty() ? s.backlog : s.live;
  if (q.empty()) return {Subscription::Status::kTimeout, nullptr};
  EventPtr ev = std::move(q.front());
  q.pop_front();
  return {Subscription::Status::kEvent, std::move(ev)};
}

}  // namespace

Subscription::Next Subscription::try_next() {
  if (!sub_) return {Status::kClosed, nullptr};
  std::lock_guard l(sub_->mu);
  return take_locked(*sub_);
}

Subscription::Next Subscription::next(std::chrono::milliseconds timeout) {
  if (!sub_) return {Status::kClosed, nullptr};
  std::unique_lock l(sub_->mu);
  sub_->cv.wait_for(l, timeout, [&] {
    return sub_->closed.load(std::memory_order_relaxed) || !sub_->backlog.empty() ||
           !sub_->live.empty() || sub_->woken;
  });
  sub_->woken = false;
  return take_locked(*sub_);
}

void Subscription::cancel() {
  if (sub_) sub_->close("cancelled");
}

void Subscription::set_on_cut_off(std::function<void()> fn) {
  if (!sub_) return;
  std::lock_guard l(sub_->mu);
  sub_->on_cut_off = std::move(fn);
}

void Subscription::wake() {
  if (!sub_) return;
  {
    std::lock_guard l(sub_->mu);
    sub_->woken = true;
  }
  sub_->cv.notify_all();
}

bool Subscription::closed() const { return !sub_ || sub_->closed.load(std::memory_order_relaxed); }
bool Subscription::cut_off() const {
  if (!sub_) return false;
  std::lock_guard l(sub_->mu);
  return sub_->cut_off;
}
std::string Subscription::close_reason() const {
  if (!sub_) return "not subscribed";
  std::lock_guard l(sub_->mu);
  return sub_->close_reason;
}
uint64_t Subscription::id() const { return sub_ ? sub_->id : 0; }
size_t Subscription::queue_capacity() const { return sub_ ? sub_->capacity : 0; }
size_t Subscription::queued() const {
  if (!sub_) return 0;
  std::lock_guard l(sub_->mu);
  return sub_->live.size();
}
size_t Subscription::max_queued() const {
  if (!sub_) return 0;
  std::lock_guard l(sub_->mu);
  return sub_->max_queued;
}
size_t Subscription::backlog() const {
  if (!sub_) return 0;
  std::lock_guard l(sub_->mu);
  return sub_->backlog.size();
}

// ---- EventBus ----

EventBus::EventBus(EventBusOptions options)
    : core_(std::make_unique<detail::BusCore>(std::move(options))),
      instance_id_(random_instance_id()) {
  if (core_->options.history_capacity == 0) core_->options.history_capacity = 1;
  if (core_->options.default_queue_capacity == 0)
    core_->options.default_queue_capacity = kDefaultQueueCapacity;
}

EventBus::~EventBus() { close("event bus shut down"); }

void EventBus::publish(pleg::PodLifecycleEvent ev) {
  // Readers to tell once the lock is released (on_ready); reused, so no allocation per event.
  thread_local std::vector<std::shared_ptr<detail::Subscriber>> ready;
  publish_locked(std::move(ev), ready);
  for (auto& s : ready) s->on_ready();
  ready.clear();
}

void EventBus::publish_locked(pleg::PodLifecycleEvent ev,
                              std::vector<std::shared_ptr<detail::Subscriber>>& ready) {
  std::lock_guard l(core_->mu);
  ev.seq = ++core_->last_seq;
  if (ev.emit_ts_ns == 0) ev.emit_ts_ns = pleg::realtime_now_ns();
  auto shared = std::make_shared<const pleg::PodLifecycleEvent>(std::move(ev));
  if (core_->options.on_publish) core_->options.on_publish(*shared);

  core_->history.push_back(shared);
  if (core_->history.size() > core_->options.history_capacity) core_->history.pop_front();

  bool any_closed = false;
  for (const auto& s : core_->subscribers) {
    if (!s->filter.matches(*shared)) continue;
    bool tell = false;
    if (size_t discarded = s->offer(shared, tell); discarded > 0) {
      ++core_->cut_off_total;
      core_->discarded_total += discarded;
    }
    if (tell && s->on_ready) ready.push_back(s);
    any_closed = any_closed || s->closed.load(std::memory_order_relaxed);
  }
  if (any_closed) core_->prune();
}

Subscription EventBus::subscribe(uint64_t from_seq, EventFilter filter, size_t queue_capacity,
                                 std::function<void()> on_ready) {
  if (queue_capacity == 0) queue_capacity = core_->options.default_queue_capacity;
  std::lock_guard l(core_->mu);
  core_->prune();
  auto s = std::make_shared<detail::Subscriber>(core_->next_subscriber_id++, std::move(filter),
                                                queue_capacity, std::move(on_ready));
  if (core_->closed) {
    s->close(core_->close_reason);
    return Subscription(std::move(s));
  }

  const uint64_t last = core_->last_seq;
  const uint64_t oldest = core_->history.empty() ? last + 1 : core_->history.front()->seq;
  if (from_seq == kOldestRetained) {
    for (const auto& ev : core_->history)
      if (s->filter.matches(*ev)) s->backlog.push_back(ev);
  } else if (from_seq != 0) {
    if (from_seq == kStreamStart) from_seq = 0;
    if (from_seq > last) {
      // Not a position in this stream: another daemon instance, or a made-up number.
      s->backlog.push_back(make_resync(
          last, from_seq == kUnknownPosition
                    ? fmt::format("the consumer's position is not in this event stream (last "
                                  "seq {}): List again",
                                  last)
                    : fmt::format("seq {} is not in this event stream (last seq {}): List again",
                                  from_seq, last)));
    } else if (from_seq + 1 < oldest) {
      s->backlog.push_back(make_resync(
          oldest - 1, fmt::format("events {}..{} are no longer retained (history holds {}..{}): "
                                  "List again",
                                  from_seq + 1, oldest - 1, oldest, last)));
    }
    if (from_seq < last) {
      // History is in seq order: skip to the first event after from_seq.
      auto it = std::upper_bound(core_->history.begin(), core_->history.end(), from_seq,
                                 [](uint64_t seq, const EventPtr& ev) { return seq < ev->seq; });
      for (; it != core_->history.end(); ++it)
        if (s->filter.matches(**it)) s->backlog.push_back(*it);
    }
  }
  core_->subscribers.push_back(s);
  return Subscription(std::move(s));
}

uint64_t EventBus::run_locked(const std::function<void()>& f) {
  std::lock_guard l(core_->mu);
  f();
  return core_->last_seq;
}

void EventBus::close(const std::string& reason) {
  std::vector<std::shared_ptr<detail::Subscriber>> closed;
  {
    std::lock_guard l(core_->mu);
    core_->closed = true;
    core_->close_reason = reason;
    closed.swap(core_->subscribers);
  }
  for (const auto& s : closed)
    if (s->close(reason) && s->on_ready) s->on_ready();
}

uint64_t EventBus::last_seq() const {
  std::lock_guard l(core_->mu);
  return core_->last_seq;
}

BusStats EventBus::stats() const {
  std::lock_guard l(core_->mu);
  BusStats st;
  st.last_seq = core_->last_seq;
  st.oldest_retained_seq = core_->history.empty() ? 0 : core_->history.front()->seq;
  st.history_size = core_->history.size();
  st.history_capacity = core_->options.history_capacity;
  for (const auto& s : core_->subscribers)
    if (!s->closed.load(std::memory_order_relaxed)) ++st.subscribers;
  st.subscribers_cut_off = core_->cut_off_total;
  st.discarded_events = core_->discarded_total;
  return st;
}

}  // namespace kpleg::bus

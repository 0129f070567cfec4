// The EventBus owns kpleg's event stream: it gives every published event its global sequence
// number, keeps a bounded history for consumers that resume, and fans events out to
// subscribers through per-subscriber bounded queues.
//
// Guarantees:
// - Sequence numbers start at 1 and strictly increase, in publish order.
// - A subscriber sees events in sequence order, never a silent gap: a position older than the
//   history (or not from this stream) gets an explicit RESYNC event first, meaning "List again".
// - publish() never waits for a subscriber. A subscriber whose queue is full is cut off (its
//   queue dropped, the reason recorded); the others are unaffected. Memory is bounded by the
//   history capacity plus each subscriber's queue capacity.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pleg/event.h"

namespace kpleg::bus {

// Published events are immutable and shared by the history and every subscriber queue.
using EventPtr = std::shared_ptr<const pleg::PodLifecycleEvent>;

// Which events a subscriber wants; empty fields match everything. RESYNC always matches.
struct EventFilter {
  std::string pod_uid;
  std::string pod_namespace;

  bool matches(const pleg::PodLifecycleEvent& ev) const;
};

// A from_seq that is not a position in this stream (e.g. one from another daemon instance):
// the subscription starts with RESYNC, then live events.
inline constexpr uint64_t kUnknownPosition = UINT64_MAX;
// Every retained event (from the oldest in the history, without RESYNC), then live events: for
// an in-process consumer that starts after the daemon's start-up sync and wants it too.
inline constexpr uint64_t kOldestRetained = UINT64_MAX - 1;
// The position before the stream's first event (seq 0 of a stream, as a List before any event
// gives it): every retained event, after a RESYNC if the first ones are no longer retained.
// A from_seq of 0 itself means "from now on".
inline constexpr uint64_t kStreamStart = UINT64_MAX - 2;

inline constexpr size_t kDefaultHistoryCapacity = 10'000;
inline constexpr size_t kDefaultQueueCapacity = 1'000;

struct EventBusOptions {
  size_t history_capacity = kDefaultHistoryCapacity;  // at least 1
  size_t default_queue_capacity = kDefaultQueueCapacity;
  // Called for every event once its seq is assigned, under the publish lock, before fan-out:
  // it must be cheap and must not publish (metrics: events by type, detection latency).
  std::function<void(const pleg::PodLifecycleEvent&)> on_publish;
};

struct BusStats {
  uint64_t last_seq = 0;
  uint64_t oldest_retained_seq = 0;  // 0 while nothing is retained
  uint64_t history_size = 0;
  uint64_t history_capacity = 0;
  uint64_t subscribers = 0;          // open subscriptions
  uint64_t subscribers_cut_off = 0;  // since start
  uint64_t discarded_events = 0;     // queued events dropped with cut-off subscribers
};

namespace detail {
struct Subscriber;
struct BusCore;
}  // namespace detail

// One consumer's view of the stream. Move-only; destroying it cancels it.
class Subscription {
 public:
  enum class Status {
    kEvent,    // `event` is set
    kTimeout,  // nothing arrived within the timeout
    kClosed,   // cancelled, cut off, or the bus was closed: see close_reason()
  };
  struct Next {
    Status status = Status::kTimeout;
    EventPtr event;
  };

  Subscription() = default;
  Subscription(Subscription&&) noexcept;
  Subscription& operator=(Subscription&&) noexcept;
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  ~Subscription();

  // Waits up to `timeout` for the next event. After the subscription closes, returns kClosed
  // at once (a cut-off subscriber's queued events are dropped with it: resume from the last
  // seq received).
  Next next(std::chrono::milliseconds timeout);
  // The next event if one is waiting, kTimeout if none, kClosed once closed; never waits (for a
  // writer driven by on_ready, see EventBus::subscribe).
  Next try_next();
  // Stops delivery and wakes a blocked next(). Idempotent; safe from any thread.
  void cancel();
  // Makes a blocked next() (or the next call of it) return kTimeout at once, without closing
  // anything: the reader gets to look at something else now (the API server uses it to make
  // an idle Watch check whether its client went away). Safe from any thread.
  void wake();

  // Runs `fn` (on the publishing thread, under the subscription's lock: keep it short, take
  // no bus lock) when the subscriber is cut off for being too slow. Setting another (or an
  // empty one) waits for a running call, so after it returns the old `fn` is never called.
  void set_on_cut_off(std::function<void()> fn);

  bool closed() const;
  bool cut_off() const;
  // Why the subscription closed: "subscriber too slow: queue of N events full", "cancelled",
  // or the reason given to EventBus::close(); empty while open.
  std::string close_reason() const;
  uint64_t id() const;
  size_t queue_capacity() const;
  // Live events waiting (the initial backlog of retained events is not counted).
  size_t queued() const;
  // The most live events that were ever waiting at once; never above queue_capacity().
  size_t max_queued() const;
  // Initial backlog (RESYNC and retained events) not yet taken.
  size_t backlog() const;

 private:
  friend class EventBus;
  explicit Subscription(std::shared_ptr<detail::Subscriber> s);
  std::shared_ptr<detail::Subscriber> sub_;
};

class EventBus final : public pleg::EventSink {
 public:
  explicit EventBus(EventBusOptions options = {});
  ~EventBus() override;  // closes every subscription ("event bus shut down")
  EventBus(const EventBus&) = delete;
  EventBus& operator=(const EventBus&) = delete;

  // Assigns ev.seq (and emit_ts_ns when unset), records it in the history and queues it for
  // every matching subscriber. Never blocks on a subscriber.
  void publish(pleg::PodLifecycleEvent ev) override;

  // Events with seq > from_seq (0: only events published from now on; kOldestRetained: the
  // whole history; kStreamStart: as if from_seq were the position 0), filtered.
  // queue_capacity 0 takes the bus's default. The initial backlog (RESYNC when from_seq is
  // older than the history or not in this stream, then the retained events after from_seq)
  // does not count against queue_capacity, so a consumer can always resume from anywhere in
  // the history; live events do.
  //
  // `on_ready`, when given, is how a consumer that writes from the publishing thread learns that
  // there is something to take: it runs on the publishing thread, after publish() released the
  // bus's lock (so it may take the consumer's own locks and call try_next(), but must not publish
  // or subscribe), when an event arrives for a subscription that had none waiting, and when the
  // subscription is cut off or the bus closes it. Not when it is cancelled (the canceller knows),
  // and not for the initial backlog (the subscriber takes it first). It may run after the
  // subscription was cancelled: it must hold what it touches (a weak_ptr, say).
  Subscription subscribe(uint64_t from_seq, EventFilter filter = {}, size_t queue_capacity = 0,
                         std::function<void()> on_ready = {});

  // Runs f while holding the publish lock and returns the last assigned seq with f's result
  // ({seq, result}, or just seq when f returns void). A snapshot taken inside f is exactly
  // consistent with that seq, provided producers update the state the snapshot reads before
  // they publish, under a lock that f takes too. f must not publish.
  template <typename F>
  auto with_seq(F&& f) {
    using R = std::invoke_result_t<F&>;
    if constexpr (std::is_void_v<R>) {
      return run_locked([&] { f(); });
    } else {
      std::optional<R> result;
      uint64_t seq = run_locked([&] { result.emplace(f()); });
      return std::pair<uint64_t, R>(seq, std::move(*result));
    }
  }

  // Closes every subscription with `reason`; later subscriptions start closed. Publishing
  // still assigns sequence numbers and fills the history.
  void close(const std::string& reason);

  uint64_t last_seq() const;
  BusStats stats() const;
  // Random, fixed for this bus: sequence numbers mean something only within one instance.
  const std::string& instance_id() const { return instance_id_; }

 private:
  uint64_t run_locked(const std::function<void()>& f);
  void publish_locked(pleg::PodLifecycleEvent ev,
                      std::vector<std::shared_ptr<detail::Subscriber>>& ready);

  std::unique_ptr<detail::BusCore> core_;
  std::string instance_id_;
};

}  // namespace kpleg::bus

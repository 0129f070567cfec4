// RuntimeEvents: the runtime's own lifecycle events (CRI GetContainerEvents, served by
// containerd 1.7 and later) as the confirmation of what the kernel signalled, instead of a
// targeted look per signal. The runtime sends each event after it recorded the change, with the
// container's full status, so an event says exactly what a look would have said at that moment.
//
// The kernel stays the source of what happened and when; the stream only stands in for the
// looks. It is trusted while it delivers: every event marks it live, and a look that settles a
// signal before its event arrived (the event late or lost, the stream stalled) marks it not live
// until the next event; the looks then go at their usual time. A stream that ends or fails is
// subscribed again, backing off; a runtime without it (UNIMPLEMENTED: containerd 1.6) is asked
// again only after it reconnected (it may have been upgraded).
//
// It runs on a thread of its own (`kpleg-cri-event`, reading the stream with a blocking call),
// or, built with an event loop, on that loop (Tracker::runtime_events(): the stream's socket is
// one more descriptor of the tracker's loop, and an event reaches the tracker without a hand-off
// to another thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/result.h"
#include "cri/cancel_token.h"
#include "cri/cri_client.h"
#include "pleg/event_loop.h"

namespace kpleg::pleg {

struct RuntimeEventsStats {
  uint64_t subscriptions = 0;  // streams opened
  uint64_t events = 0;         // events received
  bool unimplemented = false;  // the runtime has no event stream
  std::string last_error;      // how the last stream ended
};

class RuntimeEvents {
 public:
  using OnEvent = std::function<void(cri::v1::ContainerEventResponse&)>;
  // Opens the stream and reads it until it ends (GrpcCriClient::container_events).
  using Subscribe = std::function<Status(cri::CancelToken&, const OnEvent&)>;

  struct Options {
    std::chrono::milliseconds retry_first{1000};
    std::chrono::milliseconds retry_max{30'000};
    // On an event loop: after an event, the stream is not read for `hold_off` unless `wanted()`
    // (an event is awaited now); the events that come meanwhile (a container's CREATED, a
    // DELETED, another pod's) are read together, without a wakeup each. `set_reader` is given
    // the function that ends a hold (false: read on as events come, from the loop's next turn;
    // true: also hand on at once what has come), and nullptr when the stream goes. 0: every
    // event is read when it comes.
    std::chrono::milliseconds hold_off{0};
    std::function<bool()> wanted;
    std::function<void(std::function<void(bool now)>)> set_reader;
  };

  // `on_event` gets every event; `on_stopped` is called each time a stream ended or failed.
  // Both run on the feed's thread.
  RuntimeEvents(Subscribe subscribe, OnEvent on_event, std::function<void()> on_stopped,
                Options opts);
  RuntimeEvents(Subscribe subscribe, OnEvent on_event, std::function<void()> on_stopped)
      : RuntimeEvents(std::move(subscribe), std::move(on_event), std::move(on_stopped),
                      Options{}) {}
  // On `loop`: `open` starts the stream there (cri::AsyncStatusCalls::container_events), and
  // `on_event` and `on_stopped` run on the loop.
  using Open = std::function<std::unique_ptr<cri::AsyncStatusCalls::Stream>(
      OnEvent on_event, std::function<void(Status)> on_end)>;
  RuntimeEvents(EventLoop& loop, Open open, OnEvent on_event, std::function<void()> on_stopped,
                Options opts);
  ~RuntimeEvents();

  void start();
  void stop();
  // The runtime came back (reconnected): a runtime that had no stream is asked again, and a
  // backoff is cut short.
  void retry_now();
  RuntimeEventsStats stats() const;

 private:
  void loop();
  // The loop's way (the constructor with an event loop), on that loop.
  void subscribe_on_loop();
  void ended_on_loop(const Status& st);
  // After an event, on the loop: the stream holds off unless an event is awaited.
  void hold_unless_wanted();
  // How a stream ended, in the log and the stats; whether the runtime has no stream at all.
  bool note_end(const Status& st);

  const Subscribe subscribe_;
  const OnEvent on_event_;
  const std::function<void()> on_stopped_;
  const Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool retry_ = false;
  cri::CancelToken* cancel_ = nullptr;  // the open stream's, for stop()
  RuntimeEventsStats stats_;
  std::thread thread_;
  // With an event loop (the loop's own, no lock; events_ is read by stats()):
  EventLoop* event_loop_ = nullptr;
  const Open open_;
  std::unique_ptr<cri::AsyncStatusCalls::Stream> stream_;
  std::atomic<uint64_t> events_{0};
  uint64_t received_ = 0;  // on the open stream
  std::chrono::milliseconds backoff_{0};
  EventLoop::TimerId retry_timer_ = 0;
  bool waiting_ = false;   // for retry_now() (no stream, retry_timer_ or an unimplemented runtime)
  bool loop_stopping_ = false;
};

}  // namespace kpleg::pleg

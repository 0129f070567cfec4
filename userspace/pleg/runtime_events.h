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
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/result.h"
#include "cri/cancel_token.h"
#include "cri/cri_client.h"

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
  };

  // `on_event` gets every event; `on_stopped` is called each time a stream ended or failed.
  // Both run on the feed's thread.
  RuntimeEvents(Subscribe subscribe, OnEvent on_event, std::function<void()> on_stopped,
                Options opts);
  RuntimeEvents(Subscribe subscribe, OnEvent on_event, std::function<void()> on_stopped)
      : RuntimeEvents(std::move(subscribe), std::move(on_event), std::move(on_stopped),
                      Options{}) {}
  ~RuntimeEvents();

  void start();
  void stop();
  // The runtime came back (reconnected): a runtime that had no stream is asked again, and a
  // backoff is cut short.
  void retry_now();
  RuntimeEventsStats stats() const;

 private:
  void loop();

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
};

}  // namespace kpleg::pleg

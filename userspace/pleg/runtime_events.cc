#include "pleg/runtime_events.h"

#include <grpcpp/support/status_code_enum.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/thread_name.h"

namespace kpleg::pleg {

RuntimeEvents::RuntimeEvents(Subscribe subscribe, OnEvent on_event,
                             std::function<void()> on_stopped, Options opts)
    : subscribe_(std::move(subscribe)),
      on_event_(std::move(on_event)),
      on_stopped_(std::move(on_stopped)),
      opts_(opts) {}

RuntimeEvents::~RuntimeEvents() { stop(); }

void RuntimeEvents::start() {
  thread_ = std::thread([this] {
    set_thread_name("kpleg-cri-event");
    loop();
  });
}

void RuntimeEvents::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (cancel_ != nullptr) cancel_->cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RuntimeEvents::retry_now() {
  {
    std::lock_guard lk(mu_);
    retry_ = true;
  }
  cv_.notify_all();
}

RuntimeEventsStats RuntimeEvents::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void RuntimeEvents::loop() {
  auto backoff = opts_.retry_first;
  while (true) {
    cri::CancelToken cancel;
    uint64_t received = 0;
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      cancel_ = &cancel;
      retry_ = false;
      ++stats_.subscriptions;
    }
    Status st = subscribe_(cancel, [&](cri::v1::ContainerEventResponse& ev) {
      if (received++ == 0) {
        spdlog::info("runtime events: subscribed to the runtime's GetContainerEvents stream; "
                     "its events confirm the kernel's signals");
        backoff = opts_.retry_first;
      }
      {
        std::lock_guard lk(mu_);
        ++stats_.events;
      }
      on_event_(ev);
    });
    bool unimplemented = false;
    {
      std::lock_guard lk(mu_);
      cancel_ = nullptr;
      if (stopping_) return;
      stats_.last_error = st ? std::string("the stream ended") : st.error().message;
      unimplemented = !st && st.error().code == grpc::StatusCode::UNIMPLEMENTED;
      stats_.unimplemented = unimplemented;
    }
    on_stopped_();
    if (unimplemented) {
      spdlog::info("runtime events: the runtime does not serve GetContainerEvents; the kernel's "
                   "signals are confirmed by targeted looks");
    } else {
      spdlog::warn("runtime events: {}; confirming by targeted looks, subscribing again in {} ms",
                   st ? std::string("the stream ended") : st.error().message, backoff.count());
    }
    std::unique_lock lk(mu_);
    if (unimplemented) {
      cv_.wait(lk, [&] { return stopping_ || retry_; });
    } else {
      cv_.wait_for(lk, backoff, [&] { return stopping_ || retry_; });
      backoff = std::min(backoff * 2, opts_.retry_max);
    }
  }
}

}  // namespace kpleg::pleg

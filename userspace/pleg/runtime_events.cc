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

RuntimeEvents::RuntimeEvents(EventLoop& loop, Open open, OnEvent on_event,
                             std::function<void()> on_stopped, Options opts)
    : on_event_(std::move(on_event)),
      on_stopped_(std::move(on_stopped)),
      opts_(opts),
      event_loop_(&loop),
      open_(std::move(open)) {}

RuntimeEvents::~RuntimeEvents() { stop(); }

void RuntimeEvents::start() {
  if (event_loop_) {
    backoff_ = opts_.retry_first;
    event_loop_->post([this] { subscribe_on_loop(); });
    return;
  }
  thread_ = named_thread("kpleg-cri-event", [this] { loop(); });
}

void RuntimeEvents::stop() {
  if (event_loop_) {
    event_loop_->call([this] {
      loop_stopping_ = true;
      event_loop_->cancel(retry_timer_);
      if (opts_.set_reader) opts_.set_reader(nullptr);
      stream_.reset();
    });
    return;
  }
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (cancel_ != nullptr) cancel_->cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RuntimeEvents::retry_now() {
  if (event_loop_) {
    event_loop_->post([this] {
      if (loop_stopping_ || !waiting_) return;
      event_loop_->cancel(retry_timer_);
      retry_timer_ = 0;
      subscribe_on_loop();
    });
    return;
  }
  {
    std::lock_guard lk(mu_);
    retry_ = true;
  }
  cv_.notify_all();
}

RuntimeEventsStats RuntimeEvents::stats() const {
  std::lock_guard lk(mu_);
  RuntimeEventsStats st = stats_;
  if (event_loop_) st.events = events_.load(std::memory_order_relaxed);
  return st;
}

void RuntimeEvents::subscribe_on_loop() {
  if (loop_stopping_) return;
  waiting_ = false;
  received_ = 0;
  {
    std::lock_guard lk(mu_);  // once per subscription, for stats()
    ++stats_.subscriptions;
  }
  if (opts_.set_reader) {
    opts_.set_reader([this](bool now) {
      if (!stream_) return;
      if (now) {
        stream_->read_queued();
      } else {
        stream_->resume();
      }
    });
  }
  stream_ = open_(
      [this](cri::v1::ContainerEventResponse& ev) {
        if (received_++ == 0) {
          spdlog::info("runtime events: subscribed to the runtime's GetContainerEvents stream; "
                       "its events confirm the kernel's signals");
          backoff_ = opts_.retry_first;
        }
        events_.fetch_add(1, std::memory_order_relaxed);
        on_event_(ev);
        hold_unless_wanted();
      },
      [this](Status st) {
        // From inside the stream's own reader: it is let go at the next subscription.
        ended_on_loop(st);
      });
}

void RuntimeEvents::hold_unless_wanted() {
  if (opts_.hold_off.count() <= 0 || !stream_ || (opts_.wanted && opts_.wanted())) return;
  stream_->hold(std::chrono::steady_clock::now() + opts_.hold_off);
}

void RuntimeEvents::ended_on_loop(const Status& st) {
  if (loop_stopping_) return;
  const bool unimplemented = note_end(st);
  on_stopped_();
  waiting_ = true;
  if (unimplemented) return;  // until retry_now()
  retry_timer_ = event_loop_->at(
      std::chrono::steady_clock::now() + backoff_,
      [this] {
        retry_timer_ = 0;
        subscribe_on_loop();
      },
      "runtime events: subscribe again");
  backoff_ = std::min(backoff_ * 2, opts_.retry_max);
}

bool RuntimeEvents::note_end(const Status& st) {
  bool unimplemented;
  {
    std::lock_guard lk(mu_);
    stats_.last_error = st ? std::string("the stream ended") : st.error().message;
    unimplemented = !st && st.error().code == grpc::StatusCode::UNIMPLEMENTED;
    stats_.unimplemented = unimplemented;
  }
  if (unimplemented) {
    spdlog::info("runtime events: the runtime does not serve GetContainerEvents; the kernel's "
                 "signals are confirmed by targeted looks");
  } else {
    spdlog::warn("runtime events: {}; confirming by targeted looks, subscribing again in {} ms",
                 st ? std::string("the stream ended") : st.error().message, backoff_.count());
  }
  return unimplemented;
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

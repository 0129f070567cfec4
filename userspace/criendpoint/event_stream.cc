#include "criendpoint/event_stream.h"

#include <spdlog/spdlog.h>

#include "criforward/forwarder.h"

#include <deque>
#include <optional>

#include "criendpoint/container_event_feed.h"

namespace kpleg::criendpoint {

// The state of one stream, shared by its reactor and the feed: it outlives the reactor, so a
// delivery racing the stream's end finds it closed instead of a dangling reactor. The lock is
// recursive because gRPC may run a reaction inline within StartWrite or Finish on the same
// thread.
class EventStreams::Mailbox final : public EventReceiver {
 public:
  Mailbox(grpc::ServerGenericBidiReactor* reactor, size_t max_queued, const std::string& who)
      : reactor_(reactor), max_queued_(max_queued), who_(who) {}

  void deliver(std::shared_ptr<const std::string> message) override {
    std::lock_guard lk(mu_);
    if (finishing_ || reactor_ == nullptr) return;
    if (queue_.size() >= max_queued_) {
      spdlog::warn("{}: a GetContainerEvents subscriber is {} events behind; ending its stream",
                   who_, queue_.size());
      cut_off_ = true;
      finish_locked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 who_ + ": subscriber too slow: " + std::to_string(max_queued_) +
                                     " container events queued"));
      return;
    }
    queue_.push_back(std::move(message));
    if (!writing_) write_front_locked();
  }

  void write_done(bool ok) {
    std::lock_guard lk(mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) {
      finish_locked(grpc::Status::CANCELLED);
      return;
    }
    if (pending_finish_) {
      auto st = *pending_finish_;
      pending_finish_.reset();
      finish_locked(st);
      return;
    }
    if (!queue_.empty() && !finishing_) write_front_locked();
  }

  // Cancelled by the caller, or the server stops (OK).
  void end(const grpc::Status& status) {
    std::lock_guard lk(mu_);
    finish_locked(status);
  }

  void reactor_done() {
    std::lock_guard lk(mu_);
    reactor_ = nullptr;
  }
  bool cut_off() const {
    std::lock_guard lk(mu_);
    return cut_off_;
  }

 private:
  void write_front_locked() {
    const std::string& m = *queue_.front();
    grpc::Slice slice(m.data(), m.size());
    buffer_ = grpc::ByteBuffer(&slice, 1);
    writing_ = true;
    reactor_->StartWrite(&buffer_);
  }
  void finish_locked(const grpc::Status& status) {
    if (finished_ || reactor_ == nullptr) return;
    finishing_ = true;
    if (writing_) {  // after the write in progress
      if (!pending_finish_) pending_finish_ = status;
      return;
    }
    finished_ = true;
    reactor_->Finish(status);
  }

  mutable std::recursive_mutex mu_;
  grpc::ServerGenericBidiReactor* reactor_;
  size_t max_queued_;
  std::string who_;
  std::deque<std::shared_ptr<const std::string>> queue_;
  grpc::ByteBuffer buffer_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  bool cut_off_ = false;
  std::optional<grpc::Status> pending_finish_;
};

// One stream. Headers go out at once, so clients that wait for them before the first event do
// not hang on a quiet node.
class EventStream final : public grpc::ServerGenericBidiReactor {
 public:
  EventStream(EventStreams* streams, std::shared_ptr<EventStreams::Mailbox>* out)
      : streams_(streams) {
    mailbox_ = std::make_shared<EventStreams::Mailbox>(this, streams->max_queued_, streams->who_);
    *out = mailbox_;
  }
  void begin() {
    feed_id_ = streams_->feed_.add(mailbox_);
    StartSendInitialMetadata();
    StartRead(&request_);
  }
  void OnReadDone(bool) override {}  // the request carries nothing; the stream ends by cancel
  void OnWriteDone(bool ok) override { mailbox_->write_done(ok); }
  void OnCancel() override { mailbox_->end(grpc::Status::CANCELLED); }
  void OnDone() override {
    streams_->feed_.remove(feed_id_);
    mailbox_->reactor_done();
    streams_->closed(mailbox_, mailbox_->cut_off());
    delete this;
  }

 private:
  EventStreams* streams_;
  std::shared_ptr<EventStreams::Mailbox> mailbox_;
  uint64_t feed_id_ = 0;
  grpc::ByteBuffer request_;
};

EventStreams::EventStreams(ContainerEventFeed& feed, std::string who, size_t max_queued_events,
                           size_t max_streams)
    : feed_(feed),
      who_(std::move(who)),
      max_queued_(max_queued_events),
      max_streams_(max_streams) {}

EventStreams::~EventStreams() { end_all(); }

grpc::ServerGenericBidiReactor* EventStreams::open() {
  EventStream* stream;
  {
    std::lock_guard lk(mu_);
    if (ended_)
      return criforward::refuse_call(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, who_ + " is stopping"));
    if (streams_.size() >= max_streams_) {
      ++stats_.refused;
      return criforward::refuse_call(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          who_ + ": " + std::to_string(max_streams_) + " GetContainerEvents streams open already"));
    }
    std::shared_ptr<Mailbox> m;
    stream = new EventStream(this, &m);
    streams_.insert(m);
    ++stats_.total;
  }
  stream->begin();
  return stream;
}

void EventStreams::end_all() {
  std::set<std::shared_ptr<Mailbox>> streams;
  {
    std::lock_guard lk(mu_);
    ended_ = true;
    streams = streams_;
  }
  for (const auto& m : streams) m->end(grpc::Status::OK);
}

void EventStreams::closed(const std::shared_ptr<Mailbox>& m, bool cut_off) {
  std::lock_guard lk(mu_);
  streams_.erase(m);
  if (cut_off) ++stats_.cut_off;
}

EventStreamsStats EventStreams::stats() const {
  std::lock_guard lk(mu_);
  auto s = stats_;
  s.open = streams_.size();
  return s;
}

}  // namespace kpleg::criendpoint

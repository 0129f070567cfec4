// EventStreams: the GetContainerEvents streams served from a ContainerEventFeed, for kplegd's
// CRI endpoint and kpleg-cri-relay alike: each stream gets every event the feed builds from its
// start on, until its caller cancels or the server stops (OK). A stream whose caller falls
// max_queued_events behind is ended (RESOURCE_EXHAUSTED) rather than buffered without bound;
// at most max_streams are open at once (a kubelet holds one).
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace kpleg::criendpoint {

class ContainerEventFeed;

struct EventStreamsStats {
  uint64_t open = 0;
  uint64_t total = 0;
  uint64_t cut_off = 0;
  uint64_t refused = 0;  // over max_streams
};

class EventStreams {
 public:
  // `who` names the server in statuses ("kplegd", "kpleg-cri-relay"). `feed` must outlive it.
  EventStreams(ContainerEventFeed& feed, std::string who, size_t max_queued_events,
               size_t max_streams);
  ~EventStreams();
  EventStreams(const EventStreams&) = delete;
  EventStreams& operator=(const EventStreams&) = delete;

  // The reactor of a new stream (it deletes itself), or of a refusal.
  grpc::ServerGenericBidiReactor* open();
  // Ends every stream with OK and refuses new ones (UNAVAILABLE); idempotent.
  void end_all();
  EventStreamsStats stats() const;

  class Mailbox;

 private:
  friend class EventStream;
  void closed(const std::shared_ptr<Mailbox>& m, bool cut_off);

  ContainerEventFeed& feed_;
  std::string who_;
  size_t max_queued_;
  size_t max_streams_;
  mutable std::mutex mu_;
  bool ended_ = false;
  std::set<std::shared_ptr<Mailbox>> streams_;
  EventStreamsStats stats_;
};

}  // namespace kpleg::criendpoint

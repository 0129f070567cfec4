// CriEndpoint: kplegd's CRI socket for the kubelet (--cri-listen). It serves the CRI
// RuntimeService and ImageService by forwarding every call to the real runtime unchanged —
// generically, by method name and raw bytes, so methods kpleg does not know (newer CRI versions'
// calls, streaming ones) pass through too, and Exec/Attach/PortForward return the runtime's
// URL untouched. The caller's deadline, cancellation and custom metadata go upstream with the
// request; the runtime's response messages and status (code, message, details) come back as
// sent.
//
// GetContainerEvents is answered by kplegd itself from its confirmed lifecycle events
// (container_event_feed.h), for runtimes that stream none (containerd 1.6) and instead of
// theirs: a stream that never ends by itself, for any number of subscribers. With
// serve_container_events off it is forwarded like any call.
//
// Every forwarded call is registered in the InflightCalls while it runs, with the pod it is
// about (call_watch.h): the stuck-call watchdog's view of the kubelet's calls. The same pieces
// (criforward, the feed, event_stream.h, call_watch.h) make kpleg-cri-relay (userspace/relay),
// which keeps the kubelet's CRI path out of kplegd.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/result.h"
#include "cri/inflight_calls.h"

namespace kpleg::criendpoint {

class ContainerEventFeed;

struct CriEndpointOptions {
  // Where to listen: unix:///path, unix:/path or /path. A stale socket file is replaced; a live
  // one is an error.
  std::string listen_endpoint;
  // The runtime's CRI endpoint, same spellings.
  std::string upstream_endpoint;
  // Answer GetContainerEvents from kpleg's events (true) or forward it to the runtime.
  bool serve_container_events = true;
  // Largest message either way; the kubelet allows 16 MiB.
  int max_message_bytes = 16 * 1024 * 1024;
  // A GetContainerEvents subscriber that falls this many events behind is ended
  // (RESOURCE_EXHAUSTED) rather than buffered without bound.
  size_t max_queued_events = 10000;
  size_t max_event_streams = 64;
  // Forwarded calls in flight at once; more are refused (RESOURCE_EXHAUSTED).
  size_t max_calls = 4096;
  std::shared_ptr<cri::InflightCalls> inflight;  // required
};

struct CriEndpointStats {
  // Finished forwarded calls by (method, gRPC status code).
  std::map<std::pair<std::string, int>, uint64_t> calls;
  uint64_t event_streams = 0;        // GetContainerEvents streams open now
  uint64_t event_streams_total = 0;  // since start
  uint64_t event_streams_cut_off = 0;
};

class CriEndpoint {
 public:
  // `feed` (may be null when serve_container_events is off) must outlive the endpoint.
  static Result<std::unique_ptr<CriEndpoint>> start(CriEndpointOptions options,
                                                    ContainerEventFeed* feed);
  ~CriEndpoint();
  CriEndpoint(const CriEndpoint&) = delete;
  CriEndpoint& operator=(const CriEndpoint&) = delete;

  // "unix:///path"
  const std::string& endpoint() const;
  CriEndpointStats stats() const;
  // Ends event streams (OK), stops serving, removes the socket; idempotent.
  void stop();

  class Impl;

 private:
  explicit CriEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kpleg::criendpoint

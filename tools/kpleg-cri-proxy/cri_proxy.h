// CriProxy: a CRI runtime.v1 RuntimeService on a unix socket that forwards every call to a real
// runtime and can make one pod's calls slow or hang. It is how kpleg's tests and benchmarks
// reproduce the failure that makes the kubelet's PLEG unhealthy — one pod whose status calls
// are stuck behind a wedged shim or a hung CNI plugin — against a real containerd, without
// touching the runtime itself.
//
// Forwarding is transparent: the request goes upstream as received (unknown fields included),
// with the caller's deadline and cancellation propagated, and the upstream's response and
// status come back unchanged, including errors such as NOT_FOUND or UNIMPLEMENTED.
//
// A stall applies to the calls that concern the stalled pod, by pod uid:
//   - PodSandboxStatus, StopPodSandbox, RemovePodSandbox of one of its sandbox ids;
//   - ContainerStatus, StopContainer, RemoveContainer of one of its container (or sandbox) ids;
//   - ListContainers and ListPodSandbox whose filter selects only that pod: by one of its ids,
//     by its sandbox id, or by the io.kubernetes.pod.uid label.
// Unfiltered lists, Version, Status and the calls that create or start workloads are never
// stalled: they concern the whole node, or are the workload itself. Unfiltered lists can be made
// slow on their own instead (set_full_list_delay), as a large or loaded node's are. On the GetContainerEvents
// stream, the stalled pod's events are held back, as a runtime stuck on that pod would not
// send them, and go out, in order, with the stream's first event after the stall was cleared.
//
// Ids are mapped to pod uids through the upstream (sandbox metadata uid; container label
// io.kubernetes.pod.uid, else its sandbox's uid) and cached; lists and statuses that pass
// through while a stall is set fill the cache too. Mapping lookups happen only while a stall is
// set, so a proxy without a stall adds one hop and nothing else.
//
// A stalled call either waits a fixed delay and is then forwarded, is forwarded at once and its
// answer held for a fixed delay (a runtime whose answers are late: the state it reports is
// already old when the caller reads it), or hangs until the caller's deadline passes or it
// cancels (answered DEADLINE_EXCEEDED / CANCELLED, as a hung runtime
// would be seen by the caller). Either way the call ends as soon as the caller gives up, and
// clearing the stall releases held calls at once (they are forwarded: the call was slow, not
// failed). A held call holds no thread (criforward's gates, one timer thread for the delays, id
// lookups made asynchronously), so held calls never delay other pods.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace kpleg::cri {

enum class StallMode {
  kDelay,       // wait `delay`, then forward
  kLateAnswer,  // forward at once, then hold the answer for `delay`
  kHang,        // never answer until the caller's deadline or cancellation (or the stall is cleared)
};

struct PodStall {
  std::string pod_uid;
  StallMode mode = StallMode::kHang;
  std::chrono::milliseconds delay{0};  // kDelay and kLateAnswer only
};

struct CriProxyOptions {
  // Where the proxy listens: unix:///path, unix:/path or /path. A stale socket file nobody
  // listens on is replaced; a live one is an error.
  std::string listen_endpoint;
  // The real runtime's CRI endpoint, same spellings.
  std::string upstream_endpoint;
  // At least 4. No longer a bound on held calls: they hold no thread (kept for the CLI's
  // --max-threads).
  int max_threads = 256;
  // Deadline of the proxy's own id -> pod lookups upstream (shortened to the caller's deadline).
  std::chrono::milliseconds lookup_timeout{2000};
  // Largest message in either direction; the kubelet allows 16 MiB for big nodes' lists.
  int max_message_bytes = 16 * 1024 * 1024;
};

struct CriProxyStats {
  uint64_t forwarded = 0;          // calls sent upstream (including stalled ones sent late)
  uint64_t stalled = 0;            // calls that matched the stalled pod
  uint64_t stalled_in_flight = 0;  // calls being held right now
  uint64_t gave_up = 0;            // held calls answered DEADLINE_EXCEEDED/CANCELLED, not sent
  uint64_t lookups = 0;            // id -> pod uid lookups made upstream
  uint64_t full_lists_delayed = 0;  // unfiltered lists held by set_full_list_delay
  uint64_t full_lists_in_flight = 0;  // ... being held right now
};

class CriProxy {
 public:
  // Binds the listening socket and starts serving; the upstream may come up later (calls fail
  // with the upstream's UNAVAILABLE meanwhile). Errors name the socket and the cause.
  static Result<std::unique_ptr<CriProxy>> start(CriProxyOptions options);
  // Releases held calls, stops the server and removes the socket.
  ~CriProxy();
  CriProxy(const CriProxy&) = delete;
  CriProxy& operator=(const CriProxy&) = delete;

  // The endpoint to give clients, "unix:///path".
  const std::string& endpoint() const;
  // One Version call upstream through the proxy's own connection, for a start-up check.
  Result<std::string> upstream_version(std::chrono::milliseconds timeout) const;

  // Stalls the pod's calls from now on (replacing any earlier stall). Calls already held under
  // an earlier stall keep waiting under the new one if it names the same pod, else are released.
  void set_stalled_pod(PodStall stall);
  // Ends the stall; held calls are forwarded at once.
  void clear_stall();
  std::optional<PodStall> stall() const;
  // Unfiltered ListContainers and ListPodSandbox (a full list; a state filter still counts as
  // one) wait `delay` before they go upstream, as on a node with thousands of containers or a
  // runtime under load; a caller whose deadline passes first gets DEADLINE_EXCEEDED. Zero: off.
  void set_full_list_delay(std::chrono::milliseconds delay);

  CriProxyStats stats() const;

  // Stops accepting calls and releases held ones; idempotent. The destructor calls it.
  void shutdown();

  class Impl;

 private:
  explicit CriProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kpleg::cri

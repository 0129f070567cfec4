// InflightCalls: every CRI call in flight, by whom, about what, and since when — the watchdog's
// view of the node. kplegd's own calls (GrpcCriClient) and the calls passing through its CRI
// endpoint (the kubelet's) both register here, so that a call that hangs in the runtime or a
// CNI plugin is named, with its pod, long before the kubelet's PLEG gives up after 3 minutes.
//
// A call registers what its request names: a pod's metadata (RunPodSandbox), or a sandbox or
// container id. Ids are turned into pods only when somebody asks (kplegctl stuck, /metrics,
// health), through a resolver the daemon provides, so that a call costs one lock and one map
// insert and erase, never a lookup; a call is resolved once, when first listed, and keeps the
// answer, so that a call that hangs costs one lookup however often health is read.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/pod_identity.h"

namespace kpleg::cri {

// Who made the call.
enum class CallOrigin : uint8_t {
  kDaemon,    // kplegd itself (confirmations, reconciles, event looks)
  kEndpoint,  // a client of kplegd's CRI endpoint (the kubelet, crictl), forwarded to the runtime
};
const char* to_string(CallOrigin origin);

// What a call is about, as far as its request says.
struct CallSubject {
  std::string id;              // a sandbox or container id the request names ("" none)
  PodIdentity pod;             // the pod, when the request carries its metadata (or its uid)
  std::string container_name;  // CreateContainer's container
};

struct InflightCall {
  uint64_t serial = 0;
  std::string method;  // "StopPodSandbox", or the full path of a method kpleg has no name for
  CallOrigin origin = CallOrigin::kDaemon;
  CallSubject subject;  // resolved: pod fields filled from the id where the resolver knew it
  std::chrono::milliseconds age{0};
};

// "StopPodSandbox for default/web-0 (uid 1234), container app (3f2a…), in flight for 2m13s"
std::string describe(const InflightCall& call);

struct MethodInflight {
  std::string method;
  CallOrigin origin = CallOrigin::kDaemon;
  uint64_t count = 0;
  std::chrono::milliseconds oldest{0};
};

class InflightCalls {
 public:
  using Clock = std::chrono::steady_clock;
  // Finds the pod of a subject that names only an id or a pod uid: the subject's pod, and the
  // name of the container its id names ("" for a sandbox), as far as the resolver knows them.
  using Resolver = std::function<std::optional<CallSubject>(const CallSubject& subject)>;

  // Holds a call's entry while it lives; movable, ends the call when destroyed.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& o) noexcept : owner_(o.owner_), serial_(o.serial_) { o.owner_ = nullptr; }
    Ticket& operator=(Ticket&& o) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { end(); }
    void end();

   private:
    friend class InflightCalls;
    Ticket(InflightCalls* owner, uint64_t serial) : owner_(owner), serial_(serial) {}
    InflightCalls* owner_ = nullptr;
    uint64_t serial_ = 0;
  };

  // `method` must outlive the call when it is a view of a constant; it is copied otherwise.
  Ticket begin(std::string_view method, CallOrigin origin, CallSubject subject);

  // Set once, before calls are listed; called without the registry's lock held.
  void set_resolver(Resolver resolver);

  // Calls at least `min_age` old, oldest first, their ids resolved to pods (each call asks the
  // resolver once; a miss again after kResolveRetry).
  std::vector<InflightCall> older_than(std::chrono::milliseconds min_age) const;
  // Count and oldest age per (method, origin) for every pair ever seen (count 0 when none is
  // in flight now), so that gauges fall back to 0 instead of vanishing.
  std::vector<MethodInflight> by_method() const;
  size_t size() const;
  // How long until the oldest call younger than `age` reaches it; none when no call is younger.
  std::optional<std::chrono::milliseconds> until_one_reaches(std::chrono::milliseconds age) const;

 private:
  static constexpr std::chrono::seconds kResolveRetry{10};

  struct Entry {
    std::string method;
    CallOrigin origin;
    CallSubject subject;  // resolved in place once the resolver knew its pod
    Clock::time_point started;
    Clock::time_point resolve_after{};  // the resolver did not know it: not asked again before
  };
  void finish(uint64_t serial);

  mutable std::mutex mu_;
  uint64_t next_serial_ = 1;
  mutable std::map<uint64_t, Entry> calls_;  // older_than() keeps what it resolved  // by serial: the oldest first
  std::map<std::pair<std::string, CallOrigin>, bool> seen_;
  Resolver resolver_;
};

}  // namespace kpleg::cri

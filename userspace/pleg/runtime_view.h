// The runtime view: how kpleg reads CRI messages, shared by every producer of lifecycle events
// (the generic relist and the kernel-driven tracker), so that all of them agree on who a pod is,
// what state a container is in, and which events a state change means.
//
// Everything here is pure: no CRI calls, no clocks, no locks. The rules are the kubelet's
// (pkg/kubelet/pleg/generic.go and kuberuntime GetPods); where kpleg departs from them the
// comment says so and why.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/pod_identity.h"
#include "cri/api.pb.h"
#include "pleg/containers.h"
#include "pleg/event.h"

namespace kpleg::pleg {

namespace v1 = ::runtime::v1;

// The kubelet's labels (pkg/kubelet/types/labels.go), on every sandbox and container it makes.
inline constexpr const char* kPodUidLabel = "io.kubernetes.pod.uid";
inline constexpr const char* kPodNameLabel = "io.kubernetes.pod.name";
inline constexpr const char* kPodNamespaceLabel = "io.kubernetes.pod.namespace";
inline constexpr const char* kContainerNameLabel = "io.kubernetes.container.name";

// --- state mapping ---------------------------------------------------------------------------

// The runtime's state, unchanged: what ContainerSnapshot reports.
ContainerState runtime_state(v1::ContainerState state);
// A sandbox as a container, like the kubelet's SandboxToContainerState: READY is running,
// NOTREADY is exited.
ContainerState runtime_state(v1::PodSandboxState state);

// The generic PLEG's view of a state (its plegContainerState): created counts as unknown
// because the kubelet does not act on "created", so created -> unknown is no change and
// non-existent -> created is only a ContainerChanged, which is never sent.
ContainerState pleg_state(ContainerState state);

// --- snapshots of one inspection -------------------------------------------------------------

// What ContainerStatus said. Timestamps stay in nanoseconds, as the CRI reports them.
ContainerSnapshot from_status(const v1::ContainerStatus& status);
// What PodSandboxStatus said. A sandbox has only a creation time; exit code and reason are
// empty because the CRI reports none for sandboxes.
ContainerSnapshot from_status(const v1::PodSandboxStatus& status);

// --- who a pod is (PodIdentity, common/pod_identity.h) -------------------------------------------

// A sandbox's pod: the kubelet's labels, else the sandbox's metadata (which the CRI requires).
PodIdentity pod_identity(const v1::PodSandbox& sandbox);
PodIdentity pod_identity(const v1::PodSandboxStatus& status);
// A container's pod: the kubelet's labels, else `sandbox`'s identity (the container's own
// sandbox, when the caller knows it; pass nullptr when not). The kubelet itself groups an
// unlabelled container under an empty pod uid; kpleg attributes it to its sandbox instead.
PodIdentity pod_identity(const v1::Container& container, const PodIdentity* sandbox);
PodIdentity pod_identity(const v1::ContainerStatus& status, const PodIdentity* sandbox);

// io.kubernetes.container.name, else the container's metadata name.
std::string container_name(const v1::Container& container);
std::string container_name(const v1::ContainerStatus& status);

// --- the runtime at one instant --------------------------------------------------------------

// The generic PLEG's state of the container or sandbox `id` in `pod`; kNonExistent when it is
// not there.
ContainerState pleg_state_of(const PodRecord& pod, const std::string& id);

// pod uid -> pod, like the kubelet's GetPods(all = true).
struct RuntimeSnapshot {
  std::map<std::string, PodRecord> pods;

  size_t container_count() const;  // sandboxes included
};

// Groups listed sandboxes and containers into pods. Sandboxes and containers without an id,
// and containers without metadata, are skipped as the kubelet skips them. Within a pod, its
// sandboxes come first, then its containers, each in the runtime's list order.
RuntimeSnapshot build_snapshot(const std::vector<v1::PodSandbox>& sandboxes,
                               const std::vector<v1::Container>& containers);

// The containers (and sandboxes) of `old_pod` and `new_pod`, each once, in the kubelet's order:
// old containers, old sandboxes, then whatever only the new pod has. Either pod may be null.
std::vector<const ContainerRecord*> containers_of(const PodRecord* old_pod,
                                                  const PodRecord* new_pod);

// --- events ----------------------------------------------------------------------------------

// The kubelet's generateEvents: the events that a container's change of state from old_state to
// new_state means. States are compared as pleg_state(): the same state gives nothing; running
// gives ContainerStarted; exited gives ContainerDied; unknown gives ContainerChanged (which
// callers must not send); non-existent gives ContainerRemoved after exited, else ContainerDied
// then ContainerRemoved.
//
// The events carry the pod's and the container's identity; type-specific data (exit code,
// status snapshot, source, timestamps) is the caller's to fill in.
std::vector<PodLifecycleEvent> generate_events(const PodRecord& pod,
                                               const ContainerRecord& container,
                                               ContainerState old_state, ContainerState new_state);

// Whether an event of this type leaves kpleg (the kubelet drops ContainerChanged).
bool is_sent(EventType type);

}  // namespace kpleg::pleg

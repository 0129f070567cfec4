// Cgroup path -> identity of what runs in it (pod uid, container id, runtime, QoS class).
//
// Runs on every cgroup_mkdir event, so it is a pure, hand-written matcher over a string_view:
// no regex, no allocation until a path is accepted. It is deliberately strict: a path is either
// one of the known kubelet/runtime layouts, matched component for component, or rejected. A
// rejected path costs kpleg nothing (the reconcile relist still sees the container); a wrongly
// accepted one would attribute a process to the wrong container.
//
// Accepted layouts (paths are relative to the cgroup2 root and start with '/'):
//   cgroupfs driver   <prefix>/kubepods[/<qos>]/pod<uid>/<id>          (also crio-<id>,
//                                                                       crio-conmon-<id>)
//   systemd driver    <prefix>/<S>.slice[/<S>-<qos>.slice]/<S>[-<qos>]-pod<uid_>.slice/<scope>
//                     where <S> is "kubepods" or "<root>-kubepods" (kubelet --cgroup-root) and
//                     <scope> is cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope
//                     or crio-conmon-<id>.scope (ignored)
//   containerd, SystemdCgroup=false under a systemd parent
//                     <prefix>/<S>[-<qos>]-pod<uid_>.slice:cri-containerd:<id>
//   containerd without a cgroup parent
//                     <prefix>/k8s.io/<id>
// The root, QoS and pod levels of those trees are accepted too (they matter for mkdir events).
//
// <prefix> is any run of components that contains no root marker (kubepods, *kubepods.slice,
// k8s.io, *:cri-containerd:*): nodes nested in containers (kind) or under a custom cgroup root
// put the tree below other directories. The FIRST root marker decides; everything after it must
// match exactly, so a kubepods tree nested inside a pod's container is rejected rather than
// attributed to the inner pod.
//
// <id> is a 64-char lowercase hex container id. <uid> is either an RFC 4122 UUID (36 chars,
// lowercase hex and dashes; the API server's format) or 32 lowercase hex chars: the kubelet
// names a static pod without metadata.uid after an md5 of its manifest (kube-apiserver, etcd
// on kubeadm control planes). In systemd slice names the kubelet writes '_' for '-'; pod_uid
// is always returned with dashes, as the CRI reports it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kpleg::cgroup {

// Paths longer than this are rejected (PATH_MAX; the kernel's cgroup path buffers are smaller).
inline constexpr std::size_t kMaxCgroupPathLength = 4096;
inline constexpr std::size_t kContainerIdLength = 64;

// Which runtime created the cgroup, as far as the path tells.
enum class Runtime : std::uint8_t {
  kUnknown = 0,     // cgroupfs bare-id layout: containerd and cri-dockerd look the same
  kContainerd = 1,  // cri-containerd-<id>.scope, *:cri-containerd:<id>, /k8s.io/<id>
  kCrio = 2,        // crio-<id>[.scope]
  kDocker = 3,      // docker-<id>.scope (cri-dockerd with the systemd driver)
};

enum class QosClass : std::uint8_t {
  kUnknown = 0,  // the path has no QoS level (kubepods root, /k8s.io/<id>)
  kGuaranteed = 1,
  kBurstable = 2,
  kBestEffort = 3,
};

enum class Kind : std::uint8_t {
  // The root under which pod or container cgroups are created: kubepods, <S>.slice, k8s.io.
  kRoot = 0,
  // kubepods/burstable, kubepods/besteffort and their systemd slices. Guaranteed pods sit
  // directly under the root, which has no QoS directory of its own.
  kQos = 1,
  // A pod's cgroup: pod_uid set, container_id empty.
  kPod = 2,
  // A container's cgroup. The path alone cannot tell a pod's sandbox (pause) container from an
  // application container: they are siblings with the same layout. Only the CRI can say which
  // one it is, so consumers must not assume either.
  kContainerOrSandbox = 3,
  // Recognised but not a container: CRI-O's conmon monitor (crio-conmon-<id>). container_id
  // names the container it monitors; nothing running in it is that container's process.
  kIgnored = 4,
  // A cgroup below a container's own (docker-in-docker, systemd in a container, any privileged
  // pod that makes child cgroups). pod_uid and container_id are that container's: what runs
  // there belongs to it, but its execs and exits are not the container's lifecycle. Never
  // returned by parse_cgroup_path(); the index derives it from the parent.
  kNested = 5,
};

struct CgroupIdentity {
  std::string pod_uid;       // empty for kRoot, kQos and for /k8s.io/<id> containers
  std::string container_id;  // set for kContainerOrSandbox and kIgnored only
  Runtime runtime = Runtime::kUnknown;
  QosClass qos = QosClass::kUnknown;
  Kind kind = Kind::kRoot;

  bool operator==(const CgroupIdentity&) const = default;
};

// Parses a cgroup2-relative path ("/kubepods/burstable/pod.../<id>"). Returns nullopt for
// every path that is not exactly one of the layouts above.
std::optional<CgroupIdentity> parse_cgroup_path(std::string_view path);

// True when `path` is well formed and some descendant of it could still parse: it contains no
// root marker yet, or it parses as a root, QoS or pod cgroup. A tree walk uses it to skip
// container subtrees and trees that were already rejected.
bool may_contain_pod_cgroups(std::string_view path);

// For logs and tests.
std::string_view to_string(Runtime runtime);
std::string_view to_string(QosClass qos);
std::string_view to_string(Kind kind);

}  // namespace kpleg::cgroup

// kpleg-load creates pods the way the kubelet does, so that what kpleg sees in the kernel and
// through the CRI (cgroup paths, labels, annotations, metadata) is what it sees on a real node.
// This file builds those CRI configs; it makes no calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "cri/cri_client.h"

namespace kpleg::load {

namespace v1 = ::runtime::v1;

// The label kpleg-load puts on every pod it creates (as a pod label in the pod spec would be);
// `clean` removes exactly the pods carrying it.
inline constexpr std::string_view kLoadLabel = "kpleg.io/load";
// Where the pod's log directory is, so removal can delete it (the CRI does not report it).
inline constexpr std::string_view kLogDirectoryAnnotation = "kpleg.io/log-directory";
inline constexpr std::string_view kDefaultImage = "localhost/kpleg/busybox:1";

// The kubelet's labels (pkg/kubelet/types/labels.go).
inline constexpr std::string_view kPodNameLabel = "io.kubernetes.pod.name";
inline constexpr std::string_view kPodNamespaceLabel = "io.kubernetes.pod.namespace";
inline constexpr std::string_view kPodUidLabel = "io.kubernetes.pod.uid";
inline constexpr std::string_view kContainerNameLabel = "io.kubernetes.container.name";

enum class QosClass { kGuaranteed, kBurstable, kBestEffort };

// "guaranteed", "burstable", "besteffort" (case-insensitive).
Result<QosClass> parse_qos_class(std::string_view name);
std::string_view qos_class_name(QosClass qos);

// The kubelet's cgroupfs-driver pod cgroup: /kubepods/<qos>/pod<uid>, /kubepods/pod<uid> for
// guaranteed pods.
std::string pod_cgroup_parent(QosClass qos, std::string_view pod_uid);

// A random RFC 4122 version 4 UUID, as the API server gives pods.
std::string new_pod_uid();

// Splits a command line the way a POSIX shell splits words: whitespace separates, '...' is
// literal, "..." allows \" \\ \$ \` escapes, and a backslash outside quotes escapes the next
// character. No expansion of any kind. Unbalanced quotes are an error.
Result<std::vector<std::string>> split_command(std::string_view line);

struct PodSpec {
  std::string name;
  std::string namespace_;
  std::string uid;
  uint32_t attempt = 0;
  QosClass qos = QosClass::kBestEffort;
  bool host_network = true;
  std::string log_directory;  // absolute; the caller creates it
};

struct ContainerSpec {
  std::string name;
  std::string image{kDefaultImage};
  std::vector<std::string> command;
  int64_t memory_limit_bytes = 0;  // 0: no limit
  uint32_t attempt = 0;
};

v1::PodSandboxConfig sandbox_config(const PodSpec& pod);
v1::ContainerConfig container_config(const PodSpec& pod, const ContainerSpec& container);

// The log directory the kubelet would use, under root instead of /var/log/pods:
// <root>/<namespace>_<name>_<uid>.
std::string pod_log_directory(std::string_view root, const PodSpec& pod);

}  // namespace kpleg::load

#include "cgroup/cgroup_path.h"

#include <array>

namespace kpleg::cgroup {
namespace {

constexpr std::string_view kCgroupfsRoot = "kubepods";
constexpr std::string_view kSystemdRootStem = "kubepods";
constexpr std::string_view kContainerdNamespace = "k8s.io";
constexpr std::string_view kColonContainerd = ":cri-containerd:";
constexpr std::string_view kSliceSuffix = ".slice";
constexpr std::string_view kScopeSuffix = ".scope";
constexpr std::string_view kPodPrefix = "pod";
constexpr std::string_view kCrioPrefix = "crio-";
constexpr std::string_view kConmonPrefix = "crio-conmon-";

// Below a root marker the deepest layout is <qos>/<pod>/<container>.
constexpr std::size_t kMaxComponentsBelowRoot = 3;

// RFC 4122 text form: 8-4-4-4-12.
constexpr std::array<std::size_t, 4> kUuidSeparatorPositions = {8, 13, 18, 23};
constexpr std::size_t kUuidLength = 36;
// The kubelet's hash-derived uid for static pods: hex of an md5 digest.
constexpr std::size_t kStaticPodUidLength = 32;

enum class Outcome { kAccepted, kRejected, kNoRoot };

enum class RootMarker { kNone, kCgroupfs, kSystemd, kContainerdNamespace, kColonContainerd };

bool consume_prefix(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

bool consume_suffix(std::string_view& s, std::string_view suffix) {
  if (!s.ends_with(suffix)) return false;
  s.remove_suffix(suffix.size());
  return true;
}

bool is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool all_lower_hex(std::string_view s) {
  for (char c : s) {
    if (!is_lower_hex(c)) return false;
  }
  return true;
}

bool is_container_id(std::string_view s) {
  return s.size() == kContainerIdLength && all_lower_hex(s);
}

// `separator` is '-' in cgroupfs names and '_' in systemd unit names (where '-' means nesting).
// Validates before allocating so rejected paths stay allocation-free.
std::optional<std::string> parse_pod_uid(std::string_view s, char separator) {
  if (s.size() == kStaticPodUidLength) {
    if (!all_lower_hex(s)) return std::nullopt;
    return std::string(s);
  }
  if (s.size() != kUuidLength) return std::nullopt;
  std::size_t next_separator = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (next_separator < kUuidSeparatorPositions.size() &&
        i == kUuidSeparatorPositions[next_separator]) {
      if (s[i] != separator) return std::nullopt;
      ++next_separator;
    } else if (!is_lower_hex(s[i])) {
      return std::nullopt;
    }
  }
  std::string uid(s);
  for (std::size_t pos : kUuidSeparatorPositions) uid[pos] = '-';
  return uid;
}

std::string_view qos_dir_name(QosClass qos) {
  switch (qos) {
    case QosClass::kBurstable:
      return "burstable";
    case QosClass::kBestEffort:
      return "besteffort";
    default:
      return {};
  }
}

// Only burstable and besteffort have their own level; "guaranteed" is never a directory.
std::optional<QosClass> qos_from_dir_name(std::string_view name) {
  if (name == qos_dir_name(QosClass::kBurstable)) return QosClass::kBurstable;
  if (name == qos_dir_name(QosClass::kBestEffort)) return QosClass::kBestEffort;
  return std::nullopt;
}

// Systemd stems nest by prefix: "kubepods" -> "kubepods-burstable"; with --cgroup-root=/kubelet
// "kubelet-kubepods" -> "kubelet-kubepods-burstable". True when `stem` names a kubepods root.
bool is_kubepods_stem(std::string_view stem) {
  if (!consume_suffix(stem, kSystemdRootStem)) return false;
  return stem.empty() || (stem.size() > 1 && stem.back() == '-');
}

RootMarker root_marker(std::string_view component) {
  if (component == kCgroupfsRoot) return RootMarker::kCgroupfs;
  if (component == kContainerdNamespace) return RootMarker::kContainerdNamespace;
  if (component.find(kColonContainerd) != std::string_view::npos) {
    return RootMarker::kColonContainerd;
  }
  std::string_view stem = component;
  if (consume_suffix(stem, kSliceSuffix) && is_kubepods_stem(stem)) return RootMarker::kSystemd;
  return RootMarker::kNone;
}

// <id>, crio-<id>, crio-conmon-<id>: container directories under a cgroupfs pod.
bool parse_cgroupfs_container(std::string_view name, CgroupIdentity* out) {
  Runtime runtime = Runtime::kUnknown;
  Kind kind = Kind::kContainerOrSandbox;
  if (consume_prefix(name, kConmonPrefix)) {
    runtime = Runtime::kCrio;
    kind = Kind::kIgnored;
  } else if (consume_prefix(name, kCrioPrefix)) {
    runtime = Runtime::kCrio;
  }
  if (!is_container_id(name)) return false;
  out->container_id.assign(name);
  out->runtime = runtime;
  out->kind = kind;
  return true;
}

// cri-containerd-<id>.scope, crio-<id>.scope, crio-conmon-<id>.scope, docker-<id>.scope.
bool parse_systemd_scope(std::string_view name, CgroupIdentity* out) {
  if (!consume_suffix(name, kScopeSuffix)) return false;
  Runtime runtime = Runtime::kUnknown;
  Kind kind = Kind::kContainerOrSandbox;
  if (consume_prefix(name, "cri-containerd-")) {
    runtime = Runtime::kContainerd;
  } else if (consume_prefix(name, kConmonPrefix)) {
    runtime = Runtime::kCrio;
    kind = Kind::kIgnored;
  } else if (consume_prefix(name, kCrioPrefix)) {
    runtime = Runtime::kCrio;
  } else if (consume_prefix(name, "docker-")) {
    runtime = Runtime::kDocker;
  } else {
    return false;
  }
  if (!is_container_id(name)) return false;
  out->container_id.assign(name);
  out->runtime = runtime;
  out->kind = kind;
  return true;
}

// /kubepods[/<qos>]/pod<uid>[/<container>]
Outcome parse_cgroupfs(const std::string_view* rest, std::size_t n, CgroupIdentity* out) {
  if (n == 0) {
    out->kind = Kind::kRoot;
    return Outcome::kAccepted;
  }
  std::size_t i = 0;
  QosClass qos = QosClass::kGuaranteed;
  if (auto level = qos_from_dir_name(rest[0])) {
    qos = *level;
    if (n == 1) {
      out->qos = qos;
      out->kind = Kind::kQos;
      return Outcome::kAccepted;
    }
    i = 1;
  }
  std::string_view pod = rest[i];
  if (!consume_prefix(pod, kPodPrefix)) return Outcome::kRejected;
  auto uid = parse_pod_uid(pod, '-');
  if (!uid) return Outcome::kRejected;
  const std::size_t below_pod = n - i - 1;
  if (below_pod > 1) return Outcome::kRejected;
  if (below_pod == 1 && !parse_cgroupfs_container(rest[i + 1], out)) return Outcome::kRejected;
  if (below_pod == 0) out->kind = Kind::kPod;
  out->pod_uid = std::move(*uid);
  out->qos = qos;
  return Outcome::kAccepted;
}

// <stem>[-<qos>]-pod<uid_>.slice
std::optional<std::string> match_pod_slice(std::string_view name, std::string_view stem,
                                           QosClass qos) {
  if (!consume_prefix(name, stem)) return std::nullopt;
  if (qos != QosClass::kGuaranteed) {
    if (!consume_prefix(name, "-") || !consume_prefix(name, qos_dir_name(qos))) {
      return std::nullopt;
    }
  }
  if (!consume_prefix(name, "-") || !consume_prefix(name, kPodPrefix) ||
      !consume_suffix(name, kSliceSuffix)) {
    return std::nullopt;
  }
  return parse_pod_uid(name, '_');
}

// <stem>-<qos>.slice
std::optional<QosClass> match_qos_slice(std::string_view name, std::string_view stem) {
  if (!consume_prefix(name, stem) || !consume_prefix(name, "-") ||
      !consume_suffix(name, kSliceSuffix)) {
    return std::nullopt;
  }
  return qos_from_dir_name(name);
}

// /<stem>.slice[/<stem>-<qos>.slice]/<stem>[-<qos>]-pod<uid_>.slice[/<scope>]
Outcome parse_systemd(std::string_view root, const std::string_view* rest, std::size_t n,
                      CgroupIdentity* out) {
  std::string_view stem = root;
  consume_suffix(stem, kSliceSuffix);
  if (n == 0) {
    out->kind = Kind::kRoot;
    return Outcome::kAccepted;
  }
  std::size_t i = 0;
  QosClass qos = QosClass::kGuaranteed;
  if (auto level = match_qos_slice(rest[0], stem)) {
    qos = *level;
    if (n == 1) {
      out->qos = qos;
      out->kind = Kind::kQos;
      return Outcome::kAccepted;
    }
    i = 1;
  }
  auto uid = match_pod_slice(rest[i], stem, qos);
  if (!uid) return Outcome::kRejected;
  const std::size_t below_pod = n - i - 1;
  if (below_pod > 1) return Outcome::kRejected;
  if (below_pod == 1 && !parse_systemd_scope(rest[i + 1], out)) return Outcome::kRejected;
  if (below_pod == 0) out->kind = Kind::kPod;
  out->pod_uid = std::move(*uid);
  out->qos = qos;
  return Outcome::kAccepted;
}

// <stem>[-<qos>]-pod<uid_>.slice:cri-containerd:<id>, always the last component: containerd
// with SystemdCgroup=false hands runc the systemd-style cgroupsPath, which runc's cgroupfs
// driver takes literally as one directory name.
Outcome parse_colon_containerd(std::string_view name, std::size_t n, CgroupIdentity* out) {
  if (n != 0) return Outcome::kRejected;
  const std::size_t colon = name.find(kColonContainerd);
  std::string_view slice = name.substr(0, colon);
  std::string_view id = name.substr(colon + kColonContainerd.size());
  if (!is_container_id(id) || !consume_suffix(slice, kSliceSuffix)) return Outcome::kRejected;
  // The uid never contains '-' in a systemd name, so the last '-' starts "pod<uid_>".
  const std::size_t dash = slice.rfind('-');
  if (dash == std::string_view::npos) return Outcome::kRejected;
  std::string_view pod = slice.substr(dash + 1);
  std::string_view head = slice.substr(0, dash);
  if (!consume_prefix(pod, kPodPrefix)) return Outcome::kRejected;
  auto uid = parse_pod_uid(pod, '_');
  if (!uid) return Outcome::kRejected;
  QosClass qos = QosClass::kGuaranteed;
  for (QosClass level : {QosClass::kBurstable, QosClass::kBestEffort}) {
    std::string_view stem = head;
    if (consume_suffix(stem, qos_dir_name(level)) && consume_suffix(stem, "-")) {
      qos = level;
      head = stem;
      break;
    }
  }
  if (!is_kubepods_stem(head)) return Outcome::kRejected;
  out->pod_uid = std::move(*uid);
  out->container_id.assign(id);
  out->runtime = Runtime::kContainerd;
  out->qos = qos;
  out->kind = Kind::kContainerOrSandbox;
  return Outcome::kAccepted;
}

// /k8s.io[/<id>]
Outcome parse_containerd_namespace(const std::string_view* rest, std::size_t n,
                                   CgroupIdentity* out) {
  out->runtime = Runtime::kContainerd;
  if (n == 0) {
    out->kind = Kind::kRoot;
    return Outcome::kAccepted;
  }
  if (n != 1 || !is_container_id(rest[0])) return Outcome::kRejected;
  out->container_id.assign(rest[0]);
  out->kind = Kind::kContainerOrSandbox;
  return Outcome::kAccepted;
}

Outcome classify(std::string_view path, CgroupIdentity* out) {
  if (path.empty() || path.size() > kMaxCgroupPathLength || path.front() != '/') {
    return Outcome::kRejected;
  }
  if (path == "/") return Outcome::kNoRoot;

  RootMarker marker = RootMarker::kNone;
  std::string_view root;
  std::array<std::string_view, kMaxComponentsBelowRoot> rest;
  std::size_t n_rest = 0;

  std::size_t pos = 1;  // just past a '/'
  while (true) {
    const std::size_t slash = path.find('/', pos);
    const std::size_t end = slash == std::string_view::npos ? path.size() : slash;
    const std::string_view component = path.substr(pos, end - pos);
    // Empty components are doubled or trailing slashes; "." and ".." would make the textual
    // path name a different directory than the one the kernel reported.
    if (component.empty() || component == "." || component == ".." ||
        component.find('\0') != std::string_view::npos) {
      return Outcome::kRejected;
    }
    if (marker == RootMarker::kNone) {
      marker = root_marker(component);
      if (marker != RootMarker::kNone) root = component;
    } else {
      if (n_rest == rest.size()) return Outcome::kRejected;
      rest[n_rest++] = component;
    }
    if (slash == std::string_view::npos) break;
    pos = slash + 1;
  }

  switch (marker) {
    case RootMarker::kNone:
      return Outcome::kNoRoot;
    case RootMarker::kCgroupfs:
      return parse_cgroupfs(rest.data(), n_rest, out);
    case RootMarker::kSystemd:
      return parse_systemd(root, rest.data(), n_rest, out);
    case RootMarker::kContainerdNamespace:
      return parse_containerd_namespace(rest.data(), n_rest, out);
    case RootMarker::kColonContainerd:
      return parse_colon_containerd(root, n_rest, out);
  }
  return Outcome::kRejected;
}

}  // namespace

std::optional<CgroupIdentity> parse_cgroup_path(std::string_view path) {
  CgroupIdentity identity;
  if (classify(path, &identity) != Outcome::kAccepted) return std::nullopt;
  return identity;
}

bool may_contain_pod_cgroups(std::string_view path) {
  CgroupIdentity identity;
  switch (classify(path, &identity)) {
    case Outcome::kNoRoot:
      return true;
    case Outcome::kAccepted:
      return identity.kind == Kind::kRoot || identity.kind == Kind::kQos ||
             identity.kind == Kind::kPod;
    case Outcome::kRejected:
      return false;
  }
  return false;
}

std::string_view to_string(Runtime runtime) {
  switch (runtime) {
    case Runtime::kUnknown:
      return "unknown";
    case Runtime::kContainerd:
      return "containerd";
    case Runtime::kCrio:
      return "cri-o";
    case Runtime::kDocker:
      return "docker";
  }
  return "invalid";
}

std::string_view to_string(QosClass qos) {
  switch (qos) {
    case QosClass::kUnknown:
      return "unknown";
    case QosClass::kGuaranteed:
      return "Guaranteed";
    case QosClass::kBurstable:
      return "Burstable";
    case QosClass::kBestEffort:
      return "BestEffort";
  }
  return "invalid";
}

std::string_view to_string(Kind kind) {
  switch (kind) {
    case Kind::kRoot:
      return "root";
    case Kind::kQos:
      return "qos";
    case Kind::kPod:
      return "pod";
    case Kind::kContainerOrSandbox:
      return "container-or-sandbox";
    case Kind::kIgnored:
      return "ignored";
    case Kind::kNested:
      return "nested";
  }
  return "invalid";
}

}  // namespace kpleg::cgroup

// Fuzzes parse_cgroup_path() and may_contain_pod_cgroups() with arbitrary bytes as cgroup
// paths. Besides memory errors (ASan/UBSan), it aborts when an accepted identity breaks what
// the rest of kpleg relies on: well-formed ids, fields consistent with the kind, identities
// that come from the path itself, and a walk pruning rule that never hides a parsable path.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cgroup/cgroup_path.h"

namespace {

using kpleg::cgroup::CgroupIdentity;
using kpleg::cgroup::Kind;
using kpleg::cgroup::QosClass;
using kpleg::cgroup::Runtime;

[[noreturn]] void violated(const char* what, std::string_view path) {
  std::fprintf(stderr, "invariant violated: %s\npath (%zu bytes): %.*s\n", what, path.size(),
               static_cast<int>(path.size()), path.data());
  std::abort();
}

#define REQUIRE(cond, path)               \
  do {                                    \
    if (!(cond)) violated(#cond, (path)); \
  } while (0)

bool lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool is_container_id(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!lower_hex(c)) return false;
  }
  return true;
}

bool is_pod_uid(std::string_view s) {
  if (s.size() == 32) {
    for (char c : s) {
      if (!lower_hex(c)) return false;
    }
    return true;
  }
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool dash_position = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash_position ? s[i] != '-' : !lower_hex(s[i])) return false;
  }
  return true;
}

std::string with_underscores(std::string uid) {
  for (char& c : uid) {
    if (c == '-') c = '_';
  }
  return uid;
}

void check_identity(const CgroupIdentity& id, std::string_view path) {
  REQUIRE(!path.empty() && path.front() == '/', path);
  REQUIRE(path.size() <= kpleg::cgroup::kMaxCgroupPathLength, path);
  REQUIRE(path.find("//") == std::string_view::npos, path);
  REQUIRE(path.find("/../") == std::string_view::npos && !path.ends_with("/.."), path);
  REQUIRE(path.find("/./") == std::string_view::npos && !path.ends_with("/."), path);
  REQUIRE(path.find('\0') == std::string_view::npos, path);
  REQUIRE(!path.ends_with("/"), path);
  REQUIRE(static_cast<unsigned>(id.runtime) <= static_cast<unsigned>(Runtime::kDocker), path);
  REQUIRE(static_cast<unsigned>(id.qos) <= static_cast<unsigned>(QosClass::kBestEffort), path);
  REQUIRE(static_cast<unsigned>(id.kind) <= static_cast<unsigned>(Kind::kIgnored), path);

  const bool has_container = id.kind == Kind::kContainerOrSandbox || id.kind == Kind::kIgnored;
  if (has_container) {
    REQUIRE(is_container_id(id.container_id), path);
    // The container id is the tail of the cgroup's own directory name.
    REQUIRE(path.ends_with(id.container_id) || path.ends_with(id.container_id + ".scope"), path);
  } else {
    REQUIRE(id.container_id.empty(), path);
  }
  if (id.kind == Kind::kIgnored) REQUIRE(id.runtime == Runtime::kCrio, path);

  if (!id.pod_uid.empty()) {
    REQUIRE(is_pod_uid(id.pod_uid), path);
    REQUIRE(path.find("pod" + id.pod_uid) != std::string_view::npos ||
                path.find("pod" + with_underscores(id.pod_uid)) != std::string_view::npos,
            path);
    REQUIRE(id.qos != QosClass::kUnknown, path);
  }
  switch (id.kind) {
    case Kind::kRoot:
      REQUIRE(id.pod_uid.empty() && id.qos == QosClass::kUnknown, path);
      break;
    case Kind::kQos:
      REQUIRE(id.pod_uid.empty(), path);
      REQUIRE(id.qos == QosClass::kBurstable || id.qos == QosClass::kBestEffort, path);
      break;
    case Kind::kPod:
      REQUIRE(!id.pod_uid.empty(), path);
      break;
    case Kind::kContainerOrSandbox:
    case Kind::kIgnored:
      // Only containerd's k8s.io namespace layout has no pod level.
      if (id.pod_uid.empty()) {
        REQUIRE(id.runtime == Runtime::kContainerd && id.qos == QosClass::kUnknown, path);
        REQUIRE(path.ends_with("/k8s.io/" + id.container_id), path);
      }
      break;
    case Kind::kNested:
      REQUIRE(false, path);  // the index derives it from a parent; the parser never returns it
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view path(reinterpret_cast<const char*>(data), size);
  const auto identity = kpleg::cgroup::parse_cgroup_path(path);
  const bool may_contain = kpleg::cgroup::may_contain_pod_cgroups(path);

  REQUIRE(kpleg::cgroup::parse_cgroup_path(path) == identity, path);  // pure

  if (identity) {
    check_identity(*identity, path);
    const bool container_level =
        identity->kind == Kind::kContainerOrSandbox || identity->kind == Kind::kIgnored;
    REQUIRE(may_contain == !container_level, path);
  }

  if (path.empty() || path.front() != '/') return 0;

  // Directories above the kubepods root do not change what is below it.
  const std::string nested = "/outer" + std::string(path);
  if (nested.size() <= kpleg::cgroup::kMaxCgroupPathLength) {
    REQUIRE(kpleg::cgroup::parse_cgroup_path(nested) == identity, path);
  }

  // The tree walk does not descend where may_contain_pod_cgroups() is false: nothing below
  // such a directory may parse, or the index would miss it.
  if (!may_contain) {
    static const std::string kChildren[] = {"kubepods",
                                            "kubepods.slice",
                                            "k8s.io",
                                            "burstable",
                                            std::string(64, 'a'),
                                            "pod01234567-89ab-cdef-0123-456789abcdef",
                                            "cri-containerd-" + std::string(64, 'b') + ".scope"};
    for (const auto& child : kChildren) {
      REQUIRE(!kpleg::cgroup::parse_cgroup_path(std::string(path) + "/" + child), path);
    }
  }
  return 0;
}

// Fuzzes the ring-buffer ABI decoder (decode_event) and sequences of kernel events applied to the
// cgroup index, the two things a hostile workload's cgroups and processes reach. The input is a
// sequence of chunks, each a mode byte and a length-prefixed body:
//   mode 0: raw record bytes, decoded as they come (any size, any header);
//   mode 1: a well-formed cgroup_mkdir record built from the body (id, parent, path), so that
//           paths reach the index, not only the decoder's size checks;
//   mode 2: a well-formed cgroup_rmdir of an id.
// Decoded cgroup events are applied to a CgroupIndex in order, against a model of what must
// then hold. Aborts (besides ASan/UBSan errors) when:
//   - a record is accepted whose size is not exactly its type's (or the type is unknown),
//     or its JSON line is not valid JSON, or a path is longer than the ABI allows;
//   - after an rmdir the id is still indexed; after an accepted mkdir the id is not indexed
//     under the mkdir's path (or its container, for nested cgroups);
//   - find_container() names an id whose entry is not that container's, or size() disagrees
//     with snapshot().
#include <nlohmann/json.hpp>

#include "require.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "cgroup/cgroup_index.h"
#include "kernel/kernel_event.h"

namespace {

using kpleg::cgroup::CgroupIndex;
using kpleg::cgroup::Kind;
using namespace kpleg::kernel;


size_t expected_size(uint16_t type) {
  switch (type) {
    case KPLEG_EVENT_CGROUP_MKDIR:
    case KPLEG_EVENT_CGROUP_RMDIR: return sizeof(kpleg_cgroup_event);
    case KPLEG_EVENT_EXEC: return sizeof(kpleg_exec_event);
    case KPLEG_EVENT_EXIT: return sizeof(kpleg_exit_event);
    case KPLEG_EVENT_OOM: return sizeof(kpleg_oom_event);
    default: return 0;
  }
}

std::string cgroup_record(uint16_t type, uint64_t id, uint64_t parent, std::string_view path) {
  kpleg_cgroup_event raw{};
  raw.hdr.type = type;
  raw.hdr.size = sizeof(raw);
  raw.cgroup_id = id;
  raw.parent_cgroup_id = parent;
  const size_t n = std::min(path.size(), sizeof(raw.path) - 1);
  std::memcpy(raw.path, path.data(), n);
  raw.path_len = uint32_t(n);
  return std::string(reinterpret_cast<const char*>(&raw), sizeof(raw));
}

// Paths that parse, so that sequences exercise pods, containers and nesting, not only rejects.
constexpr std::string_view kPrefixes[] = {
    "/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000001/",
    "/kubepods/pod0a1b2c3d-0000-4000-8000-000000000002/",
    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_0000_4000_8000_000000000003.slice/cri-containerd-",
    "/kubepods/burstable/",
    "",
};
constexpr std::string_view kId64 = "3f2a9c1d5e7b8a0c4d6e1f2a3b5c7d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8";

void apply(CgroupIndex& index, const KernelEvent& ev) {
  if (const auto* mk = std::get_if<CgroupMkdir>(&ev.body)) {
    const bool indexed = index.on_mkdir(mk->cgroup_id, mk->path, mk->parent_cgroup_id);
    auto entry = index.lookup(mk->cgroup_id);
    REQUIRE(indexed == entry.has_value());
    if (entry && entry->identity.kind != Kind::kNested) REQUIRE(entry->path == mk->path);
  } else if (const auto* rm = std::get_if<CgroupRmdir>(&ev.body)) {
    index.on_rmdir(rm->cgroup_id);
    REQUIRE(!index.lookup(rm->cgroup_id).has_value());
  }
}

void check_index(const CgroupIndex& index) {
  auto snap = index.snapshot();
  REQUIRE(snap.size() == index.size());
  for (const auto& [id, entry] : snap) {
    if (entry.identity.kind != Kind::kContainerOrSandbox) continue;
    auto found = index.find_container(entry.identity.container_id);
    REQUIRE(found.has_value());
    auto e = index.lookup(*found);
    REQUIRE(e.has_value());
    REQUIRE(e->identity.container_id == entry.identity.container_id);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CgroupIndex index;
  size_t at = 0;
  while (at + 3 <= size) {
    const uint8_t mode = data[at] % 3;
    const size_t len = size_t(data[at + 1]) | (size_t(data[at + 2]) << 8);
    at += 3;
    const size_t n = std::min(len, size - at);
    std::string_view body(reinterpret_cast<const char*>(data + at), n);
    at += n;

    std::string record;
    if (mode == 0) {
      record.assign(body);
    } else if (mode == 1) {
      const uint64_t id = body.empty() ? 1 : uint8_t(body[0]) % 16 + 1;
      const uint64_t parent = body.size() < 2 ? 0 : uint8_t(body[1]) % 17;
      std::string path;
      if (body.size() >= 3) {
        path = kPrefixes[uint8_t(body[2]) % std::size(kPrefixes)];
        if (body.size() >= 4 && (body[3] & 1)) path += kId64;
        if (body.size() > 4) path += body.substr(4);
      }
      record = cgroup_record(KPLEG_EVENT_CGROUP_MKDIR, id, parent, path);
    } else {
      const uint64_t id = body.empty() ? 1 : uint8_t(body[0]) % 16 + 1;
      record = cgroup_record(KPLEG_EVENT_CGROUP_RMDIR, id, 0, "");
    }

    auto ev = decode_event(std::as_bytes(std::span(record.data(), record.size())));
    if (!ev) continue;
    kpleg_event_header hdr;
    REQUIRE(record.size() >= sizeof(hdr));
    std::memcpy(&hdr, record.data(), sizeof(hdr));
    const size_t want = expected_size(hdr.type);
    REQUIRE(want != 0);
    REQUIRE(hdr.size == want);
    auto line = nlohmann::json::parse(to_json_line(*ev), nullptr, false);
    REQUIRE(!line.is_discarded());
    if (const auto* mk = std::get_if<CgroupMkdir>(&ev->body))
      REQUIRE(mk->path.size() < KPLEG_CGROUP_PATH_MAX);
    apply(index, *ev);
  }
  check_index(index);
  return 0;
}

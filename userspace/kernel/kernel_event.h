// Typed kernel events and their decoding from the raw ring-buffer records of bpf/kpleg_events.h.
// Decoding never trusts the record: truncated, oversized, mis-sized and unknown-type records are
// rejected with a counted reason, never a crash.
#pragma once

#include <linux/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "common/result.h"
#include "kpleg_events.h"

namespace kpleg::kernel {

// The ABI, pinned: the BPF side compiles the same header, these keep both sides honest.
static_assert(sizeof(kpleg_event_header) == 16);
static_assert(offsetof(kpleg_event_header, type) == 0);
static_assert(offsetof(kpleg_event_header, flags) == 2);
static_assert(offsetof(kpleg_event_header, size) == 4);
static_assert(offsetof(kpleg_event_header, ktime_ns) == 8);
static_assert(sizeof(kpleg_cgroup_event) == 16 + 8 + 8 + 4 + 4 + KPLEG_CGROUP_PATH_MAX);
static_assert(offsetof(kpleg_cgroup_event, cgroup_id) == 16);
static_assert(offsetof(kpleg_cgroup_event, parent_cgroup_id) == 24);
static_assert(offsetof(kpleg_cgroup_event, level) == 32);
static_assert(offsetof(kpleg_cgroup_event, path_len) == 36);
static_assert(offsetof(kpleg_cgroup_event, path) == 40);
static_assert(sizeof(kpleg_exec_event) == 16 + 8 + 16 + KPLEG_COMM_MAX + KPLEG_FILENAME_MAX);
static_assert(offsetof(kpleg_exec_event, cgroup_id) == 16);
static_assert(offsetof(kpleg_exec_event, pid) == 24);
static_assert(offsetof(kpleg_exec_event, comm) == 40);
static_assert(sizeof(kpleg_exit_event) == 16 + 8 + 16);
static_assert(offsetof(kpleg_exit_event, exit_code) == 28);
static_assert(offsetof(kpleg_exit_event, signal) == 32);
static_assert(sizeof(kpleg_oom_event) == 16 + 8 + 8);
static_assert(sizeof(kpleg_removal_hint_event) == 16 + KPLEG_ID_LEN);
static_assert(offsetof(kpleg_removal_hint_event, id) == 16);
static_assert(sizeof(kpleg_tracked_cgroup) == 40);
static_assert(offsetof(kpleg_tracked_cgroup, parent_id) == 24);
static_assert(offsetof(kpleg_tracked_cgroup, pod_id) == 32);
static_assert(sizeof(kpleg_pod_budget) == 40);
static_assert(sizeof(kpleg_cgroup_event) % 8 == 0 && sizeof(kpleg_exec_event) % 8 == 0 &&
              sizeof(kpleg_exit_event) % 8 == 0 && sizeof(kpleg_oom_event) % 8 == 0);

struct CgroupMkdir {
  uint64_t cgroup_id = 0;
  uint64_t parent_cgroup_id = 0;
  uint32_t level = 0;
  std::string path;  // relative to the cgroup2 root
  bool path_truncated = false;
  // Under a tracked root, but the kernel's tracked-cgroup map was full: nothing that happens in
  // this cgroup (or below it) reaches userspace until a resync tracks it.
  bool untracked = false;
  // Not tracked because its pod is over its budget (then untracked is set too): the cost of
  // that pod's cgroups stays with it. At most one such record per pod and second.
  bool over_budget = false;
};

struct CgroupRmdir {
  uint64_t cgroup_id = 0;
  uint64_t parent_cgroup_id = 0;
  uint32_t level = 0;
  std::string path;
  bool path_truncated = false;
};

struct ProcessExec {
  uint64_t cgroup_id = 0;
  uint32_t pid = 0;
  uint32_t tid = 0;
  uint32_t ppid = 0;
  std::string comm;
  std::string filename;
};

struct ProcessExit {
  uint64_t cgroup_id = 0;
  uint32_t pid = 0;
  uint32_t exit_code = 0;
  uint32_t signal = 0;
  bool core_dumped = false;
  bool oom_killed = false;  // the OOM killer killed this init (read at its exit)
};

struct OomKill {
  uint64_t cgroup_id = 0;
  uint32_t victim_pid = 0;
};

// A directory named by a watched id is being removed: the runtime is removing that exited
// container or sandbox (or is about to). Not in any cgroup (KernelEvent::cgroup_id() is 0).
struct RemovalHint {
  std::string id;
};

// In the order of the BPF record types (KPLEG_EVENT_CGROUP_MKDIR ... _REMOVAL_HINT).
using KernelEventBody = std::variant<CgroupMkdir, CgroupRmdir, ProcessExec, ProcessExit, OomKill, RemovalHint>;
inline constexpr size_t kKernelEventKinds = std::variant_size_v<KernelEventBody>;
// Each kind's name (metrics labels, --trace-kernel), by the body's index.
inline constexpr std::array<const char*, kKernelEventKinds> kKernelEventKindNames = {
    "cgroup_mkdir", "cgroup_rmdir", "exec", "exit", "oom", "removal_hint"};

struct KernelEvent {
  uint64_t ktime_ns = 0;  // CLOCK_MONOTONIC, from the BPF program
  KernelEventBody body;

  uint64_t cgroup_id() const;  // 0 for a RemovalHint
  const char* kind() const { return kKernelEventKindNames[body.index()]; }
};

enum class DecodeErrorKind : int { kTruncated = 0, kOversized, kSizeMismatch, kUnknownType, kCount };

// Why records were rejected, counted per reason; safe to read from any thread.
class DecodeStats {
 public:
  void count(DecodeErrorKind k) { n_[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t get(DecodeErrorKind k) const {
    return n_[static_cast<int>(k)].load(std::memory_order_relaxed);
  }
  uint64_t total() const;

 private:
  std::array<std::atomic<uint64_t>, static_cast<int>(DecodeErrorKind::kCount)> n_{};
};

const char* to_string(DecodeErrorKind k);

// Largest record the ABI defines; anything bigger is rejected as oversized.
constexpr size_t kMaxRecordSize = sizeof(kpleg_cgroup_event);

// Decodes one ring-buffer record. On a rejected record the reason is counted in `stats` (when
// given) and returned as the Error (code EBADMSG).
Result<KernelEvent> decode_event(std::span<const std::byte> record, DecodeStats* stats = nullptr);

// Converts a CLOCK_MONOTONIC timestamp (BPF ktime) to CLOCK_REALTIME nanoseconds.
uint64_t monotonic_to_realtime_ns(uint64_t mono_ns);

// One decoded event as a JSON object on one line (the --trace-kernel format).
std::string to_json_line(const KernelEvent& ev);

}  // namespace kpleg::kernel

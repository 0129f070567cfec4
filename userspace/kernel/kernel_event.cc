#include "kernel/kernel_event.h"

#include <time.h>

#include <cstring>
#include <nlohmann/json.hpp>

namespace kpleg::kernel {

namespace {

// Reads a NUL-terminated string from a fixed-size array without trusting the terminator.
std::string bounded_string(const char* s, size_t cap) {
  size_t n = strnlen(s, cap);
  return std::string(s, n);
}

template <typename Raw>
bool exact_size(std::span<const std::byte> rec, const kpleg_event_header& hdr, DecodeStats* stats,
                Raw* out) {
  if (rec.size() < sizeof(Raw)) {
    if (stats) stats->count(DecodeErrorKind::kTruncated);
    return false;
  }
  if (hdr.size != sizeof(Raw)) {
    if (stats) stats->count(DecodeErrorKind::kSizeMismatch);
    return false;
  }
  std::memcpy(out, rec.data(), sizeof(Raw));
  return true;
}

Error reject(const char* what) { return Error{EBADMSG, std::string("bad kernel record: ") + what}; }

template <typename T>
T cgroup_event(const kpleg_cgroup_event& raw) {
  T ev;
  ev.cgroup_id = raw.cgroup_id;
  ev.parent_cgroup_id = raw.parent_cgroup_id;
  ev.level = raw.level;
  size_t len = std::min<size_t>(raw.path_len, sizeof(raw.path));
  ev.path = bounded_string(raw.path, len);
  ev.path_truncated = (raw.hdr.flags & KPLEG_FLAG_PATH_TRUNCATED) != 0;
  return ev;
}

}  // namespace

uint64_t DecodeStats::total() const {
  uint64_t t = 0;
  for (const auto& v : n_) t += v.load(std::memory_order_relaxed);
  return t;
}

const char* to_string(DecodeErrorKind k) {
  switch (k) {
    case DecodeErrorKind::kTruncated: return "truncated";
    case DecodeErrorKind::kOversized: return "oversized";
    case DecodeErrorKind::kSizeMismatch: return "size_mismatch";
    case DecodeErrorKind::kUnknownType: return "unknown_type";
    case DecodeErrorKind::kCount: break;
  }
  return "?";
}

uint64_t KernelEvent::cgroup_id() const {
  return std::visit(
      [](const auto& b) -> uint64_t {
        if constexpr (std::is_same_v<std::decay_t<decltype(b)>, RemovalHint>) {
          return 0;
        } else {
          return b.cgroup_id;
        }
      },
      body);
}

Result<KernelEvent> decode_event(std::span<const std::byte> rec, DecodeStats* stats) {
  if (rec.size() < sizeof(kpleg_event_header)) {
    if (stats) stats->count(DecodeErrorKind::kTruncated);
    return reject("shorter than the header");
  }
  if (rec.size() > kMaxRecordSize + 8) {  // the ring buffer rounds sizes up to 8 bytes
    if (stats) stats->count(DecodeErrorKind::kOversized);
    return reject("larger than any record type");
  }
  kpleg_event_header hdr;
  std::memcpy(&hdr, rec.data(), sizeof(hdr));
  if (hdr.size > rec.size()) {
    if (stats) stats->count(DecodeErrorKind::kTruncated);
    return reject("header size exceeds the record");
  }

  KernelEvent ev;
  ev.ktime_ns = hdr.ktime_ns;
  switch (hdr.type) {
    case KPLEG_EVENT_CGROUP_MKDIR:
    case KPLEG_EVENT_CGROUP_RMDIR: {
      kpleg_cgroup_event raw;
      if (!exact_size(rec, hdr, stats, &raw)) return reject("cgroup record size");
      if (hdr.type == KPLEG_EVENT_CGROUP_MKDIR) {
        auto mk = cgroup_event<CgroupMkdir>(raw);
        mk.untracked = (hdr.flags & KPLEG_FLAG_UNTRACKED) != 0;
        mk.over_budget = (hdr.flags & KPLEG_FLAG_OVER_BUDGET) != 0;
        ev.body = std::move(mk);
      } else {
        ev.body = cgroup_event<CgroupRmdir>(raw);
      }
      return ev;
    }
    case KPLEG_EVENT_EXEC: {
      kpleg_exec_event raw;
      if (!exact_size(rec, hdr, stats, &raw)) return reject("exec record size");
      ev.body = ProcessExec{raw.cgroup_id, raw.pid, raw.tid, raw.ppid,
                            bounded_string(raw.comm, sizeof(raw.comm)),
                            bounded_string(raw.filename, sizeof(raw.filename))};
      return ev;
    }
    case KPLEG_EVENT_EXIT: {
      kpleg_exit_event raw;
      if (!exact_size(rec, hdr, stats, &raw)) return reject("exit record size");
      ev.body = ProcessExit{raw.cgroup_id, raw.pid, raw.exit_code, raw.signal,
                            (hdr.flags & KPLEG_FLAG_CORE_DUMPED) != 0,
                            (hdr.flags & KPLEG_FLAG_OOM_KILLED) != 0};
      return ev;
    }
    case KPLEG_EVENT_OOM: {
      kpleg_oom_event raw;
      if (!exact_size(rec, hdr, stats, &raw)) return reject("oom record size");
      ev.body = OomKill{raw.cgroup_id, raw.victim_pid};
      return ev;
    }
    case KPLEG_EVENT_REMOVAL_HINT: {
      kpleg_removal_hint_event raw;
      if (!exact_size(rec, hdr, stats, &raw)) return reject("removal hint record size");
      ev.body = RemovalHint{bounded_string(raw.id, sizeof(raw.id))};
      return ev;
    }
    default:
      if (stats) stats->count(DecodeErrorKind::kUnknownType);
      return reject("unknown event type");
  }
}

uint64_t monotonic_to_realtime_ns(uint64_t mono_ns) {
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  int64_t now_mono = int64_t(mono.tv_sec) * 1'000'000'000 + mono.tv_nsec;
  int64_t now_real = int64_t(real.tv_sec) * 1'000'000'000 + real.tv_nsec;
  return uint64_t(now_real - (now_mono - int64_t(mono_ns)));
}

std::string to_json_line(const KernelEvent& ev) {
  nlohmann::json j;
  j["kind"] = ev.kind();
  j["cgroup_id"] = ev.cgroup_id();
  j["ktime_ns"] = ev.ktime_ns;
  std::visit(
      [&j](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, CgroupMkdir> || std::is_same_v<T, CgroupRmdir>) {
          j["path"] = b.path;
          j["parent_cgroup_id"] = b.parent_cgroup_id;
          if (b.path_truncated) j["path_truncated"] = true;
          if constexpr (std::is_same_v<T, CgroupMkdir>) {
            if (b.untracked) j["untracked"] = true;
            if (b.over_budget) j["over_budget"] = true;
          }
        } else if constexpr (std::is_same_v<T, ProcessExec>) {
          j["pid"] = b.pid;
          j["comm"] = b.comm;
          j["filename"] = b.filename;
        } else if constexpr (std::is_same_v<T, ProcessExit>) {
          j["pid"] = b.pid;
          j["exit_code"] = b.exit_code;
          j["signal"] = b.signal;
          if (b.core_dumped) j["core_dumped"] = true;
          if (b.oom_killed) j["oom_killed"] = true;
        } else if constexpr (std::is_same_v<T, OomKill>) {
          j["pid"] = b.victim_pid;
        } else if constexpr (std::is_same_v<T, RemovalHint>) {
          j["id"] = b.id;
        }
      },
      ev.body);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kpleg::kernel

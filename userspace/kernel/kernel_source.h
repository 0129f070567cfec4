// KernelSource: the kernel's container start/stop signals as typed events.
//
// The BPF implementation loads kpleg's programs, attaches them, seeds the tracked cgroups from
// the existing cgroup2 tree, and consumes the ring buffer on its own thread (epoll), or, with
// KernelSourceOptions::own_thread off, on the caller's event loop (ring_fd() and consume()),
// handing every decoded event to the sink in ring-buffer order. Loss (the BPF drop counter moved) is
// reported to the sink so that the daemon can reconcile at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/log_limiter.h"
#include "common/result.h"
#include "kernel/bpf_program.h"
#include "kernel/kernel_event.h"

struct ring_buffer;  // libbpf

namespace kpleg::kernel {

struct KernelSourceOptions {
  BpfOptions bpf;
  std::string cgroup_base = "/sys/fs/cgroup";  // cgroup2 is found here or at <base>/unified
  // Ring-buffer loss (the drop counter) is read after each drain of the ring, which catches
  // every loss (a record is dropped only while the ring is full, so a drain follows). A
  // positive interval adds a periodic check; 0: no timer, the thread sleeps until records come.
  std::chrono::milliseconds loss_check_interval{0};
  // false: no thread; the owner's event loop polls ring_fd() and calls consume() whenever it is
  // readable (the sink's callbacks then run on that loop). loss_check_interval is not used.
  bool own_thread = true;
};

struct KernelSink {
  std::function<void(const KernelEvent&)> on_event;
  std::function<void(uint64_t lost)> on_loss;  // records lost since the last report
  std::function<void()> on_stopped;  // the consuming thread ended on an error
  // A cgroup under a tracked root was made while the kernel's tracked-cgroup map was full:
  // nothing in it is seen until resync_tracked() finds room. Called on the consumer thread.
  std::function<void(const std::string& path)> on_untracked;
  // A cgroup was not tracked because its pod is over its budget (BpfOptions): at most once a
  // second per pod, on the consumer thread. The record is not handed to on_event.
  std::function<void(const CgroupMkdir&)> on_over_budget;
};

// What one resync_tracked() did.
struct ResyncResult {
  size_t added = 0;        // cgroups under a tracked root that were missing from the map
  size_t still_full = 0;   // ... that did not fit: the map is full
  size_t stale = 0;        // entries of cgroups that no longer exist, removed
  bool walk_complete = true;  // every directory was read (stale entries are removed only then)
};

struct KernelSourceStats {
  BpfCounters bpf;
  uint64_t received = 0;       // records decoded and handed to the sink
  uint64_t decode_errors = 0;  // records rejected by decode_event
  uint64_t lost_reported = 0;  // drops reported through on_loss
  bool attached = false;
  bool consuming = false;      // the consumer thread is alive
  size_t seeded_cgroups = 0;
  // Cgroups under a tracked root that the map had no room for, made since the last resync
  // (flagged mkdirs) plus those its walk could not place. 0 once a resync placed them all.
  uint64_t untracked_cgroups = 0;
  uint64_t stale_removed = 0;    // entries removed by resyncs
  uint32_t map_capacity = 0;     // BpfOptions::max_tracked_cgroups
  uint64_t over_budget_notices = 0;  // KPLEG_FLAG_OVER_BUDGET records received
  std::string cgroup2_mount;
};

class KernelSource {
 public:
  virtual ~KernelSource() = default;
  virtual Status start(KernelSink sink) = 0;
  virtual void stop() = 0;
  virtual KernelSourceStats stats() const = 0;
  // Attached and consumed: `attached && consuming` of stats(), without reading any counter.
  virtual bool live() const = 0;
};

// Checks what the BPF source needs before anything is loaded, and returns one line that names
// the missing piece (BTF, a kernel feature, CAP_BPF/CAP_PERFMON, cgroup2) and that relist mode
// is the fallback.
Status preflight(const KernelSourceOptions& opts);

// The kernel features kpleg's BPF programs need beyond BTF, probed (libbpf_probe_*) rather than
// read off the version, since distributions backport them. Linux 5.10 has them all. tp_btf
// programs (5.5) are not probed: libbpf's probe cannot load a tracing program without a target,
// and every kernel with the ring buffer (5.8) has them.
struct KernelFeatures {
  bool ringbuf = false;   // BPF_MAP_TYPE_RINGBUF: Linux 5.8
  bool lru_hash = false;  // BPF_MAP_TYPE_LRU_HASH (the claims, removal_early): Linux 4.10
};
KernelFeatures probe_kernel_features();
// The first missing feature as one line naming it, the kernel release and the Linux version
// that brought it, with the relist fallback; ok when none is missing.
Status check_kernel_features(const KernelFeatures& features, std::string_view release);

class BpfKernelSource final : public KernelSource {
 public:
  explicit BpfKernelSource(KernelSourceOptions opts);
  ~BpfKernelSource() override;

  Status start(KernelSink sink) override;
  void stop() override;
  KernelSourceStats stats() const override;
  bool live() const override { return program_ != nullptr && consuming_.load(); }

  // The loaded program, for tests and benchmarks (program stats, tracked map).
  BpfProgram* program() { return program_.get(); }

  // Walks the cgroup2 tree again, as the start-up seed does: tracks every cgroup under a
  // tracked root that the map lacks (made while it was full, or seen by neither the hook nor
  // the start-up walk), and removes the entries of cgroups that no longer exist (removed while
  // the start-up walk ran, before their entry was written). Safe while the programs run: an
  // entry the kernel adds during the walk is never removed. One resync at a time.
  Result<ResyncResult> resync_tracked();

  // Without own_thread: the descriptor that is readable when records wait (epoll), and the
  // drain of the ring buffer that hands them to the sink, on the loop's thread. Between
  // start() and stop() only.
  int ring_fd() const;
  void consume();

  // The parent of a tracked cgroup, as the kernel saw it made (nullopt: untracked, or a root).
  std::optional<uint64_t> tracked_parent(uint64_t cgroup_id) const;

 private:
  struct Walk {
    size_t added = 0;
    size_t full = 0;
    size_t over_budget = 0;  // not tracked: their pod is over its count
    bool complete = true;
    std::vector<uint64_t> seen;  // every cgroup at or below a tracked root
  };
  Status walk_and_track(const std::string& cgroup2_root, Walk& out);
  void consume_loop();
  void check_loss();
  static int on_record(void* ctx, void* data, size_t size);

  KernelSourceOptions opts_;
  KernelSink sink_;
  std::unique_ptr<BpfProgram> program_;
  ::ring_buffer* rb_ = nullptr;
  int stop_fd_ = -1;
  std::thread thread_;
  std::string cgroup2_mount_;
  DecodeStats decode_stats_;
  LogLimiter decode_log_{std::chrono::seconds(10)};  // undecodable records: one line per 10 s
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> lost_reported_{0};
  std::atomic<bool> consuming_{false};
  uint64_t drops_seen_ = 0;
  size_t seeded_ = 0;
  std::mutex resync_mu_;
  std::atomic<uint64_t> untracked_{0};        // since the last resync
  std::atomic<uint64_t> stale_removed_{0};
  std::atomic<uint64_t> over_budget_notices_{0};
  LogLimiter untracked_log_{std::chrono::seconds(10)};
};

}  // namespace kpleg::kernel

#include "kernel/kernel_source.h"
#include "common/thread_name.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/capability.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <fstream>
#include <set>
#include <vector>

#include "cgroup/cgroup2_mount.h"

namespace kpleg::kernel {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFallback =
    "; the kernel event source cannot start, relist mode (--mode=relist) is the fallback";

bool has_cap(const __user_cap_data_struct data[2], int cap) {
  return (data[cap / 32].effective & (1u << (cap % 32))) != 0;
}

// The container's init among the processes of a cgroup: the one whose parent is outside it
// (the shim). Ties go to the oldest (lowest) pid.
uint32_t find_init(const std::vector<uint32_t>& pids) {
  std::set<uint32_t> members(pids.begin(), pids.end());
  uint32_t best = 0;
  for (uint32_t pid : pids) {
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(st, line)) continue;
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state;
    uint32_t ppid = 0;
    if (sscanf(line.c_str() + close + 1, " %c %u", &state, &ppid) != 2) continue;
    if (!members.count(ppid) && (best == 0 || pid < best)) best = pid;
  }
  return best;
}

// A level between a root and its pods (a QoS level, or the kubelet's kubepods below a root of
// another name), by name, as the mkdir program decides (cgroup__name_is_level).
bool is_level_name(const std::string& name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name == "kubepods" || name == "kubepods.slice" || name == "burstable" ||
         name == "besteffort" || ends_with("-burstable.slice") ||
         ends_with("-besteffort.slice");
}

std::vector<uint32_t> read_procs(const fs::path& dir) {
  std::vector<uint32_t> pids;
  std::ifstream in(dir / "cgroup.procs");
  uint32_t pid;
  while (in >> pid) pids.push_back(pid);
  return pids;
}

}  // namespace

KernelFeatures probe_kernel_features() {
  // 1 supported, 0 not, <0 the probe itself failed (then the load will say more).
  KernelFeatures f;
  f.ringbuf = libbpf_probe_bpf_map_type(BPF_MAP_TYPE_RINGBUF, nullptr) != 0;
  f.lru_hash = libbpf_probe_bpf_map_type(BPF_MAP_TYPE_LRU_HASH, nullptr) != 0;
  return f;
}

Status check_kernel_features(const KernelFeatures& f, std::string_view release) {
  auto missing = [&](const char* what, const char* since) {
    return Error{EOPNOTSUPP, "Linux " + std::string(release) + " has no " + what + " (Linux " +
                                 since + "+)" + kFallback};
  };
  if (!f.ringbuf) return missing("BPF ring buffer (BPF_MAP_TYPE_RINGBUF)", "5.8");
  if (!f.lru_hash) return missing("BPF LRU hash map", "4.10");
  return {};
}

Status preflight(const KernelSourceOptions& opts) {
  const std::string btf = opts.bpf.btf_path.empty() ? "/sys/kernel/btf/vmlinux" : opts.bpf.btf_path;
  if (access(btf.c_str(), R_OK) != 0) {
    return Error{ENOENT, "kernel BTF not readable at " + btf +
                             " (the kernel needs CONFIG_DEBUG_INFO_BTF=y, or pass a BTF file)" +
                             kFallback};
  }
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &hdr, data) != 0) {
    return Error::from_errno(errno, std::string("reading process capabilities") + kFallback);
  }
  bool admin = has_cap(data, CAP_SYS_ADMIN);
  if (!admin && !(has_cap(data, CAP_BPF) && has_cap(data, CAP_PERFMON))) {
    return Error{EPERM, std::string("missing CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to load "
                                    "BPF programs") +
                            kFallback};
  }
  utsname uts{};
  uname(&uts);
  if (auto st = check_kernel_features(probe_kernel_features(), uts.release); !st) return st;
  auto mount = cgroup::find_cgroup2_mount(opts.cgroup_base);
  if (!mount)
    return Error{mount.error().code, "no cgroup2 hierarchy: " + mount.error().message + kFallback};
  if (auto st = validate(opts.bpf); !st) return st;
  return {};
}

BpfKernelSource::BpfKernelSource(KernelSourceOptions opts) : opts_(std::move(opts)) {}

BpfKernelSource::~BpfKernelSource() { stop(); }

Status BpfKernelSource::start(KernelSink sink) {
  if (auto st = preflight(opts_); !st) return st;
  sink_ = std::move(sink);
  cgroup2_mount_ = *cgroup::find_cgroup2_mount(opts_.cgroup_base);

  install_libbpf_logger();
  auto prog = BpfProgram::load(opts_.bpf);
  if (!prog) return Error{prog.error().code, prog.error().message + kFallback};
  program_ = std::move(*prog);

  rb_ = ring_buffer__new(program_->ringbuf_fd(), &BpfKernelSource::on_record, this, nullptr);
  if (!rb_) return Error::from_errno(errno, "creating the ring buffer consumer");

  // Attach first, then seed top-down: a cgroup made after its parent was seeded is caught by the
  // mkdir hook, one made before is in the directory listing.
  if (auto st = program_->attach(); !st)
    return Error{st.error().code, st.error().message + kFallback};
  Walk walk;
  if (auto st = walk_and_track(cgroup2_mount_, walk); !st) return st;
  seeded_ = walk.added;
  if (walk.full > 0) {
    untracked_ += walk.full;
    spdlog::warn("kernel source: the tracked-cgroup map (capacity {}) is full: {} existing "
                 "cgroups are not tracked and their containers' events come only from the "
                 "reconcile; raise --max-tracked-cgroups",
                 opts_.bpf.max_tracked_cgroups, walk.full);
  }

  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return Error::from_errno(errno, "eventfd");
  if (auto d = program_->ringbuf_drops()) drops_seen_ = *d;
  consuming_ = true;
  if (opts_.own_thread) {
    thread_ = named_thread("kpleg-ringbuf", [this] { consume_loop(); });
  }
  spdlog::info("kernel source attached: cgroup2 at {}, {} cgroups tracked, ring buffer {} KiB",
               cgroup2_mount_, seeded_, opts_.bpf.ringbuf_bytes / 1024);
  return {};
}

Status BpfKernelSource::walk_and_track(const std::string& root, Walk& out) {
  const auto& names = opts_.bpf.root_names;
  // Depth-first, parent before children. What a directory's children inherit: whether they are
  // at or below a root, and the parent's id, kind and pod (as the mkdir program derives them).
  struct Visit {
    fs::path dir;
    bool parent_tracked = false;
    uint64_t parent_id = 0;
    uint32_t parent_kind = 0;
    uint64_t parent_pod = 0;
  };
  std::vector<Visit> stack{{fs::path(root)}};
  while (!stack.empty()) {
    Visit at = std::move(stack.back());
    stack.pop_back();
    const fs::path& dir = at.dir;
    bool tracked = at.parent_tracked;
    uint64_t id = 0;
    kpleg_tracked_cgroup v{};
    if (dir != fs::path(root)) {
      const std::string name = dir.filename().string();
      bool is_root = std::find(names.begin(), names.end(), name) != names.end();
      if (at.parent_tracked || is_root) {
        struct stat st;
        if (stat(dir.c_str(), &st) != 0) continue;  // removed meanwhile
        id = st.st_ino;
        out.seen.push_back(id);
        if (!at.parent_tracked) {
          v.kind = KPLEG_TRACKED_ROOT;
        } else {
          v.kind = KPLEG_TRACKED_DESCENDANT;
          v.parent_id = at.parent_id;
          if ((at.parent_kind == KPLEG_TRACKED_ROOT || at.parent_kind == KPLEG_TRACKED_QOS) &&
              is_level_name(name))
            v.kind = KPLEG_TRACKED_QOS;
          else if (at.parent_kind == KPLEG_TRACKED_ROOT || at.parent_kind == KPLEG_TRACKED_QOS)
            v.pod_id = id;
          else
            v.pod_id = at.parent_pod;
        }
        // Processes in it: its start happened before kpleg, its init's exit is still news. A
        // created container whose runtime init waits for StartContainer looks the same here,
        // and nothing a process controls (its name) may tell them apart: the exec program
        // still takes that init's own exec for the start (KPLEG_EXEC_SEEDED), anyone else's not.
        if (auto pids = read_procs(dir); !pids.empty()) {
          v.exec_seen = KPLEG_EXEC_SEEDED;
          v.init_tgid = find_init(pids);
        }
        const bool counted = v.pod_id != 0 && v.pod_id != id;
        if (counted && program_->is_tracked(id)) {
          // Already there (the hook, or an earlier walk): counted then.
        } else if (counted && !program_->charge_pod(v.pod_id)) {
          ++out.over_budget;
          continue;  // over its pod's budget: neither it nor anything below it is tracked
        } else if (bpf_map_update_elem(program_->tracked_map_fd(), &id, &v, BPF_NOEXIST) == 0) {
          // BPF_NOEXIST: an entry the kernel wrote meanwhile (with what it saw) stays as it is.
          ++out.added;
        } else if (errno == E2BIG) {
          ++out.full;  // the map is full: the walk goes on, a later resync may find room
        } else if (errno != EEXIST) {
          return Error::from_errno(errno, "tracking cgroup " + dir.string());
        }
        tracked = true;
        if (auto in_map = program_->tracked_entry(id)) v = *in_map;
      }
    }
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      std::error_code ec2;
      if (entry.is_directory(ec2) && !entry.is_symlink(ec2))
        stack.push_back({entry.path(), tracked, id, v.kind, v.pod_id});
    }
    // A directory that vanished is fine; one that could not be read hides its subtree.
    if (ec && ec != std::errc::no_such_file_or_directory) out.complete = false;
  }
  return {};
}

std::optional<uint64_t> BpfKernelSource::tracked_parent(uint64_t cgroup_id) const {
  if (!program_) return std::nullopt;
  auto v = program_->tracked_entry(cgroup_id);
  if (!v || v->parent_id == 0) return std::nullopt;
  return v->parent_id;
}

Result<ResyncResult> BpfKernelSource::resync_tracked() {
  if (!program_) return Error{ENODEV, "the kernel source is not started"};
  std::lock_guard lk(resync_mu_);
  // The entries that exist before the walk: only those can be stale. One the kernel adds while
  // the walk runs (a new cgroup) is not among them, so it is never removed.
  const auto before = program_->tracked_ids();
  // Flagged mkdirs counted from here on are made after the walk started: they stay counted.
  const uint64_t untracked_before = untracked_.exchange(0);
  Walk walk;
  if (auto st = walk_and_track(cgroup2_mount_, walk); !st) {
    untracked_ += untracked_before;
    return st.error();
  }
  ResyncResult r;
  r.added = walk.added;
  r.still_full = walk.full;
  r.walk_complete = walk.complete;
  untracked_ += walk.full;
  if (walk.complete) {
    std::sort(walk.seen.begin(), walk.seen.end());
    for (uint64_t id : before) {
      if (std::binary_search(walk.seen.begin(), walk.seen.end(), id)) continue;
      // Gone, or removed during the walk (then the kernel already deleted it: ENOENT is fine).
      if (auto gone = program_->untrack(id); gone.ok() && *gone) ++r.stale;
    }
    stale_removed_ += r.stale;
  }
  return r;
}

int BpfKernelSource::on_record(void* ctx, void* data, size_t size) {
  auto* self = static_cast<BpfKernelSource*>(ctx);
  auto ev = decode_event({static_cast<const std::byte*>(data), size}, &self->decode_stats_);
  if (!ev) {
    uint64_t left_out = 0;
    if (self->decode_log_.allow(left_out))
      spdlog::warn("kernel source: {}{}", ev.error().message,
                   left_out > 0 ? fmt::format(" ({} more undecodable records since the last "
                                              "such line)",
                                              left_out)
                                : std::string());
    return 0;
  }
  self->received_.fetch_add(1, std::memory_order_relaxed);
  if (const auto* mk = std::get_if<CgroupMkdir>(&ev->body); mk != nullptr && mk->over_budget) {
    // Its pod's own cost, not the map's: no resync can make room for it, and no other pod is
    // short of anything.
    self->over_budget_notices_.fetch_add(1, std::memory_order_relaxed);
    if (self->sink_.on_over_budget) self->sink_.on_over_budget(*mk);
    return 0;
  }
  if (const auto* mk = std::get_if<CgroupMkdir>(&ev->body); mk != nullptr && mk->untracked) {
    self->untracked_.fetch_add(1);
    uint64_t left_out = 0;
    if (self->untracked_log_.allow(left_out)) {
      spdlog::warn("kernel source: the tracked-cgroup map (capacity {}) is full: {} is not "
                   "tracked, its containers' events come only from the reconcile; raise "
                   "--max-tracked-cgroups{}",
                   self->opts_.bpf.max_tracked_cgroups, mk->path,
                   left_out > 0 ? fmt::format(" ({} more not logged)", left_out) : "");
    }
    if (self->sink_.on_untracked) self->sink_.on_untracked(mk->path);
  }
  if (self->sink_.on_event) self->sink_.on_event(*ev);
  return 0;
}

void BpfKernelSource::check_loss() {
  auto drops = program_->ringbuf_drops();
  if (!drops) return;
  if (*drops > drops_seen_) {
    uint64_t lost = *drops - drops_seen_;
    drops_seen_ = *drops;
    lost_reported_.fetch_add(lost, std::memory_order_relaxed);
    spdlog::warn("kernel source: {} events lost (ring buffer full)", lost);
    if (sink_.on_loss) sink_.on_loss(lost);
  }
}

void BpfKernelSource::consume_loop() {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = ring_buffer__epoll_fd(rb_);
  epoll_ctl(ep, EPOLL_CTL_ADD, ring_buffer__epoll_fd(rb_), &ev);
  ev.data.fd = stop_fd_;
  epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd_, &ev);

  bool running = true;
  while (running) {
    epoll_event out[2];
    // Loss is checked after each drain, not on a timer: the kernel drops a record only while
    // the ring is full, i.e. while records wait that this loop will drain afterwards.
    const int timeout =
        opts_.loss_check_interval.count() > 0 ? int(opts_.loss_check_interval.count()) : -1;
    int n = epoll_wait(ep, out, 2, timeout);
    if (n < 0 && errno != EINTR) {
      spdlog::error("kernel source: epoll_wait: {}", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (out[i].data.fd == stop_fd_) running = false;
    }
    int err = ring_buffer__consume(rb_);
    if (err < 0 && err != -EINTR) {
      spdlog::error("kernel source: consuming the ring buffer: {}", std::strerror(-err));
      break;
    }
    if (err > 0 || n == 0) check_loss();
  }
  close(ep);
  consuming_ = false;
  if (running && sink_.on_stopped) sink_.on_stopped();
}

int BpfKernelSource::ring_fd() const { return rb_ ? ring_buffer__epoll_fd(rb_) : -1; }

void BpfKernelSource::consume() {
  if (!rb_ || !consuming_) return;
  const int err = ring_buffer__consume(rb_);
  if (err < 0 && err != -EINTR) {
    spdlog::error("kernel source: consuming the ring buffer: {}", std::strerror(-err));
    consuming_ = false;
    if (sink_.on_stopped) sink_.on_stopped();
    return;
  }
  // Loss is checked after each drain: the kernel drops a record only while the ring is full.
  if (err > 0) check_loss();
}

void BpfKernelSource::stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (rb_) {
    ring_buffer__free(rb_);
    rb_ = nullptr;
  }
  if (stop_fd_ >= 0) {
    close(stop_fd_);
    stop_fd_ = -1;
  }
  program_.reset();
}

KernelSourceStats BpfKernelSource::stats() const {
  KernelSourceStats s;
  if (program_) {
    if (auto c = program_->counters()) s.bpf = *c;
    s.attached = true;
  }
  s.received = received_.load(std::memory_order_relaxed);
  s.decode_errors = decode_stats_.total();
  s.lost_reported = lost_reported_.load(std::memory_order_relaxed);
  s.consuming = consuming_.load();
  s.seeded_cgroups = seeded_;
  s.untracked_cgroups = untracked_.load();
  s.stale_removed = stale_removed_.load();
  s.map_capacity = opts_.bpf.max_tracked_cgroups;
  s.over_budget_notices = over_budget_notices_.load(std::memory_order_relaxed);
  s.cgroup2_mount = cgroup2_mount_;
  return s;
}

}  // namespace kpleg::kernel

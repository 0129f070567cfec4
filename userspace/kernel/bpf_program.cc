#include "kernel/bpf_program.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>

#include "kpleg_bpf.skel.h"

namespace kpleg::kernel {

namespace {
// Calls fn(key) for every key of a BPF hash map (a snapshot as the kernel walks it).
template <typename Key, typename Fn>
void for_each_key(int map_fd, Fn&& fn) {
  Key key{}, next{};
  const Key* prev = nullptr;
  while (bpf_map_get_next_key(map_fd, prev, &next) == 0) {
    fn(next);
    key = next;
    prev = &key;
  }
}

std::mutex g_log_mu;
std::deque<std::string> g_log_tail;
constexpr size_t kLogTailLines = 60;

int libbpf_print(enum libbpf_print_level level, const char* fmt, va_list args) {
  char buf[1024];
  int n = vsnprintf(buf, sizeof(buf), fmt, args);
  std::string line(buf, n > 0 ? std::min<size_t>(n, sizeof(buf) - 1) : 0);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  if (line.rfind("libbpf: ", 0) == 0) line.erase(0, 8);
  if (level == LIBBPF_WARN) {  // the verifier log of a failed load comes at this level
    std::lock_guard lk(g_log_mu);
    g_log_tail.push_back(line);
    if (g_log_tail.size() > kLogTailLines) g_log_tail.pop_front();
  }
  switch (level) {
    case LIBBPF_WARN: spdlog::warn("libbpf: {}", line); break;
    case LIBBPF_INFO: spdlog::debug("libbpf: {}", line); break;
    case LIBBPF_DEBUG: spdlog::trace("libbpf: {}", line); break;
  }
  return n;
}

bool is_power_of_two(uint32_t v) { return v && !(v & (v - 1)); }

}  // namespace

void install_libbpf_logger() { libbpf_set_print(libbpf_print); }

std::string libbpf_log_tail() {
  std::lock_guard lk(g_log_mu);
  std::string out;
  for (const auto& l : g_log_tail) out += l + "\n";
  return out;
}

Status validate(const BpfOptions& opts) {
  long page = sysconf(_SC_PAGESIZE);
  if (!is_power_of_two(opts.ringbuf_bytes) || opts.ringbuf_bytes < uint32_t(page)) {
    return Error{EINVAL, "ring buffer size " + std::to_string(opts.ringbuf_bytes) +
                             " must be a power of two and at least the page size (" +
                             std::to_string(page) + ")"};
  }
  if (opts.max_tracked_cgroups < kMinTrackedCgroups ||
      opts.max_tracked_cgroups > kMaxTrackedCgroups) {
    return Error{EINVAL, "the tracked-cgroup map's capacity " +
                             std::to_string(opts.max_tracked_cgroups) + " must be between " +
                             std::to_string(kMinTrackedCgroups) + " and " +
                             std::to_string(kMaxTrackedCgroups)};
  }
  if (opts.root_names.empty()) return Error{EINVAL, "at least one cgroup root name is needed"};
  if (opts.root_names.size() > KPLEG_MAX_ROOT_NAMES) {
    return Error{EINVAL, "at most " + std::to_string(KPLEG_MAX_ROOT_NAMES) +
                             " cgroup root names are supported"};
  }
  for (const auto& n : opts.root_names) {
    if (n.empty() || n.size() >= KPLEG_ROOT_NAME_MAX || n.find('/') != std::string::npos) {
      return Error{EINVAL, "cgroup root name '" + n + "' must be a single path component of 1-" +
                               std::to_string(KPLEG_ROOT_NAME_MAX - 1) + " characters"};
    }
  }
  return {};
}

namespace {

// Whether the kernel whose BTF libbpf loads against has bpf_timer (Linux 5.15+): its helpers are
// named in the BTF's enum bpf_func_id. No BTF to read: assumed not (the load then fails anyway).
bool kernel_has_bpf_timer(const std::string& btf_path) {
  btf* b = btf_path.empty() ? btf__load_vmlinux_btf() : btf__parse(btf_path.c_str(), nullptr);
  if (libbpf_get_error(b) != 0 || b == nullptr) return false;
  bool found = false;
  const int id = btf__find_by_name_kind(b, "bpf_func_id", BTF_KIND_ENUM);
  if (id > 0) {
    const btf_type* t = btf__type_by_id(b, id);
    const struct btf_enum* e = btf_enum(t);
    for (int i = 0; i < btf_vlen(t) && !found; ++i)
      found = std::strcmp(btf__name_by_offset(b, e[i].name_off), "BPF_FUNC_timer_start") == 0;
  }
  btf__free(b);
  return found;
}

}  // namespace

Result<std::unique_ptr<BpfProgram>> BpfProgram::load(const BpfOptions& opts) {
  if (auto st = validate(opts); !st) return st.error();
  if (opts.wake_timer && kernel_has_bpf_timer(opts.btf_path)) {
    auto timed = open_and_load(opts, true);
    if (timed.ok()) return timed;
    // A kernel that names the helpers but refuses them here (a backport, a lockdown): the
    // programs without the wake timer, whose records wake the reader at once.
    spdlog::warn("loading the BPF programs with the wake timer failed ({}); loading them "
                 "without it: the exec's and the rmdir's records wake kplegd at once",
                 timed.error().message.substr(0, timed.error().message.find('\n')));
  }
  return open_and_load(opts, false);
}

Result<std::unique_ptr<BpfProgram>> BpfProgram::open_and_load(const BpfOptions& opts,
                                                              bool timers) {
  LIBBPF_OPTS(bpf_object_open_opts, open_opts);
  if (!opts.btf_path.empty()) open_opts.btf_custom_path = opts.btf_path.c_str();

  kpleg_bpf* skel = kpleg_bpf__open_opts(&open_opts);
  if (!skel) {
    int err = errno;
    return Error{err, std::string("opening the BPF object failed: ") + std::strerror(err)};
  }
  auto owner = std::unique_ptr<BpfProgram>(new BpfProgram(skel, opts.removal_hint, timers));

  if (skel->rodata->kpleg_abi_version != KPLEG_ABI_VERSION) {
    return Error{EPROTO, "BPF object ABI version " +
                             std::to_string(skel->rodata->kpleg_abi_version) +
                             " does not match userspace ABI version " +
                             std::to_string(KPLEG_ABI_VERSION)};
  }
  std::memset(const_cast<char(*)[KPLEG_ROOT_NAME_MAX]>(skel->rodata->root_names), 0,
              sizeof(skel->rodata->root_names));
  for (size_t i = 0; i < opts.root_names.size(); ++i) {
    std::memcpy(const_cast<char*>(skel->rodata->root_names[i]), opts.root_names[i].data(),
                opts.root_names[i].size());
  }
  skel->rodata->root_name_count = opts.root_names.size();
  skel->rodata->max_cgroups_per_pod = opts.max_cgroups_per_pod;
  skel->rodata->max_mkdirs_per_pod_per_sec = opts.max_mkdirs_per_pod_per_sec;
  // At most one budget per tracked cgroup (a pod cgroup is tracked).
  bpf_map__set_max_entries(skel->maps.pod_budgets, opts.max_tracked_cgroups);
  bpf_map__set_max_entries(skel->maps.events, opts.ringbuf_bytes);
  // The OOM hook is a classic tracepoint (see core_fixes.bpf.h) and needs tracefs; it is
  // attached on its own so that its absence costs only the OOMKilled hint.
  bpf_program__set_autoattach(skel->progs.oom_mark_victim, false);
  bpf_map__set_max_entries(skel->maps.tracked_cgroups, opts.max_tracked_cgroups);
  // The removal hint is a hint: without its tracepoints (not asked for, or no tracefs; attached
  // after the OOM hook mounted it if need be) removals are swept for as before.
  bpf_map__set_max_entries(skel->maps.removal_watch, opts.max_tracked_cgroups);
  bpf_map__set_max_entries(skel->maps.removal_claims, opts.max_tracked_cgroups);
  // An exec and an exit claim per tracked cgroup (kpleg.bpf.c: claims).
  bpf_map__set_max_entries(skel->maps.claims, 2 * opts.max_tracked_cgroups);
  // Removals before the arming: only with the hint (an LRU map's memory is allocated at once).
  if (!opts.removal_hint) {
    bpf_map__set_max_entries(skel->maps.removal_early, 1);
    bpf_map__set_max_entries(skel->maps.removal_claims, 1);
  }
  bpf_program__set_autoattach(skel->progs.removal_hint_unlinkat, false);
  bpf_program__set_autoattach(skel->progs.removal_hint_rmdir, false);
  // One of each pair of the exec's and the rmdir's programs (kpleg.bpf.c: the wake timer).
  bpf_program__set_autoload(skel->progs.sched_process_exec_untimed, !timers);
  bpf_program__set_autoload(skel->progs.cgroup_rmdir_untimed, !timers);
  bpf_program__set_autoload(skel->progs.sched_process_exec, timers);
  bpf_program__set_autoload(skel->progs.cgroup_rmdir, timers);
  if (!timers) bpf_map__set_autocreate(skel->maps.wake_timers, false);

  if (int err = kpleg_bpf__load(skel); err) {
    err = -err;
    std::string cause = std::strerror(err);
    if (err == EPERM || err == EACCES) {
      cause += " (missing CAP_BPF/CAP_PERFMON or CAP_SYS_ADMIN?)";
    }
    return Error{err, "loading the BPF programs failed: " + cause + "\n" + libbpf_log_tail()};
  }
  return owner;
}

BpfProgram::~BpfProgram() { kpleg_bpf__destroy(skel_); }

Status BpfProgram::attach() {
  if (int err = kpleg_bpf__attach(skel_); err) {
    return Error{-err, std::string("attaching the BPF programs failed: ") + std::strerror(-err)};
  }
  oom_attached_ = attach_oom();
  removal_hints_attached_ = removal_hint_ && attach_removal_hint();
  return {};
}

bool BpfProgram::attach_removal_hint() {
  bpf_link* unlinkat = bpf_program__attach(skel_->progs.removal_hint_unlinkat);
  if (!unlinkat) {
    spdlog::warn("attaching the removal hint (syscalls:sys_enter_unlinkat) failed: {}: removals "
                 "are swept for, without the kernel's hint",
                 std::strerror(errno));
    return false;
  }
  skel_->links.removal_hint_unlinkat = unlinkat;  // destroyed with the skeleton
  bpf_link* rmdir = bpf_program__attach(skel_->progs.removal_hint_rmdir);
  if (!rmdir && errno == ENOENT) {
    // arm64 (and every architecture of the generic syscall table) has no rmdir(2): its libc
    // removes directories with unlinkat(AT_REMOVEDIR), which the hint sees already.
    spdlog::info("no syscalls:sys_enter_rmdir tracepoint (no rmdir syscall on this "
                 "architecture): the removal hint watches unlinkat alone");
    return true;
  }
  if (!rmdir) {
    spdlog::warn("attaching the removal hint (syscalls:sys_enter_rmdir) failed: {}: removals "
                 "are swept for, without the kernel's hint",
                 std::strerror(errno));
    bpf_link__destroy(unlinkat);
    skel_->links.removal_hint_unlinkat = nullptr;
    return false;
  }
  skel_->links.removal_hint_rmdir = rmdir;
  return true;
}

void BpfProgram::set_exit_wakeup(bool wake) {
  // The .data section is mmap'ed into this process (libbpf, Linux 5.5+): a store is seen by
  // the program's next run.
  __atomic_store_n(&skel_->data->exit_wakes, wake ? 1u : 0u, __ATOMIC_RELAXED);
}

bool BpfProgram::exit_wakeup() const {
  return __atomic_load_n(&skel_->data->exit_wakes, __ATOMIC_RELAXED) != 0;
}

void BpfProgram::set_wake_after(std::chrono::nanoseconds exec, std::chrono::nanoseconds rmdir) {
  auto ns = [](std::chrono::nanoseconds d) { return uint64_t(std::max<int64_t>(0, d.count())); };
  __atomic_store_n(&skel_->bss->exec_wake_after_ns, ns(exec), __ATOMIC_RELAXED);
  __atomic_store_n(&skel_->bss->rmdir_wake_after_ns, ns(rmdir), __ATOMIC_RELAXED);
}

std::pair<std::chrono::nanoseconds, std::chrono::nanoseconds> BpfProgram::wake_after() const {
  return {std::chrono::nanoseconds(__atomic_load_n(&skel_->bss->exec_wake_after_ns, __ATOMIC_RELAXED)),
          std::chrono::nanoseconds(__atomic_load_n(&skel_->bss->rmdir_wake_after_ns, __ATOMIC_RELAXED))};
}

bool BpfProgram::watch_removal(const std::string& id) {
  if (id.size() != KPLEG_ID_LEN) return false;
  const uint64_t armed = 1;
  // A fresh arming: the claim of an earlier one goes first (kpleg.bpf.c: removal_claims).
  bpf_map_delete_elem(bpf_map__fd(skel_->maps.removal_claims), id.data());
  return bpf_map_update_elem(bpf_map__fd(skel_->maps.removal_watch), id.data(), &armed,
                             BPF_ANY) == 0;
}

void BpfProgram::unwatch_removal(const std::string& id) {
  if (id.size() != KPLEG_ID_LEN) return;
  bpf_map_delete_elem(bpf_map__fd(skel_->maps.removal_watch), id.data());
  bpf_map_delete_elem(bpf_map__fd(skel_->maps.removal_claims), id.data());
}

bool BpfProgram::take_early_removal(const std::string& id) {
  if (id.size() != KPLEG_ID_LEN) return false;
  const int fd = bpf_map__fd(skel_->maps.removal_early);
  uint64_t at = 0;
  // A look-up and a delete (lookup_and_delete on a hash map needs Linux 5.14).
  if (bpf_map_lookup_elem(fd, id.data(), &at) != 0) return false;
  bpf_map_delete_elem(fd, id.data());
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // bpf_ktime_get_ns()'s clock
  const uint64_t now_ns = uint64_t(now.tv_sec) * 1'000'000'000u + uint64_t(now.tv_nsec);
  return now_ns >= at &&
         now_ns - at <= uint64_t(std::chrono::nanoseconds(kEarlyRemovalWindow).count());
}

size_t BpfProgram::removal_watch_count() const {
  size_t n = 0;
  for_each_key<std::array<char, KPLEG_ID_LEN>>(bpf_map__fd(skel_->maps.removal_watch),
                                               [&n](const auto&) { ++n; });
  return n;
}

bool BpfProgram::attach_oom() {
  auto try_attach = [this] {
    bpf_link* link = bpf_program__attach(skel_->progs.oom_mark_victim);
    if (!link) return false;
    skel_->links.oom_mark_victim = link;  // destroyed with the skeleton
    return true;
  };
  if (try_attach()) return true;
  // tracefs is often not mounted on nodes; the daemon runs privileged, so mount it once.
  struct stat st;
  if (stat("/sys/kernel/tracing/events", &st) != 0 &&
      mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nullptr) == 0) {
    spdlog::info("mounted tracefs at /sys/kernel/tracing for the oom:mark_victim tracepoint");
    if (try_attach()) return true;
  }
  spdlog::warn("oom:mark_victim tracepoint unavailable (tracefs?): OOM kills are not seen in the "
               "kernel; the OOMKilled reason then comes from the runtime alone");
  return false;
}

int BpfProgram::ringbuf_fd() const { return bpf_map__fd(skel_->maps.events); }
int BpfProgram::tracked_map_fd() const { return bpf_map__fd(skel_->maps.tracked_cgroups); }

Status BpfProgram::track(uint64_t cgroup_id, const kpleg_tracked_cgroup& value) {
  if (bpf_map_update_elem(tracked_map_fd(), &cgroup_id, &value, BPF_ANY) != 0) {
    return Error::from_errno(errno, "tracking cgroup " + std::to_string(cgroup_id));
  }
  return {};
}

Result<bool> BpfProgram::untrack(uint64_t cgroup_id) {
  const auto entry = tracked_entry(cgroup_id);
  if (bpf_map_delete_elem(tracked_map_fd(), &cgroup_id) == 0) {
    // Its pod's budget: as the rmdir program does.
    const int fd = bpf_map__fd(skel_->maps.pod_budgets);
    if (entry && entry->pod_id == cgroup_id) {
      bpf_map_delete_elem(fd, &cgroup_id);
    } else if (entry && entry->pod_id != 0) {
      kpleg_pod_budget b{};
      if (bpf_map_lookup_elem(fd, &entry->pod_id, &b) == 0 && b.tracked > 0) {
        --b.tracked;
        bpf_map_update_elem(fd, &entry->pod_id, &b, BPF_EXIST);
      }
    }
    return true;
  }
  if (errno == ENOENT) return false;
  return Error::from_errno(errno, "untracking cgroup " + std::to_string(cgroup_id));
}

std::vector<uint64_t> BpfProgram::tracked_ids() const {
  std::vector<uint64_t> ids;
  for_each_key<uint64_t>(tracked_map_fd(), [&ids](uint64_t id) { ids.push_back(id); });
  return ids;
}

std::optional<kpleg_tracked_cgroup> BpfProgram::tracked_entry(uint64_t cgroup_id) const {
  kpleg_tracked_cgroup v{};
  if (bpf_map_lookup_elem(tracked_map_fd(), &cgroup_id, &v) != 0) return std::nullopt;
  return v;
}

bool BpfProgram::charge_pod(uint64_t pod_id) {
  // Read, add, write: the program may count a mkdir of the same pod in between, and one of
  // the two counts is then lost. The loader charges only cgroups the hook never reported, so
  // this undercounts a pod at most by what it made during a walk.
  const int fd = bpf_map__fd(skel_->maps.pod_budgets);
  kpleg_pod_budget b{};
  if (bpf_map_lookup_elem(fd, &pod_id, &b) != 0) b = {};
  const uint32_t max = skel_->rodata->max_cgroups_per_pod;
  if (max != 0 && b.tracked >= max) {
    ++b.refused;
    bpf_map_update_elem(fd, &pod_id, &b, BPF_ANY);
    return false;
  }
  ++b.tracked;
  bpf_map_update_elem(fd, &pod_id, &b, BPF_ANY);
  return true;
}

std::vector<std::pair<uint64_t, kpleg_pod_budget>> BpfProgram::pod_budgets() const {
  std::vector<std::pair<uint64_t, kpleg_pod_budget>> out;
  const int fd = bpf_map__fd(skel_->maps.pod_budgets);
  for_each_key<uint64_t>(fd, [&](uint64_t id) {
    kpleg_pod_budget b{};
    if (bpf_map_lookup_elem(fd, &id, &b) == 0) out.emplace_back(id, b);
  });
  return out;
}

uint32_t BpfProgram::tracked_capacity() const {
  return bpf_map__max_entries(skel_->maps.tracked_cgroups);
}

bool BpfProgram::is_tracked(uint64_t cgroup_id) const {
  kpleg_tracked_cgroup v;
  return bpf_map_lookup_elem(tracked_map_fd(), &cgroup_id, &v) == 0;
}

size_t BpfProgram::tracked_count() const {
  size_t n = 0;
  for_each_key<uint64_t>(tracked_map_fd(), [&n](uint64_t) { ++n; });
  return n;
}

Result<BpfCounters> BpfProgram::counters() const {
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return Error{-ncpu, "cannot count possible CPUs"};
  std::vector<uint64_t> values(ncpu);
  uint64_t sums[KPLEG_CNT_MAX] = {};
  int fd = bpf_map__fd(skel_->maps.counters);
  for (uint32_t i = 0; i < KPLEG_CNT_MAX; ++i) {
    if (bpf_map_lookup_elem(fd, &i, values.data()) != 0) {
      return Error::from_errno(errno, "reading BPF counter " + std::to_string(i));
    }
    for (auto v : values) sums[i] += v;
  }
  BpfCounters c;
  c.emitted = sums[KPLEG_CNT_EMITTED];
  c.filtered = sums[KPLEG_CNT_FILTERED];
  c.ringbuf_drops = sums[KPLEG_CNT_RINGBUF_DROPS];
  c.helper_failures = sums[KPLEG_CNT_HELPER_FAILURES];
  c.exec_repeated = sums[KPLEG_CNT_EXEC_REPEATED];
  c.exit_ignored = sums[KPLEG_CNT_EXIT_IGNORED];
  c.track_full = sums[KPLEG_CNT_TRACK_FULL];
  c.exec_reexec = sums[KPLEG_CNT_EXEC_REEXEC];
  c.exec_hook = sums[KPLEG_CNT_EXEC_HOOK];
  c.over_budget = sums[KPLEG_CNT_OVER_BUDGET];
  for (int t = 0; t < 5; ++t) c.drops_by_type[t] = sums[KPLEG_CNT_DROPS_MKDIR + t];
  c.drops_by_type[5] = sums[KPLEG_CNT_DROPS_REMOVAL_HINT];
  return c;
}

Result<std::vector<HelperFailure>> BpfProgram::helper_failures() const {
  static const char* kPrograms[KPLEG_PROG_MAX] = {"cgroup_mkdir", "cgroup_rmdir", "exec", "exit",
                                                  "oom",          "removal_hint"};
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return Error{-ncpu, "cannot count possible CPUs"};
  std::vector<uint64_t> values(ncpu);
  const int fd = bpf_map__fd(skel_->maps.helper_failures);
  std::vector<HelperFailure> out;
  for (uint32_t i = 0; i < KPLEG_PROG_MAX * KPLEG_ERRNO_SLOTS; ++i) {
    if (bpf_map_lookup_elem(fd, &i, values.data()) != 0)
      return Error::from_errno(errno, "reading BPF helper failures " + std::to_string(i));
    uint64_t sum = 0;
    for (auto v : values) sum += v;
    if (sum == 0) continue;
    out.push_back({kPrograms[i / KPLEG_ERRNO_SLOTS], int(i % KPLEG_ERRNO_SLOTS), sum});
  }
  return out;
}

Result<uint64_t> BpfProgram::ringbuf_drops() const {
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return Error{-ncpu, "cannot count possible CPUs"};
  std::vector<uint64_t> values(ncpu);
  uint32_t idx = KPLEG_CNT_RINGBUF_DROPS;
  if (bpf_map_lookup_elem(bpf_map__fd(skel_->maps.counters), &idx, values.data()) != 0) {
    return Error::from_errno(errno, "reading the BPF drop counter");
  }
  uint64_t sum = 0;
  for (auto v : values) sum += v;
  return sum;
}

std::vector<ProgramStats> BpfProgram::program_stats() const {
  std::vector<ProgramStats> out;
  bpf_program* prog;
  bpf_object__for_each_program(prog, skel_->obj) {
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len) != 0) continue;
    out.push_back({bpf_program__name(prog), info.run_time_ns, info.run_cnt});
  }
  return out;
}

}  // namespace kpleg::kernel

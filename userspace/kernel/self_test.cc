#include "kernel/self_test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "cgroup/cgroup2_mount.h"

namespace kpleg::kernel {

namespace fs = std::filesystem;

Result<ScratchCgroup> ScratchCgroup::create(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error::from_errno(errno, "mkdir " + path);
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Error::from_errno(errno, "stat " + path);
  return ScratchCgroup(path, st.st_ino);
}

Status ScratchCgroup::remove() {
  if (path_.empty()) return {};
  // Children first (deepest paths first).
  std::vector<std::string> dirs;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(path_, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (ec) break;
    if (it->is_directory(ec)) dirs.push_back(it->path());
  }
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const auto& d : dirs) rmdir(d.c_str());
  if (rmdir(path_.c_str()) != 0 && errno != ENOENT) return Error::from_errno(errno, "rmdir " + path_);
  path_.clear();
  return {};
}

ScratchCgroup::~ScratchCgroup() { (void)remove(); }

Result<pid_t> spawn_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv) {
  std::string procs = cgroup_dir + "/cgroup.procs";
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno(errno, "open " + procs);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(fd);
    return Error::from_errno(err, "fork");
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    if (write(fd, "0", 1) != 1) _exit(126);  // "0" moves the writing process
    close(fd);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

Result<int> wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Error::from_errno(errno, "waitpid");
  }
  return status;
}

Result<int> run_in_cgroup(const std::string& cgroup_dir, const std::vector<std::string>& argv) {
  auto pid = spawn_in_cgroup(cgroup_dir, argv);
  if (!pid) return pid.error();
  return wait_child(*pid);
}

KernelSink EventCollector::sink() {
  KernelSink s;
  s.on_event = [this](const KernelEvent& ev) {
    {
      std::lock_guard lk(mu_);
      events_.push_back(ev);
    }
    cv_.notify_all();
  };
  s.on_loss = [this](uint64_t n) {
    {
      std::lock_guard lk(mu_);
      lost_ += n;
    }
    cv_.notify_all();
  };
  return s;
}

bool EventCollector::wait_for(const std::function<bool(const std::vector<KernelEvent>&)>& pred,
                              std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return pred(events_); });
}

bool EventCollector::wait_accounted(uint64_t n, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return events_.size() + lost_ >= n; });
}

std::vector<KernelEvent> EventCollector::events() const {
  std::lock_guard lk(mu_);
  return events_;
}

std::vector<KernelEvent> filter_cgroups(const std::vector<KernelEvent>& evs,
                                        const std::vector<uint64_t>& ids) {
  std::vector<KernelEvent> out;
  for (const auto& ev : evs) {
    if (std::find(ids.begin(), ids.end(), ev.cgroup_id()) != ids.end()) out.push_back(ev);
  }
  return out;
}

std::vector<KernelEvent> EventCollector::for_cgroups(const std::vector<uint64_t>& ids) const {
  std::lock_guard lk(mu_);
  return filter_cgroups(events_, ids);
}

uint64_t EventCollector::lost() const {
  std::lock_guard lk(mu_);
  return lost_;
}

size_t count_kind(const std::vector<KernelEvent>& evs, const std::string& kind) {
  return std::count_if(evs.begin(), evs.end(), [&](const auto& e) { return kind == e.kind(); });
}

SelfTestResult run_self_test(const BpfOptions& base, const std::string& cgroup_base) {
  SelfTestResult r;
  utsname u{};
  uname(&u);
  r.kernel_release = u.release;
  auto fail = [&r](const std::string& check) { r.failures.push_back(check); };

  auto mount = cgroup::find_cgroup2_mount(cgroup_base);
  if (!mount) {
    fail("cgroup2: " + mount.error().message);
    return r;
  }
  // A private root name, so the self-test never touches a real node's kubepods tree.
  std::string root_name = "kpleg-selftest-" + std::to_string(getpid());
  KernelSourceOptions opts;
  opts.bpf = base;
  opts.bpf.root_names = {root_name};
  opts.bpf.removal_hint = true;  // checked too, for the nodes that turn it on
  opts.cgroup_base = cgroup_base;
  opts.loss_check_interval = std::chrono::milliseconds(100);

  BpfKernelSource source(opts);
  EventCollector events;
  if (auto st = source.start(events.sink()); !st) {
    fail("load/attach: " + st.error().message);
    return r;
  }

  const std::string container_id(64, 'a');
  auto root = ScratchCgroup::create(*mount + "/" + root_name);
  if (!root) {
    fail("mkdir root: " + root.error().message);
    return r;
  }
  auto pod = ScratchCgroup::create(root->path() + "/pod0b1d3c1e-0000-4000-8000-000000000001");
  if (!pod) {
    fail("mkdir pod: " + pod.error().message);
    return r;
  }
  auto ctr = ScratchCgroup::create(pod->path() + "/" + container_id);
  if (!ctr) {
    fail("mkdir container: " + ctr.error().message);
    return r;
  }
  const uint64_t cid = ctr->id();
  // An untracked sibling: what runs there must cost a filter hit and produce nothing.
  auto other = ScratchCgroup::create(*mount + "/" + root_name + "-untracked");
  if (!other) {
    fail("mkdir untracked: " + other.error().message);
    return r;
  }
  const uint64_t filtered_before = source.stats().bpf.filtered;
  if (auto st = run_in_cgroup(other->path(), {"/bin/true"}); !st) {
    fail("run untracked process: " + st.error().message);
    return r;
  }
  // The container's init execs a shell that execs again (like an entrypoint wrapper), and
  // a child exec (like an exec probe); then exits 7.
  auto status = run_in_cgroup(ctr->path(), {"/bin/sh", "-c", "/bin/true; exec /bin/sh -c 'exit 7'"});
  if (!status) {
    fail("run process: " + status.error().message);
    return r;
  }
  // The kernel's removal hint (--removal-hints kernel), armed for the container's id: its
  // cgroup's rmdir is an rmdir of a directory with that name. Optional like the OOM hook
  // (tracefs): checked where it attaches.
  BpfProgram* program = source.program();
  const bool hint_attached = program != nullptr && program->removal_hints_attached();
  const bool hint_armed = hint_attached && program->watch_removal(container_id);
  if (hint_attached && !hint_armed) fail("removal hint: arming the container's id");
  if (auto st = ctr->remove(); !st) fail("rmdir container: " + st.error().message);

  using namespace std::chrono_literals;
  bool complete = events.wait_for(
      [&](const auto& evs) { return count_kind(filter_cgroups(evs, {cid}), "cgroup_rmdir") >= 1; }, 5s);
  if (!complete) fail("rmdir event: not seen within 5 s");
  if (hint_armed) {
    bool hinted = events.wait_for(
        [&](const auto& evs) {
          return std::any_of(evs.begin(), evs.end(), [&](const KernelEvent& e) {
            auto* h = std::get_if<RemovalHint>(&e.body);
            return h != nullptr && h->id == container_id;
          });
        },
        5s);
    if (!hinted) fail("removal hint: not seen within 5 s of the rmdir");
  }

  auto evs = events.for_cgroups({cid});
  std::vector<std::string> kinds;
  for (const auto& e : evs) kinds.push_back(e.kind());
  std::string seq;
  for (const auto& k : kinds) seq += (seq.empty() ? "" : ",") + k;
  if (kinds != std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}) {
    fail("event sequence: want cgroup_mkdir,exec,exit,cgroup_rmdir got " + seq);
  }
  for (const auto& e : evs) {
    if (auto* x = std::get_if<ProcessExit>(&e.body)) {
      if (x->exit_code != 7 || x->signal != 0) {
        fail("exit code: want 7 got " + std::to_string(x->exit_code) + " signal " +
             std::to_string(x->signal));
      }
    }
    if (auto* m = std::get_if<CgroupMkdir>(&e.body)) {
      if (m->path.find(container_id) == std::string::npos) fail("mkdir path: got " + m->path);
    }
  }
  auto st = source.stats();
  if (st.bpf.exec_repeated < 2) {
    fail("exec_repeated counter: want >= 2 got " + std::to_string(st.bpf.exec_repeated));
  }
  if (st.bpf.filtered < filtered_before + 2) {
    fail("filtered counter: want >= " + std::to_string(filtered_before + 2) + " (an untracked exec and exit) got " +
         std::to_string(st.bpf.filtered));
  }
  if (!events.for_cgroups({other->id()}).empty()) fail("events for an untracked cgroup");
  if (st.bpf.ringbuf_drops != 0) fail("ring buffer drops: " + std::to_string(st.bpf.ringbuf_drops));
  if (st.decode_errors != 0) fail("decode errors: " + std::to_string(st.decode_errors));
  source.stop();
  r.passed = r.failures.empty();
  return r;
}

}  // namespace kpleg::kernel

#include "selftest/self_test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <variant>

#include "cgroup/cgroup2_mount.h"
#include "cgroup/cgroup_process.h"
#include "common/result.h"
#include "kernel/kernel_source.h"

namespace kpleg::selftest {
namespace {

using kernel::KernelEvent;
using namespace std::chrono_literals;

// A directory the check makes in the cgroup2 tree, removed when it goes away. The check makes
// them parent first, so they go child first.
class CgroupDir {
 public:
  static Result<CgroupDir> make(const std::string& path) {
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return Error::from_errno(errno, "mkdir " + path);
    }
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return Error::from_errno(errno, "stat " + path);
    return CgroupDir(path, st.st_ino);
  }
  CgroupDir(CgroupDir&& o) noexcept : path_(std::exchange(o.path_, {})), id_(o.id_) {}
  CgroupDir& operator=(CgroupDir&&) = delete;
  CgroupDir(const CgroupDir&) = delete;
  ~CgroupDir() { (void)remove(); }

  const std::string& path() const { return path_; }
  uint64_t id() const { return id_; }  // the cgroup id: the directory's inode number
  Status remove() {
    if (path_.empty()) return {};
    if (rmdir(path_.c_str()) != 0 && errno != ENOENT) return Error::from_errno(errno, "rmdir " + path_);
    path_.clear();
    return {};
  }

 private:
  CgroupDir(std::string path, uint64_t id) : path_(std::move(path)), id_(id) {}
  std::string path_;
  uint64_t id_;
};

// The kernel events the check receives, kept to be waited for and read back.
class EventLog {
 public:
  kernel::KernelSink sink() {
    kernel::KernelSink s;
    s.on_event = [this](const KernelEvent& ev) {
      {
        std::lock_guard lk(mu_);
        events_.push_back(ev);
      }
      cv_.notify_all();
    };
    return s;
  }
  // Whether an event that `matches` has arrived, or arrives within `timeout`.
  bool wait_for(const std::function<bool(const KernelEvent&)>& matches,
                std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout,
                        [&] { return std::any_of(events_.begin(), events_.end(), matches); });
  }
  // The events of one cgroup, in arrival order.
  std::vector<KernelEvent> of_cgroup(uint64_t id) const {
    std::lock_guard lk(mu_);
    std::vector<KernelEvent> out;
    for (const auto& ev : events_) {
      if (ev.cgroup_id() == id) out.push_back(ev);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<KernelEvent> events_;
};

}  // namespace

Report run(const kernel::BpfOptions& base, const std::string& cgroup_base) {
  Report r;
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
  kernel::KernelSourceOptions opts;
  opts.bpf = base;
  opts.bpf.root_names = {root_name};
  opts.bpf.removal_hint = true;  // checked too, for the nodes that turn it on
  opts.cgroup_base = cgroup_base;
  opts.loss_check_interval = std::chrono::milliseconds(100);

  kernel::BpfKernelSource source(opts);
  EventLog events;
  if (auto st = source.start(events.sink()); !st) {
    fail("load/attach: " + st.error().message);
    return r;
  }

  const std::string container_id(64, 'a');
  auto root = CgroupDir::make(*mount + "/" + root_name);
  if (!root) {
    fail("mkdir root: " + root.error().message);
    return r;
  }
  auto pod = CgroupDir::make(root->path() + "/pod0b1d3c1e-0000-4000-8000-000000000001");
  if (!pod) {
    fail("mkdir pod: " + pod.error().message);
    return r;
  }
  auto ctr = CgroupDir::make(pod->path() + "/" + container_id);
  if (!ctr) {
    fail("mkdir container: " + ctr.error().message);
    return r;
  }
  const uint64_t cid = ctr->id();
  // An untracked sibling: what runs there must cost a filter hit and produce nothing.
  auto other = CgroupDir::make(*mount + "/" + root_name + "-untracked");
  if (!other) {
    fail("mkdir untracked: " + other.error().message);
    return r;
  }
  const uint64_t filtered_before = source.stats().bpf.filtered;
  if (auto st = cgroup::run_in_cgroup(other->path(), {"/bin/true"}); !st) {
    fail("run untracked process: " + st.error().message);
    return r;
  }
  // The container's init execs a shell that execs again (like an entrypoint wrapper), and
  // a child exec (like an exec probe); then exits 7.
  auto status = cgroup::run_in_cgroup(ctr->path(), {"/bin/sh", "-c", "/bin/true; exec /bin/sh -c 'exit 7'"});
  if (!status) {
    fail("run process: " + status.error().message);
    return r;
  }
  // The kernel's removal hint (--removal-hints kernel), armed for the container's id: its
  // cgroup's rmdir is an rmdir of a directory with that name. Optional like the OOM hook
  // (tracefs): checked where it attaches.
  kernel::BpfProgram* program = source.program();
  const bool hint_attached = program != nullptr && program->removal_hints_attached();
  const bool hint_armed = hint_attached && program->watch_removal(container_id);
  if (hint_attached && !hint_armed) fail("removal hint: arming the container's id");
  if (auto st = ctr->remove(); !st) fail("rmdir container: " + st.error().message);

  const bool removed = events.wait_for(
      [&](const KernelEvent& e) {
        return e.cgroup_id() == cid && std::holds_alternative<kernel::CgroupRmdir>(e.body);
      },
      5s);
  if (!removed) fail("rmdir event: not seen within 5 s");
  if (hint_armed) {
    const bool hinted = events.wait_for(
        [&](const KernelEvent& e) {
          auto* h = std::get_if<kernel::RemovalHint>(&e.body);
          return h != nullptr && h->id == container_id;
        },
        5s);
    if (!hinted) fail("removal hint: not seen within 5 s of the rmdir");
  }

  auto evs = events.of_cgroup(cid);
  std::vector<std::string> kinds;
  for (const auto& e : evs) kinds.push_back(e.kind());
  std::string seq;
  for (const auto& k : kinds) seq += (seq.empty() ? "" : ",") + k;
  if (kinds != std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}) {
    fail("event sequence: want cgroup_mkdir,exec,exit,cgroup_rmdir got " + seq);
  }
  for (const auto& e : evs) {
    if (auto* x = std::get_if<kernel::ProcessExit>(&e.body)) {
      if (x->exit_code != 7 || x->signal != 0) {
        fail("exit code: want 7 got " + std::to_string(x->exit_code) + " signal " +
             std::to_string(x->signal));
      }
    }
    if (auto* m = std::get_if<kernel::CgroupMkdir>(&e.body)) {
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
  if (!events.of_cgroup(other->id()).empty()) fail("events for an untracked cgroup");
  if (st.bpf.ringbuf_drops != 0) fail("ring buffer drops: " + std::to_string(st.bpf.ringbuf_drops));
  if (st.decode_errors != 0) fail("decode errors: " + std::to_string(st.decode_errors));
  source.stop();
  r.passed = r.failures.empty();
  return r;
}

}  // namespace kpleg::selftest

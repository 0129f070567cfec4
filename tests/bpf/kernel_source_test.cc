// The kernel source against the real kernel: real BPF programs, real cgroups, real processes.
// Every test works in a private cgroup2 subtree (kpleg-bpf-test-<pid>/...) and looks only at
// the events of the cgroups it made, so a runtime on the same machine does not disturb it.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <fstream>
#include <optional>
#include <random>
#include <algorithm>
#include <thread>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "cgroup/cgroup2_mount.h"
#include "kernel/kernel_source.h"
#include "support/event_collector.h"
#include "support/eventually.h"
#include "support/privileged.h"
#include "support/scratch_cgroup.h"

namespace kpleg::kernel {
namespace {

using namespace std::chrono_literals;
using kpleg::testing::count_kind;
using kpleg::testing::eventually;
using kpleg::testing::EventCollector;
using kpleg::testing::filter_cgroups;
using kpleg::testing::run_in_cgroup;
using kpleg::testing::ScratchCgroup;
using kpleg::testing::spawn_in_cgroup;
using kpleg::testing::wait_child;

constexpr auto kDeadline = 5s;
const std::string kPodUid = "0c1d2e3f-4a5b-4c6d-8e7f-000000000001";

std::string hex_id(char c) { return std::string(64, c); }

std::vector<std::string> kinds_of(const std::vector<KernelEvent>& evs) {
  std::vector<std::string> out;
  for (const auto& e : evs) out.push_back(e.kind());
  return out;
}

class KernelSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KPLEG_REQUIRE_OR_SKIP(geteuid() == 0, "needs root to load BPF programs and make cgroups");
    KernelSourceOptions probe;
    auto pf = preflight(probe);
    KPLEG_REQUIRE_OR_SKIP(pf.ok(), pf.ok() ? "" : pf.error().message);
    mount_ = *cgroup::find_cgroup2_mount();
    static int n = 0;
    auto base = ScratchCgroup::create(mount_ + "/kpleg-bpf-test-" + std::to_string(getpid()) + "-" +
                                      std::to_string(n++));
    ASSERT_TRUE(base.ok()) << base.error().message;
    base_.emplace(std::move(*base));
  }

  void start(KernelSourceOptions opts = {}) {
    source_ = std::make_unique<BpfKernelSource>(opts);
    auto st = source_->start(collector_.sink());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  void TearDown() override {
    if (source_) source_->stop();
  }

  // base/kubepods/burstable/pod<uid>/<id>
  std::string container_path(char id_char) {
    return base_->path() + "/kubepods/burstable/pod" + kPodUid + "/" + hex_id(id_char);
  }

  Result<ScratchCgroup> make_tree(const std::string& leaf) {
    // mkdir -p, one level at a time, so the kernel sees each mkdir.
    std::string rel = leaf.substr(base_->path().size());
    std::string cur = base_->path();
    size_t pos = 1;
    while (true) {
      size_t next = rel.find('/', pos);
      cur = base_->path() + rel.substr(0, next);
      if (next == std::string::npos) break;
      if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return Error::from_errno(errno, cur);
      pos = next + 1;
    }
    return ScratchCgroup::create(leaf);
  }

  bool wait_kinds(uint64_t id, const std::vector<std::string>& want) {
    return collector_.wait_for(
        [&](const auto& evs) { return kinds_of(filter_cgroups(evs, {id})).size() >= want.size(); },
        kDeadline);
  }

  // Starts a process in a new container cgroup and expects its exec's record read within 300 ms
  // (no wake-after holds it back); the process is killed and reaped. The cgroup, or nothing when
  // it could not be made.
  std::optional<ScratchCgroup> expect_exec_read_at_once(char id_char) {
    auto ctr = make_tree(container_path(id_char));
    if (!ctr.ok()) {
      ADD_FAILURE() << ctr.error().message;
      return std::nullopt;
    }
    auto pid = spawn_in_cgroup(ctr->path(), {"/bin/sleep", "30"});
    if (!pid.ok()) {
      ADD_FAILURE() << pid.error().message;
      return std::nullopt;
    }
    EXPECT_TRUE(collector_.wait_for(
        [&](const auto& evs) { return kinds_of(filter_cgroups(evs, {ctr->id()})).size() >= 2; },
        300ms))
        << "the exec's record waited";
    kill(*pid, SIGKILL);
    EXPECT_TRUE(wait_child(*pid).ok());
    return std::move(*ctr);
  }

  std::string mount_;
  std::optional<ScratchCgroup> base_;
  EventCollector collector_;
  std::unique_ptr<BpfKernelSource> source_;
};

TEST_F(KernelSourceTest, ContainerLifecycleExactlyOneExecThenExitThenRmdir) {
  start();
  auto ctr = make_tree(container_path('a'));
  ASSERT_TRUE(ctr.ok()) << ctr.error().message;
  const uint64_t id = ctr->id();

  // The init execs itself five more times (an exec chain, like entrypoint wrappers), then exits 3.
  const std::string chain =
      "n=${N:-0}; if [ $n -lt 5 ]; then export N=$((n+1)); exec /bin/sh -c \"$0\" \"$0\"; fi; exit 3";
  auto status = run_in_cgroup(ctr->path(), {"/bin/sh", "-c", chain, chain});
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFEXITED(*status));
  ASSERT_EQ(WEXITSTATUS(*status), 3);
  ASSERT_TRUE(ctr->remove().ok());

  const std::vector<std::string> want{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"};
  ASSERT_TRUE(wait_kinds(id, want)) << "events: " << ::testing::PrintToString(kinds_of(collector_.for_cgroups({id})));
  auto evs = collector_.for_cgroups({id});
  EXPECT_EQ(kinds_of(evs), want);

  const auto& mk = std::get<CgroupMkdir>(evs[0].body);
  EXPECT_EQ(mk.path, container_path('a').substr(mount_.size()));
  const auto& ex = std::get<ProcessExec>(evs[1].body);
  EXPECT_EQ(ex.filename, "/bin/sh");
  const auto& xt = std::get<ProcessExit>(evs[2].body);
  EXPECT_EQ(xt.pid, ex.pid);
  EXPECT_EQ(xt.exit_code, 3u);
  EXPECT_EQ(xt.signal, 0u);
  // Timestamps are ordered like the transitions.
  EXPECT_LT(evs[0].ktime_ns, evs[1].ktime_ns);
  EXPECT_LT(evs[1].ktime_ns, evs[2].ktime_ns);
  EXPECT_LT(evs[2].ktime_ns, evs[3].ktime_ns);

  auto st = source_->stats();
  EXPECT_GE(st.bpf.exec_repeated, 5u);
  EXPECT_EQ(st.bpf.ringbuf_drops, 0u);
  EXPECT_EQ(st.decode_errors, 0u);
}

// A random id: another test process (or a runtime) on the machine never arms the same one.
std::string random_id() {
  static std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id(64, '0');
  for (auto& c : id) c = kHex[rng() % 16];
  return id;
}

std::vector<std::string> hinted_ids(const std::vector<KernelEvent>& evs) {
  std::vector<std::string> out;
  for (const auto& e : evs)
    if (auto* h = std::get_if<RemovalHint>(&e.body)) out.push_back(h->id);
  return out;
}

TEST_F(KernelSourceTest, TheRmdirOfADirectoryNamedByAWatchedIdHintsItsRemovalOncePerArming) {
  KernelSourceOptions opts;
  opts.bpf.removal_hint = true;
  start(opts);
  BpfProgram* prog = source_->program();
  ASSERT_NE(prog, nullptr);
  ASSERT_TRUE(prog->removal_hints_attached()) << "the removal hint's syscall tracepoints";
  char tmpl[] = "/tmp/kpleg-hint-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const int dirfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dirfd, 0);
  auto made = [&](const std::string& name) {
    return mkdir((dir + "/" + name).c_str(), 0755) == 0;
  };

  const std::string watched = random_id(), other = random_id(), forgotten = random_id(),
                    sentinel = random_id();
  ASSERT_TRUE(prog->watch_removal(watched));
  ASSERT_TRUE(prog->watch_removal(forgotten));
  EXPECT_FALSE(prog->watch_removal("abc")) << "not an id";

  // Removed by its full path with rmdir(2), as a C runtime does: one hint.
  ASSERT_TRUE(made(watched));
  ASSERT_EQ(rmdir((dir + "/" + watched).c_str()), 0);
  ASSERT_TRUE(collector_.wait_for([&](const auto& evs) { return !hinted_ids(evs).empty(); },
                                  kDeadline));

  // None of these hints: the same id again (the hint disarmed it), an id nobody watches, a
  // longer name that ends in the watched id, a file named by it, an id no longer watched.
  ASSERT_TRUE(made(watched));
  ASSERT_EQ(unlinkat(AT_FDCWD, (dir + "/" + watched).c_str(), AT_REMOVEDIR), 0);
  ASSERT_TRUE(made(other));
  ASSERT_EQ(rmdir((dir + "/" + other).c_str()), 0);
  // An id nobody armed yet: its removal is remembered for the arming (the runtime may remove a
  // container before its death is confirmed), once.
  EXPECT_TRUE(prog->take_early_removal(other)) << "the removal before the arming was not kept";
  EXPECT_FALSE(prog->take_early_removal(other)) << "answered twice";
  EXPECT_FALSE(prog->take_early_removal(sentinel)) << "never removed";
  EXPECT_FALSE(prog->take_early_removal(watched)) << "armed when removed: hinted instead";
  ASSERT_TRUE(made("x" + forgotten));
  ASSERT_EQ(rmdir((dir + "/x" + forgotten).c_str()), 0);
  const int f = open((dir + "/" + forgotten).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(f, 0);
  close(f);
  ASSERT_EQ(unlinkat(dirfd, forgotten.c_str(), 0), 0);
  prog->unwatch_removal(forgotten);
  ASSERT_TRUE(made(forgotten));
  ASSERT_EQ(rmdir((dir + "/" + forgotten).c_str()), 0);

  // Armed again, removed relative to its parent as Go's os.RemoveAll does at last: a hint. The
  // failing rmdir of a directory not yet empty hints too (it is a hint: userspace looks).
  ASSERT_TRUE(prog->watch_removal(watched));
  ASSERT_TRUE(made(watched));
  ASSERT_TRUE(made(watched + "/rootfs"));
  ASSERT_NE(unlinkat(dirfd, watched.c_str(), AT_REMOVEDIR), 0);
  ASSERT_EQ(errno, ENOTEMPTY);
  ASSERT_EQ(rmdir((dir + "/" + watched + "/rootfs").c_str()), 0);
  ASSERT_EQ(unlinkat(dirfd, watched.c_str(), AT_REMOVEDIR), 0);

  // The sentinel's hint comes after everything above was seen.
  ASSERT_TRUE(prog->watch_removal(sentinel));
  ASSERT_TRUE(made(sentinel));
  ASSERT_EQ(unlinkat(dirfd, sentinel.c_str(), AT_REMOVEDIR), 0);
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) {
        auto ids = hinted_ids(evs);
        return std::find(ids.begin(), ids.end(), sentinel) != ids.end();
      },
      kDeadline));
  EXPECT_EQ(hinted_ids(collector_.events()),
            (std::vector<std::string>{watched, watched, sentinel}));
  EXPECT_EQ(prog->removal_watch_count(), 2u) << "the disarmed ids stay until userspace forgets them";
  close(dirfd);
  rmdir(dir.c_str());
  auto st = source_->stats();
  EXPECT_EQ(st.bpf.drops_by_type[5], 0u);
  EXPECT_EQ(st.decode_errors, 0u);
}

// The removal hint's syscall tracepoints cost every syscall on the node: they are attached
// only when asked for. The rmdir of a container cgroup named by an armed id hints nothing by
// default (with the hint, its record would come before the cgroup's rmdir record).
TEST_F(KernelSourceTest, TheRemovalHintIsNotAttachedUnlessAskedFor) {
  start();
  BpfProgram* prog = source_->program();
  ASSERT_NE(prog, nullptr);
  EXPECT_FALSE(prog->removal_hints_attached());
  auto ctr = make_tree(container_path('c'));
  ASSERT_TRUE(ctr.ok());
  ASSERT_TRUE(prog->watch_removal(hex_id('c')));
  ASSERT_TRUE(ctr->remove().ok());
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) { return count_kind(filter_cgroups(evs, {ctr->id()}), "cgroup_rmdir") == 1; },
      kDeadline));
  EXPECT_TRUE(hinted_ids(collector_.events()).empty());
}

TEST_F(KernelSourceTest, RuntimeReexecThroughAnFdIsNotTheStart) {
  // Like runc's memfd re-exec of `runc init` inside the container's cgroup: the first exec is of
  // /dev/fd/N; the start is the exec of the entrypoint that follows, and its exit is the death.
  start();
  auto ctr = make_tree(container_path('7'));
  ASSERT_TRUE(ctr.ok());
  int fd = open("/bin/sh", O_RDONLY);  // inherited by the child (no O_CLOEXEC)
  ASSERT_GE(fd, 0);
  auto status = run_in_cgroup(ctr->path(), {"/dev/fd/" + std::to_string(fd), "-c",
                                            "exec /bin/sh -c 'exit 6'"});
  close(fd);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 6);
  ASSERT_TRUE(ctr->remove().ok());
  ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  auto evs = collector_.for_cgroups({ctr->id()});
  ASSERT_EQ(kinds_of(evs), (std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  EXPECT_EQ(std::get<ProcessExec>(evs[1].body).filename, "/bin/sh");
  EXPECT_EQ(std::get<ProcessExit>(evs[2].body).exit_code, 6u);
  EXPECT_GE(source_->stats().bpf.exec_reexec, 1u);
}

// Forks a process into `cgroup_dir` that first runs `hook` as its own child (like an OCI
// createContainer/startContainer hook run by the runtime's init), or, with `comm`, names itself
// like a runtime's init and waits until `go_fd` is readable; then execs `entry`.
// Only async-signal-safe calls in the child.
pid_t fork_init_in_cgroup(const std::string& cgroup_dir, const char* hook, const char* comm,
                          int go_fd, const char* entry) {
  std::string procs = cgroup_dir + "/cgroup.procs";
  int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (write(fd, "0", 1) != 1) _exit(126);
    if (comm) prctl(PR_SET_NAME, comm, 0, 0, 0);
    if (go_fd >= 0) {
      char c;
      if (read(go_fd, &c, 1) != 1) _exit(125);
    }
    if (hook) {
      pid_t h = fork();
      if (h == 0) {
        execl(hook, hook, static_cast<char*>(nullptr));
        _exit(127);
      }
      int st;
      waitpid(h, &st, 0);
    }
    execl("/bin/sh", "sh", "-c", entry, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fd);
  return pid;
}

TEST_F(KernelSourceTest, AnOciHookRunBeforeTheEntrypointIsNotTheStart) {
  start();
  auto ctr = make_tree(container_path('4'));
  ASSERT_TRUE(ctr.ok());
  pid_t init = fork_init_in_cgroup(ctr->path(), "/bin/true", nullptr, -1, "exit 5");
  ASSERT_GT(init, 0);
  auto status = wait_child(init);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 5);
  ASSERT_TRUE(ctr->remove().ok());
  ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  auto evs = collector_.for_cgroups({ctr->id()});
  ASSERT_EQ(kinds_of(evs), (std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  const auto& ex = std::get<ProcessExec>(evs[1].body);
  EXPECT_EQ(ex.pid, uint32_t(init)) << "the hook's exec was taken as the start";
  EXPECT_EQ(ex.filename, "/bin/sh");
  EXPECT_EQ(std::get<ProcessExit>(evs[2].body).exit_code, 5u) << "the hook's exit was taken as the death";
  EXPECT_GE(source_->stats().bpf.exec_hook, 1u);
}

TEST_F(KernelSourceTest, AContainerCreatedBeforeTheLoaderStartsOnItsEntrypointsExec) {
  // A created container: the runtime's init sits in the cgroup, waiting for StartContainer.
  auto ctr = make_tree(container_path('3'));
  ASSERT_TRUE(ctr.ok());
  int go[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t init = fork_init_in_cgroup(ctr->path(), nullptr, "runc:[2:INIT]", go[0], "exit 6");
  close(go[0]);
  ASSERT_GT(init, 0);
  ASSERT_TRUE(eventually(  // named and in its cgroup before the walk
      [&] {
        std::ifstream comm("/proc/" + std::to_string(init) + "/comm");
        std::string name;
        std::getline(comm, name);
        return name == "runc:[2:INIT]";
      },
      kDeadline, 1ms))
      << "the init never named itself";
  start();
  // Seeded like a running container (nothing the process controls tells them apart); its
  // init's own exec is still the start.
  EXPECT_EQ(source_->program()->tracked_entry(ctr->id())->exec_seen, uint64_t(KPLEG_EXEC_SEEDED));
  ASSERT_EQ(write(go[1], "g", 1), 1);  // StartContainer
  close(go[1]);
  auto status = wait_child(init);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 6);
  ASSERT_TRUE(wait_kinds(ctr->id(), {"exec", "exit"}));
  auto evs = collector_.for_cgroups({ctr->id()});
  ASSERT_EQ(kinds_of(evs), (std::vector<std::string>{"exec", "exit"}))
      << "the entrypoint's exec must be the start, not a repeat of one before kpleg";
  EXPECT_EQ(std::get<ProcessExec>(evs[0].body).pid, uint32_t(init));
}

// A running workload whose processes call themselves "crun" (any process picks its name): seeded
// as started, with its init. Its probe's exec is no start, and its probe's exit no death; only
// the init's own exec and exit count (an init that execs again is claimed, and the runtime,
// asked, says it is nothing new).
TEST_F(KernelSourceTest, AWorkloadNamingItselfLikeARuntimeIsSeededAsStarted) {
  auto ctr = make_tree(container_path('5'));
  ASSERT_TRUE(ctr.ok());
  int go[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t init = fork_init_in_cgroup(ctr->path(), nullptr, "crun", go[0], "exit 4");
  close(go[0]);
  ASSERT_GT(init, 0);
  ASSERT_TRUE(eventually(
      [&] {
        std::ifstream comm("/proc/" + std::to_string(init) + "/comm");
        std::string name;
        std::getline(comm, name);
        return name == "crun";
      },
      kDeadline, 1ms));
  start();
  auto seeded = source_->program()->tracked_entry(ctr->id());
  ASSERT_TRUE(seeded.has_value());
  EXPECT_EQ(seeded->exec_seen, uint64_t(KPLEG_EXEC_SEEDED)) << "seeded as not started";
  EXPECT_EQ(seeded->init_tgid, uint32_t(init));
  // A probe: exec'd into the cgroup from outside it, exits.
  ASSERT_TRUE(run_in_cgroup(ctr->path(), {"/bin/true"}).ok());
  ASSERT_EQ(write(go[1], "g", 1), 1);
  close(go[1]);
  auto status = wait_child(init);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(wait_kinds(ctr->id(), {"exec", "exit"}));
  auto evs = collector_.for_cgroups({ctr->id()});
  ASSERT_EQ(kinds_of(evs), (std::vector<std::string>{"exec", "exit"}));
  EXPECT_EQ(std::get<ProcessExec>(evs[0].body).pid, uint32_t(init))
      << "the probe's exec was taken for the container's start";
  EXPECT_EQ(std::get<ProcessExit>(evs[1].body).pid, uint32_t(init))
      << "the probe's exit was taken for the container's death";
  EXPECT_EQ(std::get<ProcessExit>(evs[1].body).exit_code, 4u);
}

// One pod making cgroups below its own (DinD, systemd in a container) is held to its budget:
// what is over it is not tracked, is counted for that pod and named once a second; the map
// keeps its room and another pod's container is seen as ever.
TEST_F(KernelSourceTest, APodOverItsCgroupBudgetIsRefusedCountedAndNamedAnotherPodIsSeen) {
  KernelSourceOptions opts;
  opts.bpf.max_cgroups_per_pod = 4;
  opts.bpf.max_mkdirs_per_pod_per_sec = 0;
  std::mutex mu;
  std::vector<CgroupMkdir> notices;
  KernelSink sink = collector_.sink();
  sink.on_over_budget = [&](const CgroupMkdir& mk) {
    std::lock_guard lk(mu);
    notices.push_back(mk);
  };
  source_ = std::make_unique<BpfKernelSource>(opts);
  ASSERT_TRUE(source_->start(sink).ok());

  auto noisy_ctr = make_tree(container_path('6'));  // the pod's container: 1 of its 4
  ASSERT_TRUE(noisy_ctr.ok());
  const uint64_t noisy_pod = source_->tracked_parent(noisy_ctr->id()).value_or(0);
  ASSERT_NE(noisy_pod, 0u);
  auto pod_entry = source_->program()->tracked_entry(noisy_pod);
  ASSERT_TRUE(pod_entry.has_value());
  EXPECT_EQ(pod_entry->pod_id, noisy_pod) << "a pod cgroup is its own budget";
  EXPECT_EQ(source_->program()->tracked_entry(noisy_ctr->id())->pod_id, noisy_pod);
  std::vector<ScratchCgroup> nested;
  for (int i = 0; i < 10; ++i) {
    auto n = ScratchCgroup::create(noisy_ctr->path() + "/n" + std::to_string(i));
    ASSERT_TRUE(n.ok()) << n.error().message;
    nested.push_back(std::move(*n));
  }
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(source_->program()->is_tracked(nested[i].id()), i < 3) << nested[i].path();
  EXPECT_EQ(source_->stats().bpf.over_budget, 7u);
  uint64_t refused = 0, tracked = 0;
  for (const auto& [pod, b] : source_->program()->pod_budgets()) {
    if (pod != noisy_pod) continue;
    refused = b.refused;
    tracked = b.tracked;
  }
  EXPECT_EQ(refused, 7u);
  EXPECT_EQ(tracked, 4u);
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return !notices.empty();
  }));
  {
    std::lock_guard lk(mu);
    EXPECT_LE(notices.size(), 2u) << "one notice per pod and second, not one per refusal";
    EXPECT_TRUE(notices[0].over_budget && notices[0].untracked);
    EXPECT_EQ(notices[0].cgroup_id, nested[3].id());
    EXPECT_NE(notices[0].path.find("pod" + kPodUid), std::string::npos) << notices[0].path;
  }
  // Nothing that runs in a refused cgroup costs a record.
  ASSERT_TRUE(run_in_cgroup(nested[9].path(), {"/bin/true"}).ok());

  // Another pod: tracked, its container's start and death seen.
  auto quiet = make_tree(base_->path() + "/kubepods/besteffort/pod" + std::string(8, '1') +
                         "-2222-4333-8444-555555555555/" + hex_id('7'));
  ASSERT_TRUE(quiet.ok());
  ASSERT_TRUE(run_in_cgroup(quiet->path(), {"/bin/sh", "-c", "exit 3"}).ok());
  ASSERT_TRUE(wait_kinds(quiet->id(), {"cgroup_mkdir", "exec", "exit"}));
  EXPECT_TRUE(collector_.for_cgroups({nested[9].id()}).empty());

  // Room in the budget again once a tracked cgroup goes.
  ASSERT_TRUE(nested[0].remove().ok());
  auto again = ScratchCgroup::create(noisy_ctr->path() + "/again");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(source_->program()->is_tracked(again->id()));
  ASSERT_TRUE(again->remove().ok());
  for (int i = 9; i >= 1; --i) ASSERT_TRUE(nested[i].remove().ok());
}

// Which cgroup is a pod's (whose budget the cgroups below it count against): a child of a root
// or of a QoS level, the QoS levels told by name, in both drivers' layouts.
TEST_F(KernelSourceTest, QosLevelsAreToldApartFromPodsInBothLayouts) {
  start();
  const std::string uid_ = "0c1d2e3f_4a5b_4c6d_8e7f_000000000009";
  for (const std::string& qos : {"/kubepods/burstable", "/kubepods/besteffort",
                                  "/kubepods.slice/kubepods-burstable.slice",
                                  "/kubepods.slice/kubepods-besteffort.slice"}) {
    const bool systemd = qos.find(".slice") != std::string::npos;
    const std::string pod_name = systemd ? qos.substr(qos.rfind('/') + 1, qos.size() - qos.rfind('/') - 7) +
                                               "-pod" + uid_ + ".slice"
                                         : "pod" + kPodUid;
    auto ctr = make_tree(base_->path() + qos + "/" + pod_name + "/" + hex_id('9'));
    ASSERT_TRUE(ctr.ok()) << qos;
    const uint64_t pod = source_->tracked_parent(ctr->id()).value_or(0);
    const uint64_t qos_id = source_->tracked_parent(pod).value_or(0);
    ASSERT_NE(qos_id, 0u) << qos;
    EXPECT_EQ(source_->program()->tracked_entry(qos_id)->kind, uint32_t(KPLEG_TRACKED_QOS)) << qos;
    EXPECT_EQ(source_->program()->tracked_entry(qos_id)->pod_id, 0u) << qos;
    EXPECT_EQ(source_->program()->tracked_entry(pod)->pod_id, pod) << pod_name;
    EXPECT_EQ(source_->program()->tracked_entry(ctr->id())->pod_id, pod) << pod_name;
  }
  // A guaranteed pod sits right below the root.
  auto guaranteed = make_tree(base_->path() + "/kubepods/pod" + kPodUid + "/" + hex_id('a'));
  ASSERT_TRUE(guaranteed.ok());
  const uint64_t pod = source_->tracked_parent(guaranteed->id()).value_or(0);
  EXPECT_EQ(source_->program()->tracked_entry(pod)->pod_id, pod);
}

// `kubelet --cgroup-root=/x` puts its pods at /x/kubepods/<qos>/pod<uid>, and `--cgroup-root x`
// makes x the tracked root: kubepods and the QoS level below it are levels, each pod has a budget
// of its own (not one budget, kubepods's, for every pod of the node), whether the cgroups were
// there before the start (the walk) or made after it (the mkdir program).
TEST_F(KernelSourceTest, KubepodsBelowARootOfAnotherNameIsALevelEachPodHasItsOwnBudget) {
  const std::string root_name = "kpleg-test-root-" + std::to_string(getpid());
  const std::string qos = base_->path() + "/" + root_name + "/kubepods/besteffort";
  const std::string pod_a = qos + "/pod" + kPodUid;
  const std::string pod_b = qos + "/pod" + std::string(8, '2') + "-2222-4333-8444-555555555555";
  auto before = make_tree(pod_a + "/" + hex_id('1'));  // there before the start: the walk
  ASSERT_TRUE(before.ok()) << before.error().message;
  KernelSourceOptions opts;
  opts.bpf.root_names = {root_name};
  opts.bpf.max_cgroups_per_pod = 2;
  opts.bpf.max_mkdirs_per_pod_per_sec = 0;
  start(opts);
  auto after = make_tree(pod_b + "/" + hex_id('2'));  // made after it: the mkdir program
  ASSERT_TRUE(after.ok()) << after.error().message;
  for (const auto* ctr : {&*before, &*after}) {
    const uint64_t pod = source_->tracked_parent(ctr->id()).value_or(0);
    ASSERT_NE(pod, 0u) << ctr->path();
    const uint64_t qos_id = source_->tracked_parent(pod).value_or(0);
    const uint64_t kubepods = source_->tracked_parent(qos_id).value_or(0);
    ASSERT_NE(kubepods, 0u) << ctr->path();
    EXPECT_EQ(source_->program()->tracked_entry(kubepods)->kind, uint32_t(KPLEG_TRACKED_QOS));
    EXPECT_EQ(source_->program()->tracked_entry(qos_id)->kind, uint32_t(KPLEG_TRACKED_QOS));
    EXPECT_EQ(source_->program()->tracked_entry(pod)->pod_id, pod) << ctr->path();
    EXPECT_EQ(source_->program()->tracked_entry(ctr->id())->pod_id, pod) << ctr->path();
  }
  // Two pods, two budgets of 2: each pod's second container is tracked (one shared budget
  // would have refused the second pod's).
  auto a2 = ScratchCgroup::create(pod_a + "/" + hex_id('3'));
  auto b2 = ScratchCgroup::create(pod_b + "/" + hex_id('4'));
  ASSERT_TRUE(a2.ok() && b2.ok());
  EXPECT_TRUE(source_->program()->is_tracked(a2->id()));
  EXPECT_TRUE(source_->program()->is_tracked(b2->id()));
  EXPECT_EQ(source_->stats().bpf.over_budget, 0u);
  ASSERT_TRUE(a2->remove().ok());
  ASSERT_TRUE(b2->remove().ok());
}

// A mkdir/rmdir loop below one pod: held to its mkdirs per second, the rest counted.
TEST_F(KernelSourceTest, APodsMkdirLoopIsHeldToItsRatePerSecond) {
  KernelSourceOptions opts;
  opts.bpf.max_cgroups_per_pod = 0;
  opts.bpf.max_mkdirs_per_pod_per_sec = 5;
  start(opts);
  auto ctr = make_tree(container_path('8'));
  ASSERT_TRUE(ctr.ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    auto n = ScratchCgroup::create(ctr->path() + "/loop");
    ASSERT_TRUE(n.ok());
    ASSERT_TRUE(n->remove().ok());
  }
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::steady_clock::now() - t0).count() + 1;
  // Every tracked mkdir has its rmdir: wait for the last rmdirs, then count.
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) {
        size_t mk = 0, rm = 0;
        for (const auto& e : evs) {
          if (auto* m = std::get_if<CgroupMkdir>(&e.body); m && m->parent_cgroup_id == ctr->id())
            mk += !m->untracked;
          if (auto* r = std::get_if<CgroupRmdir>(&e.body); r && r->parent_cgroup_id == ctr->id())
            ++rm;
        }
        return mk > 0 && rm == mk;
      },
      kDeadline));
  size_t admitted = 0;
  for (const auto& e : collector_.events())
    if (auto* m = std::get_if<CgroupMkdir>(&e.body); m && m->parent_cgroup_id == ctr->id() && !m->untracked)
      ++admitted;
  // The container's own mkdir counts in the first window too.
  EXPECT_LE(admitted, size_t(5 * (seconds + 1))) << seconds << " s";
  EXPECT_GE(source_->stats().bpf.over_budget, 200u - admitted);
}

TEST_F(KernelSourceTest, ExitBySignalReportsTheSignal) {
  start();
  auto ctr = make_tree(container_path('b'));
  ASSERT_TRUE(ctr.ok());
  auto pid = spawn_in_cgroup(ctr->path(), {"/bin/sleep", "30"});
  ASSERT_TRUE(pid.ok());
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) { return count_kind(filter_cgroups(evs, {ctr->id()}), "exec") == 1; },
      kDeadline));
  kill(*pid, SIGKILL);
  auto status = wait_child(*pid);
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFSIGNALED(*status));
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) { return count_kind(filter_cgroups(evs, {ctr->id()}), "exit") == 1; },
      kDeadline));
  for (const auto& e : collector_.for_cgroups({ctr->id()})) {
    if (auto* x = std::get_if<ProcessExit>(&e.body)) {
      EXPECT_EQ(x->signal, unsigned(SIGKILL));
      EXPECT_EQ(x->exit_code, 0u);
      EXPECT_EQ(x->pid, unsigned(*pid));
    }
  }
}

// A memory limit of 32 MiB for a test process in the tracked cgroup `ctr`: on a hybrid host a
// cgroup of the v1 memory hierarchy (the shell joins it with the returned command), on a pure
// cgroup2 host `ctr` itself (memory enabled down to it). Removed with the object.
class MemoryLimit {
 public:
  static Result<MemoryLimit> create(const std::string& mount, const std::string& ctr,
                                    const std::string& name) {
    MemoryLimit m;
    const std::string v1 = "/sys/fs/cgroup/memory";
    if (access((v1 + "/memory.limit_in_bytes").c_str(), F_OK) == 0) {
      m.dir_ = v1 + "/" + name;
      if (mkdir(m.dir_.c_str(), 0755) != 0 && errno != EEXIST) return Error::from_errno(errno, m.dir_);
      if (!write(m.dir_ + "/memory.limit_in_bytes", "33554432"))
        return Error{EIO, "cannot limit " + m.dir_};
      write(m.dir_ + "/memory.memsw.limit_in_bytes", "33554432");  // absent without swap accounting
      m.join_ = "echo $$ > " + m.dir_ + "/cgroup.procs; ";
      return m;
    }
    // cgroup2: every level from the mount down to ctr's parent passes the controller on.
    for (size_t at = mount.size(); at != std::string::npos && at < ctr.size();
         at = ctr.find('/', at + 1)) {
      if (!write(ctr.substr(0, at) + "/cgroup.subtree_control", "+memory"))
        return Error{ENOTSUP, "no memory controller to delegate below " + ctr.substr(0, at)};
    }
    if (!write(ctr + "/memory.max", "33554432")) return Error{ENOTSUP, "cannot limit " + ctr};
    return m;
  }
  MemoryLimit(MemoryLimit&& o) noexcept : dir_(std::exchange(o.dir_, "")), join_(o.join_) {}
  ~MemoryLimit() {
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  // Shell commands that put the shell under the limit.
  const std::string& join() const { return join_; }

 private:
  MemoryLimit() = default;
  static bool write(const std::string& path, const std::string& value) {
    std::ofstream f(path);
    f << value;
    f.flush();
    return bool(f);
  }
  std::string dir_, join_;
};

// The exit record says whether the OOM killer ended the init itself, read off the dying process
// (oom:mark_victim runs in the allocating task's context, which need not be the victim's
// container, and a child's OOM kill does not end the container).
TEST_F(KernelSourceTest, AnOomKilledInitsExitSaysSoAndAChildsOomKillDoesNot) {
  start();
  auto run = [&](char id, const std::string& script) -> std::optional<ProcessExit> {
    auto ctr = make_tree(container_path(id));
    EXPECT_TRUE(ctr.ok());
    if (!ctr.ok()) return std::nullopt;
    auto limit = MemoryLimit::create(mount_, ctr->path(),
                                     "kpleg-oom-test-" + std::to_string(getpid()) + id);
    EXPECT_TRUE(limit.ok()) << limit.error().message;
    if (!limit.ok()) return std::nullopt;
    auto status = run_in_cgroup(ctr->path(), {"/bin/sh", "-c", limit->join() + script});
    EXPECT_TRUE(status.ok());
    EXPECT_TRUE(collector_.wait_for(
        [&](const auto& evs) { return count_kind(filter_cgroups(evs, {ctr->id()}), "exit") == 1; },
        kDeadline));
    for (const auto& e : collector_.for_cgroups({ctr->id()}))
      if (auto* x = std::get_if<ProcessExit>(&e.body)) return *x;
    return std::nullopt;
  };
  auto killed = run('e', "exec tail /dev/zero");
  ASSERT_TRUE(killed.has_value());
  EXPECT_EQ(killed->signal, unsigned(SIGKILL));
  EXPECT_TRUE(killed->oom_killed);

  auto survivor = run('f', "tail /dev/zero; exit 3");
  ASSERT_TRUE(survivor.has_value());
  EXPECT_EQ(survivor->exit_code, 3u);
  EXPECT_EQ(survivor->signal, 0u);
  EXPECT_FALSE(survivor->oom_killed);
}

TEST_F(KernelSourceTest, UntrackedCgroupProducesNothingFor1000Execs) {
  start();
  auto other = make_tree(base_->path() + "/not-kubernetes/" + hex_id('c'));
  ASSERT_TRUE(other.ok());
  auto before = source_->stats().bpf.filtered;
  // One process execs 1,000 times in the untracked cgroup.
  auto status = run_in_cgroup(other->path(),
                              {"/bin/sh", "-c", "i=0; while [ $i -lt 1000 ]; do /bin/true; i=$((i+1)); done"});
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  // A tracked container started afterwards is a barrier: once its exec arrived, anything the
  // untracked execs produced would have arrived before it.
  auto barrier = make_tree(container_path('d'));
  ASSERT_TRUE(barrier.ok());
  ASSERT_TRUE(run_in_cgroup(barrier->path(), {"/bin/true"}).ok());
  ASSERT_TRUE(wait_kinds(barrier->id(), {"cgroup_mkdir", "exec", "exit"}));
  EXPECT_TRUE(collector_.for_cgroups({other->id()}).empty());
  EXPECT_GE(source_->stats().bpf.filtered - before, 2000u) << "each exec and exit is filtered";
}

// A container cgroup's mkdir wakes nobody: its record is read with the next record that wakes
// the reader, here the exec of the container's init, and comes before it.
TEST_F(KernelSourceTest, AMkdirWakesNobodyAndIsReadWithTheExecAfterIt) {
  start();
  auto pod = make_tree(base_->path() + "/kubepods/besteffort/pod" + kPodUid);
  ASSERT_TRUE(pod.ok());
  // The pod's own cgroups' mkdirs sit unread too: a record that wakes brings them along.
  auto first = ScratchCgroup::create(pod->path() + "/" + hex_id('1'));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(run_in_cgroup(first->path(), {"/bin/true"}).ok());
  ASSERT_TRUE(wait_kinds(first->id(), {"cgroup_mkdir", "exec", "exit"}));
  // Any other tracked cgroup on this machine (a runtime's pods) may wake the reader meanwhile:
  // a try is then inconclusive, and made again.
  bool seen_asleep = false;
  for (int attempt = 0; attempt < 5 && !seen_asleep; ++attempt) {
    const size_t before = collector_.events().size();
    auto ctr = ScratchCgroup::create(pod->path() + "/" + hex_id(char('a' + attempt)));
    ASSERT_TRUE(ctr.ok());
    ASSERT_TRUE(source_->program()->is_tracked(ctr->id())) << "the kernel side saw the mkdir";
    // The absence is the behaviour under test: give a woken reader ample time to read.
    std::this_thread::sleep_for(300ms);
    const auto evs = collector_.events();
    const bool arrived = !filter_cgroups(evs, {ctr->id()}).empty();
    if (!arrived) seen_asleep = true;
    else if (evs.size() == before + 1)
      ADD_FAILURE() << "the mkdir record alone woke the reader";
    ASSERT_TRUE(run_in_cgroup(ctr->path(), {"/bin/sh", "-c", "exit 2"}).ok());
    ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit"}));
    EXPECT_EQ(kinds_of(collector_.for_cgroups({ctr->id()})),
              (std::vector<std::string>{"cgroup_mkdir", "exec", "exit"}));
  }
  EXPECT_TRUE(seen_asleep) << "in 5 tries, another cgroup woke the reader every time";
}

// While the tracker has switched exit wakeups off (the runtime removes the cgroup right after
// the init dies), an init's exit wakes nobody: it is read with the cgroup's rmdir, before it.
// An OOM kill would still wake; switched back on, an exit wakes again.
TEST_F(KernelSourceTest, AnExitWakesNobodyWhileExitWakeupIsOffAndIsReadWithTheRmdir) {
  start();
  auto* program = source_->program();
  ASSERT_TRUE(program->exit_wakeup()) << "on at load";
  program->set_exit_wakeup(false);
  bool seen_asleep = false;
  for (int attempt = 0; attempt < 5 && !seen_asleep; ++attempt) {
    auto ctr = make_tree(container_path(char('a' + attempt)));
    ASSERT_TRUE(ctr.ok());
    auto pid = spawn_in_cgroup(ctr->path(), {"/bin/sleep", "30"});
    ASSERT_TRUE(pid.ok());
    ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec"}));
    kill(*pid, SIGKILL);
    ASSERT_TRUE(wait_child(*pid).ok());
    // The absence is the behaviour under test: give a woken reader ample time to read. Any
    // other tracked cgroup on this machine may wake the reader meanwhile: a try is then
    // inconclusive, and made again.
    std::this_thread::sleep_for(300ms);
    if (collector_.for_cgroups({ctr->id()}).size() == 2) seen_asleep = true;
    ASSERT_TRUE(ctr->remove().ok());
    ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
    EXPECT_EQ(kinds_of(collector_.for_cgroups({ctr->id()})),
              (std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  }
  EXPECT_TRUE(seen_asleep) << "in 5 tries, the exit (or another cgroup) woke the reader every time";

  // On again: the exit is read without an rmdir.
  program->set_exit_wakeup(true);
  auto ctr = make_tree(container_path('f'));
  ASSERT_TRUE(ctr.ok());
  ASSERT_TRUE(run_in_cgroup(ctr->path(), {"/bin/sh", "-c", "exit 3"}).ok());
  ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit"}));
}

// Whether the running kernel is at least major.minor (uname's release).
bool kernel_at_least(int major, int minor) {
  utsname u{};
  if (uname(&u) != 0) return false;
  int ma = 0, mi = 0;
  if (std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

// With a wake-after (the tracker's learned lag, kpleg.bpf.c: the wake timer), a container's exec
// and its cgroup's rmdir wake nobody when they are made: their records are read when the wake
// timer fires, that long after them (or with anything that wakes the reader before). Set back to
// 0, the exec wakes the reader at once again.
TEST_F(KernelSourceTest, AnExecAndAnRmdirWakeTheReaderWhenTheirWakeAfterIsUp) {
  start();
  auto* program = source_->program();
  ASSERT_EQ(program->wake_timer(), kernel_at_least(5, 15))
      << "the programs with the wake timer load where the kernel has bpf_timer (5.15+)";
  if (!program->wake_timer()) return;  // the twins without it: checked in the next test
  constexpr auto kAfter = 1500ms;
  program->set_wake_after(kAfter, kAfter);
  EXPECT_EQ(program->wake_after(), std::make_pair(std::chrono::nanoseconds(kAfter),
                                                  std::chrono::nanoseconds(kAfter)));
  bool seen_asleep = false;
  for (int attempt = 0; attempt < 5 && !seen_asleep; ++attempt) {
    auto ctr = make_tree(container_path(char('a' + attempt)));
    ASSERT_TRUE(ctr.ok());
    auto pid = spawn_in_cgroup(ctr->path(), {"/bin/sleep", "30"});
    ASSERT_TRUE(pid.ok());
    // The absence is the behaviour under test: give a woken reader ample time to read. Any
    // other tracked cgroup on this machine may wake the reader meanwhile: a try is then
    // inconclusive, and made again.
    std::this_thread::sleep_for(300ms);
    const bool exec_asleep = collector_.for_cgroups({ctr->id()}).empty();
    // Nothing else need wake it: the timer does.
    ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec"}));
    kill(*pid, SIGKILL);
    ASSERT_TRUE(wait_child(*pid).ok());
    ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit"}));  // the exit wakes
    ASSERT_TRUE(ctr->remove().ok());
    std::this_thread::sleep_for(300ms);
    const bool rmdir_asleep = collector_.for_cgroups({ctr->id()}).size() == 3;
    ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
    EXPECT_EQ(kinds_of(collector_.for_cgroups({ctr->id()})),
              (std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
    seen_asleep = exec_asleep && rmdir_asleep;
  }
  EXPECT_TRUE(seen_asleep) << "in 5 tries, the exec or the rmdir (or another cgroup) woke the "
                              "reader before its wake-after every time";

  // Back to 0: the exec wakes the reader when it is made.
  program->set_wake_after(0ms, 0ms);
  expect_exec_read_at_once('f');
}

// Loaded without the wake timer (BpfOptions::wake_timer off, or a kernel before 5.15), the
// programs' twins make records that wake the reader at once, whatever the wake-after.
TEST_F(KernelSourceTest, WithoutTheWakeTimerAnExecWakesTheReaderAtOnce) {
  KernelSourceOptions opts;
  opts.bpf.wake_timer = false;
  start(opts);
  auto* program = source_->program();
  ASSERT_FALSE(program->wake_timer());
  program->set_wake_after(1500ms, 1500ms);
  auto ctr = expect_exec_read_at_once('a');
  ASSERT_TRUE(ctr.has_value());
  ASSERT_TRUE(ctr->remove().ok());
  ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
}

TEST_F(KernelSourceTest, ForkedChildrenThatExecAddNoLifecycleEvents) {
  start();
  auto ctr = make_tree(container_path('e'));
  ASSERT_TRUE(ctr.ok());
  // The init forks 10 children that exec, waits for them, then exits 0.
  auto status = run_in_cgroup(ctr->path(), {"/bin/sh", "-c",
                                            "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true & done; wait; exit 0"});
  ASSERT_TRUE(status.ok());
  ASSERT_TRUE(ctr->remove().ok());
  ASSERT_TRUE(wait_kinds(ctr->id(), {"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  auto evs = collector_.for_cgroups({ctr->id()});
  EXPECT_EQ(kinds_of(evs), (std::vector<std::string>{"cgroup_mkdir", "exec", "exit", "cgroup_rmdir"}));
  auto st = source_->stats();
  EXPECT_GE(st.bpf.exec_repeated, 10u);
  EXPECT_GE(st.bpf.exit_ignored, 10u);
}

TEST_F(KernelSourceTest, CgroupsThatExistedBeforeTheLoaderAreTracked) {
  // Made before the source starts: an empty container cgroup and one with a running init.
  auto idle = make_tree(container_path('f'));
  auto busy = make_tree(container_path('9'));
  ASSERT_TRUE(idle.ok() && busy.ok());
  auto pid = spawn_in_cgroup(busy->path(), {"/bin/sleep", "30"});
  ASSERT_TRUE(pid.ok());
  // The child must be in the cgroup before the walk; wait until cgroup.procs lists it.
  ASSERT_TRUE(eventually(
      [&] {
        std::ifstream procs(busy->path() + "/cgroup.procs");
        std::string line;
        return std::getline(procs, line) && !line.empty();
      },
      kDeadline, 1ms))
      << "child never joined its cgroup";
  start();
  EXPECT_TRUE(source_->program()->is_tracked(idle->id()));
  EXPECT_TRUE(source_->program()->is_tracked(busy->id()));
  EXPECT_GE(source_->stats().seeded_cgroups, 5u);  // kubepods, burstable, pod, 2 containers

  // The running container's start predates kpleg: an exec probe now is not a start.
  auto probe = run_in_cgroup(busy->path(), {"/bin/true"});
  ASSERT_TRUE(probe.ok());
  // Its init's death is news.
  kill(*pid, SIGTERM);
  ASSERT_TRUE(wait_child(*pid).ok());
  // The idle container starts now: its first exec is a start.
  auto run = run_in_cgroup(idle->path(), {"/bin/sh", "-c", "exit 4"});
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(wait_kinds(idle->id(), {"exec", "exit"}));
  ASSERT_TRUE(wait_kinds(busy->id(), {"exit"}));
  EXPECT_EQ(kinds_of(collector_.for_cgroups({busy->id()})), std::vector<std::string>{"exit"});
  EXPECT_EQ(kinds_of(collector_.for_cgroups({idle->id()})), (std::vector<std::string>{"exec", "exit"}));
  for (const auto& e : collector_.for_cgroups({busy->id()})) {
    EXPECT_EQ(std::get<ProcessExit>(e.body).signal, unsigned(SIGTERM));
  }
}

TEST_F(KernelSourceTest, AFullTrackedMapFlagsNewCgroupsAndAResyncTracksThemOnceThereIsRoom) {
  // How many cgroups this machine already has under tracked roots (a runtime's pods): the map
  // is then sized for them, this test's pod tree (3) and `room` (at least 4) of its room + 2
  // containers.
  size_t existing = 0;
  {
    BpfKernelSource probe(KernelSourceOptions{});
    ASSERT_TRUE(probe.start(KernelSink{}).ok());
    existing = probe.program()->tracked_count();
  }
  KernelSourceOptions opts;
  opts.bpf.max_tracked_cgroups = std::max<uint32_t>(kMinTrackedCgroups, uint32_t(existing) + 3 + 4);
  // Room for the pod tree and `room` containers; two more than that are made.
  const size_t room = opts.bpf.max_tracked_cgroups - existing - 3;
  std::mutex mu;
  std::vector<std::string> untracked_paths;
  KernelSink sink = collector_.sink();
  sink.on_untracked = [&](const std::string& path) {
    std::lock_guard lk(mu);
    untracked_paths.push_back(path);
  };
  source_ = std::make_unique<BpfKernelSource>(opts);
  ASSERT_TRUE(source_->start(sink).ok());
  ASSERT_EQ(source_->stats().untracked_cgroups, 0u);

  auto pod = make_tree(base_->path() + "/kubepods/besteffort/pod" + kPodUid);
  ASSERT_TRUE(pod.ok());
  ASSERT_TRUE(source_->program()->is_tracked(pod->id()));
  std::vector<ScratchCgroup> ctrs;
  std::vector<uint64_t> ids;
  for (char c : std::string("abcdefghijkl").substr(0, room + 2)) {
    auto ctr = ScratchCgroup::create(pod->path() + "/" + hex_id(c));
    ASSERT_TRUE(ctr.ok()) << ctr.error().message;
    ids.push_back(ctr->id());
    ctrs.push_back(std::move(*ctr));
  }
  // Every mkdir is reported, tracked or not, and says which it is.
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) { return filter_cgroups(evs, ids).size() == ids.size(); }, kDeadline));
  std::vector<size_t> tracked, flagged;
  for (const auto& ev : collector_.for_cgroups(ids)) {
    const auto& mk = std::get<CgroupMkdir>(ev.body);
    const size_t i = std::find(ids.begin(), ids.end(), mk.cgroup_id) - ids.begin();
    EXPECT_EQ(mk.untracked, !source_->program()->is_tracked(mk.cgroup_id)) << mk.path;
    (mk.untracked ? flagged : tracked).push_back(i);
  }
  ASSERT_GE(flagged.size(), 2u) << "the map had room for more than " << room << " of them";
  {
    std::lock_guard lk(mu);
    EXPECT_EQ(untracked_paths.size(), flagged.size());
  }
  auto st = source_->stats();
  EXPECT_EQ(st.untracked_cgroups, flagged.size());
  EXPECT_GE(st.bpf.track_full, flagged.size());
  EXPECT_EQ(st.map_capacity, opts.bpf.max_tracked_cgroups);
  // Each refused map update is a helper failure of the mkdir program, with the kernel's errno.
  auto failures = source_->program()->helper_failures();
  ASSERT_TRUE(failures.ok()) << failures.error().message;
  uint64_t e2big = 0;
  for (const auto& f : *failures) {
    EXPECT_EQ(f.program, "cgroup_mkdir") << f.error;
    if (f.error == E2BIG) e2big = f.count;
  }
  EXPECT_GE(e2big, flagged.size()) << "map-full updates not counted as (cgroup_mkdir, E2BIG)";
  EXPECT_EQ(st.bpf.helper_failures, e2big);

  // An untracked container is blind: its init's exec and exit are not seen.
  const size_t blind = flagged.front();
  ASSERT_TRUE(run_in_cgroup(ctrs[blind].path(), {"/bin/true"}).ok());

  // Room again: the tracked containers go away. A stale entry (a cgroup id that exists
  // nowhere, as one removed during the start-up walk leaves behind) takes one slot.
  for (size_t i : tracked) ASSERT_TRUE(ctrs[i].remove().ok());
  ASSERT_TRUE(collector_.wait_for(
      [&](const auto& evs) {
        std::vector<uint64_t> gone;
        for (size_t i : tracked) gone.push_back(ids[i]);
        return count_kind(filter_cgroups(evs, gone), "cgroup_rmdir") == tracked.size();
      },
      kDeadline));
  const uint64_t stale_id = (uint64_t(1) << 62) + 12345;
  ASSERT_TRUE(source_->program()->track(stale_id, kpleg_tracked_cgroup{KPLEG_TRACKED_DESCENDANT, 0, 0, 0}).ok());

  auto r = source_->resync_tracked();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->walk_complete);
  EXPECT_GE(r->added, flagged.size());
  EXPECT_EQ(r->still_full, 0u);
  EXPECT_GE(r->stale, 1u);
  EXPECT_FALSE(source_->program()->is_tracked(stale_id));
  for (size_t i : flagged) EXPECT_TRUE(source_->program()->is_tracked(ids[i])) << ctrs[i].path();
  st = source_->stats();
  EXPECT_EQ(st.untracked_cgroups, 0u);
  EXPECT_GE(st.stale_removed, 1u);

  // Now seen: the formerly blind container's init starts and dies.
  ASSERT_TRUE(run_in_cgroup(ctrs[blind].path(), {"/bin/sh", "-c", "exit 7"}).ok());
  ASSERT_TRUE(wait_kinds(ids[blind], {"cgroup_mkdir", "exec", "exit"}))
      << ::testing::PrintToString(kinds_of(collector_.for_cgroups({ids[blind]})));
  EXPECT_EQ(kinds_of(collector_.for_cgroups({ids[blind]})),
            (std::vector<std::string>{"cgroup_mkdir", "exec", "exit"}));
}

TEST_F(KernelSourceTest, TinyRingBufferReportsExactlyWhatWasLost) {
  // A consumer stalled behind a slow sink, as in a daemon that cannot keep up: the first record
  // blocks the consumer thread until the burst is over, so the one-page ring buffer overflows.
  // The gate is shared with the sink, which the consumer thread may still be calling (for the
  // rmdir records of the clean-up) after this test body has returned.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    void release() {
      {
        std::lock_guard lk(mu);
        open = true;
      }
      cv.notify_all();
    }
  };
  auto gate = std::make_shared<Gate>();
  // A failed assertion below must not leave the consumer thread blocked for TearDown to join.
  struct ReleaseOnExit {
    std::shared_ptr<Gate> g;
    ~ReleaseOnExit() { g->release(); }
  } release_on_exit{gate};
  auto inner = collector_.sink();
  KernelSink gated;
  gated.on_event = [gate, inner](const KernelEvent& ev) {
    {
      std::unique_lock lk(gate->mu);
      gate->cv.wait(lk, [&] { return gate->open; });
    }
    inner.on_event(ev);
  };
  gated.on_loss = inner.on_loss;

  KernelSourceOptions opts;
  opts.bpf.ringbuf_bytes = uint32_t(sysconf(_SC_PAGESIZE));
  // One pod's burst of 300 cgroups: over its default budget, which is not what this tests.
  opts.bpf.max_cgroups_per_pod = 0;
  opts.bpf.max_mkdirs_per_pod_per_sec = 0;
  // The default: no timer; the loss is found by the check after the drain that follows it.
  ASSERT_EQ(opts.loss_check_interval.count(), 0);
  source_ = std::make_unique<BpfKernelSource>(opts);
  ASSERT_TRUE(source_->start(gated).ok());

  constexpr int kBurst = 300;  // cgroup records: 3 parents + 300 containers
  auto pod = make_tree(base_->path() + "/kubepods/besteffort/pod" + kPodUid);
  ASSERT_TRUE(pod.ok());
  std::vector<ScratchCgroup> burst;
  for (int i = 0; i < kBurst; ++i) {
    char id[65];
    snprintf(id, sizeof(id), "%064x", i);
    auto c = ScratchCgroup::create(pod->path() + "/" + id);
    ASSERT_TRUE(c.ok());
    burst.push_back(std::move(*c));
  }
  const uint64_t generated = kBurst + 3;
  gate->release();

  // Accounted for once received + reported lost covers everything generated.
  ASSERT_TRUE(collector_.wait_accounted(generated, kDeadline))
      << "received " << collector_.events().size() << " lost " << collector_.lost();
  const auto st = source_->stats();
  const uint64_t received = collector_.events().size();
  EXPECT_GT(st.bpf.ringbuf_drops, 0u) << "a one-page ring buffer must overflow under the burst";
  EXPECT_EQ(received + st.bpf.ringbuf_drops, generated);
  EXPECT_EQ(st.bpf.drops_by_type[0], st.bpf.ringbuf_drops) << "all drops were mkdir records";
  EXPECT_EQ(st.lost_reported, st.bpf.ringbuf_drops) << "every drop reported to the sink";
  EXPECT_EQ(collector_.lost(), st.lost_reported);
  burst.clear();
}

}  // namespace
}  // namespace kpleg::kernel

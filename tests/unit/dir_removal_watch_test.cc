// The removal hint from inotify on the runtime's per-container directories, on a real
// directory tree (no root needed), read on an event loop.
#include "kernel/dir_removal_watch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pleg/event_loop.h"
#include "support/eventually.h"

namespace kpleg::kernel {
namespace {

using kpleg::testing::eventually;
namespace fs = std::filesystem;

std::string id_of(char c) { return std::string(64, c); }

// The watch lives on an event loop of the test's own (in kplegd, the tracker's): everything it
// does runs on that loop's thread, so the test arms and disarms through the loop (arm(),
// disarm(), armed()) and reads only the counters from its own thread.
class DirRemovalWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kpleg-rmdirs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    containers_ = root_ + "/containers";
    ASSERT_EQ(mkdir(containers_.c_str(), 0755), 0);
    loop_.start("kpleg-test-loop");
  }
  void TearDown() override {
    loop_.call([this] { watch_.reset(); });
    loop_.stop();
    fs::remove_all(root_);
  }
  void start(const std::vector<std::string>& dirs,
             std::chrono::milliseconds hold_off = DirRemovalWatch::kHoldOff) {
    start(
        dirs, [this](const std::string& id) { record(id); }, hold_off);
  }
  void start(const std::vector<std::string>& dirs, DirRemovalWatch::OnHint on_hint,
             std::chrono::milliseconds hold_off = DirRemovalWatch::kHoldOff) {
    auto w = loop_.call(
        [&] { return DirRemovalWatch::start(loop_, dirs, std::move(on_hint), hold_off); });
    ASSERT_TRUE(w.ok()) << w.error().message;
    watch_ = std::move(*w);
  }
  DirRemovalWatch::Arm arm(const std::string& id) {
    return loop_.call([&] { return watch_->watch(id); });
  }
  void disarm(const std::string& id) {
    loop_.call([&] { watch_->unwatch(id); });
  }
  size_t armed() {
    return loop_.call([&] { return watch_->watch_count(); });
  }
  // The hint callback's record; also whether it ran anywhere but on the loop's thread.
  void record(const std::string& id) {
    std::lock_guard lk(mu_);
    hinted_.push_back(id);
    if (!loop_.in_loop()) ++hinted_off_loop_;
  }
  std::vector<std::string> hinted() {
    std::lock_guard lk(mu_);
    return hinted_;
  }
  bool hinted_has(const std::string& id) {
    auto h = hinted();
    return std::find(h.begin(), h.end(), id) != h.end();
  }
  // Removes a directory named by `id` in `dir` until its removal is hinted: a watch the
  // loop adds when it reads a creation is not there at once.
  bool hinted_once_watched(const std::string& dir, const std::string& id) {
    return eventually(
        [&] {
          make_and_remove(dir + "/" + id);
          return hinted_has(id);
        },
        std::chrono::seconds(5), std::chrono::milliseconds(20));
  }
  // A directory with a file in it, removed the way Go's os.RemoveAll does.
  static void make_and_remove(const std::string& dir) {
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
    const std::string f = dir + "/status";
    int fd = open(f.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_EQ(unlink(f.c_str()), 0);
    ASSERT_EQ(rmdir(dir.c_str()), 0);
  }

  std::string root_, containers_;
  pleg::EventLoop loop_;
  std::unique_ptr<DirRemovalWatch> watch_;
  std::mutex mu_;
  std::vector<std::string> hinted_;
  size_t hinted_off_loop_ = 0;
};

TEST_F(DirRemovalWatchTest, TheRemovalOfAnArmedIdsDirectoryHintsItOncePerArming) {
  start({containers_});
  const std::string a = id_of('a'), b = id_of('b'), c = id_of('c'), d = id_of('d'),
                    sentinel = id_of('e');
  ASSERT_EQ(arm(a), DirRemovalWatch::Arm::kArmed);
  ASSERT_EQ(arm(c), DirRemovalWatch::Arm::kArmed);
  EXPECT_EQ(arm("abc"), DirRemovalWatch::Arm::kNotAnId);
  EXPECT_EQ(armed(), 2u);

  make_and_remove(containers_ + "/" + a);
  ASSERT_TRUE(eventually([&] { return hinted_has(a); }));
  EXPECT_EQ(armed(), 1u) << "the hint disarms its id";

  // None of these hints: the same id again (disarmed), an id nobody armed, a file named by an
  // armed id, an id no longer armed, an armed id's directory elsewhere.
  make_and_remove(containers_ + "/" + a);
  make_and_remove(containers_ + "/" + b);
  const std::string file = containers_ + "/" + c;
  int fd = open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(unlink(file.c_str()), 0);
  disarm(c);
  make_and_remove(containers_ + "/" + c);
  ASSERT_EQ(arm(d), DirRemovalWatch::Arm::kArmed);
  make_and_remove(root_ + "/" + d);

  // Moved away (renamed aside before its removal): a hint. Then the sentinel, after all above.
  ASSERT_EQ(mkdir((containers_ + "/" + d).c_str(), 0755), 0);
  ASSERT_EQ(rename((containers_ + "/" + d).c_str(), (root_ + "/trash").c_str()), 0);
  ASSERT_EQ(arm(sentinel), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + sentinel);
  ASSERT_TRUE(eventually([&] { return hinted_has(sentinel); }));
  EXPECT_EQ(hinted(), (std::vector<std::string>{a, d, sentinel}));
  EXPECT_EQ(watch_->overflows(), 0u);
}

// The runtime may remove an id's directory before the tracker arms it (a RemoveContainer right
// after StopContainer, before the death is confirmed): arming it then says it is gone, and no
// hint is left to wait for. A removal is remembered once only, and not after kRememberGone.
TEST_F(DirRemovalWatchTest, ArmingAnIdWhoseDirectoryWentAlreadySaysSo) {
  start({containers_});
  const std::string early = id_of('1'), later = id_of('2');
  make_and_remove(containers_ + "/" + early);
  ASSERT_TRUE(eventually([&] { return watch_->reads() >= 1; })) << "the removal was never read";
  EXPECT_EQ(arm(early), DirRemovalWatch::Arm::kGone);
  EXPECT_EQ(armed(), 0u) << "nothing armed for a removal already seen";
  EXPECT_EQ(arm(early), DirRemovalWatch::Arm::kArmed) << "remembered once";
  // Armed, it is hinted as before.
  ASSERT_EQ(arm(later), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + later);
  ASSERT_TRUE(eventually([&] { return hinted_has(later); }));
  EXPECT_FALSE(hinted_has(early));
}

// Under churn the runtime removes directories several times a second: after a read, the
// watch holds off reading (a second, or until the sweep ends it), so removals that come
// meanwhile cost it one wakeup together, not one each, and each is still hinted.
TEST_F(DirRemovalWatchTest, RemovalsThatComeWhileItHoldsOffAreReadTogether) {
  start({containers_});
  const std::string first = id_of('0');
  ASSERT_EQ(arm(first), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + first);
  ASSERT_TRUE(eventually([&] { return hinted_has(first); }));
  const uint64_t reads_before = watch_->reads();
  const auto first_hinted = std::chrono::steady_clock::now();

  // Ten removals 20 ms apart: 200 ms in all, inside one hold-off.
  std::vector<std::string> ids;
  for (char c : std::string("123456789a")) {
    ids.push_back(id_of(c));
    ASSERT_EQ(arm(ids.back()), DirRemovalWatch::Arm::kArmed);
  }
  for (const auto& id : ids) {
    make_and_remove(containers_ + "/" + id);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(eventually([&] { return hinted().size() == 11; }));
  const auto all_hinted = std::chrono::steady_clock::now();
  EXPECT_LE(watch_->reads() - reads_before, 2u) << "one read for the ten removals, two at most";
  EXPECT_GE(all_hinted - first_hinted, DirRemovalWatch::kHoldOff - std::chrono::milliseconds(50))
      << "the ten were hinted before the hold-off ended";
  EXPECT_EQ(armed(), 0u);
}

// The removal sweep ends a hold-off before it lists (take_held): what came meanwhile is hinted
// at once, and a read that saw a removal holds off again from then.
TEST_F(DirRemovalWatchTest, TakeHeldHintsWhatItHoldsBackAtOnceAndHoldsOffAgain) {
  start({containers_});
  const std::string first = id_of('0'), held = id_of('1'), next = id_of('2');
  for (const auto& id : {first, held, next}) ASSERT_EQ(arm(id), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + first);
  ASSERT_TRUE(eventually([&] { return hinted_has(first); }));
  make_and_remove(containers_ + "/" + held);
  // An event, or the hold-off's end, would show it; neither comes for the hold-off (a second).
  EXPECT_FALSE(eventually([&] { return hinted_has(held); }, std::chrono::milliseconds(200)));
  loop_.call([&] { watch_->take_held(); });
  EXPECT_TRUE(hinted_has(held)) << "not hinted when the hold-off was ended";
  make_and_remove(containers_ + "/" + next);
  EXPECT_FALSE(eventually([&] { return hinted_has(next); }, std::chrono::milliseconds(200)))
      << "no hold-off after the read that take_held() made";
  loop_.call([&] { watch_->take_held(); });
  EXPECT_TRUE(hinted_has(next));
  // Nothing held: nothing to do.
  loop_.call([&] { watch_->take_held(); });
  EXPECT_EQ(hinted().size(), 3u);
}

// Paused (the runtime's events report every removal), the watch reads nothing, neither when
// the descriptor is readable nor at a hold-off's end: the loop is not woken for it. The sweep
// reads what queued (take_held), and resumed it reads at once and goes on as before.
TEST_F(DirRemovalWatchTest, PausedItReadsOnlyAtTheSweepAndResumedAtOnce) {
  start({containers_});
  const std::string first = id_of('0'), held = id_of('1'), at_sweep = id_of('2'),
                    queued = id_of('3'), after = id_of('4');
  for (const auto& id : {first, held, at_sweep, queued, after})
    ASSERT_EQ(arm(id), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + first);
  ASSERT_TRUE(eventually([&] { return hinted_has(first); }));
  make_and_remove(containers_ + "/" + held);  // held back by the hold-off
  loop_.call([&] { watch_->set_paused(true); });
  // The hold-off (a second) ends without a read while paused.
  EXPECT_FALSE(eventually([&] { return hinted_has(held); }, std::chrono::milliseconds(1500)))
      << "a paused watch read at its hold-off's end";
  make_and_remove(containers_ + "/" + at_sweep);
  EXPECT_FALSE(eventually([&] { return hinted_has(at_sweep); }, std::chrono::milliseconds(300)))
      << "a paused watch read when its descriptor was readable";
  EXPECT_EQ(watch_->reads(), 1u);
  loop_.call([&] { watch_->take_held(); });
  EXPECT_TRUE(hinted_has(held) && hinted_has(at_sweep)) << "the sweep did not read what queued";
  make_and_remove(containers_ + "/" + queued);
  EXPECT_FALSE(eventually([&] { return hinted_has(queued); }, std::chrono::milliseconds(300)))
      << "still paused after the sweep's read";
  loop_.call([&] { watch_->set_paused(false); });
  EXPECT_TRUE(hinted_has(queued)) << "not read at once when resumed";
  // Read again as before: the resume's read saw a removal, so the next waits for a hold-off's end.
  make_and_remove(containers_ + "/" + after);
  EXPECT_TRUE(eventually([&] { return hinted_has(after); }, std::chrono::seconds(5)))
      << "not read after it was resumed";
}

// The removal of an id not armed yet (remembered for its arming) is followed by a hold-off too:
// under churn most removals come before the tracker arms their ids, and each would otherwise
// wake the loop. The remembered removal is answered at once all the same.
TEST_F(DirRemovalWatchTest, ARemovalRememberedForItsArmingIsFollowedByAHoldOff) {
  start({containers_}, std::chrono::seconds(30));
  const std::string early = id_of('1'), armed = id_of('2');
  ASSERT_EQ(arm(armed), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + early);
  ASSERT_TRUE(eventually([&] { return watch_->reads() == 1; }));
  EXPECT_EQ(arm(early), DirRemovalWatch::Arm::kGone) << "not delayed by the hold-off";
  make_and_remove(containers_ + "/" + armed);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a bounded negative wait
  EXPECT_FALSE(hinted_has(armed)) << "read at once after a remembered removal: no hold-off";
  EXPECT_EQ(watch_->reads(), 1u);
}

// A read that saw no id's directory removed (here a file named by the id, removed first) is
// not followed by a hold-off: the directory's removal just after it is hinted at once.
TEST_F(DirRemovalWatchTest, NoHoldOffAfterAReadThatHintedNothing) {
  start({containers_}, std::chrono::seconds(30));
  const std::string a = id_of('a');
  ASSERT_EQ(arm(a), DirRemovalWatch::Arm::kArmed);
  const std::string file = containers_ + "/" + a;
  int fd = open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(unlink(file.c_str()), 0);
  ASSERT_TRUE(eventually([&] { return watch_->reads() == 1; }));
  make_and_remove(containers_ + "/" + a);
  EXPECT_TRUE(eventually([&] { return hinted_has(a); }, std::chrono::seconds(10)))
      << "held off after a read that hinted nothing";
}

TEST_F(DirRemovalWatchTest, ADirectoryMadeAfterTheStartIsWatchedFromItsCreation) {
  const std::string sandboxes = root_ + "/sandboxes";
  start({containers_, sandboxes});
  const std::string s = id_of('5');
  ASSERT_EQ(arm(s), DirRemovalWatch::Arm::kArmed);
  // The runtime makes the directory with its first sandbox.
  ASSERT_EQ(mkdir(sandboxes.c_str(), 0755), 0);
  // The watch is added on the loop when it reads the creation: retried until then
  // (a removal before it is found by the removal sweep, not hinted).
  ASSERT_TRUE(hinted_once_watched(sandboxes, s));
  EXPECT_EQ(hinted(), std::vector<std::string>{s});
  EXPECT_EQ(watch_->overflows(), 0u) << "hinted by its removal, not all at once";
}

TEST_F(DirRemovalWatchTest, AWatchedDirectoryThatGoesHintsEveryArmedIdAndIsWatchedWhenMadeAgain) {
  start({containers_});
  const std::string a = id_of('a'), b = id_of('b'), c = id_of('c');
  ASSERT_EQ(arm(a), DirRemovalWatch::Arm::kArmed);
  ASSERT_EQ(arm(b), DirRemovalWatch::Arm::kArmed);
  ASSERT_EQ(rmdir(containers_.c_str()), 0);
  ASSERT_TRUE(eventually([&] { return hinted().size() == 2; }));
  EXPECT_EQ(watch_->overflows(), 1u);
  EXPECT_EQ(armed(), 0u);

  // Made again: its removals hint again (retried until the loop has added it).
  ASSERT_EQ(mkdir(containers_.c_str(), 0755), 0);
  ASSERT_EQ(arm(c), DirRemovalWatch::Arm::kArmed);
  ASSERT_TRUE(hinted_once_watched(containers_, c));
  EXPECT_EQ(watch_->overflows(), 1u);
}

TEST_F(DirRemovalWatchTest, AWatchedDirectoryMovedAwayIsWatchedWhereItWas) {
  start({containers_});
  ASSERT_EQ(rename(containers_.c_str(), (root_ + "/old").c_str()), 0);
  ASSERT_TRUE(eventually([&] { return watch_->overflows() == 1; }));
  // A removal in the moved directory is not a removal in the watched one.
  const std::string a = id_of('a'), b = id_of('b');
  ASSERT_EQ(arm(a), DirRemovalWatch::Arm::kArmed);
  make_and_remove(root_ + "/old/" + a);
  ASSERT_EQ(mkdir(containers_.c_str(), 0755), 0);
  ASSERT_EQ(arm(b), DirRemovalWatch::Arm::kArmed);
  ASSERT_TRUE(hinted_once_watched(containers_, b));
  EXPECT_FALSE(hinted_has(a));
}

// The tracker arms ids again from inside the hint (a sweep that still lists it): the id
// re-armed in the callback is hinted by its next removal.
TEST_F(DirRemovalWatchTest, TheCallbackMayArmAgain) {
  start({containers_}, [this](const std::string& id) {
    record(id);
    if (hinted().size() == 1) watch_->watch(id);
  });
  const std::string a = id_of('a');
  ASSERT_EQ(arm(a), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + a);
  ASSERT_TRUE(eventually([&] { return hinted().size() == 1; }));
  ASSERT_TRUE(eventually([&] { return armed() == 1; }));
  make_and_remove(containers_ + "/" + a);
  ASSERT_TRUE(eventually([&] { return hinted().size() == 2; }));
  EXPECT_EQ(armed(), 0u);
  EXPECT_EQ(arm(std::string(64, 'G')), DirRemovalWatch::Arm::kNotAnId) << "not hex";
}

// No thread of its own: the hints run on the loop's thread (in kplegd, the tracker's, which
// takes them there at once), and starting the watch adds no thread to the process.
TEST_F(DirRemovalWatchTest, HintsRunOnTheLoopsThreadWithNoThreadOfItsOwn) {
  auto threads = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& t : fs::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  const size_t before = threads();
  start({containers_, root_ + "/sandboxes"}, std::chrono::milliseconds(50));
  EXPECT_EQ(threads(), before);
  const std::string a = id_of('a'), b = id_of('b');
  ASSERT_EQ(arm(a), DirRemovalWatch::Arm::kArmed);
  ASSERT_EQ(arm(b), DirRemovalWatch::Arm::kArmed);
  make_and_remove(containers_ + "/" + a);
  ASSERT_TRUE(eventually([&] { return hinted_has(a); }));
  // Hinted all at once (the watched directory went), and after a hold-off's timer.
  ASSERT_EQ(rmdir(containers_.c_str()), 0);
  ASSERT_TRUE(eventually([&] { return hinted_has(b); }));
  EXPECT_EQ(threads(), before);
  std::lock_guard lk(mu_);
  EXPECT_EQ(hinted_off_loop_, 0u) << "a hint ran off the loop's thread";
}

TEST(DirRemovalWatchStart, FailsWhenADirectoryAndItsParentAreMissing) {
  pleg::EventLoop loop;  // not started: a watch that fails to start never uses it
  auto w =
      DirRemovalWatch::start(loop, {"/nonexistent-kpleg/a/containers"}, [](const std::string&) {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("/nonexistent-kpleg/a/containers"), std::string::npos)
      << w.error().message;
  EXPECT_FALSE(DirRemovalWatch::start(loop, {}, [](const std::string&) {}).ok());
}

TEST(RemovalDirsFromStatusInfo, ContainerdsRootDirNamesItsContainersAndSandboxes) {
  EXPECT_EQ(removal_dirs_from_status_info(
                {{"config", R"({"containerdRootDir":"/var/lib/containerd",)"
                            R"("rootDir":"/var/lib/containerd/io.containerd.grpc.v1.cri"})"}}),
            (std::vector<std::string>{"/var/lib/containerd/io.containerd.grpc.v1.cri/containers",
                                      "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes"}));
  EXPECT_TRUE(removal_dirs_from_status_info({}).empty());
  EXPECT_TRUE(removal_dirs_from_status_info({{"config", "not json"}}).empty());
  EXPECT_TRUE(removal_dirs_from_status_info({{"config", R"({"rootDir":7})"}}).empty());
  EXPECT_TRUE(removal_dirs_from_status_info({{"config", R"({"rootDir":"relative"})"}}).empty());
  EXPECT_TRUE(removal_dirs_from_status_info({{"config", "[]"}}).empty());
}

}  // namespace
}  // namespace kpleg::kernel

// The removal hint without a syscall tracepoint: inotify on the directories where the runtime
// keeps one subdirectory per container and sandbox, named by its id (containerd's CRI plugin:
// `<rootDir>/containers/<id>` and `<rootDir>/sandboxes/<id>`, removed on RemoveContainer and
// RemovePodSandbox). The removal of an armed id's subdirectory calls on_hint(id) once and
// disarms it, like the BPF program's removal_watch map (bpf/kpleg.bpf.c); nothing else on the
// node pays for it (fsnotify costs only operations inside the watched directories).
//
// It has no thread of its own: it lives on an event loop (cri::Reactor; in kplegd the tracker's,
// pleg/event_loop.h), which reads the inotify descriptor when it is readable, so a hint is
// taken by the tracker on the thread that reads it, without a hand-off. After a read that saw
// an id's subdirectory removed, it holds off reading for `hold_off` (the descriptor is left out
// of the loop's epoll set until a timer of the loop ends it; the kernel queues what comes
// meanwhile): under churn the runtime removes a directory several times a second, and each
// removal would otherwise be a wakeup of its own. The tracker sweeps for hinted removals once a
// second at most anyway (TrackerOptions::removal_sweep_period), and each sweep ends the hold-off
// first (take_held()): under churn the hints are read at the sweeps, once a second, with no
// wakeup of their own; the hold-off's timer (a second) ends one only when no sweep came. Both
// the sweep's timer and the hold-off's may wait a little for a wakeup the loop has anyway
// (EventLoop::at with slack): they share another cause's wakeup when one comes in time. A read
// that saw no such removal (a file named by an id) is not followed by a hold-off: the hint of
// the directory's removal just after it is not held.
// While the runtime's own events report every removal, the tracker pauses it (set_paused): it
// reads then only at the sweeps, which come rarely.
// The removal of an id not armed yet is remembered for a while: arming it then answers kGone
// (the hold-off does not delay that answer).
// A lost event (the inotify queue overflowed) or a watched directory that went away hints every
// armed id: the hint only brings the removal sweep, which re-arms the ids it still finds. A
// directory that went is watched again when it is made again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "cri/reactor.h"

namespace kpleg::kernel {

// The directories to watch from the runtime's verbose Status information: containerd's CRI
// plugin names its "rootDir" in the "config" document, with one subdirectory per container
// (`containers/`) and per sandbox (`sandboxes/`). Empty when the information has none (another
// runtime, or not a document): the caller says which directories (--removal-hint-dir).
std::vector<std::string> removal_dirs_from_status_info(
    const std::map<std::string, std::string>& info);

// Everything below runs on the loop's thread: start(), watch(), unwatch(), watch_count(), the
// destructor (or once the loop has stopped), and on_hint. So nothing takes a lock.
class DirRemovalWatch {
 public:
  using OnHint = std::function<void(const std::string& id)>;
  static constexpr std::chrono::milliseconds kHoldOff{1000};

  // Watches every directory of `dirs`, read on `loop`; one that does not exist yet (a runtime
  // makes them with its first container) is watched from its creation, found by a watch on its
  // parent (which must exist). on_hint runs on the loop: it may call watch() and unwatch().
  static Result<std::unique_ptr<DirRemovalWatch>> start(
      cri::Reactor& loop, const std::vector<std::string>& dirs, OnHint on_hint,
      std::chrono::milliseconds hold_off = kHoldOff);
  ~DirRemovalWatch();
  DirRemovalWatch(const DirRemovalWatch&) = delete;
  DirRemovalWatch& operator=(const DirRemovalWatch&) = delete;

  enum class Arm {
    kArmed,    // the next removal of its subdirectory hints it
    kGone,     // its subdirectory was removed (unarmed) within kRememberGone: no hint will come
    kNotAnId,  // not 64 lowercase hex digits
  };
  // Removals of unarmed ids' subdirectories are remembered this long (kRememberGoneMax at
  // most): an id is armed when the tracker has confirmed its container's death, and the runtime
  // may remove it before that (a RemoveContainer right after StopContainer), so its hint came
  // before anyone asked for it.
  static constexpr std::chrono::seconds kRememberGone{10};
  static constexpr size_t kRememberGoneMax = 4096;

  // Arms an id (64 lowercase hex digits): the next removal of a subdirectory by that name in a
  // watched directory hints it. kGone instead when that removal has already been read: the
  // caller takes that answer as the hint (nothing is armed).
  Arm watch(const std::string& id);
  void unwatch(const std::string& id);
  size_t watch_count() const { return armed_.size(); }
  // Ends a hold-off now: what came meanwhile is read (and hinted) at once, and a read that saw a
  // removal holds off again from now. For the removal sweep, which reads the held hints just
  // before it lists: under churn the hold-off then ends at the sweep's wakeup, not at one of
  // its own. Nothing when it does not hold off.
  void take_held();
  // Paused, it reads nothing (the descriptor leaves the loop's epoll set, a hold-off ends
  // without a read) but at take_held(): what comes waits in the kernel's queue. Resumed, it
  // reads what came at once and goes on as before. For a runtime whose events report every
  // removal: its hints are not needed then, and under churn each read was a wakeup.
  void set_paused(bool paused);
  bool paused() const { return paused_; }

  const std::vector<std::string>& dirs() const { return dirs_; }
  // From any thread: times every armed id was hinted at once (a lost inotify event, a watched
  // directory gone), and times it read inotify events (a wakeup of the loop for it, or a
  // hold-off's end that found some), counted once it has taken what it read.
  uint64_t overflows() const { return overflows_.load(std::memory_order_relaxed); }
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }

 private:
  DirRemovalWatch(cri::Reactor& loop, int inotify_fd, std::vector<std::string> dirs, OnHint on_hint,
                  std::chrono::milliseconds hold_off);
  // The descriptor is readable, or a hold-off ended: reads what the kernel queued, then holds
  // off or reads on.
  void take();
  enum class Read { kNothing, kSome, kRemoval, kFailed };
  Read read_queued();
  void hint_all(const char* why);
  // Watches `dir`, or its parent for its creation when it does not exist (yet).
  Status add(const std::string& dir);
  // A directory created in a parent watched for it: watched from now on.
  void on_created(int parent_wd, const std::string& name);
  // A watch the kernel dropped (IN_IGNORED: its directory removed, or moved away).
  void on_watch_gone(int wd);
  // Remembers the removal of unarmed `name` (an id's subdirectory).
  void remember_gone(std::string name, std::chrono::steady_clock::time_point now);

  struct Pending {
    int parent_wd;
    std::string name;  // in the parent
    std::string path;
  };

  cri::Reactor& loop_;
  const int inotify_fd_;
  const std::vector<std::string> dirs_;
  const OnHint on_hint_;
  const std::chrono::milliseconds hold_off_;
  bool registered_ = false;  // with the loop; not after reading failed (no more hints then)
  bool reading_ = false;     // in the loop's epoll set for EPOLLIN (not while holding off)
  bool paused_ = false;      // set_paused
  uint64_t hold_timer_ = 0;  // the loop's timer that ends a hold-off; 0: none
  std::map<int, std::string> watched_;  // watch descriptor -> directory
  std::vector<Pending> pending_;
  std::unordered_set<std::string> armed_;
  // Unarmed ids whose subdirectory was removed, when; and in the order they came.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> gone_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::string>> gone_order_;
  std::atomic<uint64_t> overflows_{0};
  std::atomic<uint64_t> reads_{0};
};

}  // namespace kpleg::kernel

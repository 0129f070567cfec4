#include "kernel/dir_removal_watch.h"

#include <sys/epoll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kpleg::kernel {

namespace {
constexpr size_t kIdLen = 64;
// A subdirectory removed or moved away (Go's os.RemoveAll ends with an rmdir of the
// directory; a runtime may also rename it aside before removing it).
constexpr uint32_t kMask =
    IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_MASK_ADD;

bool is_id(const std::string& s) {
  return s.size() == kIdLen && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}
}  // namespace

std::vector<std::string> removal_dirs_from_status_info(
    const std::map<std::string, std::string>& info) {
  auto it = info.find("config");
  if (it == info.end()) return {};
  auto doc = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return {};
  auto root = doc.find("rootDir");
  if (root == doc.end() || !root->is_string()) return {};
  const std::string dir = root->get<std::string>();
  if (dir.empty() || dir.front() != '/') return {};
  return {dir + "/containers", dir + "/sandboxes"};
}

Result<std::unique_ptr<DirRemovalWatch>> DirRemovalWatch::start(
    cri::Reactor& loop, const std::vector<std::string>& dirs, OnHint on_hint,
    std::chrono::milliseconds hold_off) {
  if (dirs.empty()) return Error{EINVAL, "no directory to watch for removals"};
  int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (ifd < 0) return Error::from_errno(errno, "inotify_init1");
  auto w = std::unique_ptr<DirRemovalWatch>(
      new DirRemovalWatch(loop, ifd, dirs, std::move(on_hint), hold_off));
  for (const auto& d : dirs) {
    if (auto st = w->add(d); !st) return st.error();  // the destructor closes the descriptor
  }
  loop.watch(ifd, EPOLLIN, [p = w.get()](uint32_t) { p->take(); }, "removal hints");
  w->registered_ = true;
  w->reading_ = true;
  return w;
}

Status DirRemovalWatch::add(const std::string& dir) {
  if (int wd = inotify_add_watch(inotify_fd_, dir.c_str(), kMask); wd >= 0) {
    watched_[wd] = dir;
    return {};
  }
  int err = errno;
  const auto slash = dir.find_last_of('/');
  if (err == ENOENT && slash != std::string::npos && slash + 1 < dir.size()) {
    const std::string parent = slash == 0 ? "/" : dir.substr(0, slash);
    int pwd = inotify_add_watch(inotify_fd_, parent.c_str(),
                                IN_CREATE | IN_MOVED_TO | IN_ONLYDIR | IN_MASK_ADD);
    if (pwd >= 0) {
      // Made between the two calls: watched now.
      if (int wd = inotify_add_watch(inotify_fd_, dir.c_str(), kMask); wd >= 0) {
        watched_[wd] = dir;
      } else {
        pending_.push_back({pwd, dir.substr(slash + 1), dir});
      }
      return {};
    }
    err = errno;
  }
  return Error::from_errno(err, "watching " + dir + " for removals (inotify)");
}

DirRemovalWatch::DirRemovalWatch(cri::Reactor& loop, int inotify_fd, std::vector<std::string> dirs,
                                 OnHint on_hint, std::chrono::milliseconds hold_off)
    : loop_(loop),
      inotify_fd_(inotify_fd),
      dirs_(std::move(dirs)),
      on_hint_(std::move(on_hint)),
      hold_off_(hold_off) {}

DirRemovalWatch::~DirRemovalWatch() {
  if (hold_timer_ != 0) loop_.cancel(hold_timer_);
  if (registered_) loop_.unwatch(inotify_fd_);
  close(inotify_fd_);
}

DirRemovalWatch::Arm DirRemovalWatch::watch(const std::string& id) {
  if (!is_id(id)) return Arm::kNotAnId;
  if (auto it = gone_.find(id); it != gone_.end()) {
    const bool recent = std::chrono::steady_clock::now() - it->second < kRememberGone;
    gone_.erase(it);
    if (recent) return Arm::kGone;
  }
  armed_.insert(id);
  return Arm::kArmed;
}

void DirRemovalWatch::unwatch(const std::string& id) { armed_.erase(id); }

void DirRemovalWatch::take_held() {
  if (paused_) {
    if (registered_) take();  // what queued since: read at the sweep, not at a wakeup of its own
    return;
  }
  if (hold_timer_ == 0 || !loop_.cancel(hold_timer_)) return;
  hold_timer_ = 0;
  take();
}

void DirRemovalWatch::set_paused(bool paused) {
  if (paused == paused_) return;
  paused_ = paused;
  if (!registered_) return;  // reading failed: nothing to pause or resume
  if (!paused) {
    take();  // what came meanwhile, at once; then it holds off or reads on
    return;
  }
  if (hold_timer_ != 0) {
    loop_.cancel(hold_timer_);
    hold_timer_ = 0;
  }
  if (reading_) {
    loop_.modify(inotify_fd_, 0);
    reading_ = false;
  }
}

void DirRemovalWatch::remember_gone(std::string name, std::chrono::steady_clock::time_point now) {
  while (!gone_order_.empty() && (gone_order_.size() >= kRememberGoneMax ||
                                  now - gone_order_.front().first >= kRememberGone)) {
    auto& [at, old] = gone_order_.front();
    // Only the entry of that removal: the name may have been taken (or removed again) since.
    if (auto it = gone_.find(old); it != gone_.end() && it->second == at) gone_.erase(it);
    gone_order_.pop_front();
  }
  gone_[name] = now;
  gone_order_.emplace_back(now, std::move(name));
}

void DirRemovalWatch::hint_all(const char* why) {
  overflows_.fetch_add(1, std::memory_order_relaxed);
  std::unordered_set<std::string> all;
  all.swap(armed_);  // on_hint may arm ids again
  spdlog::warn(
      "removal watch: {}: hinting all {} armed ids (the removal sweep re-arms those still there)",
      why, all.size());
  for (const auto& id : all) on_hint_(id);
}

void DirRemovalWatch::on_created(int parent_wd, const std::string& name) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->parent_wd != parent_wd || it->name != name) continue;
    int wd = inotify_add_watch(inotify_fd_, it->path.c_str(), kMask);
    if (wd < 0) {
      spdlog::warn("removal watch: watching {} (just made): {}", it->path, std::strerror(errno));
      return;  // its ids' removals are then found by the sweep
    }
    spdlog::debug("removal watch: {} made, watched", it->path);
    watched_[wd] = it->path;
    pending_.erase(it);
    return;
  }
}

void DirRemovalWatch::on_watch_gone(int wd) {
  if (auto it = watched_.find(wd); it != watched_.end()) {
    const std::string dir = it->second;
    watched_.erase(it);
    hint_all(("watched directory " + dir + " was removed or moved").c_str());
    // Watched again when it is made again (a runtime re-created, a root restored).
    if (auto st = add(dir); !st)
      spdlog::warn("removal watch: {}: its removals are swept for", st.error().message);
    return;
  }
  // A parent watched for a directory not made yet: that one is not found any more.
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->parent_wd != wd) {
      ++it;
      continue;
    }
    spdlog::warn("removal watch: the parent of {} went: its removals are swept for", it->path);
    it = pending_.erase(it);
  }
}

void DirRemovalWatch::take() {
  const Read got = read_queued();
  if (got == Read::kFailed) {  // no more hints: the sweep finds the removals
    if (std::exchange(registered_, false)) loop_.unwatch(inotify_fd_);
    return;
  }
  // Counted once what it read is taken (remembered, hinted): a test that saw the count may
  // arm an id and find its removal remembered.
  if (got != Read::kNothing) reads_.fetch_add(1, std::memory_order_relaxed);
  if (paused_) return;  // out of the epoll set, and no hold-off: read again at take_held()
  // Hold off after the removal of an id's subdirectory (hinted, or remembered for its arming):
  // the descriptor leaves the loop's epoll set, and what comes meanwhile waits in the kernel's
  // queue for the read at the timer. Not after a read that saw no such removal (a file named by
  // an id, removed just before its directory), so that the hint just after it is not held. A
  // remembered removal is taken when its id is armed, which the hold-off does not delay.
  const bool hold = got == Read::kRemoval && hold_off_.count() > 0;
  if (reading_ == hold) {  // in the epoll set to hold off, or out of it to read on
    loop_.modify(inotify_fd_, hold ? 0 : EPOLLIN);
    reading_ = !hold;
  }
  if (hold) {
    // The timer reads at once what came meanwhile, without another pass through epoll. Under
    // churn it ends with the sweep that is due about then (which takes what is held), with a
    // wakeup of the loop's for something else (cri::hold_end_slack).
    hold_timer_ = loop_.at(
        cri::Reactor::Clock::now() + hold_off_, cri::hold_end_slack(hold_off_),
        [this] {
          hold_timer_ = 0;
          take();
        },
        "removal hints: hold's end");
  }
}

DirRemovalWatch::Read DirRemovalWatch::read_queued() {
  alignas(inotify_event) char buf[16 * 1024];
  Read got = Read::kNothing;
  for (;;) {
    ssize_t n = read(inotify_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return got;
    if (n <= 0) {
      spdlog::error("removal watch: read: {}: no more removal hints",
                    n < 0 ? std::strerror(errno) : "end of file");
      hint_all("reading inotify failed");
      return Read::kFailed;
    }
    if (got == Read::kNothing) got = Read::kSome;
    std::vector<std::string> hinted;
    std::vector<int> gone;
    bool lost = false;
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      p += sizeof(inotify_event) + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) lost = true;
      // A watched directory moved away is watched no more where it was; the IN_IGNORED
      // that follows (as after its removal) re-adds it by its path.
      if ((ev->mask & IN_MOVE_SELF) && watched_.count(ev->wd))
        inotify_rm_watch(inotify_fd_, ev->wd);
      if (ev->mask & IN_IGNORED) gone.push_back(ev->wd);
      if (!(ev->mask & IN_ISDIR) || ev->len == 0) continue;
      std::string name(ev->name, strnlen(ev->name, ev->len));
      if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        if (!pending_.empty()) on_created(ev->wd, name);
        continue;
      }
      if (!(ev->mask & (IN_DELETE | IN_MOVED_FROM)) || !watched_.count(ev->wd)) continue;
      if (armed_.erase(name) != 0) {
        hinted.push_back(std::move(name));
        got = Read::kRemoval;
      } else if (is_id(name)) {
        remember_gone(std::move(name), std::chrono::steady_clock::now());
        got = Read::kRemoval;
      }
    }
    for (const auto& id : hinted) on_hint_(id);
    if (lost) hint_all("the inotify queue overflowed");
    for (int wd : gone) on_watch_gone(wd);
  }
}

}  // namespace kpleg::kernel

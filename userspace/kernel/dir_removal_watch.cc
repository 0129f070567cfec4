#include "kernel/dir_removal_watch.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "common/thread_name.h"

namespace kpleg::kernel {

namespace {
constexpr size_t kIdLen = 64;
// A subdirectory removed or moved away (Go's os.RemoveAll ends with an rmdir of the
// directory; a runtime may also rename it aside before removing it).
constexpr uint32_t kMask = IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_MASK_ADD;
}  // namespace

std::vector<std::string> removal_dirs_from_status_info(const std::map<std::string, std::string>& info) {
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

Result<std::unique_ptr<DirRemovalWatch>> DirRemovalWatch::start(const std::vector<std::string>& dirs,
                                                                OnHint on_hint) {
  if (dirs.empty()) return Error{EINVAL, "no directory to watch for removals"};
  int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (ifd < 0) return Error::from_errno(errno, "inotify_init1");
  std::vector<Pending> pending;
  for (const auto& d : dirs) {
    if (inotify_add_watch(ifd, d.c_str(), kMask) >= 0) continue;
    int err = errno;
    const auto slash = d.find_last_of('/');
    if (err == ENOENT && slash != std::string::npos && slash > 0 && slash + 1 < d.size()) {
      const std::string parent = d.substr(0, slash);
      int pwd = inotify_add_watch(ifd, parent.c_str(), IN_CREATE | IN_MOVED_TO | IN_ONLYDIR | IN_MASK_ADD);
      if (pwd >= 0) {
        pending.push_back({pwd, d.substr(slash + 1), d});
        // Made between the two calls: watched now.
        if (inotify_add_watch(ifd, d.c_str(), kMask) >= 0) pending.pop_back();
        continue;
      }
      err = errno;
    }
    close(ifd);
    return Error::from_errno(err, "watching " + d + " for removals (inotify)");
  }
  int sfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (sfd < 0) {
    int err = errno;
    close(ifd);
    return Error::from_errno(err, "eventfd");
  }
  auto w = std::unique_ptr<DirRemovalWatch>(new DirRemovalWatch(ifd, sfd, dirs, std::move(on_hint)));
  w->pending_ = std::move(pending);
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

DirRemovalWatch::DirRemovalWatch(int inotify_fd, int stop_fd, std::vector<std::string> dirs, OnHint on_hint)
    : inotify_fd_(inotify_fd), stop_fd_(stop_fd), dirs_(std::move(dirs)), on_hint_(std::move(on_hint)) {}

DirRemovalWatch::~DirRemovalWatch() {
  const uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof one) != sizeof one) {
    spdlog::error("removal watch: waking its thread to stop failed: {}", std::strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
  close(inotify_fd_);
  close(stop_fd_);
}

bool DirRemovalWatch::watch(const std::string& id) {
  if (id.size() != kIdLen) return false;
  std::lock_guard lk(mu_);
  armed_.insert(id);
  return true;
}

void DirRemovalWatch::unwatch(const std::string& id) {
  std::lock_guard lk(mu_);
  armed_.erase(id);
}

size_t DirRemovalWatch::watch_count() const {
  std::lock_guard lk(mu_);
  return armed_.size();
}

void DirRemovalWatch::hint_all(const char* why) {
  overflows_.fetch_add(1, std::memory_order_relaxed);
  std::unordered_set<std::string> all;
  {
    std::lock_guard lk(mu_);
    all.swap(armed_);
  }
  spdlog::warn("removal watch: {}: hinting all {} armed ids (the removal sweep re-arms those still there)",
               why, all.size());
  for (const auto& id : all) on_hint_(id);
}

void DirRemovalWatch::on_created(int parent_wd, const std::string& name) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->parent_wd != parent_wd || it->name != name) continue;
    if (inotify_add_watch(inotify_fd_, it->path.c_str(), kMask) < 0) {
      spdlog::warn("removal watch: watching {} (just made): {}", it->path, std::strerror(errno));
      return;  // its ids' removals are then found by the sweep
    }
    spdlog::debug("removal watch: {} made, watched", it->path);
    pending_.erase(it);
    return;
  }
}

void DirRemovalWatch::run() {
  set_thread_name("kpleg-rmdirs");
  alignas(inotify_event) char buf[16 * 1024];
  pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  bool dir_gone_reported = false;
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("removal watch: poll: {}: no more removal hints", std::strerror(errno));
      hint_all("poll failed");
      return;
    }
    if (fds[1].revents != 0) return;
    for (;;) {
      ssize_t n = read(inotify_fd_, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) spdlog::error("removal watch: read: {}", std::strerror(errno));
        break;
      }
      std::vector<std::string> hinted;
      bool lost = false, gone = false;
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        p += sizeof(inotify_event) + ev->len;
        if (ev->mask & IN_Q_OVERFLOW) lost = true;
        if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT)) gone = true;
        if (!(ev->mask & IN_ISDIR) || ev->len == 0) continue;
        std::string name(ev->name, strnlen(ev->name, ev->len));
        if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
          if (!pending_.empty()) on_created(ev->wd, name);
          continue;
        }
        if (!(ev->mask & (IN_DELETE | IN_MOVED_FROM))) continue;
        if (name.size() != kIdLen) continue;
        std::lock_guard lk(mu_);
        if (armed_.erase(name) != 0) hinted.push_back(std::move(name));
      }
      for (const auto& id : hinted) on_hint_(id);
      if (lost) hint_all("the inotify queue overflowed");
      if (gone && !dir_gone_reported) {
        dir_gone_reported = true;
        hint_all("a watched directory was removed or moved");
      }
    }
  }
}

}  // namespace kpleg::kernel

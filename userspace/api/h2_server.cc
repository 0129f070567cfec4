#include "api/h2_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "api/client_identity.h"
#include "common/thread_name.h"

namespace kpleg::api {

H2Server::H2Server(PodLifecycleService& lifecycle, HealthService& health, bus::EventBus& bus,
                   StreamSlots& slots, std::chrono::milliseconds cut_off_grace)
    : shared_{lifecycle, health, bus, slots, cut_off_grace, [this] { wake(); }} {}

H2Server::~H2Server() {
  stop(std::chrono::milliseconds(0));
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status H2Server::start() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Error::from_errno(errno, "api: epoll_create1");
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return Error::from_errno(errno, "api: eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0)
    return Error::from_errno(errno, "api: epoll_ctl");
  thread_ = named_thread("kpleg-api", [this] { loop(); });
  return {};
}

void H2Server::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void H2Server::adopt(int fd, const ucred& peer) {
  {
    std::lock_guard l(mu_);
    if (stop_requested_ || !thread_.joinable()) {
      close(fd);
      return;
    }
    adopted_.emplace_back(fd, client_of(peer));
  }
  wake();
}

void H2Server::health_changed() {
  std::vector<std::shared_ptr<h2::Connection>> conns;
  {
    std::lock_guard l(mu_);
    for (auto& [fd, c] : connections_) conns.push_back(c);
  }
  for (auto& c : conns) c->health_changed();
}

void H2Server::stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard l(mu_);
    if (!stop_requested_) {
      stop_requested_ = true;
      stop_deadline_ = Clock::now() + grace;
      shared_.stopping.store(true);
    }
  }
  if (!thread_.joinable()) return;
  wake();
  thread_.join();
}

void H2Server::take_new_connections() {
  std::vector<std::pair<int, std::string>> adopted;
  {
    std::lock_guard l(mu_);
    adopted.swap(adopted_);
  }
  for (auto& [fd, client] : adopted) {
    auto conn = std::make_shared<h2::Connection>(fd, epoll_fd_, std::move(client), shared_);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      spdlog::warn("api: cannot watch a new connection: {}", std::strerror(errno));
      continue;  // conn's destructor closes fd
    }
    {
      std::lock_guard l(mu_);
      connections_[fd] = conn;
    }
    if (!conn->open()) drop(fd);
  }
}

void H2Server::drop(int fd) {
  std::shared_ptr<h2::Connection> conn;
  {
    std::lock_guard l(mu_);
    auto it = connections_.find(fd);
    if (it == connections_.end()) return;
    conn = std::move(it->second);
    connections_.erase(it);
  }
  conn->close();
}

void H2Server::loop() {
  bool shutting_down = false;
  epoll_event events[64];
  for (;;) {
    const auto now = Clock::now();
    std::optional<Clock::time_point> due;
    std::vector<int> done;
    for (auto& [fd, conn] : connections_) {  // only this thread changes the map
      if (auto d = conn->reap(now); d && (!due || *d < *due)) due = d;
      if (shutting_down && !conn->alive()) done.push_back(fd);
    }
    for (int fd : done) drop(fd);
    if (shutting_down) {
      if (connections_.empty() || now >= stop_deadline_) break;
      if (!due || stop_deadline_ < *due) due = stop_deadline_;
    }
    int timeout = -1;
    if (due) {
      timeout = int(std::chrono::ceil<std::chrono::milliseconds>(*due - now).count());
      if (timeout < 0) timeout = 0;
    }
    const int n = epoll_wait(epoll_fd_, events, int(std::size(events)), timeout);
    if (n < 0 && errno != EINTR) {
      spdlog::error("api: epoll_wait: {}", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      // A connection's socket and the wakeup's eventfd are keyed by their descriptor, a
      // connection's quiet timer by h2::Connection::timer_key.
      const uint64_t key = events[i].data.u64;
      const int fd = int(uint32_t(key));
      const bool quiet_timer = (key >> 32) != 0;
      if (fd == wake_fd_ && !quiet_timer) {
        uint64_t count;
        [[maybe_unused]] ssize_t r = read(wake_fd_, &count, sizeof count);
        take_new_connections();
        bool stop;
        {
          std::lock_guard l(mu_);
          stop = stop_requested_;
        }
        if (stop && !shutting_down) {
          shutting_down = true;
          std::vector<int> ended;
          for (auto& [cfd, conn] : connections_)
            if (!conn->shut_down()) ended.push_back(cfd);
          for (int cfd : ended) drop(cfd);
        }
        continue;
      }
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      const auto conn = it->second;
      bool alive = true;
      if (quiet_timer) {
        alive = conn->on_quiet_timer();
      } else {
        if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) alive = conn->on_readable();
        if (alive && (events[i].events & EPOLLOUT)) alive = conn->on_writable();
      }
      if (!alive) {
        spdlog::debug("api: connection {} done", fd);
        drop(fd);
      }
    }
  }
  std::vector<int> left;
  for (auto& [fd, conn] : connections_) left.push_back(fd);
  for (int fd : left) drop(fd);
  std::lock_guard l(mu_);
  for (auto& [fd, client] : adopted_) close(fd);
  adopted_.clear();
}

}  // namespace kpleg::api

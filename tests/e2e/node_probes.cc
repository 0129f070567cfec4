#include "e2e/node_probes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>

namespace kpleg::testing {
namespace {

int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string socket_of(const KplegdProcess& d) {
  std::smatch m;
  const auto log = d.log();
  // start_kplegd passes --socket /tmp/kpleg-e2e-<pid>-<n>.sock
  static const std::regex re("(/tmp/kpleg-e2e-[0-9]+-[0-9]+\\.sock)");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

int metrics_port(const KplegdProcess& d) {
  std::smatch m;
  const auto log = d.log();
  static const std::regex re("/readyz on 127\\.0\\.0\\.1:([0-9]+)");
  return std::regex_search(log, m, re) ? std::stoi(m[1].str()) : 0;
}

int http_status(int port, const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int fd = connect_loopback(port);
  if (fd < 0) return -1;
  std::string got;
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size())) {
    while (got.find("\r\n") == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, int(left.count())) <= 0) break;
      char buf[512];
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, size_t(n));
    }
  }
  close(fd);
  if (got.rfind("HTTP/1.1 ", 0) != 0 || got.size() < 12) return -1;
  return std::stoi(got.substr(9, 3));
}

HeaderTricklers::HeaderTricklers(int port, int n) {
  for (int i = 0; i < n; ++i) threads_.emplace_back([this, port] { trickle(port); });
}

HeaderTricklers::~HeaderTricklers() { stop(); }

void HeaderTricklers::stop() {
  stop_ = true;
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void HeaderTricklers::trickle(int port) {
  // Reconnects as soon as it is cut off, as an attacker would. The 200 ms between bytes paces
  // the load; nothing waits on it.
  while (!stop_) {
    const int fd = connect_loopback(port);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    ++connections_;
    const std::string start = "GET /healthz HTTP/1.1\r\nX-Slow: ";
    bool alive = send(fd, start.data(), start.size(), MSG_NOSIGNAL) > 0;
    while (alive && !stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      alive = send(fd, "a", 1, MSG_NOSIGNAL) == 1;
      char c;
      // The server closed it (the deadline): reads end of stream or an error.
      if (alive && recv(fd, &c, 1, MSG_DONTWAIT) == 0) alive = false;
    }
    if (!alive) ++cut_off_;
    close(fd);
  }
}

}  // namespace kpleg::testing

// A "runtime" that accepts CRI connections on a unix socket and never answers anything: what
// a wedged containerd or a CRI call stuck behind a hung CNI plugin looks like to a client.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace kpleg::testing {

class HungRuntime {
 public:
  HungRuntime();
  ~HungRuntime();
  HungRuntime(const HungRuntime&) = delete;
  HungRuntime& operator=(const HungRuntime&) = delete;

  bool ok() const { return listen_fd_ >= 0; }
  const std::string& error() const { return error_; }
  std::string endpoint() const { return "unix://" + socket_path_; }
  int connections_accepted() const { return accepted_.load(); }

 private:
  void accept_loop();

  std::string dir_;
  std::string socket_path_;
  std::string error_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<int> connections_;  // held open, never read: the peer sees silence, not EOF
  std::thread thread_;
};

}  // namespace kpleg::testing

// kplegd as a child process, the way a user runs it: real flags, events read from its
// `--print-events json` stdout, logs captured from stderr, stopped with SIGTERM.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"

namespace kpleg::testing {

class KplegdProcess {
 public:
  static Result<std::unique_ptr<KplegdProcess>> start(const std::vector<std::string>& args);
  ~KplegdProcess();

  // Waits until `pred` holds over the events received so far.
  bool wait_for(const std::function<bool(const std::vector<nlohmann::json>&)>& pred,
                std::chrono::milliseconds timeout);
  // Waits until stderr contains `text` (at least `times` times).
  bool wait_for_log(const std::string& text, std::chrono::milliseconds timeout, size_t times = 1);
  std::vector<nlohmann::json> events() const;
  // Event types for one container id, in order.
  std::vector<std::string> types_for(const std::string& container_id) const;
  std::string log() const;
  // SIGTERM and wait; returns the exit status (128+signal when killed).
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Exit status if it exited on its own within `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  pid_t pid() const { return pid_; }

 private:
  KplegdProcess() = default;
  void read_loop(int fd, bool is_stdout);

  pid_t pid_ = -1;
  std::string args_;
  std::optional<int> exit_status_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<nlohmann::json> events_;
  std::string log_;
  std::thread out_reader_, err_reader_;
};

// The kplegd binary of this build tree.
std::string kplegd_binary();

// The events of `events` for `container_id`, as their type names, in order.
std::vector<std::string> types_of(const std::vector<nlohmann::json>& events,
                                  const std::string& container_id);

}  // namespace kpleg::testing

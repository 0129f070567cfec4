// Cancels the calls of cut-off Watches whose consumers still read nothing after the grace
// (ApiServerOptions::cut_off_grace): their handlers stay blocked in a write that the consumer's
// flow control holds, each on a server thread. One thread for all of them, asleep while none is
// due (no periodic wakeup).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace grpc {
class ServerContext;
}

namespace kpleg::api {

class CutOffReaper {
 public:
  CutOffReaper();
  ~CutOffReaper();
  CutOffReaper(const CutOffReaper&) = delete;
  CutOffReaper& operator=(const CutOffReaper&) = delete;

  // Cancels `ctx`'s call at `at` unless disarmed first.
  void arm(grpc::ServerContext* ctx, std::chrono::steady_clock::time_point at);
  // After this returns, `ctx` is never cancelled by the reaper (TryCancel runs under mu_).
  void disarm(grpc::ServerContext* ctx);
  uint64_t cancelled() const { return cancelled_.load(); }

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<grpc::ServerContext*, std::chrono::steady_clock::time_point> due_;
  bool stopping_ = false;
  std::atomic<uint64_t> cancelled_{0};
  std::thread thread_;
};

}  // namespace kpleg::api

#include "api/cut_off_reaper.h"

#include <grpcpp/server_context.h>

#include <algorithm>

#include "common/thread_name.h"

namespace kpleg::api {

CutOffReaper::CutOffReaper()
    : thread_(named_thread("kpleg-api-reap", [this] { loop(); })) {}

CutOffReaper::~CutOffReaper() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CutOffReaper::arm(grpc::ServerContext* ctx, std::chrono::steady_clock::time_point at) {
  {
    std::lock_guard lk(mu_);
    due_[ctx] = at;
  }
  cv_.notify_all();
}

void CutOffReaper::disarm(grpc::ServerContext* ctx) {
  std::lock_guard lk(mu_);
  due_.erase(ctx);
}

void CutOffReaper::loop() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    if (due_.empty()) {
      cv_.wait(lk, [&] { return stopping_ || !due_.empty(); });
      continue;
    }
    auto next = std::min_element(due_.begin(), due_.end(), [](const auto& a, const auto& b) {
                  return a.second < b.second;
                })->second;
    if (std::chrono::steady_clock::now() < next) {
      cv_.wait_until(lk, next);
      continue;
    }
    for (auto it = due_.begin(); it != due_.end();) {
      if (it->second <= std::chrono::steady_clock::now()) {
        it->first->TryCancel();
        ++cancelled_;
        it = due_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace kpleg::api

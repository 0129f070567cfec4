#include "pleg/offload.h"

#include <algorithm>

#include "common/thread_name.h"

namespace kpleg::pleg {

Offload::Offload(size_t threads) : threads_wanted_(std::max<size_t>(threads, 1)) {}

Offload::~Offload() { stop(); }

void Offload::run(const std::string& key, Work work) {
  std::lock_guard lk(mu_);
  if (stopping_) return;
  // Started on first use: a tracker whose looks go elsewhere has no threads here.
  if (threads_.empty()) {
    for (size_t i = 0; i < threads_wanted_; ++i)
      threads_.push_back(named_thread("kpleg-offload", [this] { serve(); }));
  }
  queue_.emplace_back(key, std::move(work));
  cv_.notify_one();
}

void Offload::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void Offload::serve() {
  std::unique_lock lk(mu_);
  for (;;) {
    auto it = queue_.end();
    cv_.wait(lk, [&] {
      if (stopping_) return true;
      it = std::find_if(queue_.begin(), queue_.end(),
                        [&](const auto& w) { return !busy_.count(w.first); });
      return it != queue_.end();
    });
    if (stopping_) return;
    auto [key, work] = std::move(*it);
    queue_.erase(it);
    busy_.insert(key);
    lk.unlock();
    work();
    lk.lock();
    busy_.erase(key);
    // Another thread may wait for this key's next piece.
    if (!queue_.empty()) cv_.notify_one();
  }
}

}  // namespace kpleg::pleg

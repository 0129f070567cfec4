// Offload: a few threads for the kernel-driven path's blocking work (CRI looks, full lists),
// so that the event loop never waits on the runtime. Work is keyed (a pod, the removal sweep):
// one key's work runs one piece at a time, in the order it came, and different keys run in
// parallel, so a pod whose calls hang holds one thread, never the loop or the other pods. A
// piece of work posts its outcome back to the loop itself (EventLoop::post).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kpleg::pleg {

class Offload {
 public:
  using Work = std::function<void()>;
  explicit Offload(size_t threads);
  ~Offload();
  Offload(const Offload&) = delete;
  Offload& operator=(const Offload&) = delete;

  // Runs `work` on one of the threads, after `key`'s earlier work.
  void run(const std::string& key, Work work);
  // Ends the threads once their current work is done; work not started is dropped.
  void stop();

 private:
  void serve();

  const size_t threads_wanted_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, Work>> queue_;
  std::set<std::string> busy_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kpleg::pleg

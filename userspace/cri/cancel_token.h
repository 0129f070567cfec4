// CancelToken: ends a long blocking call (a stream read) from another thread. A call that waits
// in poll(2) adds fd() to its wait; a gRPC call registers its ClientContext's TryCancel as the
// hook. cancel() is thread-safe and idempotent; a token stays cancelled.
#pragma once

#include <functional>
#include <mutex>

namespace kpleg::cri {

class CancelToken {
 public:
  CancelToken();
  ~CancelToken();
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  void cancel();
  bool cancelled() const;
  // Readable once cancelled (an eventfd); -1 if none could be made (cancelled() still works).
  int fd() const { return fd_; }
  // Runs `hook` at cancel(), or at once when already cancelled; it must be quick and must not
  // call back into the token. One hook at a time; the caller clears it (set_hook({})) before
  // what it captures goes away.
  void set_hook(std::function<void()> hook);

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  std::function<void()> hook_;
  int fd_ = -1;
};

}  // namespace kpleg::cri

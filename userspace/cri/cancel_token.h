// CancelToken: ends a long blocking call (a stream read) from another thread. The call waits in
// poll(2) with fd() among its descriptors. cancel() is thread-safe and idempotent; a token stays
// cancelled.
#pragma once

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

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  int fd_ = -1;
};

}  // namespace kpleg::cri

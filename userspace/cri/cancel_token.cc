#include "cri/cancel_token.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace kpleg::cri {

CancelToken::CancelToken() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

CancelToken::~CancelToken() {
  if (fd_ >= 0) close(fd_);
}

void CancelToken::cancel() {
  std::lock_guard lk(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(fd_, &one, sizeof(one));
  }
}

bool CancelToken::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

}  // namespace kpleg::cri

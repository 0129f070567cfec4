#include "cri/cancel_token.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

namespace kpleg::cri {

CancelToken::CancelToken() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

CancelToken::~CancelToken() {
  if (fd_ >= 0) close(fd_);
}

void CancelToken::cancel() {
  // The hook runs under the lock: once set_hook({}) returned, it is never running.
  std::lock_guard lk(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(fd_, &one, sizeof(one));
  }
  if (hook_) hook_();
}

bool CancelToken::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

void CancelToken::set_hook(std::function<void()> hook) {
  std::lock_guard lk(mu_);
  hook_ = std::move(hook);
  if (cancelled_ && hook_) hook_();
}

}  // namespace kpleg::cri

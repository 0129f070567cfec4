// CallWatch: the forwarded CRI calls of a CRI endpoint (kplegd's --cri-listen, kpleg-cri-relay):
// each one in the stuck-call watchdog's InflightCalls from its request on, with the pod it is
// about (request_subject.h), counted by method and status when it ends; and at most max_calls
// in flight at once (a call over it is refused with RESOURCE_EXHAUSTED before it reaches the
// runtime: kpleg's memory stays bounded whatever a client does).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cri/inflight_calls.h"
#include "criforward/forwarder.h"

namespace kpleg::criendpoint {

class CallWatch {
 public:
  // `log_failures`: a call the runtime or the transport failed (CANCELLED, DEADLINE_EXCEEDED,
  // UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN) is logged as a warning with its status.
  CallWatch(std::shared_ptr<cri::InflightCalls> inflight, size_t max_calls,
            bool log_failures = false)
      : inflight_(std::move(inflight)), max_calls_(max_calls), log_failures_(log_failures) {}

  // For Hooks::serve_locally: a refusal when max_calls are in flight, else nullptr (the call
  // then counts until its hooks' on_done).
  grpc::ServerGenericBidiReactor* admit(std::string_view who);
  // For Hooks::call_hooks of an admitted call.
  std::unique_ptr<criforward::CallHooks> hooks(const std::string& method);

  // Finished calls by (method, gRPC status code).
  std::map<std::pair<std::string, int>, uint64_t> calls() const;
  size_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  cri::InflightCalls& inflight() { return *inflight_; }

 private:
  friend class WatchedCall;
  void done(std::string_view method, const grpc::Status& status);

  std::shared_ptr<cri::InflightCalls> inflight_;
  size_t max_calls_;
  bool log_failures_;
  std::atomic<size_t> in_flight_{0};
  std::atomic<uint64_t> refused_{0};
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> calls_;
};

}  // namespace kpleg::criendpoint

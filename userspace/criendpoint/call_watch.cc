#include "criendpoint/call_watch.h"

#include <spdlog/spdlog.h>

#include "criforward/forwarder.h"

#include "criendpoint/request_subject.h"

namespace kpleg::criendpoint {

namespace {
// A request larger than this is not read for its subject (a CreateContainer's is a few KiB; an
// image push or a long exec command line need not be copied to find an id).
constexpr size_t kMaxSubjectRequestBytes = 64 * 1024;
}  // namespace

class WatchedCall final : public criforward::CallHooks {
 public:
  WatchedCall(CallWatch* watch, std::string method) : watch_(watch), method_(std::move(method)) {}
  void before_forward(grpc::ByteBuffer& request, criforward::Gate gate) override {
    cri::CallSubject subject;
    if (request.Length() <= kMaxSubjectRequestBytes)
      subject = request_subject(method_, criforward::flatten(request));
    ticket_ = watch_->inflight_->begin(short_method(method_), cri::CallOrigin::kEndpoint,
                                       std::move(subject));
    gate.open();
  }
  void on_done(const grpc::Status& status) override {
    ticket_.end();
    watch_->done(short_method(method_), status);
  }

 private:
  CallWatch* watch_;
  std::string method_;
  cri::InflightCalls::Ticket ticket_;
};

grpc::ServerGenericBidiReactor* CallWatch::admit(std::string_view who) {
  if (max_calls_ > 0 && in_flight_.fetch_add(1) >= max_calls_) {
    in_flight_.fetch_sub(1);
    refused_.fetch_add(1, std::memory_order_relaxed);
    return criforward::refuse_call(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        std::string(who) + ": " + std::to_string(max_calls_) + " calls in flight already"));
  }
  if (max_calls_ == 0) in_flight_.fetch_add(1);
  return nullptr;
}

std::unique_ptr<criforward::CallHooks> CallWatch::hooks(const std::string& method) {
  return std::make_unique<WatchedCall>(this, method);
}

void CallWatch::done(std::string_view method, const grpc::Status& status) {
  in_flight_.fetch_sub(1);
  const int code = status.error_code();
  if (log_failures_) {
    switch (status.error_code()) {
      case grpc::StatusCode::CANCELLED:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
      case grpc::StatusCode::INTERNAL:
      case grpc::StatusCode::UNKNOWN:
        spdlog::warn("call failed: {} ended with code {}: {}", method, code,
                     status.error_message());
        break;
      default:
        break;
    }
  }
  std::lock_guard lk(mu_);
  ++calls_[{std::string(method), code}];
}

std::map<std::pair<std::string, int>, uint64_t> CallWatch::calls() const {
  std::lock_guard lk(mu_);
  return calls_;
}

}  // namespace kpleg::criendpoint

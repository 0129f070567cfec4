// GrpcCriClient's status looks on an event loop (AsyncStatusCalls, cri_client.h): one HTTP/2
// connection of their own (h2_unary_mux.h), the same deadline, statistics and in-flight
// registry as the client's blocking calls.
#include <fmt/format.h>

#include "cri/endpoint.h"
#include "cri/event_decoder.h"
#include "cri/grpc_cri_client.h"
#include "cri/h2_stream.h"
#include "cri/h2_unary_mux.h"

namespace kpleg::cri {
namespace {

class H2StatusCalls final : public AsyncStatusCalls {
 public:
  H2StatusCalls(std::string socket_path, Reactor& reactor, H2UnaryOptions h2o,
                std::chrono::milliseconds timeout, CallStats& stats,
                std::shared_ptr<InflightCalls> inflight)
      : socket_path_(socket_path),
        reactor_(reactor),
        mux_(std::move(socket_path), reactor, h2o),
        timeout_(timeout),
        stats_(stats),
        inflight_(std::move(inflight)) {}
  ~H2StatusCalls() override { mux_.cancel_all(); }

  void container_status(const std::string& id, Done<v1::ContainerStatus> done) override {
    v1::ContainerStatusRequest req;
    req.set_container_id(id);
    status_call<v1::ContainerStatusResponse>(CriMethod::kContainerStatus, req, id, std::move(done));
  }
  void pod_sandbox_status(const std::string& id, Done<v1::PodSandboxStatus> done) override {
    v1::PodSandboxStatusRequest req;
    req.set_pod_sandbox_id(id);
    status_call<v1::PodSandboxStatusResponse>(CriMethod::kPodSandboxStatus, req, id,
                                              std::move(done));
  }
  bool list_ids(bool sandboxes, Done<std::vector<std::string>> done) override {
    // An empty request: no filter. Of the answer only the ids are read.
    call<std::vector<std::string>>(
        sandboxes ? CriMethod::kListPodSandbox : CriMethod::kListContainers, std::string(), "",
        [](const std::string& wire, std::vector<std::string>& ids) {
          return decode_listed_ids(wire, ids);
        },
        std::move(done));
    return true;
  }

  // Read over nghttp2 on the loop (h2_stream.h), counted once, when it ends, like the blocking
  // GrpcCriClient::container_events.
  std::unique_ptr<Stream> container_events(std::function<void(v1::ContainerEventResponse&)> on_event,
                                           std::function<void(Status)> on_end) override {
    auto stream = std::make_unique<EventStream>(reactor_);
    auto ev = std::make_shared<v1::ContainerEventResponse>();
    stream->reader.start(
        socket_path_, cri_method_path(CriMethod::kGetContainerEvents),
        v1::GetEventsRequest{}.SerializeAsString(),
        [ev, on_event = std::move(on_event)](std::string_view message) {
          // Only what kpleg reads of it (event_decoder.h).
          if (!decode_container_event(message, *ev)) return false;
          on_event(*ev);
          return true;
        },
        [&stats = stats_, on_end = std::move(on_end)](Status st) {
          const int code = st ? int(grpc::StatusCode::OK) : st.error().code;
          stats.record(CriMethod::kGetContainerEvents, code);
          if (st) {
            on_end(Error{grpc::StatusCode::UNAVAILABLE,
                         "CRI GetContainerEvents: the runtime ended the stream"});
          } else {
            on_end(Error{code, fmt::format("CRI GetContainerEvents failed: {}: {}",
                                           grpc_code_name(code), st.error().message)});
          }
        });
    return stream;
  }

 private:
  struct EventStream final : Stream {
    explicit EventStream(Reactor& reactor) : reader(reactor) {}
    void hold(std::chrono::steady_clock::time_point until) override { reader.hold(until); }
    void resume() override { reader.resume(); }
    void read_queued() override { reader.read_queued(); }
    H2StreamReader reader;
  };

  // A status look: the answer's `status` field, parsed from `Response`.
  template <typename Response, typename Out>
  void status_call(CriMethod method, const google::protobuf::MessageLite& request,
                   const std::string& id, Done<Out> done) {
    call<Out>(
        method, request.SerializeAsString(), id,
        [](const std::string& wire, Out& out) {
          Response r;
          if (!r.ParseFromString(wire)) return false;
          out = std::move(*r.mutable_status());
          return true;
        },
        std::move(done));
  }
  // One unary call on the mux: in the in-flight registry (the stuck-call watchdog's) while it
  // runs, counted when it ends, its answer read by `parse` (false: it does not parse).
  template <typename Answer>
  void call(CriMethod method, std::string request, const std::string& id,
            std::function<bool(const std::string&, Answer&)> parse, Done<Answer> done) {
    auto ticket = std::make_shared<InflightCalls::Ticket>();
    if (inflight_) {
      CallSubject subject;
      subject.id = id;
      *ticket = inflight_->begin(cri_method_name(method), CallOrigin::kDaemon, std::move(subject));
    }
    mux_.call(cri_method_path(method), request, std::chrono::steady_clock::now() + timeout_,
              [this, method, ticket, parse = std::move(parse),
               done = std::move(done)](Result<std::string> answer) {
                ticket->end();
                if (!answer) return done(failed(method, answer.error().code, answer.error().message));
                Answer out;
                if (!parse(*answer, out))
                  return done(failed(method, grpc::StatusCode::INTERNAL, "the answer does not parse"));
                stats_.record(method, grpc::StatusCode::OK);
                done(std::move(out));
              });
  }
  Error failed(CriMethod method, int code, std::string_view what) {
    stats_.record(method, code);
    return Error{code, fmt::format("CRI {} failed: {}: {}", cri_method_name(method),
                                   grpc_code_name(code), what)};
  }

  const std::string socket_path_;
  Reactor& reactor_;
  H2UnaryMux mux_;
  const std::chrono::milliseconds timeout_;
  CallStats& stats_;
  const std::shared_ptr<InflightCalls> inflight_;
};

}  // namespace

std::unique_ptr<AsyncStatusCalls> GrpcCriClient::async_status_calls(Reactor& reactor) {
  if (!options_.h2_read_calls) return nullptr;
  H2UnaryOptions h2o;
  h2o.max_message_bytes = size_t(options_.max_receive_message_bytes);
  return std::make_unique<H2StatusCalls>(socket_path_of(target_), reactor, h2o,
                                         options_.call_timeout, stats_, options_.inflight);
}

}  // namespace kpleg::cri

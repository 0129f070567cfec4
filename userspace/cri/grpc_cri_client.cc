#include "cri/grpc_cri_client.h"
#include "common/thread_name.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <climits>
#include <iterator>
#include <utility>

#include "cri/endpoint.h"
#include "cri/event_decoder.h"
#include "cri/h2_stream.h"

namespace kpleg::cri {
namespace {

using Clock = std::chrono::steady_clock;
using Stub = runtime::v1::RuntimeService::Stub;

ConnectionState from_grpc(grpc_connectivity_state s) {
  switch (s) {
    case GRPC_CHANNEL_IDLE:
      return ConnectionState::kIdle;
    case GRPC_CHANNEL_CONNECTING:
      return ConnectionState::kConnecting;
    case GRPC_CHANNEL_READY:
      return ConnectionState::kReady;
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return ConnectionState::kTransientFailure;
    case GRPC_CHANNEL_SHUTDOWN:
      return ConnectionState::kShutdown;
  }
  return ConnectionState::kShutdown;
}

template <typename T>
std::vector<T> take_all(google::protobuf::RepeatedPtrField<T>* items) {
  return std::vector<T>(std::make_move_iterator(items->begin()),
                        std::make_move_iterator(items->end()));
}

// A call whose answer carries nothing the caller needs: only whether it succeeded.
template <typename Response>
Status status_of(const Result<Response>& r) {
  if (!r) return r.error();
  return {};
}

CallSubject id_subject(const std::string& id) {
  CallSubject s;
  s.id = id;
  return s;
}

// A list call's subject: the id it filters by, or the pod its label selector picks.
CallSubject filter_subject(const std::string& id,
                           const google::protobuf::Map<std::string, std::string>& selector) {
  CallSubject s;
  s.id = id;
  if (auto it = selector.find("io.kubernetes.pod.uid"); it != selector.end())
    s.pod.uid = it->second;
  return s;
}

int clamp_ms(std::chrono::milliseconds ms) {
  return ms.count() > INT_MAX ? INT_MAX : static_cast<int>(ms.count());
}

}  // namespace

std::string_view connection_state_name(ConnectionState state) {
  switch (state) {
    case ConnectionState::kIdle:
      return "IDLE";
    case ConnectionState::kConnecting:
      return "CONNECTING";
    case ConnectionState::kReady:
      return "READY";
    case ConnectionState::kTransientFailure:
      return "TRANSIENT_FAILURE";
    case ConnectionState::kShutdown:
      return "SHUTDOWN";
  }
  return "UNKNOWN";
}

Result<std::unique_ptr<GrpcCriClient>> GrpcCriClient::create(std::string_view endpoint,
                                                             GrpcCriClientOptions options) {
  auto target = grpc_target_for_endpoint(endpoint);
  if (!target) return target.error();
  if (options.call_timeout <= std::chrono::milliseconds::zero()) {
    return Error{EINVAL, "CRI call timeout must be positive"};
  }
  if (options.list_timeout <= std::chrono::milliseconds::zero()) {
    return Error{EINVAL, "CRI list timeout must be positive"};
  }
  if (options.max_in_flight == 0) {
    return Error{EINVAL, "CRI max calls in flight must be at least 1"};
  }
  return std::unique_ptr<GrpcCriClient>(new GrpcCriClient(std::move(*target), std::move(options)));
}

GrpcCriClient::GrpcCriClient(std::string target, GrpcCriClientOptions options)
    : target_(std::move(target)), options_(std::move(options)), slots_(options_.max_in_flight) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, clamp_ms(options_.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, clamp_ms(options_.max_reconnect_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, clamp_ms(options_.min_connect_timeout));
  args.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  // A node agent talks to its runtime all the time; without this gRPC drops the connection
  // after 30 idle minutes and the next call would pay for a reconnect (and the watcher would
  // report a reconnect that was never an outage).
  args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT_MAX);
  // No keepalive pings, said explicitly: left at its default, the transport arms a timer of
  // INT_MAX ms and cancels and re-arms it on every read, work for gRPC's timer thread per call.
  // Given as INT_MAX, it means no timer at all.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  // No BDP pings: each one is a round trip, and a wakeup, on a stream that carries a few
  // small messages a second.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  channel_ = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
  stub_ = runtime::v1::RuntimeService::NewStub(channel_);
  // The watcher follows a connection of its own, which carries no calls: waiting on the calls'
  // connection would make it poll that connection too, and (with the poll engine) wake on every
  // response that another thread is waiting for.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  watch_channel_ = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
  if (options_.h2_read_calls) {
    H2UnaryOptions h2o;
    h2o.max_message_bytes = size_t(options_.max_receive_message_bytes);
    h2_ = std::make_unique<H2UnaryPool>(socket_path_of(target_), options_.max_in_flight, h2o);
  }
  watcher_ = named_thread("kpleg-cri-watch", [this] { watch_connectivity(); });
}

GrpcCriClient::~GrpcCriClient() {
  {
    std::lock_guard lk(watch_mu_);
    stopping_ = true;
    // The channel's shutdown ends the watcher's pending state watch.
    stub_.reset();
    channel_.reset();
    watch_channel_.reset();
  }
  if (watcher_.joinable()) watcher_.join();
  watch_cq_.Shutdown();
  void* tag;
  bool ok;
  while (watch_cq_.Next(&tag, &ok)) {
  }
}

ConnectionState GrpcCriClient::state() const {
  // The watcher's connection only: the calls' connection is read only while a call waits, so
  // it would still say READY long after the runtime went away.
  return from_grpc(watch_channel_->GetState(/*try_to_connect=*/false));
}

// The watcher follows the channel's state with gRPC's state-change notification, with no
// deadline: it sleeps until the state changes (or the client is destroyed), so an idle node
// costs no wakeup. gRPC reconnects a channel in TRANSIENT_FAILURE on its own, but a channel
// whose connection closed goes IDLE and would stay there until the next call; asking for the
// state with try_to_connect keeps it connecting, so the runtime's return is noticed (and
// reported) even when nothing is calling. A change away from READY is a lost connection even
// when the channel is READY again by the time the watcher looks.
void GrpcCriClient::watch_connectivity() {
  bool ever_ready = false;
  bool lost = false;
  bool left_ready = false;
  auto last = GRPC_CHANNEL_IDLE;
  while (true) {
    grpc_connectivity_state s;
    {
      std::lock_guard lk(watch_mu_);
      if (stopping_) break;
      s = watch_channel_->GetState(/*try_to_connect=*/true);
      // Lost: no longer READY, or it left READY since the last look (and is back already).
      if (ever_ready && !lost && (left_ready || s != GRPC_CHANNEL_READY)) {
        lost = true;
        spdlog::warn("CRI runtime at {}: connection lost ({}), reconnecting", target_,
                     s == GRPC_CHANNEL_READY ? "it left READY"
                                             : connection_state_name(from_grpc(s)));
      }
      if (s == GRPC_CHANNEL_READY && (lost || !ever_ready)) {
        if (lost) {
          reconnects_.fetch_add(1, std::memory_order_relaxed);
          spdlog::info("CRI runtime at {}: reconnected", target_);
          if (options_.on_reconnect) options_.on_reconnect();
        } else {
          spdlog::info("CRI runtime at {}: connected", target_);
        }
        ever_ready = true;
        lost = false;
      }
      if (s != last) {
        last = s;
        if (options_.on_state_change) options_.on_state_change();
      }
      watch_channel_->NotifyOnStateChange(s, gpr_inf_future(GPR_CLOCK_REALTIME), &watch_cq_,
                                          this);
    }
    void* tag;
    bool ok;
    if (!watch_cq_.Next(&tag, &ok)) break;
    left_ready = ok && s == GRPC_CHANNEL_READY;
  }
}

Error GrpcCriClient::failed(CriMethod method, int code, std::string_view what) {
  stats_.record(method, code);
  return Error{code, fmt::format("CRI {} failed: {}: {}", cri_method_name(method),
                                 grpc_code_name(code), what)};
}

// What every call does around its transport: it is in flight (for the stuck-call watchdog) from
// the start, since a call waiting for a slot is stuck too from its caller's view; it waits for
// a call slot until its deadline; and it is refused once kplegd is shutting down. `body` makes
// the call with the monotonic deadline and returns the answer or a failed(...) error.
template <typename Response, typename Body>
Result<Response> GrpcCriClient::guarded(CriMethod method, std::chrono::milliseconds timeout,
                                        CallSubject subject, Body&& body) {
  const auto deadline = Clock::now() + timeout;
  InflightCalls::Ticket ticket;
  if (options_.inflight) {
    ticket = options_.inflight->begin(cri_method_name(method), CallOrigin::kDaemon,
                                      std::move(subject));
  }
  CallSlot slot(slots_, deadline);
  if (!slot.held()) {
    return failed(method, grpc::StatusCode::DEADLINE_EXCEEDED,
                  fmt::format("no free call slot within {} ms ({} calls in flight)",
                              timeout.count(), slots_.capacity()));
  }
  return body(deadline);
}

template <typename Request, typename Response>
Result<Response> GrpcCriClient::invoke(CriMethod method, StubCall<Request, Response> rpc,
                                       const Request& request, std::chrono::milliseconds timeout,
                                       CallSubject subject) {
  return guarded<Response>(
      method, timeout, std::move(subject), [&](Clock::time_point deadline) -> Result<Response> {
        grpc::ClientContext ctx;
        // gRPC deadlines are wall-clock; convert what is left of the monotonic one.
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::duration_cast<std::chrono::system_clock::duration>(
                             deadline - Clock::now()));
        {
          std::lock_guard lk(calls_mu_);
          if (cancelled_)
            return failed(method, grpc::StatusCode::CANCELLED, "kplegd is shutting down");
          calls_.insert(&ctx);
        }
        Response response;
        grpc::Status st = (stub_.get()->*rpc)(&ctx, request, &response);
        {
          std::lock_guard lk(calls_mu_);
          calls_.erase(&ctx);
        }
        if (!st.ok()) return failed(method, st.error_code(), st.error_message());
        stats_.record(method, grpc::StatusCode::OK);
        return response;
      });
}

template <typename Response>
Result<Response> GrpcCriClient::invoke_h2(CriMethod method,
                                          const google::protobuf::MessageLite& request,
                                          std::chrono::milliseconds timeout, CallSubject subject) {
  h2_calls_.fetch_add(1, std::memory_order_relaxed);
  const std::string_view path = cri_method_path(method);
  return guarded<Response>(
      method, timeout, std::move(subject), [&](Clock::time_point deadline) -> Result<Response> {
        if (h2_cancel_.cancelled())
          return failed(method, grpc::StatusCode::CANCELLED, "kplegd is shutting down");
        auto answer = h2_->call(path, request.SerializeAsString(), deadline, &h2_cancel_);
        if (!answer) return failed(method, answer.error().code, answer.error().message);
        Response response;
        if (!response.ParseFromString(*answer))
          return failed(method, grpc::StatusCode::INTERNAL, "the answer does not parse");
        stats_.record(method, grpc::StatusCode::OK);
        return response;
      });
}

template <typename Request, typename Response>
Result<Response> GrpcCriClient::read(CriMethod method, StubCall<Request, Response> rpc,
                                     const Request& request, std::chrono::milliseconds timeout,
                                     CallSubject subject) {
  if (h2_) return invoke_h2<Response>(method, request, timeout, std::move(subject));
  return invoke(method, rpc, request, timeout, std::move(subject));
}

void GrpcCriClient::cancel_calls() {
  h2_cancel_.cancel();
  std::lock_guard lk(calls_mu_);
  cancelled_ = true;
  for (auto* ctx : calls_) ctx->TryCancel();
}

Result<v1::VersionResponse> GrpcCriClient::version() {
  v1::VersionRequest req;
  req.set_version("v1");
  return read(CriMethod::kVersion, &Stub::Version, req, options_.call_timeout, {});
}

Result<v1::RuntimeStatus> GrpcCriClient::status() {
  v1::StatusRequest req;
  auto r = read(CriMethod::kStatus, &Stub::Status, req, options_.call_timeout, {});
  if (!r) return r.error();
  return std::move(*r->mutable_status());
}

Result<std::map<std::string, std::string>> GrpcCriClient::status_info() {
  v1::StatusRequest req;
  req.set_verbose(true);
  auto r = read(CriMethod::kStatus, &Stub::Status, req, options_.call_timeout, {});
  if (!r) return r.error();
  return std::map<std::string, std::string>(r->info().begin(), r->info().end());
}

Result<std::vector<v1::PodSandbox>> GrpcCriClient::list_pod_sandboxes(
    const v1::PodSandboxFilter& filter) {
  v1::ListPodSandboxRequest req;
  *req.mutable_filter() = filter;
  const bool full = filter.id().empty() && filter.label_selector().empty();
  auto r = read(CriMethod::kListPodSandbox, &Stub::ListPodSandbox, req,
                full ? list_timeout() : options_.call_timeout,
                filter_subject(filter.id(), filter.label_selector()));
  if (!r) return r.error();
  return take_all(r->mutable_items());
}

Result<v1::PodSandboxStatus> GrpcCriClient::pod_sandbox_status(const std::string& pod_sandbox_id) {
  v1::PodSandboxStatusRequest req;
  req.set_pod_sandbox_id(pod_sandbox_id);
  auto r = read(CriMethod::kPodSandboxStatus, &Stub::PodSandboxStatus, req,
                options_.call_timeout, id_subject(pod_sandbox_id));
  if (!r) return r.error();
  return std::move(*r->mutable_status());
}

Result<std::vector<v1::Container>> GrpcCriClient::list_containers(
    const v1::ContainerFilter& filter) {
  v1::ListContainersRequest req;
  *req.mutable_filter() = filter;
  const bool full = filter.id().empty() && filter.pod_sandbox_id().empty() &&
                    filter.label_selector().empty();
  const std::string& id = filter.pod_sandbox_id().empty() ? filter.id() : filter.pod_sandbox_id();
  auto r = read(CriMethod::kListContainers, &Stub::ListContainers, req,
                full ? list_timeout() : options_.call_timeout,
                filter_subject(id, filter.label_selector()));
  if (!r) return r.error();
  return take_all(r->mutable_containers());
}

Result<v1::ContainerStatus> GrpcCriClient::container_status(const std::string& container_id) {
  v1::ContainerStatusRequest req;
  req.set_container_id(container_id);
  auto r = read(CriMethod::kContainerStatus, &Stub::ContainerStatus, req, options_.call_timeout,
                id_subject(container_id));
  if (!r) return r.error();
  return std::move(*r->mutable_status());
}

Result<std::string> GrpcCriClient::run_pod_sandbox(const v1::PodSandboxConfig& config,
                                                   const std::string& runtime_handler) {
  v1::RunPodSandboxRequest req;
  *req.mutable_config() = config;
  req.set_runtime_handler(runtime_handler);
  auto r = invoke(CriMethod::kRunPodSandbox, &Stub::RunPodSandbox, req, options_.call_timeout,
                  CallSubject{{},
                              {config.metadata().uid(), config.metadata().name(),
                               config.metadata().namespace_()},
                              {}});
  if (!r) return r.error();
  return std::move(*r->mutable_pod_sandbox_id());
}

Status GrpcCriClient::stop_pod_sandbox(const std::string& pod_sandbox_id) {
  v1::StopPodSandboxRequest req;
  req.set_pod_sandbox_id(pod_sandbox_id);
  return status_of(invoke(CriMethod::kStopPodSandbox, &Stub::StopPodSandbox, req,
                          options_.call_timeout, id_subject(pod_sandbox_id)));
}

Status GrpcCriClient::remove_pod_sandbox(const std::string& pod_sandbox_id) {
  v1::RemovePodSandboxRequest req;
  req.set_pod_sandbox_id(pod_sandbox_id);
  return status_of(invoke(CriMethod::kRemovePodSandbox, &Stub::RemovePodSandbox, req,
                          options_.call_timeout, id_subject(pod_sandbox_id)));
}

Result<std::string> GrpcCriClient::create_container(const std::string& pod_sandbox_id,
                                                    const v1::ContainerConfig& config,
                                                    const v1::PodSandboxConfig& sandbox_config) {
  v1::CreateContainerRequest req;
  req.set_pod_sandbox_id(pod_sandbox_id);
  *req.mutable_config() = config;
  *req.mutable_sandbox_config() = sandbox_config;
  auto r = invoke(CriMethod::kCreateContainer, &Stub::CreateContainer, req, options_.call_timeout,
                  id_subject(pod_sandbox_id));
  if (!r) return r.error();
  return std::move(*r->mutable_container_id());
}

Status GrpcCriClient::start_container(const std::string& container_id) {
  v1::StartContainerRequest req;
  req.set_container_id(container_id);
  return status_of(invoke(CriMethod::kStartContainer, &Stub::StartContainer, req,
                          options_.call_timeout, id_subject(container_id)));
}

Status GrpcCriClient::stop_container(const std::string& container_id, int64_t grace_period_s) {
  v1::StopContainerRequest req;
  req.set_container_id(container_id);
  req.set_timeout(grace_period_s);
  // The runtime may legitimately take the whole grace period before it kills.
  auto timeout =
      options_.call_timeout + std::chrono::seconds(grace_period_s > 0 ? grace_period_s : 0);
  return status_of(invoke(CriMethod::kStopContainer, &Stub::StopContainer, req, timeout,
                          id_subject(container_id)));
}

Status GrpcCriClient::remove_container(const std::string& container_id) {
  v1::RemoveContainerRequest req;
  req.set_container_id(container_id);
  return status_of(invoke(CriMethod::kRemoveContainer, &Stub::RemoveContainer, req,
                          options_.call_timeout, id_subject(container_id)));
}

Status GrpcCriClient::container_events(
    CancelToken& cancel, const std::function<void(v1::ContainerEventResponse&)>& on_event) {
  // Read over nghttp2 on this thread rather than with grpc++'s reader: see h2_stream.h.
  v1::ContainerEventResponse ev;
  auto st = h2_server_stream(
      socket_path_of(target_), cri_method_path(CriMethod::kGetContainerEvents),
      v1::GetEventsRequest{}.SerializeAsString(), cancel, [&](std::string_view message) {
        // Only what kpleg reads of it (event_decoder.h).
        if (!decode_container_event(message, ev)) return false;
        on_event(ev);
        return true;
      });
  const int code = st ? int(grpc::StatusCode::OK) : st.error().code;
  stats_.record(CriMethod::kGetContainerEvents, code);
  if (st) {
    return Error{grpc::StatusCode::UNAVAILABLE, "CRI GetContainerEvents: the runtime ended the stream"};
  }
  return Error{code, fmt::format("CRI GetContainerEvents failed: {}: {}", grpc_code_name(code),
                                 st.error().message)};
}

}  // namespace kpleg::cri

#include "kpleg-cri-proxy/cri_proxy.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cri/api.grpc.pb.h"
#include "cri/endpoint.h"

namespace kpleg::cri {
namespace {

namespace v1 = ::runtime::v1;
using Stub = v1::RuntimeService::Stub;
using SysClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kPodUidLabel = "io.kubernetes.pod.uid";
// A held call looks up this often to see whether its caller is still waiting (the sync server
// has no cancellation callback); clearing the stall or shutting down wakes it at once.
constexpr auto kHoldPoll = std::chrono::milliseconds(20);
// Ids of removed containers are never evicted one by one; the cache starts over past this.
constexpr size_t kMaxCachedIds = 100000;
// How long shutdown lets forwarded calls finish before gRPC cancels them.
constexpr auto kShutdownGrace = std::chrono::seconds(1);

// What a call names: ids to map to a pod, or the pod uid itself (a label selector).
struct Concern {
  std::vector<std::string> ids;
  std::string pod_uid;
  bool empty() const { return ids.empty() && pod_uid.empty(); }
};

std::string label_or_empty(const google::protobuf::Map<std::string, std::string>& labels) {
  auto it = labels.find(kPodUidLabel);
  return it == labels.end() ? std::string() : it->second;
}

}  // namespace

class CriProxy::Impl final : public v1::RuntimeService::Service {
 public:
  Impl(CriProxyOptions options, std::string listen_target, std::string upstream_target)
      : options_(std::move(options)),
        listen_target_(std::move(listen_target)),
        upstream_target_(std::move(upstream_target)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
    channel_ = grpc::CreateCustomChannel(upstream_target_, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::RuntimeService::NewStub(channel_);
  }

  kpleg::Status serve() {
    const std::string path = socket_path_of(listen_target_);
    if (auto st = prepare_listen_socket(path, "CRI proxy"); !st) return st;
    grpc::ServerBuilder builder;
    builder.AddListeningPort(listen_target_, grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
    builder.SetMaxSendMessageSize(options_.max_message_bytes);
    // Every held call keeps one server thread; the sync server adds threads on demand up to
    // this quota, so a stalled pod never queues other pods' calls behind it.
    grpc::ResourceQuota quota("kpleg-cri-proxy");
    quota.SetMaxThreads(options_.max_threads);
    builder.SetResourceQuota(quota);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
    server_ = builder.BuildAndStart();
    if (!server_) {
      return Error{EADDRNOTAVAIL, "CRI proxy: cannot listen on " + listen_target_ +
                                      " (is the directory there and writable?)"};
    }
    // The proxy is as powerful as the runtime socket it fronts: owner only, like the runtime's.
    if (chmod(path.c_str(), 0600) != 0) {
      auto err = Error::from_errno(errno, "CRI proxy: chmod " + path);
      shutdown();
      return err;
    }
    spdlog::info("CRI proxy: listening on {}, forwarding to {}", listen_target_, upstream_target_);
    return {};
  }

  void shutdown() {
    {
      std::lock_guard lk(mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    cv_.notify_all();
    if (server_) {
      server_->Shutdown(SysClock::now() + kShutdownGrace);
      server_->Wait();
    }
    unlink(socket_path_of(listen_target_).c_str());
  }

  const std::string& endpoint() const { return listen_target_; }

  Result<std::string> upstream_version(std::chrono::milliseconds timeout) const {
    grpc::ClientContext ctx;
    ctx.set_deadline(SysClock::now() + timeout);
    ctx.set_wait_for_ready(true);  // a runtime still starting gets the whole timeout
    v1::VersionRequest req;
    req.set_version("v1");
    v1::VersionResponse resp;
    auto st = stub_->Version(&ctx, req, &resp);
    if (!st.ok()) {
      return Error{st.error_code(), "CRI proxy: upstream " + upstream_target_ +
                                        " did not answer Version: " + st.error_message()};
    }
    return resp.runtime_name() + " " + resp.runtime_version() + " (CRI " +
           resp.runtime_api_version() + ")";
  }

  void set_stall(std::optional<PodStall> stall) {
    {
      std::lock_guard lk(mu_);
      stall_ = std::move(stall);
    }
    cv_.notify_all();
  }

  std::optional<PodStall> stall() const {
    std::lock_guard lk(mu_);
    return stall_;
  }

  CriProxyStats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }

  // --- RuntimeService ----------------------------------------------------------------------

  grpc::Status Version(grpc::ServerContext* ctx, const v1::VersionRequest* req,
                       v1::VersionResponse* resp) override {
    return forward(ctx, *req, resp, &Stub::Version);
  }
  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest* req,
                      v1::StatusResponse* resp) override {
    return forward(ctx, *req, resp, &Stub::Status);
  }

  grpc::Status RunPodSandbox(grpc::ServerContext* ctx, const v1::RunPodSandboxRequest* req,
                             v1::RunPodSandboxResponse* resp) override {
    auto st = forward(ctx, *req, resp, &Stub::RunPodSandbox);
    if (st.ok()) learn(resp->pod_sandbox_id(), req->config().metadata().uid());
    return st;
  }
  grpc::Status StopPodSandbox(grpc::ServerContext* ctx, const v1::StopPodSandboxRequest* req,
                              v1::StopPodSandboxResponse* resp) override {
    return stall_or_forward(ctx, "StopPodSandbox", {{req->pod_sandbox_id()}, {}}, *req, resp,
                            &Stub::StopPodSandbox);
  }
  grpc::Status RemovePodSandbox(grpc::ServerContext* ctx, const v1::RemovePodSandboxRequest* req,
                                v1::RemovePodSandboxResponse* resp) override {
    return stall_or_forward(ctx, "RemovePodSandbox", {{req->pod_sandbox_id()}, {}}, *req, resp,
                            &Stub::RemovePodSandbox);
  }
  grpc::Status PodSandboxStatus(grpc::ServerContext* ctx, const v1::PodSandboxStatusRequest* req,
                                v1::PodSandboxStatusResponse* resp) override {
    auto st = stall_or_forward(ctx, "PodSandboxStatus", {{req->pod_sandbox_id()}, {}}, *req, resp,
                               &Stub::PodSandboxStatus);
    if (st.ok()) learn(resp->status().id(), resp->status().metadata().uid());
    return st;
  }
  grpc::Status ListPodSandbox(grpc::ServerContext* ctx, const v1::ListPodSandboxRequest* req,
                              v1::ListPodSandboxResponse* resp) override {
    Concern c;
    if (!req->filter().id().empty()) c.ids.push_back(req->filter().id());
    c.pod_uid = label_or_empty(req->filter().label_selector());
    if (c.empty()) {
      if (auto answer = slow_full_list(ctx, "ListPodSandbox")) return *answer;
    }
    auto st = stall_or_forward(ctx, "ListPodSandbox", std::move(c), *req, resp,
                               &Stub::ListPodSandbox);
    if (st.ok()) {
      for (const auto& s : resp->items()) learn(s.id(), s.metadata().uid());
    }
    return st;
  }

  grpc::Status CreateContainer(grpc::ServerContext* ctx, const v1::CreateContainerRequest* req,
                               v1::CreateContainerResponse* resp) override {
    auto st = forward(ctx, *req, resp, &Stub::CreateContainer);
    if (st.ok()) {
      std::string uid = label_or_empty(req->config().labels());
      if (uid.empty()) uid = req->sandbox_config().metadata().uid();
      learn(resp->container_id(), uid);
    }
    return st;
  }
  grpc::Status StartContainer(grpc::ServerContext* ctx, const v1::StartContainerRequest* req,
                              v1::StartContainerResponse* resp) override {
    return forward(ctx, *req, resp, &Stub::StartContainer);
  }
  grpc::Status StopContainer(grpc::ServerContext* ctx, const v1::StopContainerRequest* req,
                             v1::StopContainerResponse* resp) override {
    return stall_or_forward(ctx, "StopContainer", {{req->container_id()}, {}}, *req, resp,
                            &Stub::StopContainer);
  }
  grpc::Status RemoveContainer(grpc::ServerContext* ctx, const v1::RemoveContainerRequest* req,
                               v1::RemoveContainerResponse* resp) override {
    return stall_or_forward(ctx, "RemoveContainer", {{req->container_id()}, {}}, *req, resp,
                            &Stub::RemoveContainer);
  }
  grpc::Status ListContainers(grpc::ServerContext* ctx, const v1::ListContainersRequest* req,
                              v1::ListContainersResponse* resp) override {
    Concern c;
    if (!req->filter().id().empty()) c.ids.push_back(req->filter().id());
    if (!req->filter().pod_sandbox_id().empty()) c.ids.push_back(req->filter().pod_sandbox_id());
    c.pod_uid = label_or_empty(req->filter().label_selector());
    if (c.empty()) {
      if (auto answer = slow_full_list(ctx, "ListContainers")) return *answer;
    }
    auto st = stall_or_forward(ctx, "ListContainers", std::move(c), *req, resp,
                               &Stub::ListContainers);
    if (st.ok()) {
      for (const auto& ctr : resp->containers()) learn_container(ctr);
    }
    return st;
  }
  grpc::Status ContainerStatus(grpc::ServerContext* ctx, const v1::ContainerStatusRequest* req,
                               v1::ContainerStatusResponse* resp) override {
    auto st = stall_or_forward(ctx, "ContainerStatus", {{req->container_id()}, {}}, *req, resp,
                               &Stub::ContainerStatus);
    if (st.ok()) learn(resp->status().id(), label_or_empty(resp->status().labels()));
    return st;
  }

  grpc::Status GetContainerEvents(grpc::ServerContext* ctx, const v1::GetEventsRequest* req,
                                  grpc::ServerWriter<v1::ContainerEventResponse>* writer) override {
    auto upstream_ctx = grpc::ClientContext::FromServerContext(*ctx);
    auto reader = stub_->GetContainerEvents(upstream_ctx.get(), *req);
    count_forwarded();
    v1::ContainerEventResponse ev;
    std::deque<v1::ContainerEventResponse> held;  // the stalled pod's, in order
    while (reader->Read(&ev)) {
      std::optional<std::string> stalled;
      {
        std::lock_guard lk(mu_);
        if (stall_) stalled = stall_->pod_uid;
      }
      // A runtime stuck on a pod tells nothing about it: its events wait for the stall to clear.
      if (stalled && ev.pod_sandbox_status().metadata().uid() == *stalled) {
        held.push_back(std::move(ev));
        continue;
      }
      bool gone = false;
      while (!held.empty() && (!stalled || held.front().pod_sandbox_status().metadata().uid() != *stalled)) {
        gone = gone || !writer->Write(held.front());
        held.pop_front();
      }
      if (gone || !writer->Write(ev)) {  // our caller went away
        upstream_ctx->TryCancel();
        break;
      }
    }
    return reader->Finish();
  }

 private:
  template <typename Req, typename Resp>
  using Rpc = grpc::Status (Stub::*)(grpc::ClientContext*, const Req&, Resp*);

  // The caller's deadline and cancellation carry over to the upstream call, so a caller that
  // gives up frees the upstream call (and this thread) too.
  template <typename Req, typename Resp>
  grpc::Status forward(grpc::ServerContext* ctx, const Req& req, Resp* resp, Rpc<Req, Resp> rpc) {
    auto upstream_ctx = grpc::ClientContext::FromServerContext(*ctx);
    count_forwarded();
    return (stub_.get()->*rpc)(upstream_ctx.get(), req, resp);
  }

  template <typename Req, typename Resp>
  grpc::Status stall_or_forward(grpc::ServerContext* ctx, const char* method, Concern concern,
                                const Req& req, Resp* resp, Rpc<Req, Resp> rpc) {
    if (auto stall = stall_concerning(ctx, concern)) {
      if (stall->mode == StallMode::kLateAnswer) {
        auto st = forward(ctx, req, resp, rpc);
        if (auto answer = hold(ctx, method, stall->pod_uid)) return *answer;
        return st;
      }
      if (auto answer = hold(ctx, method, stall->pod_uid)) return *answer;
    }
    return forward(ctx, req, resp, rpc);
  }

  void count_forwarded() {
    std::lock_guard lk(mu_);
    ++stats_.forwarded;
  }

  // The stall (its pod and mode, as set when the call came) if the call concerns its pod.
  std::optional<PodStall> stall_concerning(grpc::ServerContext* ctx, const Concern& c) {
    if (c.empty()) return std::nullopt;
    PodStall stall;
    std::vector<std::string> unknown;
    {
      std::lock_guard lk(mu_);
      if (!stall_) return std::nullopt;
      stall = *stall_;
      if (c.pod_uid == stall.pod_uid) return stall;
      for (const auto& id : c.ids) {
        auto it = pod_of_.find(id);
        if (it == pod_of_.end()) {
          unknown.push_back(id);
        } else if (it->second == stall.pod_uid) {
          return stall;
        }
      }
    }
    for (const auto& id : unknown) {
      if (lookup(ctx, id) == stall.pod_uid) return stall;
    }
    return std::nullopt;
  }

  // Maps an id the proxy has not seen to its pod through the upstream; empty when the
  // upstream does not know it (or does not answer in time: the call is then not stalled).
  std::string lookup(grpc::ServerContext* ctx, const std::string& id) {
    auto deadline = std::min(ctx->deadline(), SysClock::now() + options_.lookup_timeout);
    {
      std::lock_guard lk(mu_);
      ++stats_.lookups;
    }
    {
      grpc::ClientContext c;
      c.set_deadline(deadline);
      v1::ListContainersRequest req;
      req.mutable_filter()->set_id(id);
      v1::ListContainersResponse resp;
      if (auto st = stub_->ListContainers(&c, req, &resp); !st.ok()) {
        spdlog::debug("CRI proxy: looking up container {}: {}", id, st.error_message());
      } else if (resp.containers_size() > 0) {
        const auto& ctr = resp.containers(0);
        std::string uid = label_or_empty(ctr.labels());
        if (uid.empty() && !ctr.pod_sandbox_id().empty() && ctr.pod_sandbox_id() != id) {
          uid = cached(ctr.pod_sandbox_id());
          if (uid.empty()) uid = lookup(ctx, ctr.pod_sandbox_id());
        }
        learn(id, uid);
        return uid;
      }
    }
    grpc::ClientContext c;
    c.set_deadline(deadline);
    v1::ListPodSandboxRequest req;
    req.mutable_filter()->set_id(id);
    v1::ListPodSandboxResponse resp;
    if (auto st = stub_->ListPodSandbox(&c, req, &resp); !st.ok()) {
      spdlog::debug("CRI proxy: looking up sandbox {}: {}", id, st.error_message());
      return "";
    }
    for (const auto& s : resp.items()) {
      if (s.id() == id) {
        learn(id, s.metadata().uid());
        return s.metadata().uid();
      }
    }
    return "";
  }

  std::string cached(const std::string& id) {
    std::lock_guard lk(mu_);
    auto it = pod_of_.find(id);
    return it == pod_of_.end() ? std::string() : it->second;
  }

  void learn(const std::string& id, const std::string& uid) {
    if (id.empty() || uid.empty()) return;
    std::lock_guard lk(mu_);
    if (pod_of_.size() >= kMaxCachedIds) pod_of_.clear();
    pod_of_[id] = uid;
  }

  void learn_container(const v1::Container& ctr) {
    std::string uid = label_or_empty(ctr.labels());
    if (uid.empty()) uid = cached(ctr.pod_sandbox_id());
    learn(ctr.id(), uid);
  }

  // An unfiltered list waits the full-list delay (if any) before it goes upstream. Returns the
  // answer to give instead when the caller's deadline passes or it cancels meanwhile.
  std::optional<grpc::Status> slow_full_list(grpc::ServerContext* ctx, const char* method) {
    std::unique_lock lk(mu_);
    if (full_list_delay_.count() <= 0) return std::nullopt;
    ++stats_.full_lists_delayed;
    ++stats_.full_lists_in_flight;
    const auto until = SteadyClock::now() + full_list_delay_;
    std::optional<grpc::Status> answer;
    while (!answer && SteadyClock::now() < until) {
      if (shut_down_)
        answer = grpc::Status(grpc::StatusCode::UNAVAILABLE, "CRI proxy shutting down");
      else if (ctx->deadline() <= SysClock::now())
        answer = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              std::string(method) + " slowed by the CRI proxy past the deadline");
      else if (ctx->IsCancelled())
        answer = grpc::Status(grpc::StatusCode::CANCELLED, "caller cancelled a slow list");
      else
        cv_.wait_until(lk, std::min(until, SteadyClock::now() + kHoldPoll));
    }
    --stats_.full_lists_in_flight;
    return answer;
  }

 public:
  void set_full_list_delay(std::chrono::milliseconds delay) {
    std::lock_guard lk(mu_);
    full_list_delay_ = delay;
  }

 private:
  // Holds a call of the stalled pod (or, kLateAnswer, its answer). Returns the answer to give
  // instead, or nothing when the call goes on (delay over, stall cleared or moved).
  std::optional<grpc::Status> hold(grpc::ServerContext* ctx, const char* method,
                                   const std::string& uid) {
    const auto start = SteadyClock::now();
    std::optional<grpc::Status> answer;
    std::unique_lock lk(mu_);
    ++stats_.stalled;
    ++stats_.stalled_in_flight;
    spdlog::debug("CRI proxy: holding {} of pod {}", method, uid);
    while (true) {
      if (shut_down_) {
        answer = grpc::Status(grpc::StatusCode::UNAVAILABLE, "CRI proxy shutting down");
        break;
      }
      if (!stall_ || stall_->pod_uid != uid) break;
      // A passed deadline also shows as a cancelled call: look at the deadline first.
      if (ctx->deadline() <= SysClock::now()) {
        answer = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              std::string(method) + " of pod " + uid + " stalled by the CRI proxy");
        break;
      }
      if (ctx->IsCancelled()) {
        answer = grpc::Status(grpc::StatusCode::CANCELLED, "caller cancelled a stalled call");
        break;
      }
      const auto now = SteadyClock::now();
      auto wake = now + kHoldPoll;
      if (stall_->mode != StallMode::kHang) {
        const auto until = start + stall_->delay;
        if (now >= until) break;
        wake = std::min(wake, until);
      }
      cv_.wait_until(lk, wake);
    }
    --stats_.stalled_in_flight;
    if (answer) ++stats_.gave_up;
    spdlog::debug("CRI proxy: released {} of pod {} after {} ms ({})", method, uid,
                  std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start)
                      .count(),
                  answer ? answer->error_message() : "forwarded");
    return answer;
  }

  const CriProxyOptions options_;
  const std::string listen_target_;
  const std::string upstream_target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  std::unique_ptr<grpc::Server> server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<PodStall> stall_;
  std::chrono::milliseconds full_list_delay_{0};
  bool shut_down_ = false;
  std::unordered_map<std::string, std::string> pod_of_;  // sandbox/container id -> pod uid
  CriProxyStats stats_;
};

Result<std::unique_ptr<CriProxy>> CriProxy::start(CriProxyOptions options) {
  auto listen = grpc_target_for_endpoint(options.listen_endpoint);
  if (!listen) return Error{listen.error().code, "CRI proxy --listen: " + listen.error().message};
  auto upstream = grpc_target_for_endpoint(options.upstream_endpoint);
  if (!upstream) {
    return Error{upstream.error().code, "CRI proxy --upstream: " + upstream.error().message};
  }
  if (*listen == *upstream) {
    return Error{EINVAL, "CRI proxy: listen and upstream are the same socket " + *listen};
  }
  if (options.max_threads < 4) return Error{EINVAL, "CRI proxy: max_threads must be at least 4"};
  if (options.lookup_timeout <= std::chrono::milliseconds::zero()) {
    return Error{EINVAL, "CRI proxy: lookup_timeout must be positive"};
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*listen), std::move(*upstream));
  if (auto st = impl->serve(); !st) return st.error();
  return std::unique_ptr<CriProxy>(new CriProxy(std::move(impl)));
}

CriProxy::CriProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CriProxy::~CriProxy() { shutdown(); }
void CriProxy::shutdown() { impl_->shutdown(); }
const std::string& CriProxy::endpoint() const { return impl_->endpoint(); }
Result<std::string> CriProxy::upstream_version(std::chrono::milliseconds timeout) const {
  return impl_->upstream_version(timeout);
}

void CriProxy::set_stalled_pod(PodStall stall) {
  spdlog::info("CRI proxy: stalling pod {} ({})", stall.pod_uid,
               stall.mode == StallMode::kHang
                   ? std::string("hang until the caller's deadline")
               : stall.mode == StallMode::kDelay
                   ? std::to_string(stall.delay.count()) + " ms delay"
                   : "answers held " + std::to_string(stall.delay.count()) + " ms");
  impl_->set_stall(std::move(stall));
}

void CriProxy::clear_stall() {
  spdlog::info("CRI proxy: stall cleared");
  impl_->set_stall(std::nullopt);
}

std::optional<PodStall> CriProxy::stall() const { return impl_->stall(); }

void CriProxy::set_full_list_delay(std::chrono::milliseconds delay) {
  spdlog::info("CRI proxy: full lists take {} ms", delay.count());
  impl_->set_full_list_delay(delay);
}
CriProxyStats CriProxy::stats() const { return impl_->stats(); }

}  // namespace kpleg::cri

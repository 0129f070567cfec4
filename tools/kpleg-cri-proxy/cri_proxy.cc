#include "kpleg-cri-proxy/cri_proxy.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "cri/api.grpc.pb.h"
#include "cri/endpoint.h"
#include "criforward/forwarder.h"
#include "criforward/timer.h"

namespace kpleg::cri {
namespace {

namespace v1 = ::runtime::v1;
using SysClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;
using criforward::Gate;

constexpr const char* kPodUidLabel = "io.kubernetes.pod.uid";
constexpr std::string_view kRuntimeService = "/runtime.v1.RuntimeService/";
// Ids of removed containers are never evicted one by one; the cache starts over past this.
constexpr size_t kMaxCachedIds = 100000;

std::string label_or_empty(const google::protobuf::Map<std::string, std::string>& labels) {
  auto it = labels.find(kPodUidLabel);
  return it == labels.end() ? std::string() : it->second;
}

template <typename Msg>
bool parse(Msg& m, const grpc::ByteBuffer& b) {
  return m.ParseFromString(criforward::flatten(b));
}

// One call of the RuntimeService as the proxy follows it: what it names, and its hold while it
// has one. Shared by the call's hooks, its timer and its id lookups, any of which may outlive
// the call; every field but the constant ones is under the proxy's lock.
struct ProxiedCall {
  enum class Kind { kNone, kStall, kFullList };
  std::string method;  // short name
  // What the call names: ids to map to a pod, or the pod uid itself (a label selector).
  std::vector<std::string> ids;
  std::string pod_uid;
  std::string learn_uid;  // RunPodSandbox, CreateContainer: the pod the new id belongs to
  SysClock::time_point deadline;
  bool stallable = false;
  bool full_list = false;
  bool late_answer = false;  // matched a kLateAnswer stall: its answer is held
  bool ended = false;
  Gate gate{nullptr};
  Kind held = Kind::kNone;
  bool forward_gate = false;  // the hold is before the call goes upstream (else, its answer)
  std::string held_pod;
  SteadyClock::time_point held_since;
  std::chrono::milliseconds list_delay{0};  // kFullList
  criforward::Timer::Id timer = 0;
};

}  // namespace

class CriProxy::Impl final : public criforward::Hooks {
 public:
  Impl(CriProxyOptions options, std::string listen_target, std::string upstream_target)
      : options_(std::move(options)),
        listen_target_(std::move(listen_target)),
        upstream_target_(std::move(upstream_target)) {}

  kpleg::Status serve() {
    criforward::ForwarderOptions fo;
    fo.who = "CRI proxy";
    fo.listen_target = listen_target_;
    fo.upstream_target = upstream_target_;
    fo.max_message_bytes = options_.max_message_bytes;
    auto fwd = criforward::Forwarder::start(std::move(fo), this);
    if (!fwd) return fwd.error();
    forwarder_ = std::move(*fwd);
    stub_ = v1::RuntimeService::NewStub(forwarder_->channel());
    spdlog::info("CRI proxy: listening on {}, forwarding to {}", listen_target_, upstream_target_);
    return {};
  }

  void shutdown() {
    std::vector<std::shared_ptr<ProxiedCall>> held;
    {
      std::lock_guard lk(mu_);
      if (shut_down_) return;
      shut_down_ = true;
      held.assign(held_.begin(), held_.end());
      for (const auto& c : held) unhold_locked(*c, /*gave_up=*/true);
      for (auto* ctx : lookups_) ctx->TryCancel();
    }
    for (const auto& c : held) {
      c->gate.answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "CRI proxy shutting down"));
    }
    if (forwarder_) forwarder_->stop();
    std::unique_lock lk(mu_);
    lookups_done_.wait(lk, [&] { return lookups_.empty(); });
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
    std::vector<std::shared_ptr<ProxiedCall>> released;
    {
      std::lock_guard lk(mu_);
      stall_ = std::move(stall);
      for (const auto& c : std::vector(held_.begin(), held_.end())) {
        if (reevaluate_locked(c)) released.push_back(c);
      }
    }
    for (const auto& c : released) release(*c);
  }

  std::optional<PodStall> stall() const {
    std::lock_guard lk(mu_);
    return stall_;
  }
  std::optional<std::string> stalled_pod() const {
    std::lock_guard lk(mu_);
    if (!stall_) return std::nullopt;
    return stall_->pod_uid;
  }

  void set_full_list_delay(std::chrono::milliseconds delay) {
    std::lock_guard lk(mu_);
    full_list_delay_ = delay;
  }

  CriProxyStats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }

  std::unique_ptr<criforward::CallHooks> call_hooks(
      const grpc::GenericCallbackServerContext& ctx) override;

  // --- a call's course ------------------------------------------------------------------

  // The call's request has been read: hold it, look its ids up, or send it on.
  void route(const std::shared_ptr<ProxiedCall>& c) {
    std::optional<PodStall> stall;
    std::vector<std::string> unknown;
    Next next = Next::kForward;
    {
      std::lock_guard lk(mu_);
      if (shut_down_) {
        next = Next::kRefuse;
      } else if (c->full_list && full_list_delay_.count() > 0) {
        // An unfiltered list waits the full-list delay before it goes upstream.
        ++stats_.full_lists_delayed;
        ++stats_.full_lists_in_flight;
        c->list_delay = full_list_delay_;
        hold_locked(c, ProxiedCall::Kind::kFullList, true, "");
        next = reevaluate_locked(c) ? Next::kForward : Next::kHeld;
      } else if (c->stallable && stall_) {
        stall = stall_;
        bool match = !c->pod_uid.empty() && c->pod_uid == stall->pod_uid;
        for (const auto& id : c->ids) {
          if (match) break;
          auto it = pod_of_.find(id);
          if (it == pod_of_.end()) {
            unknown.push_back(id);
          } else if (it->second == stall->pod_uid) {
            match = true;
          }
        }
        if (match) {
          unknown.clear();
          next = matched_locked(c, *stall);
        }
      }
    }
    if (!unknown.empty()) return look_up_each(c, std::move(*stall), std::move(unknown), 0);
    act(*c, next);
  }

  // Maps the call's unknown ids to pods one after another until one is the stalled pod's.
  void look_up_each(std::shared_ptr<ProxiedCall> c, PodStall stall, std::vector<std::string> ids,
                    size_t i) {
    if (i == ids.size()) return forward(*c);  // not the stalled pod's (or not known in time)
    const auto deadline = std::min(c->deadline, SysClock::now() + options_.lookup_timeout);
    const std::string id = ids[i];
    look_up(id, deadline,
            [this, c, stall, ids = std::move(ids), i](const std::string& uid) mutable {
              if (uid != stall.pod_uid)
                return look_up_each(std::move(c), std::move(stall), std::move(ids), i + 1);
              Next next;
              {
                std::lock_guard lk(mu_);
                next = matched_locked(c, stall);  // the stall as set when the call came
              }
              act(*c, next);
            });
  }

  enum class Next { kForward, kHeld, kRefuse };

  // A call of the stalled pod: held before it goes upstream, or (kLateAnswer) sent on now and
  // held before its answer.
  Next matched_locked(const std::shared_ptr<ProxiedCall>& c, const PodStall& stall) {
    if (shut_down_) return Next::kRefuse;
    if (c->ended) return Next::kHeld;  // nothing to do
    if (stall.mode == StallMode::kLateAnswer) {
      c->late_answer = true;
      c->held_pod = stall.pod_uid;
      return Next::kForward;
    }
    hold_locked(c, ProxiedCall::Kind::kStall, true, stall.pod_uid);
    return reevaluate_locked(c) ? Next::kForward : Next::kHeld;
  }

  void act(ProxiedCall& c, Next next) {
    if (next == Next::kForward) {
      forward(c);
    } else if (next == Next::kRefuse) {
      c.gate.answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "CRI proxy shutting down"));
    }
  }

  // A call of the stalled pod whose answer is held (kLateAnswer).
  void hold_answer(const std::shared_ptr<ProxiedCall>& c, Gate gate) {
    Next next = Next::kHeld;
    {
      std::lock_guard lk(mu_);
      c->gate = std::move(gate);
      if (shut_down_) {
        next = Next::kRefuse;
      } else {
        hold_locked(c, ProxiedCall::Kind::kStall, false, c->held_pod);
        if (reevaluate_locked(c)) next = Next::kForward;
      }
    }
    if (next == Next::kForward) {
      c->gate.open();  // its answer; it was counted when it went upstream
    } else {
      act(*c, next);
    }
  }

  // The call ended (answered, or its caller gave up): a hold it still has is given up.
  void ended(ProxiedCall& c) {
    std::lock_guard lk(mu_);
    c.ended = true;
    if (c.held != ProxiedCall::Kind::kNone) unhold_locked(c, c.held == ProxiedCall::Kind::kStall);
  }

  void learn(const std::string& id, const std::string& uid) {
    if (id.empty() || uid.empty()) return;
    std::lock_guard lk(mu_);
    if (pod_of_.size() >= kMaxCachedIds) pod_of_.clear();
    pod_of_[id] = uid;
  }
  std::string cached(const std::string& id) {
    std::lock_guard lk(mu_);
    auto it = pod_of_.find(id);
    return it == pod_of_.end() ? std::string() : it->second;
  }
  void learn_container(const v1::Container& ctr) {
    std::string uid = label_or_empty(ctr.labels());
    if (uid.empty()) uid = cached(ctr.pod_sandbox_id());
    learn(ctr.id(), uid);
  }

  void count_forwarded() {
    std::lock_guard lk(mu_);
    ++stats_.forwarded;
  }

 private:
  void forward(ProxiedCall& c) {
    count_forwarded();
    c.gate.open();
  }

  void hold_locked(const std::shared_ptr<ProxiedCall>& c, ProxiedCall::Kind kind, bool forward_gate,
                   const std::string& pod) {
    if (kind == ProxiedCall::Kind::kStall) {
      ++stats_.stalled;
      ++stats_.stalled_in_flight;
      spdlog::debug("CRI proxy: holding {} of pod {}", c->method, pod);
    }
    c->held = kind;
    c->forward_gate = forward_gate;
    c->held_pod = pod;
    c->held_since = SteadyClock::now();
    held_.insert(c);
  }

  void unhold_locked(ProxiedCall& c, bool gave_up) {
    if (c.held == ProxiedCall::Kind::kStall) {
      --stats_.stalled_in_flight;
      if (gave_up) ++stats_.gave_up;
      spdlog::debug(
          "CRI proxy: released {} of pod {} after {} ms ({})", c.method, c.held_pod,
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - c.held_since)
              .count(),
          gave_up ? "given up" : "forwarded");
    } else if (c.held == ProxiedCall::Kind::kFullList) {
      --stats_.full_lists_in_flight;
    }
    c.held = ProxiedCall::Kind::kNone;
    if (c.timer != 0) timer_.cancel(c.timer);
    c.timer = 0;
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->get() == &c) {
        held_.erase(it);
        break;
      }
    }
  }

  // A held call under the stall as it is now: true when it goes on (and is no longer held);
  // else its timer is set for when its delay is over (none: it hangs).
  bool reevaluate_locked(const std::shared_ptr<ProxiedCall>& c) {
    if (c->held == ProxiedCall::Kind::kNone || shut_down_ || c->ended) return false;
    if (c->timer != 0) timer_.cancel(c->timer);
    c->timer = 0;
    std::optional<SteadyClock::time_point> until;
    bool go = false;
    if (c->held == ProxiedCall::Kind::kFullList) {
      until = c->held_since + c->list_delay;
    } else if (!stall_ || stall_->pod_uid != c->held_pod) {
      go = true;
    } else if (stall_->mode != StallMode::kHang) {
      until = c->held_since + stall_->delay;
    }
    if (until && SteadyClock::now() >= *until) go = true;
    if (go) {
      unhold_locked(*c, false);
    } else if (until) {
      c->timer = timer_.at(*until, [this, c] {
        bool go = false;
        {
          std::lock_guard lk(mu_);
          go = reevaluate_locked(c);
        }
        if (go) release(*c);
      });
    }
    return go;
  }

  void release(ProxiedCall& c) {
    if (c.forward_gate) {
      forward(c);
    } else {
      c.gate.open();
    }
  }

  // The pod of a container or sandbox id, from the upstream; empty when it does not know it (or
  // does not answer in time: the call is then not stalled). Asynchronous: `done` runs on a gRPC
  // thread.
  void look_up(const std::string& id, SysClock::time_point deadline,
               std::function<void(const std::string&)> done) {
    struct Op {
      grpc::ClientContext ctx;
      v1::ListContainersRequest containers_req;
      v1::ListContainersResponse containers;
      v1::ListPodSandboxRequest sandboxes_req;
      v1::ListPodSandboxResponse sandboxes;
    };
    auto op = std::make_shared<Op>();
    op->ctx.set_deadline(deadline);
    op->containers_req.mutable_filter()->set_id(id);
    begin_lookup(&op->ctx);
    stub_->async()->ListContainers(
        &op->ctx, &op->containers_req, &op->containers,
        [this, op, id, deadline, done = std::move(done)](grpc::Status st) mutable {
          if (!st.ok()) {
            spdlog::debug("CRI proxy: looking up container {}: {}", id, st.error_message());
          } else if (op->containers.containers_size() > 0) {
            const auto& ctr = op->containers.containers(0);
            std::string uid = label_or_empty(ctr.labels());
            const std::string sandbox = ctr.pod_sandbox_id();
            if (uid.empty() && !sandbox.empty() && sandbox != id) uid = cached(sandbox);
            if (uid.empty() && !sandbox.empty() && sandbox != id) {
              look_up(sandbox, deadline, [this, id, done = std::move(done)](const std::string& u) {
                learn(id, u);
                done(u);
              });
            } else {
              learn(id, uid);
              done(uid);
            }
            end_lookup(&op->ctx);
            return;
          }
          auto sb = std::make_shared<Op>();
          sb->ctx.set_deadline(deadline);
          sb->sandboxes_req.mutable_filter()->set_id(id);
          begin_lookup(&sb->ctx);
          end_lookup(&op->ctx);
          stub_->async()->ListPodSandbox(&sb->ctx, &sb->sandboxes_req, &sb->sandboxes,
                                         [this, sb, id, done = std::move(done)](grpc::Status st) {
                                           std::string uid;
                                           if (!st.ok()) {
                                             spdlog::debug("CRI proxy: looking up sandbox {}: {}",
                                                           id, st.error_message());
                                           }
                                           for (const auto& s : sb->sandboxes.items()) {
                                             if (st.ok() && s.id() == id) uid = s.metadata().uid();
                                           }
                                           learn(id, uid);
                                           done(uid);
                                           end_lookup(&sb->ctx);
                                         });
        });
  }
  void begin_lookup(grpc::ClientContext* ctx) {
    std::lock_guard lk(mu_);
    ++stats_.lookups;
    lookups_.insert(ctx);
    if (shut_down_) ctx->TryCancel();
  }
  void end_lookup(grpc::ClientContext* ctx) {
    std::lock_guard lk(mu_);
    lookups_.erase(ctx);
    if (lookups_.empty()) lookups_done_.notify_all();
  }

  const CriProxyOptions options_;
  const std::string listen_target_;
  const std::string upstream_target_;
  std::unique_ptr<v1::RuntimeService::Stub> stub_;

  mutable std::mutex mu_;
  std::optional<PodStall> stall_;
  std::chrono::milliseconds full_list_delay_{0};
  bool shut_down_ = false;
  std::unordered_map<std::string, std::string> pod_of_;  // sandbox/container id -> pod uid
  std::set<std::shared_ptr<ProxiedCall>> held_;
  std::set<grpc::ClientContext*> lookups_;  // id lookups in flight
  std::condition_variable lookups_done_;
  CriProxyStats stats_;
  criforward::Timer
      timer_;  // after what its callbacks use; before the forwarder, which stops first
  std::unique_ptr<criforward::Forwarder> forwarder_;
};

namespace {

// A RuntimeService call: what it names, read from its request, routed through the stall; the
// ids its answer tells, learned.
class RuntimeCallHooks final : public criforward::CallHooks {
 public:
  RuntimeCallHooks(CriProxy::Impl* proxy, std::shared_ptr<ProxiedCall> call)
      : proxy_(proxy), call_(std::move(call)) {}

  void before_forward(grpc::ByteBuffer& request, Gate gate) override {
    read_request(request);
    call_->gate = std::move(gate);
    proxy_->route(call_);
  }
  void before_answer(Gate gate) override {
    if (call_->late_answer) {
      proxy_->hold_answer(call_, std::move(gate));
    } else {
      gate.open();
    }
  }
  void on_response(grpc::ByteBuffer& message, std::vector<grpc::ByteBuffer>& out) override {
    learn_from(message);
    out.push_back(std::move(message));
  }
  void on_done(const grpc::Status&) override { proxy_->ended(*call_); }

 private:
  void read_request(const grpc::ByteBuffer& b) {
    ProxiedCall& c = *call_;
    const auto& m = c.method;
    if (m == "StopPodSandbox" || m == "RemovePodSandbox" || m == "PodSandboxStatus") {
      v1::PodSandboxStatusRequest r;  // field 1, the sandbox id, in all three
      if (parse(r, b)) c.ids.push_back(r.pod_sandbox_id());
      c.stallable = true;
    } else if (m == "StopContainer" || m == "RemoveContainer" || m == "ContainerStatus") {
      v1::ContainerStatusRequest r;  // field 1, the container id, in all three
      if (parse(r, b)) c.ids.push_back(r.container_id());
      c.stallable = true;
    } else if (m == "ListPodSandbox") {
      v1::ListPodSandboxRequest r;
      if (!parse(r, b)) return;
      if (!r.filter().id().empty()) c.ids.push_back(r.filter().id());
      c.pod_uid = label_or_empty(r.filter().label_selector());
      c.stallable = true;
      c.full_list = c.ids.empty() && c.pod_uid.empty();
    } else if (m == "ListContainers") {
      v1::ListContainersRequest r;
      if (!parse(r, b)) return;
      if (!r.filter().id().empty()) c.ids.push_back(r.filter().id());
      if (!r.filter().pod_sandbox_id().empty()) c.ids.push_back(r.filter().pod_sandbox_id());
      c.pod_uid = label_or_empty(r.filter().label_selector());
      c.stallable = true;
      c.full_list = c.ids.empty() && c.pod_uid.empty();
    } else if (m == "RunPodSandbox") {
      v1::RunPodSandboxRequest r;
      if (parse(r, b)) c.learn_uid = r.config().metadata().uid();
    } else if (m == "CreateContainer") {
      v1::CreateContainerRequest r;
      if (!parse(r, b)) return;
      c.learn_uid = label_or_empty(r.config().labels());
      if (c.learn_uid.empty()) c.learn_uid = r.sandbox_config().metadata().uid();
    }
  }

  void learn_from(const grpc::ByteBuffer& b) {
    const auto& m = call_->method;
    if (m == "RunPodSandbox") {
      v1::RunPodSandboxResponse r;
      if (parse(r, b)) proxy_->learn(r.pod_sandbox_id(), call_->learn_uid);
    } else if (m == "CreateContainer") {
      v1::CreateContainerResponse r;
      if (parse(r, b)) proxy_->learn(r.container_id(), call_->learn_uid);
    } else if (m == "PodSandboxStatus") {
      v1::PodSandboxStatusResponse r;
      if (parse(r, b)) proxy_->learn(r.status().id(), r.status().metadata().uid());
    } else if (m == "ContainerStatus") {
      v1::ContainerStatusResponse r;
      if (parse(r, b)) proxy_->learn(r.status().id(), label_or_empty(r.status().labels()));
    } else if (m == "ListPodSandbox") {
      v1::ListPodSandboxResponse r;
      if (!parse(r, b)) return;
      for (const auto& s : r.items()) proxy_->learn(s.id(), s.metadata().uid());
    } else if (m == "ListContainers") {
      v1::ListContainersResponse r;
      if (!parse(r, b)) return;
      for (const auto& ctr : r.containers()) proxy_->learn_container(ctr);
    }
  }

  CriProxy::Impl* proxy_;
  std::shared_ptr<ProxiedCall> call_;
};

// GetContainerEvents: a runtime stuck on a pod tells nothing about it, so the stalled pod's
// events wait, in order, and go out with the stream's first event after the stall is cleared
// (or moved to another pod).
class EventHooks final : public criforward::CallHooks {
 public:
  explicit EventHooks(CriProxy::Impl* proxy) : proxy_(proxy) {}
  void before_forward(grpc::ByteBuffer&, Gate gate) override {
    proxy_->count_forwarded();
    gate.open();
  }
  void on_response(grpc::ByteBuffer& message, std::vector<grpc::ByteBuffer>& out) override {
    const auto stalled = proxy_->stalled_pod();
    if (!stalled && held_.empty()) {
      out.push_back(std::move(message));
      return;
    }
    v1::ContainerEventResponse ev;
    parse(ev, message);
    std::string uid = ev.pod_sandbox_status().metadata().uid();
    if (stalled && uid == *stalled) {
      held_.emplace_back(std::move(uid), std::move(message));
      return;
    }
    while (!held_.empty() && (!stalled || held_.front().first != *stalled)) {
      out.push_back(std::move(held_.front().second));
      held_.pop_front();
    }
    out.push_back(std::move(message));
  }

 private:
  CriProxy::Impl* proxy_;
  std::deque<std::pair<std::string, grpc::ByteBuffer>> held_;  // the stalled pod's, in order
};

}  // namespace

std::unique_ptr<criforward::CallHooks> CriProxy::Impl::call_hooks(
    const grpc::GenericCallbackServerContext& ctx) {
  std::string_view method = ctx.method();
  if (method == "/runtime.v1.RuntimeService/GetContainerEvents") {
    return std::make_unique<EventHooks>(this);
  }
  auto call = std::make_shared<ProxiedCall>();
  if (method.starts_with(kRuntimeService)) method.remove_prefix(kRuntimeService.size());
  call->method = std::string(method);
  call->deadline = ctx.deadline();
  return std::make_unique<RuntimeCallHooks>(this, std::move(call));
}

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
               stall.mode == StallMode::kHang ? std::string("hang until the caller's deadline")
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

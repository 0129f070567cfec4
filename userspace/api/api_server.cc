#include "api/api_server.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include "common/thread_name.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "api/convert.h"
#include "api/health_service.h"
#include "kpleg/v1/pleg.grpc.pb.h"

namespace kpleg::api {
namespace {

// How often an idle Watch looks up from its subscription to notice that its client went away
// (a write to a gone client fails at once, so this only matters while no event comes). gRPC's
// sync API has no notification of a cancelled call: ServerContext::IsCancelled() is the only way
// to learn it, so a handler that waits for events has to look now and then. Each look is a
// wakeup of an otherwise idle daemon, hence a minute. A gone client's stream holds its slot, its
// thread and its subscription until then, unless an event comes first, or a new stream finds
// every slot taken: that has every open stream look at once (StreamSlots::take). A server stop
// does not wait for it either: stop() cancels every open subscription.
constexpr auto kWatchPoll = std::chrono::milliseconds(60'000);
// How long an idle sync-server polling thread waits before it looks again (see start()).
constexpr int kSyncPollerTimeoutMs = 3600 * 1000;
// Server threads for unary calls (List, Stats, InflightCalls, health Check) beside the streams.
constexpr size_t kUnaryThreads = 16;

Result<std::string> read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::from_errno(errno, fmt::format("{} {}: cannot read", flag, path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return Error{EINVAL, fmt::format("{} {}: file is empty", flag, path)};
  return ss.str();
}

// Requests are a few filters: anything bigger is refused by gRPC before a handler sees it.
constexpr int kMaxRequestBytes = 4096;

// The filters' bounds: a pod UID is 36 characters, a namespace a DNS label of at most 63, an
// instance id 32 hex digits. A longer one is a client's mistake, said as such.
grpc::Status check_filters(const std::string& pod_uid, const std::string& pod_namespace,
                           const std::string* instance_id = nullptr) {
  if (pod_uid.size() > 128)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("pod_uid is {} bytes long: at most 128", pod_uid.size())};
  if (pod_namespace.size() > 63)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("pod_namespace is {} bytes long: at most 63 (a DNS label)",
                        pod_namespace.size())};
  if (instance_id != nullptr && instance_id->size() > 64)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("instance_id is {} bytes long: at most 64", instance_id->size())};
  return grpc::Status::OK;
}

bool matches(const PodRecord& pod, const v1::ListRequest& req) {
  if (!req.pod_uid().empty() && pod.uid != req.pod_uid()) return false;
  if (!req.pod_namespace().empty() && pod.pod_namespace != req.pod_namespace()) return false;
  return true;
}

// --tls-client-allow: a verified client certificate must also name an allowed identity. Runs
// for every call (the health service's too), before the handler.
class ClientIdentityCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit ClientIdentityCheck(std::vector<std::string> allowed) : allowed_(std::move(allowed)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    std::string seen;
    for (const char* property : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
      for (const auto& value : context->FindPropertyValues(property)) {
        const std::string name(value.data(), value.size());
        if (std::find(allowed_.begin(), allowed_.end(), name) != allowed_.end())
          return grpc::Status::OK;
        seen += (seen.empty() ? "" : ", ") + name;
      }
    }
    return {grpc::StatusCode::UNAUTHENTICATED,
            "client certificate (" + (seen.empty() ? std::string("no names") : seen) +
                ") is not among --tls-client-allow"};
  }

 private:
  std::vector<std::string> allowed_;
};

// Cancels the calls of cut-off Watches whose consumers still read nothing after the grace:
// their handlers stay blocked in a write that the consumer's flow control holds, each on a
// server thread. One thread for all of them, asleep while none is due (no periodic wakeup).
class CutOffReaper {
 public:
  CutOffReaper() : thread_([this] {
    set_thread_name("kpleg-api-reap");
    loop();
  }) {}
  ~CutOffReaper() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void arm(grpc::ServerContext* ctx, std::chrono::steady_clock::time_point at) {
    {
      std::lock_guard lk(mu_);
      due_[ctx] = at;
    }
    cv_.notify_all();
  }
  // After this returns, `ctx` is never cancelled by the reaper (TryCancel runs under mu_).
  void disarm(grpc::ServerContext* ctx) {
    std::lock_guard lk(mu_);
    due_.erase(ctx);
  }
  uint64_t cancelled() const { return cancelled_.load(); }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    while (!stopping_) {
      if (due_.empty()) {
        cv_.wait(lk, [&] { return stopping_ || !due_.empty(); });
        continue;
      }
      auto next = std::min_element(due_.begin(), due_.end(), [](const auto& a, const auto& b) {
                    return a.second < b.second;
                  })->second;
      if (std::chrono::steady_clock::now() < next) {
        cv_.wait_until(lk, next);
        continue;
      }
      for (auto it = due_.begin(); it != due_.end();) {
        if (it->second <= std::chrono::steady_clock::now()) {
          it->first->TryCancel();
          ++cancelled_;
          it = due_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<grpc::ServerContext*, std::chrono::steady_clock::time_point> due_;
  bool stopping_ = false;
  std::atomic<uint64_t> cancelled_{0};
  std::thread thread_;
};

}  // namespace

class PodLifecycleService final : public v1::PodLifecycle::Service {
 public:
  PodLifecycleService(bus::EventBus& bus, StateProvider& state, HealthProvider& health,
                      StatsProvider& stats, StreamSlots& streams,
                      std::chrono::milliseconds cut_off_grace)
      : bus_(bus),
        state_(state),
        health_(health),
        stats_(stats),
        streams_(streams),
        cut_off_grace_(cut_off_grace) {}

  uint64_t cut_off_watches_cancelled() const { return reaper_.cancelled(); }
  size_t open_watches() {
    std::lock_guard lk(open_mu_);
    return open_.size();
  }

  // Has every open Watch check now whether its client went away (StreamSlots' reclaim hook):
  // an idle one otherwise looks only every kWatchPoll.
  void wake_watches() {
    std::lock_guard lk(open_mu_);
    for (bus::Subscription* sub : open_) sub->wake();
  }

  // Ends every open Watch at once, and any Watch that starts later.
  void stop() {
    std::lock_guard lk(open_mu_);
    stopping_.store(true);
    for (bus::Subscription* sub : open_) sub->cancel();
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListRequest* req,
                    v1::ListResponse* resp) override {
    if (auto st = check_filters(req->pod_uid(), req->pod_namespace()); !st.ok()) return st;
    StateSnapshot snap = state_.snapshot();
    resp->set_seq(snap.seq);
    resp->set_instance_id(bus_.instance_id());
    for (const auto& pod : snap.pods)
      if (matches(pod, *req)) to_proto(pod, resp->add_pods());
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override {
    DaemonStats d = stats_.stats();
    bus::BusStats b = bus_.stats();
    HealthReport h = health_.health();
    resp->set_instance_id(bus_.instance_id());
    resp->set_mode(d.mode);
    resp->set_start_time_ns(d.start_time_ns);
    resp->set_healthy(h.healthy);
    for (auto& r : h.reasons) resp->add_health_reasons(r);
    resp->set_last_seq(b.last_seq);
    resp->set_oldest_retained_seq(b.oldest_retained_seq);
    resp->set_history_capacity(b.history_capacity);
    resp->set_subscribers(b.subscribers);
    resp->set_subscribers_cut_off(b.subscribers_cut_off);
    resp->set_pods(d.pods);
    resp->set_containers(d.containers);
    resp->set_kernel_events(d.kernel_events);
    resp->set_lost_kernel_events(d.lost_kernel_events);
    resp->set_corrections(d.corrections);
    resp->set_cri_calls(d.cri_calls);
    resp->mutable_cri_calls_by_method()->insert(d.cri_calls_by_method.begin(),
                                                d.cri_calls_by_method.end());
    resp->set_confirm_retries(d.confirm_retries);
    resp->set_relists(d.relists);
    resp->set_last_reconcile_ns(d.last_reconcile_ns);
    return grpc::Status::OK;
  }

  grpc::Status InflightCalls(grpc::ServerContext*, const v1::InflightCallsRequest* req,
                             v1::InflightCallsResponse* resp) override {
    const auto min_age = std::chrono::milliseconds(
        std::min<uint64_t>(req->min_age_ms(), uint64_t(INT64_MAX)));
    for (const auto& c : stats_.inflight_calls(min_age)) {
      auto* out = resp->add_calls();
      out->set_method(c.method);
      out->set_origin(c.origin);
      out->set_pod_uid(c.pod_uid);
      out->set_pod_name(c.pod_name);
      out->set_pod_namespace(c.pod_namespace);
      out->set_id(c.id);
      out->set_container_name(c.container_name);
      out->set_age_ms(uint64_t(c.age.count()));
      out->set_description(c.description);
    }
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::Event>* writer) override {
    if (auto st = check_filters(req->pod_uid(), req->pod_namespace(), &req->instance_id());
        !st.ok())
      return st;
    StreamSlot slot(&streams_);
    if (!slot.taken()) {
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              fmt::format("too many watchers (limit {}, kplegd --max-watchers; grpc.health Watch "
                          "streams count too)",
                          streams_.limit())};
    }

    uint64_t from = req->from_seq();
    // A position is one in a given daemon instance's stream: without the instance it belongs
    // to, it could be another instance's (the daemon restarted since): List again (RESYNC).
    if (from != 0 && req->instance_id() != bus_.instance_id()) from = bus::kUnknownPosition;
    // The bus reads UINT64_MAX - 1 as kOldestRetained (every retained event, no RESYNC), an
    // in-process consumer's request. From a client it is a position beyond the stream's last
    // seq like any other, which docs/api.md promises a RESYNC for; passed on as is, it replayed
    // the history as if nothing had been lost.
    if (from == bus::kOldestRetained) from = bus::kUnknownPosition;
    bus::Subscription sub =
        bus_.subscribe(from, bus::EventFilter{req->pod_uid(), req->pod_namespace()});
    OpenWatch open{*this, sub, ctx};
    // Cut off for being too slow: its place goes back at once; its call (and thread) after
    // the grace unless the consumer reads again and the handler returns by itself.
    sub.set_on_cut_off([this, &slot, ctx] {
      slot.release();
      reaper_.arm(ctx, std::chrono::steady_clock::now() + cut_off_grace_);
    });

    // Initial metadata tells the consumer that its subscription is in place: anything
    // published from now on reaches it.
    ctx->AddInitialMetadata("kpleg-instance-id", bus_.instance_id());
    writer->SendInitialMetadata();

    v1::Event msg;
    for (;;) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      if (stopping_.load()) return {grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"};
      bus::Subscription::Next n = sub.next(kWatchPoll);
      if (n.status == bus::Subscription::Status::kTimeout) continue;
      if (n.status == bus::Subscription::Status::kClosed) {
        if (stopping_.load()) return {grpc::StatusCode::UNAVAILABLE, "kplegd is shutting down"};
        if (sub.cut_off()) {
          spdlog::warn("api: Watch from {} cut off: {}", ctx->peer(), sub.close_reason());
          return {grpc::StatusCode::RESOURCE_EXHAUSTED, sub.close_reason()};
        }
        return {grpc::StatusCode::UNAVAILABLE, sub.close_reason()};
      }
      to_proto(*n.event, &msg);
      grpc::WriteOptions wo;
      // More is waiting: let gRPC coalesce; the last event of a burst is flushed at once.
      if (sub.queued() + sub.backlog() > 0) wo.set_buffer_hint();
      if (!writer->Write(msg, wo)) return grpc::Status::CANCELLED;  // the consumer went away
    }
  }

 private:
  // Registers a Watch's subscription for stop() while the handler runs; on the way out, no
  // cut-off callback or reaper may touch the call any more.
  struct OpenWatch {
    PodLifecycleService& svc;
    bus::Subscription& sub;
    grpc::ServerContext* ctx;
    OpenWatch(PodLifecycleService& s, bus::Subscription& b, grpc::ServerContext* c)
        : svc(s), sub(b), ctx(c) {
      std::lock_guard lk(svc.open_mu_);
      if (svc.stopping_.load()) sub.cancel();
      svc.open_.insert(&sub);
    }
    ~OpenWatch() {
      sub.set_on_cut_off(nullptr);
      svc.reaper_.disarm(ctx);
      std::lock_guard lk(svc.open_mu_);
      svc.open_.erase(&sub);
    }
  };

  bus::EventBus& bus_;
  StateProvider& state_;
  HealthProvider& health_;
  StatsProvider& stats_;
  StreamSlots& streams_;
  const std::chrono::milliseconds cut_off_grace_;
  CutOffReaper reaper_;
  std::atomic<bool> stopping_{false};
  std::mutex open_mu_;
  std::unordered_set<bus::Subscription*> open_;
};

ApiServer::ApiServer(ApiServerOptions options, bus::EventBus& bus, StateProvider& state,
                     HealthProvider& health, StatsProvider& stats)
    : options_(std::move(options)),
      bus_(bus),
      health_(health),
      streams_(std::make_unique<StreamSlots>(options_.max_watchers)),
      service_(std::make_unique<PodLifecycleService>(bus, state, health, stats, *streams_,
                                                     options_.cut_off_grace)),
      health_service_(std::make_unique<HealthService>(kWatchPoll, streams_.get())) {
  // A stream that finds every slot taken first has the open ones look whether their clients
  // went away (a cancelled idle stream would otherwise hold its slot up to kWatchPoll).
  streams_->set_reclaim([this] {
    service_->wake_watches();
    health_service_->wake_watches();
  });
}

ApiServer::~ApiServer() { stop(); }

uint64_t ApiServer::cut_off_watches_cancelled() const {
  return service_->cut_off_watches_cancelled();
}
size_t ApiServer::open_watches() const { return service_->open_watches(); }

Status ApiServer::prepare_socket_path() {
  namespace fs = std::filesystem;
  const std::string& path = options_.socket_path;
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return Error{ENAMETOOLONG, fmt::format("--socket {}: longer than the {} bytes a unix socket "
                                           "path may have",
                                           path, sizeof(sockaddr_un::sun_path) - 1)};
  fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      return Error{ec.value(), fmt::format("--socket {}: cannot create {}: {}", path, dir.string(),
                                           ec.message())};
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return Error::from_errno(errno, "--socket " + path);
  }
  if (!S_ISSOCK(st.st_mode))
    return Error{EEXIST, fmt::format("--socket {}: exists and is not a socket; refusing to "
                                     "replace it",
                                     path)};
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::from_errno(errno, "socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  close(fd);
  if (rc == 0)
    return Error{EADDRINUSE, fmt::format("--socket {}: another server answers on it (is kplegd "
                                         "already running?)",
                                         path)};
  if (err != ECONNREFUSED) return Error::from_errno(err, "--socket " + path + ": checking it");
  // Nobody listens: a socket left behind by a daemon that did not shut down cleanly.
  if (unlink(path.c_str()) != 0 && errno != ENOENT)
    return Error::from_errno(errno, "--socket " + path + ": removing the stale socket");
  spdlog::info("api: removed stale socket {}", path);
  return {};
}

Status ApiServer::secure_socket() {
  const std::string& path = options_.socket_path;
  if (socket_gid_ != static_cast<gid_t>(-1) &&
      chown(path.c_str(), static_cast<uid_t>(-1), socket_gid_) != 0)
    return Error::from_errno(errno, "--socket-group: chown " + path);
  mode_t mode = socket_gid_ != static_cast<gid_t>(-1) ? 0660 : 0600;
  if (chmod(path.c_str(), mode) != 0) return Error::from_errno(errno, "chmod " + path);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Error::from_errno(errno, "stat " + path);
  socket_ino_ = st.st_ino;
  return {};
}

Status ApiServer::start() {
  if (server_) return Error{EALREADY, "API server already started"};
  if (auto st = options_.validate(); !st) return st;

  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  builder.RegisterService(health_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  // Threads: one per open stream (bounded by --max-watchers) plus room for unary calls; past
  // that gRPC answers RESOURCE_EXHAUSTED instead of growing without bound.
  grpc::ResourceQuota quota("kpleg-api");
  quota.SetMaxThreads(static_cast<int>(std::min<size_t>(options_.max_watchers + kUnaryThreads, 1 << 20)));
  builder.SetResourceQuota(quota);
  // A sync server's polling threads wait for calls with this timeout (gRPC's default: 10 s) and
  // then loop, or end if more than the minimum are polling: with the default each of them woke an
  // idle daemon every 10 s. Shutdown wakes them at once, so nothing needs the timeout but the
  // retiring of surplus pollers after a burst, which can wait an hour.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC,
                              kSyncPollerTimeoutMs);
  // One thread polls the connections (gRPC's default: up to two). A consumer's gRPC client
  // acknowledges every event it reads (a WINDOW_UPDATE); with two pollers the one it woke handed
  // the poll to the other through a wakeup fd, several wakeups per event (docs/design.md,
  // Threads). A unary call is handled by the thread that polled it, a new poller taking over.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1);

  if (!options_.socket_group.empty()) {
    std::vector<char> buf(16384);
    group gr{};
    group* found = nullptr;
    int err = getgrnam_r(options_.socket_group.c_str(), &gr, buf.data(), buf.size(), &found);
    if (found == nullptr)
      return err != 0
                 ? Error::from_errno(err, "--socket-group " + options_.socket_group)
                 : Error{ENOENT, "--socket-group " + options_.socket_group + ": no such group"};
    socket_gid_ = found->gr_gid;
  }
  if (!options_.socket_path.empty()) {
    if (auto st = prepare_socket_path(); !st) return st;
    builder.AddListeningPort("unix:" + options_.socket_path, grpc::InsecureServerCredentials());
  }
  if (!options_.listen_address.empty()) {
    std::shared_ptr<grpc::ServerCredentials> creds;
    if (options_.insecure_tcp) {
      creds = grpc::InsecureServerCredentials();
    } else {
      // Read once here for a clear error at start; from then on gRPC re-reads the files
      // every --tls-reload-interval, so rotated certificates need no restart.
      if (auto cert = read_file(options_.tls_cert_file, "--tls-cert"); !cert) return cert.error();
      if (auto key = read_file(options_.tls_key_file, "--tls-key"); !key) return key.error();
      if (!options_.tls_client_ca_file.empty()) {
        if (auto ca = read_file(options_.tls_client_ca_file, "--tls-client-ca"); !ca)
          return ca.error();
      }
      auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          options_.tls_key_file, options_.tls_cert_file, options_.tls_client_ca_file,
          static_cast<unsigned>(options_.tls_reload_interval.count()));
      grpc::experimental::TlsServerCredentialsOptions tls(provider);
      tls.watch_identity_key_cert_pairs();
      if (!options_.tls_client_ca_file.empty()) {
        tls.watch_root_certs();
        tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      } else {
        tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
      }
      creds = grpc::experimental::TlsServerCredentials(tls);
      if (!options_.tls_client_allow.empty())
        creds->SetAuthMetadataProcessor(
            std::make_shared<ClientIdentityCheck>(options_.tls_client_allow));
    }
    builder.AddListeningPort(options_.listen_address, creds, &tcp_port_);
  }

  // The socket is born owner-only: no window in which another user could connect before the
  // chmod below. umask is process-wide, so this belongs at start-up, before other threads
  // create files.
  mode_t old_umask = umask(0177);
  {
    std::lock_guard l(server_mu_);
    server_ = builder.BuildAndStart();
  }
  umask(old_umask);
  if (!server_) {
    return Error{
        EADDRNOTAVAIL,
        fmt::format("cannot serve the API on {}{}{}: bind failed (gRPC logged why)",
                    options_.socket_path.empty() ? "" : "unix:" + options_.socket_path,
                    options_.socket_path.empty() || options_.listen_address.empty() ? "" : " and ",
                    options_.listen_address)};
  }
  if (!options_.listen_address.empty() && tcp_port_ == 0) {
    stop();
    return Error{EADDRNOTAVAIL, "--listen " + options_.listen_address + ": cannot bind"};
  }
  if (!options_.socket_path.empty()) {
    if (auto st = secure_socket(); !st) {
      stop();
      unlink(options_.socket_path.c_str());  // ours: it was bound just above
      return st;
    }
  }

  {
    std::lock_guard l(health_mu_);
    stopping_ = false;
  }
  health_.set_health_listener([this] { request_health_refresh(); });
  refresh_health();
  health_thread_ = std::thread([this] {
    set_thread_name("kpleg-health");
    health_loop();
  });

  if (!options_.socket_path.empty())
    spdlog::info("api: serving kpleg.v1.PodLifecycle on unix:{} ({})", options_.socket_path,
                 options_.socket_group.empty() ? "0600" : "0660, group " + options_.socket_group);
  if (!options_.listen_address.empty())
    spdlog::info("api: serving kpleg.v1.PodLifecycle on {} (port {}, {})", options_.listen_address,
                 tcp_port_,
                 options_.insecure_tcp                 ? "insecure"
                 : options_.tls_client_ca_file.empty() ? "TLS"
                                                       : "TLS, client certificates required");
  return {};
}

void ApiServer::refresh_health() {
  std::optional<std::chrono::milliseconds> recheck_in;
  {
    std::lock_guard l(server_mu_);
    if (!server_) return;
    HealthReport h = health_.health();
    recheck_in = h.recheck_in;
    health_service_->set("", h.healthy);
    health_service_->set(kHealthServiceName, h.healthy);
  }
  std::lock_guard l(health_mu_);
  recheck_at_.reset();
  if (recheck_in) recheck_at_ = std::chrono::steady_clock::now() + *recheck_in;
  if (options_.health_refresh_interval.count() > 0) {
    auto periodic = std::chrono::steady_clock::now() + options_.health_refresh_interval;
    if (!recheck_at_ || periodic < *recheck_at_) recheck_at_ = periodic;
  }
  health_cv_.notify_all();  // the loop's next wake-up may have moved
}

void ApiServer::request_health_refresh() {
  {
    std::lock_guard l(health_mu_);
    refresh_requested_ = true;
  }
  health_cv_.notify_all();
}

void ApiServer::health_loop() {
  std::unique_lock l(health_mu_);
  while (!stopping_) {
    // Sleeps until the provider announces a change or the last report's deadline passes: no
    // wake-up while nothing changes. A refresh from outside that moves the deadline restarts
    // the wait.
    const auto due = recheck_at_;
    auto woken = [&] { return stopping_ || refresh_requested_ || recheck_at_ != due; };
    const bool passed = due ? !health_cv_.wait_until(l, *due, woken) : (health_cv_.wait(l, woken), false);
    if (stopping_) break;
    if (!passed && !refresh_requested_) continue;  // a new deadline: wait for that one
    refresh_requested_ = false;
    l.unlock();
    refresh_health();
    l.lock();
  }
}

void ApiServer::stop(std::chrono::milliseconds grace) {
  health_.set_health_listener(nullptr);
  {
    std::lock_guard l(health_mu_);
    stopping_ = true;
  }
  health_cv_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
  if (!server_) return;

  service_->stop();
  health_service_->stop();
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  {
    std::lock_guard l(server_mu_);
    server_.reset();
  }

  if (!options_.socket_path.empty() && socket_ino_ != 0) {
    struct stat st {};
    // Another instance may have replaced the socket meanwhile; remove only ours.
    if (lstat(options_.socket_path.c_str(), &st) == 0 && st.st_ino == socket_ino_)
      unlink(options_.socket_path.c_str());
    socket_ino_ = 0;
  }
  spdlog::info("api: stopped");
}

}  // namespace kpleg::api

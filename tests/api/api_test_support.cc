#include "api_test_support.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace kpleg::apitest {

long rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream ss(line.substr(6));
      long kb = 0;
      ss >> kb;
      return kb;
    }
  }
  return -1;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/kpleg-api-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

api::StateSnapshot TestState::snapshot() {
  // As the daemon must: read the state under the bus's publish lock so that seq is exact.
  std::lock_guard l(mu_);
  ++snapshots_;
  auto [seq, pods] = bus_.with_seq([&] { return pods_; });
  return api::StateSnapshot{seq, std::move(pods)};
}

void TestState::set_pods(std::vector<pleg::PodRecord> pods) {
  std::lock_guard l(mu_);
  pods_ = std::move(pods);
}

api::HealthReport TestHealth::health() {
  std::lock_guard l(mu_);
  ++reads_;
  return report_;
}

void TestHealth::set_health_listener(std::function<void()> fn) {
  std::lock_guard l(mu_);
  listener_ = std::move(fn);
}

void TestHealth::set(bool healthy, std::vector<std::string> reasons) {
  std::function<void()> listener;
  {
    std::lock_guard l(mu_);
    report_ = api::HealthReport{healthy, std::move(reasons)};
    listener = listener_;
  }
  if (listener) listener();
}

void TestHealth::set_quietly(api::HealthReport report) {
  std::lock_guard l(mu_);
  report_ = std::move(report);
}

api::DaemonStats TestStats::stats() {
  api::DaemonStats s;
  s.mode = "ebpf";
  s.start_time_ns = 1'700'000'000'000'000'000ull;
  s.pods = 2;
  s.containers = 5;
  s.kernel_events = 123;
  s.corrections = 0;
  s.relists = 4;
  s.cri_calls = 77;
  s.cri_calls_by_method = {{"ContainerStatus", 60}, {"ListContainers", 17}};
  s.confirm_retries = 5;
  return s;
}

pleg::PodLifecycleEvent sample_event(int i, const std::string& ns) {
  pleg::PodLifecycleEvent ev;
  ev.type = pleg::EventType::kContainerStarted;
  ev.pod_uid = fmt::format("{:08x}-1111-4222-8333-{:012x}", i % 50, i % 50);
  ev.pod_name = fmt::format("web-{}", i % 50);
  ev.pod_namespace = ns;
  ev.container_id = fmt::format("{:064x}", i);
  ev.container_name = "app";
  ev.source = pleg::EventSource::kKernel;
  ev.kernel_ts_ns = pleg::realtime_now_ns();
  ev.status.state = pleg::ContainerState::kRunning;
  ev.status.created_at_ns = static_cast<int64_t>(ev.kernel_ts_ns) - 50'000'000;
  ev.status.started_at_ns = static_cast<int64_t>(ev.kernel_ts_ns);
  return ev;
}

ServerHarness::ServerHarness(api::ApiServerOptions opts, bus::EventBusOptions bus_opts)
    : bus(std::move(bus_opts)), options(std::move(opts)) {
  socket_path = dir.path() + "/kpleg.sock";
  if (options.socket_path == api::kDefaultSocketPath) options.socket_path = socket_path;
  socket_path = options.socket_path;
}

ServerHarness::~ServerHarness() {
  if (server) server->stop();
}

Status ServerHarness::start() {
  server = std::make_unique<api::ApiServer>(options, bus, state, health, stats);
  return server->start();
}

std::shared_ptr<grpc::Channel> ServerHarness::channel() const {
  return grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
}

std::unique_ptr<v1::PodLifecycle::Stub> ServerHarness::stub() const {
  return v1::PodLifecycle::NewStub(channel());
}

WatchClient::WatchClient(std::shared_ptr<grpc::Channel> channel, v1::WatchRequest req, Options opt)
    : stub_(v1::PodLifecycle::NewStub(std::move(channel))), opt_(opt) {
  // Nothing in a test may hang: every stream ends within two minutes at worst.
  ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  reader_ = stub_->Watch(&ctx_, req);
  reader_->WaitForInitialMetadata();
  const auto& md = ctx_.GetServerInitialMetadata();
  auto it = md.find("kpleg-instance-id");
  if (it != md.end()) {
    subscribed_ = true;
    instance_id_ = std::string(it->second.data(), it->second.size());
  }
  if (opt_.read) thread_ = std::thread([this] { read_loop(); });
}

WatchClient::~WatchClient() {
  ctx_.TryCancel();
  if (!thread_.joinable()) thread_ = std::thread([this] { read_loop(); });
  thread_.join();
}

void WatchClient::read_loop() {
  v1::Event ev;
  while (reader_->Read(&ev)) {
    std::lock_guard l(mu_);
    if (ev.seq() != last_seq_ + 1 && ev.type() != v1::EVENT_TYPE_RESYNC && count_ > 0)
      in_order_ = false;
    last_seq_ = ev.seq();
    ++count_;
    if (opt_.keep_events) events_.push_back(ev);
    cv_.notify_all();
  }
  grpc::Status st = reader_->Finish();
  std::lock_guard l(mu_);
  status_ = st;
  done_ = true;
  cv_.notify_all();
}

bool WatchClient::wait_for(size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock l(mu_);
  return cv_.wait_for(l, timeout, [&] { return count_ >= n || done_; }) && count_ >= n;
}

std::vector<v1::Event> WatchClient::events() {
  std::lock_guard l(mu_);
  return events_;
}

size_t WatchClient::count() {
  std::lock_guard l(mu_);
  return count_;
}

uint64_t WatchClient::last_seq() {
  std::lock_guard l(mu_);
  return last_seq_;
}

bool WatchClient::in_order() {
  std::lock_guard l(mu_);
  return in_order_;
}

bool WatchClient::finished() {
  std::lock_guard l(mu_);
  return done_;
}

grpc::Status WatchClient::finish(std::chrono::milliseconds timeout) {
  if (!thread_.joinable()) thread_ = std::thread([this] { read_loop(); });
  std::unique_lock l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return done_; })) {
    l.unlock();
    ctx_.TryCancel();
    l.lock();
    cv_.wait(l, [&] { return done_; });
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: stream did not end in time");
  }
  return status_;
}

}  // namespace kpleg::apitest

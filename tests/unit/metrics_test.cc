#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bus/event_bus.h"
#include "cri/call_stats.h"
#include "metrics/http_server.h"
#include "metrics/kpleg_metrics.h"
#include "metrics/registry.h"
#include "support/privileged.h"

namespace kpleg::metrics {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Registry, RendersCountersGaugesAndLabelsInTheTextFormat) {
  Registry r;
  auto& requests = r.counter("app_requests_total", "Requests.", {"method", "code"});
  requests.with({"GET", "200"}).inc(3);
  requests.with({"GET", "500"}).inc();
  r.gauge("app_temperature", "Temp.").get().set(21.5);
  const std::string out = r.render();
  // prometheus-cpp writes labels sorted by name and a family's series in no fixed order.
  EXPECT_TRUE(contains(out,
                       "# HELP app_requests_total Requests.\n"
                       "# TYPE app_requests_total counter\n"))
      << out;
  EXPECT_TRUE(contains(out, "\napp_requests_total{code=\"200\",method=\"GET\"} 3\n")) << out;
  EXPECT_TRUE(contains(out, "\napp_requests_total{code=\"500\",method=\"GET\"} 1\n")) << out;
  EXPECT_TRUE(contains(out,
                       "# HELP app_temperature Temp.\n"
                       "# TYPE app_temperature gauge\n"
                       "app_temperature 21.5\n"))
      << out;
}

TEST(Registry, UnlabelledMetricsAppearAsZeroBeforeTheFirstUpdate) {
  Registry r;
  r.counter("x_total", "X.");
  EXPECT_TRUE(contains(r.render(), "\nx_total 0\n"));
}

TEST(Registry, HistogramBucketsAreCumulativeAndInclusive) {
  Registry r;
  auto& h = r.histogram("lat_seconds", "Latency.", {0.1, 1}).get();
  h.observe(0.1);  // le="0.1" is inclusive
  h.observe(0.5);
  h.observe(7);
  const std::string out = r.render();
  for (const char* line : {"# TYPE lat_seconds histogram\n", "\nlat_seconds_bucket{le=\"0.1\"} 1\n",
                           "\nlat_seconds_bucket{le=\"1\"} 2\n",
                           "\nlat_seconds_bucket{le=\"+Inf\"} 3\n", "\nlat_seconds_sum 7.6\n",
                           "\nlat_seconds_count 3\n"})
    EXPECT_TRUE(contains(out, line)) << line << " in\n" << out;
}

TEST(Registry, LabelledHistogramPutsLeLast) {
  Registry r;
  r.histogram("d_seconds", "D.", {1}, {"op"}).with({"relist"}).observe(0.5);
  EXPECT_TRUE(contains(r.render(), "d_seconds_bucket{op=\"relist\",le=\"1\"} 1\n"));
  EXPECT_TRUE(contains(r.render(), "d_seconds_count{op=\"relist\"} 1\n"));
}

TEST(Registry, EscapesLabelValues) {
  Registry r;
  r.counter("e_total", "E.", {"v"}).with({"a\"b\\c\nd"}).inc();
  std::string out = r.render();
  EXPECT_TRUE(contains(out, "e_total{v=\"a\\\"b\\\\c\\nd\"} 1\n")) << out;
}

TEST(Registry, RejectsBadDefinitions) {
  Registry r;
  r.counter("ok_total", "ok", {"kind"});
  EXPECT_THROW(r.counter("ok_total", "again"), std::invalid_argument);
  EXPECT_THROW(r.gauge("ok_total", "again, as a gauge"), std::invalid_argument);
  EXPECT_THROW(r.counter("bad-name", "x"), std::invalid_argument);
  EXPECT_THROW(r.counter("x2_total", "x", {"__reserved"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h", "x", {1}, {"le"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h2", "x", {2, 1}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h3", "x", {1, 1}), std::invalid_argument);
  // prometheus-cpp 1.0 writes help texts unescaped: one with a newline would break the output.
  EXPECT_THROW(r.counter("h4_total", "line one\nline two"), std::invalid_argument);
  EXPECT_THROW(r.counter("h5_total", "back\\slash"), std::invalid_argument);
  auto& fam = r.counter("arity_total", "x", {"a", "b"});
  EXPECT_THROW(fam.with({"only-one"}), std::invalid_argument);
  EXPECT_FALSE(contains(r.render(), "h4_total")) << "a refused definition is not registered";
}

TEST(Registry, ConcurrentIncrementsAreAllCounted) {
  Registry r;
  auto& c = r.counter("hits_total", "Hits.").get();
  auto& h = r.histogram("obs_seconds", "Obs.", {0.5}).get();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100'000; ++i) {
        c.inc();
        h.observe(0.25);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 400'000);
  const std::string out = r.render();
  EXPECT_TRUE(contains(out, "\nobs_seconds_count 400000\n")) << out;
  EXPECT_TRUE(contains(out, "\nobs_seconds_bucket{le=\"0.5\"} 400000\n")) << out;
  EXPECT_TRUE(contains(out, "\nobs_seconds_sum 100000\n")) << out;
}

TEST(Registry, CollectorsRunAtScrapeTime) {
  Registry r;
  auto& g = r.gauge("mirrored", "M.").get();
  int source = 0;
  r.add_collector([&] { g.set(source); });
  source = 7;
  EXPECT_TRUE(contains(r.render(), "\nmirrored 7\n"));
  source = 9;
  EXPECT_TRUE(contains(r.render(), "\nmirrored 9\n"));
}

// prometheus-cpp's counters only add: a total kept elsewhere is mirrored by adding the
// difference, and stays a counter in the exposition.
TEST(Registry, MirroredCounterTakesTheSourcesTotal) {
  Registry r;
  auto& c = r.counter("mirrored_total", "M.").get();
  uint64_t source = 0;
  r.add_collector([&] { c.set(static_cast<double>(source)); });
  source = 5;
  EXPECT_TRUE(contains(r.render(), "\nmirrored_total 5\n"));
  source = 12;
  EXPECT_TRUE(contains(r.render(), "\nmirrored_total 12\n"));
  EXPECT_TRUE(contains(r.render(), "\nmirrored_total 12\n")) << "the same total adds nothing";
  source = uint64_t{1} << 52;  // integers stay exact as doubles up to 2^53
  EXPECT_TRUE(contains(r.render(), "\nmirrored_total 4503599627370496\n")) << r.render();
  EXPECT_EQ(c.value(), 4503599627370496.0);
}

TEST(Registry, GaugeTimeHasSubSecondPrecision) {
  Registry r;
  auto& g = r.gauge("last_seen_seconds", "T.").get();
  timespec before{};
  clock_gettime(CLOCK_REALTIME, &before);
  g.set_to_current_time();
  timespec after{};
  clock_gettime(CLOCK_REALTIME, &after);
  EXPECT_GE(g.value(), static_cast<double>(before.tv_sec) + before.tv_nsec / 1e9 - 1e-6);
  EXPECT_LE(g.value(), static_cast<double>(after.tv_sec) + after.tv_nsec / 1e9 + 1e-6);
}

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "?";
}

TEST(KplegMetrics, ExportsEveryFamily) {
  Registry r;
  KplegMetrics m(r);
  // A labelled family without a series is not written: give each one.
  m.kernel_events.with({"exec"});
  m.corrections.with({"ContainerDied"});
  m.cri_calls.with({"Version", "OK"});
  m.bpf_ringbuf_drops.with({"exec"});
  m.bpf_helper_failures.with({"cgroup_mkdir", "7"});
  m.bpf_not_claimed.with({"exec_hook"});
  m.cri_calls_in_flight.with({"StopPodSandbox", "endpoint"});
  m.cri_call_oldest_seconds.with({"StopPodSandbox", "endpoint"});
  m.cri_endpoint_calls.with({"Version", "OK"});
  m.loop_wakeups.with({"ring buffer"});
  m.bpf_wake_after.with({"exec"});
  std::string out = r.render();
  EXPECT_EQ(metric_definitions().size(), 46u);
  for (const auto& d : metric_definitions()) {
    const std::string name(d.name);
    EXPECT_TRUE(contains(out, "# HELP " + name + " " + std::string(d.help) + "\n# TYPE " + name +
                                  " " + type_name(d.type) + "\n"))
        << name;
    // Every definition is registered: a second registration of its name fails.
    EXPECT_THROW(r.gauge(name, "again"), std::invalid_argument) << name;
  }
  EXPECT_TRUE(contains(out, "# TYPE kubelet_pleg_relist_duration_seconds histogram\n"));
  EXPECT_TRUE(contains(out, "# TYPE kubelet_pleg_discard_events counter\n"));
  EXPECT_TRUE(contains(out, "# TYPE kubelet_pleg_last_seen_seconds gauge\n"));
}

TEST(KplegMetrics, CountsPublishedEventsAndTheirDetectionLatency) {
  Registry r;
  KplegMetrics m(r);
  bus::EventBus bus(bus::EventBusOptions{
      .on_publish = [&](const pleg::PodLifecycleEvent& ev) { m.observe_published(ev); }});
  pleg::PodLifecycleEvent ev;
  ev.type = pleg::EventType::kContainerDied;
  ev.source = pleg::EventSource::kKernel;
  ev.kernel_ts_ns = 1'000'000'000;
  ev.emit_ts_ns = 1'003'000'000;  // 3 ms later
  bus.publish(ev);
  ev.source = pleg::EventSource::kReconcile;
  ev.kernel_ts_ns = 0;  // nothing from the kernel: no latency sample
  bus.publish(ev);

  std::string out = r.render();
  EXPECT_TRUE(contains(out, "kpleg_events_total{source=\"kernel\",type=\"ContainerDied\"} 1\n"));
  EXPECT_TRUE(contains(out, "kpleg_events_total{source=\"reconcile\",type=\"ContainerDied\"} 1\n"));
  EXPECT_TRUE(contains(out, "kpleg_events_total{source=\"kernel\",type=\"ContainerStarted\"} 0\n"));
  EXPECT_TRUE(contains(out, "kpleg_detection_latency_seconds_bucket{le=\"0.0025\"} 0\n")) << out;
  EXPECT_TRUE(contains(out, "kpleg_detection_latency_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_TRUE(contains(out, "kpleg_detection_latency_seconds_count 1\n"));
}

TEST(KplegMetrics, MirrorsCriCallsAndTheBusAtScrapeTime) {
  Registry r;
  KplegMetrics m(r);
  cri::CallStats calls;
  bus::EventBus bus;
  m.mirror_cri_calls(calls);
  m.mirror_bus(bus);

  calls.record(cri::CriMethod::kContainerStatus, 0);
  calls.record(cri::CriMethod::kContainerStatus, 0);
  calls.record(cri::CriMethod::kListContainers, 4);
  auto a = bus.subscribe(0, {}, 1);
  auto b = bus.subscribe(0, {}, 1);
  bus.publish({});
  bus.publish({});  // cuts off both: each had room for one

  std::string out = r.render();
  EXPECT_TRUE(contains(out, "kpleg_cri_calls_total{code=\"OK\",method=\"ContainerStatus\"} 2\n"))
      << out;
  EXPECT_TRUE(contains(
      out, "kpleg_cri_calls_total{code=\"DEADLINE_EXCEEDED\",method=\"ListContainers\"} 1\n"));
  EXPECT_FALSE(contains(out, "method=\"Version\"")) << "calls that never happened stay out";
  EXPECT_TRUE(contains(out, "\nkpleg_subscribers 0\n"));
  EXPECT_TRUE(contains(out, "\nkpleg_subscribers_cut_off_total 2\n"));
  EXPECT_TRUE(contains(out, "\nkubelet_pleg_discard_events 4\n"));

  auto c = bus.subscribe(0);
  EXPECT_TRUE(contains(r.render(), "\nkpleg_subscribers 1\n"));
}

TEST(KplegMetrics, ModeGaugeMarksOnlyTheActiveMode) {
  Registry r;
  KplegMetrics m(r);
  m.set_mode("ebpf");
  std::string out = r.render();
  EXPECT_TRUE(contains(out, "\nkpleg_mode{mode=\"ebpf\"} 1\n")) << out;
  EXPECT_TRUE(contains(out, "\nkpleg_mode{mode=\"relist\"} 0\n")) << out;
  m.set_mode("relist");
  out = r.render();
  EXPECT_TRUE(contains(out, "\nkpleg_mode{mode=\"ebpf\"} 0\n")) << out;
  EXPECT_TRUE(contains(out, "\nkpleg_mode{mode=\"relist\"} 1\n")) << out;
}

// Runs `promtool check metrics` on `text`; returns its exit status and output.
std::pair<int, std::string> promtool_check(const std::string& text) {
  char path[] = "/tmp/kpleg-metrics-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  ::close(fd);
  std::ofstream(path) << text;
  std::string cmd = std::string("/usr/bin/promtool check metrics < ") + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = p != nullptr ? pclose(p) : -1;
  unlink(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(KplegMetrics, PromtoolAcceptsTheExposition) {
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/promtool", X_OK) == 0,
                        "promtool not installed (Debian package prometheus)");
  Registry r;
  KplegMetrics m(r);
  cri::CallStats calls;
  bus::EventBus bus;
  m.mirror_cri_calls(calls);
  m.mirror_bus(bus);
  calls.record(cri::CriMethod::kContainerStatus, 0);
  m.set_mode("ebpf");
  m.kernel_events.with({"exec"}).inc();
  m.corrections.with({"missed_start"}).inc();
  m.relist_duration.observe(0.012);
  m.last_seen.set_to_current_time();
  m.observe_published(pleg::PodLifecycleEvent{});

  auto [rc, out] = promtool_check(r.render());
  // Parse errors exit 1. Lint findings exit 3; the only one allowed is the kubelet's own
  // counter name, kept on purpose so that kubelet dashboards keep working.
  EXPECT_NE(rc, 1) << out;
  std::string rest = out;
  const std::string expected =
      "kubelet_pleg_discard_events counter metrics should have \"_total\" suffix\n";
  if (auto at = rest.find(expected); at != std::string::npos) rest.erase(at, expected.size());
  EXPECT_EQ(rest, "") << "promtool: " << out;
  EXPECT_TRUE(rc == 0 || rc == 3) << out;
}

TEST(KplegMetrics, PromtoolRejectsBrokenText) {
  // The check above must be able to fail.
  KPLEG_REQUIRE_OR_SKIP(access("/usr/bin/promtool", X_OK) == 0,
                        "promtool not installed (Debian package prometheus)");
  EXPECT_EQ(promtool_check("broken{ 1\n").first, 1);
}

class SwitchableHealth : public api::HealthProvider {
 public:
  api::HealthReport health() override {
    std::lock_guard l(mu_);
    return report_;
  }
  api::HealthReport readiness() override {
    std::lock_guard l(mu_);
    return ready_;
  }
  api::HealthReport liveness() override {
    std::lock_guard l(mu_);
    return live_;
  }
  void set(api::HealthReport h, api::HealthReport ready) {
    std::lock_guard l(mu_);
    report_ = std::move(h);
    ready_ = std::move(ready);
  }
  void set_live(api::HealthReport live) {
    std::lock_guard l(mu_);
    live_ = std::move(live);
  }

 private:
  std::mutex mu_;
  api::HealthReport live_{true, {}};
  api::HealthReport report_{true, {}};
  api::HealthReport ready_{true, {}};
};

TEST(MetricsServer, ServesMetricsHealthAndReadiness) {
  Registry r;
  KplegMetrics m(r);
  SwitchableHealth health;
  MetricsServer server(MetricsServerOptions{"127.0.0.1:0"}, r, health);
  ASSERT_TRUE(server.start().ok());
  ASSERT_GT(server.port(), 0);

  httplib::Client client("127.0.0.1", server.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(contains(res->body, "# TYPE kpleg_events_total counter"));

  res = client.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");

  health.set({false, {"kernel path: no events consumed for 30 s", "runtime unreachable"}},
             {false, {"initial reconcile not done"}});
  res = client.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body,
            "unhealthy\n- kernel path: no events consumed for 30 s\n- runtime unreachable\n");
  res = client.Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "unhealthy\n- initial reconcile not done\n");

  // Liveness is its own answer: the runtime's problems above leave it passing.
  res = client.Get("/livez");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");
  health.set_live({false, {"a reconcile has been running for 200 s"}});
  res = client.Get("/livez");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "unhealthy\n- a reconcile has been running for 200 s\n");

  res = client.Get("/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  server.stop();
}

// httplib's timeout is per read: clients that send a header byte now and then held every worker
// for as long as they liked (40 of them, one byte each 200 ms: /healthz was not answered at all).
// Each request has a deadline for the whole of it now.
TEST(MetricsServer, HealthzAnswersWhileClientsTrickleHeaderBytes) {
  Registry r;
  SwitchableHealth health;
  MetricsServer server(MetricsServerOptions{"127.0.0.1:0"}, r, health);
  ASSERT_TRUE(server.start().ok());
  const int port = server.port();
  auto connect_to_server = [port] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  };
  std::atomic<bool> stop{false};
  std::atomic<int> connected{0}, cut_off{0};
  std::vector<std::thread> tricklers;
  for (int i = 0; i < 40; ++i) {
    tricklers.emplace_back([&] {
      // Reconnects at once when cut off; the pause between bytes paces the load.
      while (!stop) {
        int fd = connect_to_server();
        if (fd < 0) continue;
        ++connected;
        const std::string start = "GET /healthz HTTP/1.1\r\nX-Slow: ";
        bool alive = send(fd, start.data(), start.size(), MSG_NOSIGNAL) > 0;
        while (alive && !stop) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          char c;
          alive = send(fd, "a", 1, MSG_NOSIGNAL) == 1 && recv(fd, &c, 1, MSG_DONTWAIT) != 0;
        }
        if (!alive) ++cut_off;
        close(fd);
      }
    });
  }
  const auto connect_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (connected < 40 && std::chrono::steady_clock::now() < connect_deadline)
    std::this_thread::yield();
  ASSERT_GE(connected.load(), 40);
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(3);
  client.set_read_timeout(3);
  // Probed back to back until every trickling client has been cut off at least once.
  auto slowest = std::chrono::steady_clock::duration::zero();
  const auto probe_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  int probes = 0;
  while ((probes < 5 || cut_off < 40) && std::chrono::steady_clock::now() < probe_deadline) {
    const auto t0 = std::chrono::steady_clock::now();
    auto res = client.Get("/healthz");
    slowest = std::max(slowest, std::chrono::steady_clock::now() - t0);
    ASSERT_TRUE(res) << "probe " << probes << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    ++probes;
  }
  stop = true;
  for (auto& t : tricklers) t.join();
  EXPECT_LT(slowest, std::chrono::seconds(3));
  EXPECT_GE(cut_off.load(), 40);
  std::printf("/healthz under 40 trickling clients: %d probes, slowest %lld ms; %d connections, "
              "%d cut off\n",
              probes,
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(slowest).count()),
              connected.load(), cut_off.load());
  server.stop();
}

// Clients that connect and send nothing (or stall mid-request) must not keep the liveness probe
// from an answer: each holds a worker for a bounded time only.
TEST(MetricsServer, HealthzAnswersWhileManyConnectionsSendNothing) {
  Registry r;
  SwitchableHealth health;
  MetricsServer server(MetricsServerOptions{"127.0.0.1:0"}, r, health);
  ASSERT_TRUE(server.start().ok());
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (i % 2 == 1) {
      const char partial[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // and then nothing
      ASSERT_GT(write(fd, partial, sizeof(partial) - 1), 0);
    }
    idle.push_back(fd);
  }
  httplib::Client client("127.0.0.1", server.port());
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  const auto t0 = std::chrono::steady_clock::now();
  auto res = client.Get("/healthz");
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  // httplib's defaults (8 workers, 5 s read timeout) made it wait 40 s behind these.
  EXPECT_LT(waited, std::chrono::seconds(4));
  for (int fd : idle) close(fd);
  server.stop();
}

TEST(MetricsServer, RefusesARequestBody) {
  Registry r;
  SwitchableHealth health;
  MetricsServer server(MetricsServerOptions{"127.0.0.1:0"}, r, health);
  ASSERT_TRUE(server.start().ok());
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(5);
  auto res = client.Post("/healthz", std::string(1 << 20, 'x'), "text/plain");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413);
  res = client.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  server.stop();
}

TEST(MetricsServer, ReportsAnAddressInUse) {
  Registry r;
  SwitchableHealth health;
  MetricsServer first(MetricsServerOptions{"127.0.0.1:0"}, r, health);
  ASSERT_TRUE(first.start().ok());
  MetricsServer second(MetricsServerOptions{"127.0.0.1:" + std::to_string(first.port())}, r,
                       health);
  auto st = second.start();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.error().message, "--metrics-address 127.0.0.1:")) << st.error().message;
  EXPECT_TRUE(contains(st.error().message, "cannot bind")) << st.error().message;
}

TEST(MetricsServer, StopsPromptlyRightAfterStart) {
  Registry r;
  SwitchableHealth health;
  for (int i = 0; i < 20; ++i) {
    MetricsServer s(MetricsServerOptions{"127.0.0.1:0"}, r, health);
    ASSERT_TRUE(s.start().ok());
  }  // destructors stop; a hang here fails by the test timeout
}

TEST(MetricsServer, ParsesAddresses) {
  auto v4 = parse_host_port("127.0.0.1:10262");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->first, "127.0.0.1");
  EXPECT_EQ(v4->second, 10262);
  auto v6 = parse_host_port("[::1]:9");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  EXPECT_EQ(v6->second, 9);
  for (const char* bad : {"", "host", ":1", "h:", "h:70000", "h:12x", "::1:9", "[::1]9"})
    EXPECT_FALSE(parse_host_port(bad).ok()) << bad;
}

}  // namespace
}  // namespace kpleg::metrics

// kplegctl, the real binary, against the real ApiServer in this process.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "api_test_support.h"
#include "run_command.h"
#include "support/privileged.h"

namespace kpleg::apitest {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    if (nl > start) out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

class KplegctlTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(start_status_.ok()) << start_status_.error().message; }

  CommandResult ctl(std::vector<std::string> args, std::chrono::milliseconds timeout = 20s) {
    std::vector<std::string> argv{KPLEGCTL_BIN, "--socket", h_.socket_path};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, timeout);
  }

  ServerHarness h_;
  Status start_status_ = h_.start();
};

TEST_F(KplegctlTest, HealthExitsZeroWhenHealthyAndOneWithTheReasonsWhenNot) {
  auto ok = ctl({"health"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "healthy\n");

  h_.health.set(false, {"kernel path: ring buffer not consumed for 12 s", "runtime unreachable"});
  auto bad = ctl({"health"});
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_EQ(bad.out,
            "unhealthy\n- kernel path: ring buffer not consumed for 12 s\n- runtime "
            "unreachable\n");
}

TEST_F(KplegctlTest, WatchJsonPrintsOneParsableObjectPerEvent) {
  for (int i = 0; i < 5; ++i) h_.bus.publish(sample_event(i));
  auto r = ctl({"watch", "-o", "json", "--from-seq", "2", "--instance-id", h_.bus.instance_id(),
                "--count", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto j = nlohmann::json::parse(lines[i]);
    auto expected = sample_event(static_cast<int>(i) + 2);
    EXPECT_EQ(j.at("seq").get<uint64_t>(), i + 3);
    EXPECT_EQ(j.at("type"), "ContainerStarted");
    EXPECT_EQ(j.at("pod_uid"), expected.pod_uid);
    EXPECT_EQ(j.at("pod_name"), expected.pod_name);
    EXPECT_EQ(j.at("pod_namespace"), "default");
    EXPECT_EQ(j.at("container_id"), expected.container_id);
    EXPECT_EQ(j.at("container_name"), "app");
    EXPECT_EQ(j.at("sandbox"), false);
    EXPECT_EQ(j.at("source"), "kernel");
    EXPECT_EQ(j.at("correction"), false);
    EXPECT_GT(j.at("kernel_ts_ns").get<uint64_t>(), 0u);
    EXPECT_GE(j.at("emit_ts_ns").get<uint64_t>(), j.at("kernel_ts_ns").get<uint64_t>());
    EXPECT_EQ(j.at("status").at("state"), "running");
    EXPECT_GT(j.at("status").at("started_at_ns").get<int64_t>(), 0);
  }
}

TEST_F(KplegctlTest, WatchFollowsLiveEvents) {
  auto run = std::async(std::launch::async, [&] {
    return ctl({"watch", "-o", "json", "--namespace", "prod", "--count", "2"});
  });
  ASSERT_TRUE(eventually([&] { return h_.bus.stats().subscribers == 1; }, 10s));
  h_.bus.publish(sample_event(1, "dev"));
  h_.bus.publish(sample_event(2, "prod"));
  h_.bus.publish(sample_event(3, "dev"));
  h_.bus.publish(sample_event(4, "prod"));
  auto r = run.get();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0]).at("seq"), 2);
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("seq"), 4);
}

TEST_F(KplegctlTest, WatchTableIsReadable) {
  auto died = sample_event(3);
  died.type = pleg::EventType::kContainerDied;
  died.exit_code = 137;
  died.reason = "OOMKilled";
  h_.bus.publish(sample_event(3));
  h_.bus.publish(died);
  auto r2 = ctl({"watch", "--from-seq", "1", "--instance-id", h_.bus.instance_id(), "--count", "1"});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  auto lines = lines_of(r2.out);
  ASSERT_EQ(lines.size(), 2u) << r2.out;
  EXPECT_EQ(lines[0].rfind("TIME", 0), 0u);
  for (const char* col : {"TYPE", "NAMESPACE/POD", "CONTAINER", "EXIT/REASON", "SOURCE", "SEQ"})
    EXPECT_NE(lines[0].find(col), std::string::npos) << col;
  for (const char* cell : {"ContainerDied", "default/web-3", "app", "137 OOMKilled", "kernel"})
    EXPECT_NE(lines[1].find(cell), std::string::npos) << cell << " in: " << lines[1];
}

TEST_F(KplegctlTest, ListAndStats) {
  pleg::PodRecord web{{"uid-web", "web-0", "default"}, {}};
  const auto running = pleg::ContainerState::kRunning;
  web.containers.push_back({"c1", "nginx", false, running, {running, 1, 2, 0, 0, "", ""}});
  h_.state.set_pods({web});
  h_.bus.publish(sample_event(0));

  auto json = ctl({"list", "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j.at("seq"), 1);
  EXPECT_EQ(j.at("instance_id"), h_.bus.instance_id());
  EXPECT_EQ(j.at("pods").at(0).at("containers").at(0).at("name"), "nginx");
  EXPECT_EQ(j.at("pods").at(0).at("containers").at(0).at("status").at("state"), "running");

  auto table = ctl({"list"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("default/web-0"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("consistent with seq 1"), std::string::npos) << table.out;

  auto stats = ctl({"stats", "-o", "json"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  auto s = nlohmann::json::parse(stats.out);
  EXPECT_EQ(s.at("last_seq"), 1);
  EXPECT_EQ(s.at("mode"), "ebpf");
  EXPECT_EQ(s.at("healthy"), true);
  EXPECT_EQ(s.at("cri_calls"), 77);
  EXPECT_EQ(s.at("cri_calls_by_method").at("ContainerStatus"), 60);
  EXPECT_EQ(s.at("cri_calls_by_method").at("ListContainers"), 17);
  EXPECT_EQ(s.at("confirm_retries"), 5);

  auto text = ctl({"stats"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("  ContainerStatus:    60\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("confirm retries:      5\n"), std::string::npos) << text.out;
}

TEST_F(KplegctlTest, WatchFromASeqNeedsItsInstance) {
  auto r = ctl({"watch", "--from-seq", "3", "--count", "1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--instance-id"), std::string::npos) << r.err;
}

TEST_F(KplegctlTest, WatchShowsResync) {
  ServerHarness small({}, bus::EventBusOptions{.history_capacity = 5});
  ASSERT_TRUE(small.start().ok());
  for (int i = 0; i < 20; ++i) small.bus.publish(sample_event(i));
  auto r = run_command({KPLEGCTL_BIN, "--socket", small.socket_path, "watch", "-o", "json",
                        "--from-seq", "1", "--instance-id", small.bus.instance_id(), "--count", "2"},
                       20s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u);
  auto resync = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(resync.at("type"), "Resync");
  EXPECT_EQ(resync.at("seq"), 15);
  EXPECT_FALSE(resync.contains("status"));
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("seq"), 16);
}

TEST_F(KplegctlTest, WatchEndsWithExitTwoWhenTheDaemonStops) {
  auto run = std::async(std::launch::async, [&] { return ctl({"watch"}); });
  ASSERT_TRUE(eventually([&] { return h_.bus.stats().subscribers == 1; }, 10s));
  h_.server->stop();
  auto r = run.get();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("kplegd is shutting down"), std::string::npos) << r.err;
}

// On the unix socket a client is the process that connected: this process holding its share of
// --max-watchers (Watches whose filter matches nothing) leaves room for kplegctl.
TEST(KplegctlFairness, AProcessHoldingItsShareOfWatchersDoesNotLockAnotherOut) {
  ServerHarness h(api::ApiServerOptions{.max_watchers = 4, .max_watchers_per_client = 2});
  ASSERT_TRUE(h.start().ok());
  v1::WatchRequest nothing;
  nothing.set_pod_uid("no-such-pod");
  WatchClient a(h.channel(), nothing), b(h.channel(), nothing);
  ASSERT_TRUE(a.subscribed() && b.subscribed());
  WatchClient c(h.channel(), nothing);
  grpc::Status st = c.finish(10s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("too many watchers from this client (pid " +
                                    std::to_string(getpid()) + ", uid " +
                                    std::to_string(getuid()) + ": limit 2"),
            std::string::npos)
      << st.error_message();

  auto run = std::async(std::launch::async, [&] {
    return run_command({KPLEGCTL_BIN, "--socket", h.socket_path, "watch", "-o", "json", "--count",
                        "1"},
                       20s);
  });
  ASSERT_TRUE(eventually([&] { return h.bus.stats().subscribers == 3; }, 10s))
      << "kplegctl was locked out";
  h.bus.publish(sample_event(1));
  auto r = run.get();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
}

TEST(KplegctlNotRunning, MissingSocketSaysSoInOneLineAndExitsTwo) {
  TempDir dir;
  std::string path = dir.path() + "/kpleg.sock";
  for (const char* cmd : {"health", "watch", "list", "stats"}) {
    auto r = run_command({KPLEGCTL_BIN, "--socket", path, cmd}, 20s);
    EXPECT_EQ(r.exit_code, 2) << cmd;
    EXPECT_EQ(r.err, "kplegctl: kplegd is not running: no socket at " + path + "\n") << cmd;
    EXPECT_EQ(r.out, "") << cmd;
  }
}

TEST(KplegctlNotRunning, StaleSocketIsConnectionRefused) {
  TempDir dir;
  std::string path = dir.path() + "/kpleg.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);  // bound, never listening: what a crashed daemon leaves behind
  auto r = run_command({KPLEGCTL_BIN, "--socket", path, "health"}, 20s);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kplegctl: kplegd is not running: connection refused on " + path + "\n");
}

TEST(KplegctlNotRunning, UnreachableTcpAddressExitsTwo) {
  // A port nobody listens on: bind one, note it, close it.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto r = run_command({KPLEGCTL_BIN, "--address", addr, "--insecure-tcp", "health"}, 20s);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("kplegctl: cannot reach kplegd at " + addr + ": ", 0), 0u) << r.err;
}

}  // namespace
}  // namespace kpleg::apitest

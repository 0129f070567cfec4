// kpleg-bench-watch: the benchmark's consumer of kplegd's Watch stream. It is a plain
// kpleg.v1 PodLifecycle client, like any other consumer on the node, that stamps each event with the
// moment it arrived (CLOCK_REALTIME, the clock of kernel_ts_ns and of kpleg-load's traces), so
// detection latency is measured where a consumer sees it. It also samples Stats (relist count,
// corrections, health) on SIGUSR1, so the benchmark reads them at the edges of its windows
// without adding periodic work to the daemon it measures, or every --stats-interval-ms.
//
// Output, one JSON object per line:
//   {"kind":"ready","recv_ts_ns":...}                      the subscription is in place
//   {"kind":"event","recv_ts_ns":...,<kplegctl watch -o json fields>}
//   {"kind":"stats","ts_ns":...,<kplegctl stats -o json fields>}
//   {"kind":"end","recv_ts_ns":...,"code":...,"message":...}
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "api/client.h"
#include "cmd/kplegctl/output.h"
#include "kpleg/v1/pleg.grpc.pb.h"

namespace {

using namespace kpleg;

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::mutex g_out_mu;
void print_line(const std::string& s) {
  std::lock_guard lk(g_out_mu);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Splices leading fields into a JSON object "{...}".
std::string with_prefix(const std::string& prefix, const std::string& object) {
  if (object.size() < 2) return "{" + prefix + "}";
  return "{" + prefix + "," + object.substr(1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-bench-watch: Watch kplegd's events with arrival timestamps, sample Stats"};
  api::ClientOptions conn;
  int stats_interval_ms = 0;
  double connect_timeout_s = 10;
  app.add_option("--socket", conn.socket_path, "kplegd's unix socket")->required();
  app.add_option("--stats-interval-ms", stats_interval_ms, "Stats sampling period (0: on SIGUSR1 and at the end only)")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--connect-timeout", connect_timeout_s, "Seconds to wait for the socket to answer")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // SIGTERM/SIGINT end the watch; a final Stats sample is printed before exiting. SIGUSR1
  // takes a Stats sample now.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // kplegd may still be starting: retry the connection until the deadline.
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(int64_t(connect_timeout_s * 1000));
  std::shared_ptr<grpc::Channel> channel;
  for (;;) {
    auto ch = api::connect_channel(conn);
    if (ch) {
      channel = *ch;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "kpleg-bench-watch: %s\n", ch.error().message.c_str());
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // retry pacing
  }
  auto stub = v1::PodLifecycle::NewStub(channel);

  auto sample_stats = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse resp;
    int64_t ts = realtime_ns();
    grpc::Status st = stub->Stats(&ctx, v1::StatsRequest{}, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "kpleg-bench-watch: Stats: %s\n", st.error_message().c_str());
      return;
    }
    print_line(with_prefix("\"kind\":\"stats\",\"ts_ns\":" + std::to_string(ts),
                           kplegctl::stats_json(resp)));
  };

  grpc::ClientContext watch_ctx;
  v1::WatchRequest req;  // from_seq 0: events published from now on
  auto reader = stub->Watch(&watch_ctx, req);
  reader->WaitForInitialMetadata();
  print_line("{\"kind\":\"ready\",\"recv_ts_ns\":" + std::to_string(realtime_ns()) + "}");

  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
  std::thread stats_thread([&] {
    if (stats_interval_ms == 0) return;
    std::unique_lock lk(mu);
    while (!cv.wait_for(lk, std::chrono::milliseconds(stats_interval_ms), [&] { return done.load(); })) {
      lk.unlock();
      sample_stats();
      lk.lock();
    }
  });
  std::thread signal_thread([&] {
    for (;;) {
      int sig = 0;
      sigwait(&sigs, &sig);
      if (sig == SIGUSR1 && !done) {
        sample_stats();
        continue;
      }
      if (sig != SIGUSR1) break;
    }
    watch_ctx.TryCancel();
  });

  v1::Event ev;
  while (reader->Read(&ev)) {
    int64_t recv = realtime_ns();
    print_line(with_prefix("\"kind\":\"event\",\"recv_ts_ns\":" + std::to_string(recv),
                           kplegctl::event_json(ev)));
  }
  grpc::Status st = reader->Finish();
  {
    std::lock_guard lk(mu);
    done = true;
  }
  cv.notify_all();
  stats_thread.join();
  sample_stats();
  nlohmann::json end{{"kind", "end"},
                     {"recv_ts_ns", realtime_ns()},
                     {"code", int(st.error_code())},
                     {"message", st.error_message()}};
  print_line(end.dump());
  // The signal thread waits in sigwait: if the stream ended on its own, wake it.
  if (st.error_code() != grpc::StatusCode::CANCELLED) kill(getpid(), SIGTERM);
  signal_thread.join();
  return st.ok() || st.error_code() == grpc::StatusCode::CANCELLED ? 0 : 1;
}

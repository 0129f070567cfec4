// kpleg-bench-cri-call: what one confirmation look costs kplegd, by the way it is made. Calls
// ContainerStatus (or PodSandboxStatus) for one id --calls times, one after another, from
// --threads threads, over grpc++'s synchronous stub and over kpleg's own HTTP/2 connections
// (cri/h2_unary.h), both through GrpcCriClient, and prints one JSON line per way with the
// process CPU (user + system) and the wall time per call, and the context switches per call.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "cri/grpc_cri_client.h"

namespace {

double cpu_s(const rusage& r) {
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         double(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("GRPC_POLL_STRATEGY", "poll", 0);  // as kplegd
  CLI::App app{"kpleg-bench-cri-call: CPU per CRI status call, grpc++ against kpleg's HTTP/2"};
  std::string endpoint, id;
  int calls = 2000, threads = 1;
  bool sandbox = false;
  app.add_option("--runtime-endpoint", endpoint, "CRI endpoint (unix:///path)")->required();
  app.add_option("--id", id, "container (or, with --sandbox, sandbox) id")->required();
  app.add_flag("--sandbox", sandbox, "PodSandboxStatus instead of ContainerStatus");
  app.add_option("--calls", calls, "calls per way")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "calling threads")->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);

  int rc = 0;
  for (bool h2 : {false, true}) {
    kpleg::cri::GrpcCriClientOptions o;
    o.h2_read_calls = h2;
    auto client = kpleg::cri::GrpcCriClient::create(endpoint, o);
    if (!client) {
      std::fprintf(stderr, "kpleg-bench-cri-call: %s\n", client.error().message.c_str());
      return 2;
    }
    auto& c = **client;
    auto one = [&] {
      return sandbox ? bool(c.pod_sandbox_status(id)) : bool(c.container_status(id));
    };
    for (int i = 0; i < 50; ++i) one();  // connect, warm up
    std::atomic<int> failed{0};
    rusage r0{}, r1{};
    getrusage(RUSAGE_SELF, &r0);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&] {
        for (int i = 0; i < calls / threads; ++i)
          if (!one()) failed.fetch_add(1);
      });
    for (auto& t : ts) t.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    getrusage(RUSAGE_SELF, &r1);
    const int n = calls / threads * threads;
    nlohmann::json j{{"way", h2 ? "h2" : "grpc++"},
                     {"calls", n},
                     {"failed", failed.load()},
                     {"threads", threads},
                     {"cpu_us_per_call", (cpu_s(r1) - cpu_s(r0)) * 1e6 / n},
                     {"wall_us_per_call", wall * 1e6 / n},
                     {"ctx_switches_per_call",
                      double((r1.ru_nvcsw + r1.ru_nivcsw) - (r0.ru_nvcsw + r0.ru_nivcsw)) / n}};
    std::printf("%s\n", j.dump().c_str());
    if (failed.load() > 0) rc = 1;
  }
  return rc;
}

// cri_call_latency: the latency of CRI calls on one connection, one after the other, for
// comparing the runtime's socket with kpleg-cri-relay's in front of it (docs/kubelet.md).
//
//   cri_call_latency ENDPOINT METHOD COUNT     METHOD: Version | ListContainers | ListPodSandbox
//
// Prints "METHOD n=COUNT p50_us=... p90_us=... p99_us=... max_us=... failed=...".
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cri/api.grpc.pb.h"

namespace v1 = ::runtime::v1;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: cri_call_latency ENDPOINT METHOD COUNT\n");
    return 2;
  }
  std::string endpoint = argv[1];
  if (endpoint.starts_with("/")) endpoint = "unix://" + endpoint;
  const std::string method = argv[2];
  const int count = std::atoi(argv[3]);
  auto stub = v1::RuntimeService::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  auto call = [&]() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (method == "Version") {
      v1::VersionResponse r;
      return stub->Version(&ctx, v1::VersionRequest(), &r);
    }
    if (method == "ListPodSandbox") {
      v1::ListPodSandboxResponse r;
      return stub->ListPodSandbox(&ctx, v1::ListPodSandboxRequest(), &r);
    }
    v1::ListContainersResponse r;
    return stub->ListContainers(&ctx, v1::ListContainersRequest(), &r);
  };
  for (int i = 0; i < 20; ++i) call();  // connect, warm up
  std::vector<double> us;
  int failed = 0;
  for (int i = 0; i < count; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto st = call();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) ++failed;
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
  std::printf("%s n=%d p50_us=%.0f p90_us=%.0f p99_us=%.0f max_us=%.0f failed=%d\n", method.c_str(),
              count, at(0.5), at(0.9), at(0.99), us.back(), failed);
  return failed == 0 ? 0 : 1;
}

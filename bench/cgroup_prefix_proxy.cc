// kpleg-bench-cri-prefix: a CRI RuntimeService forwarder that moves the pods it creates under a
// cgroup prefix: a cgroup parent "/kubepods/..." in RunPodSandbox and CreateContainer becomes
// "<prefix>/kubepods/...". Every other call and field goes through unchanged.
//
// Why: the benchmark's private containerd shares the host's cgroup tree with whatever else runs
// on the machine (here, the shared test bed other tests churn). Under the default tracked root
// (kubepods) an ebpf-mode kplegd also sees those foreign containers, cannot confirm them with
// its own runtime, and retries and reconciles: work that belongs to no real node and would be
// charged to kpleg. With the benchmark's pods at <prefix>/kubepods/<qos>/pod<uid>/<id> (a layout
// kpleg accepts: "kubelet --cgroup-root") and kplegd tracking only <prefix>, each side sees
// exactly its own pods. The load generator (kpleg-load) talks through this; the daemons talk to
// containerd directly.
//
//   kpleg-bench-cri-prefix --listen unix:///tmp/p.sock --upstream unix:///run/containerd.sock
//       --prefix /kpleg-bench-1234
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "cri/api.grpc.pb.h"
#include "cri/endpoint.h"

namespace {

namespace v1 = runtime::v1;

std::string prefixed(const std::string& prefix, const std::string& parent) {
  if (parent.rfind("/kubepods", 0) == 0) return prefix + parent;
  return parent;
}

class PrefixingRuntime final : public v1::RuntimeService::Service {
 public:
  PrefixingRuntime(std::shared_ptr<grpc::Channel> upstream, std::string prefix)
      : stub_(v1::RuntimeService::NewStub(upstream)), prefix_(std::move(prefix)) {}

  grpc::Status RunPodSandbox(grpc::ServerContext* ctx, const v1::RunPodSandboxRequest* req,
                             v1::RunPodSandboxResponse* resp) override {
    v1::RunPodSandboxRequest r = *req;
    if (r.has_config() && r.config().has_linux()) {
      auto* l = r.mutable_config()->mutable_linux();
      l->set_cgroup_parent(prefixed(prefix_, l->cgroup_parent()));
    }
    return forward(ctx, &v1::RuntimeService::Stub::RunPodSandbox, r, resp);
  }

  // containerd derives the container's cgroup from the sandbox config the request carries.
  grpc::Status CreateContainer(grpc::ServerContext* ctx, const v1::CreateContainerRequest* req,
                               v1::CreateContainerResponse* resp) override {
    v1::CreateContainerRequest r = *req;
    if (r.has_sandbox_config() && r.sandbox_config().has_linux()) {
      auto* l = r.mutable_sandbox_config()->mutable_linux();
      l->set_cgroup_parent(prefixed(prefix_, l->cgroup_parent()));
    }
    return forward(ctx, &v1::RuntimeService::Stub::CreateContainer, r, resp);
  }

#define KPLEG_FORWARD(Method)                                                                   \
  grpc::Status Method(grpc::ServerContext* ctx, const v1::Method##Request* req,                 \
                      v1::Method##Response* resp) override {                                    \
    return forward(ctx, &v1::RuntimeService::Stub::Method, *req, resp);                         \
  }
  KPLEG_FORWARD(Version)
  KPLEG_FORWARD(StopPodSandbox)
  KPLEG_FORWARD(RemovePodSandbox)
  KPLEG_FORWARD(PodSandboxStatus)
  KPLEG_FORWARD(ListPodSandbox)
  KPLEG_FORWARD(StartContainer)
  KPLEG_FORWARD(StopContainer)
  KPLEG_FORWARD(RemoveContainer)
  KPLEG_FORWARD(ListContainers)
  KPLEG_FORWARD(ContainerStatus)
  KPLEG_FORWARD(Status)
#undef KPLEG_FORWARD

 private:
  template <typename Req, typename Resp>
  grpc::Status forward(grpc::ServerContext* ctx,
                       grpc::Status (v1::RuntimeService::Stub::*call)(grpc::ClientContext*, const Req&, Resp*),
                       const Req& req, Resp* resp) {
    grpc::ClientContext up;
    // The caller's deadline, or a generous one: a forwarder must never hang forever.
    auto deadline = ctx->deadline();
    if (deadline > std::chrono::system_clock::now() + std::chrono::minutes(5)) {
      deadline = std::chrono::system_clock::now() + std::chrono::minutes(5);
    }
    up.set_deadline(deadline);
    return ((*stub_).*call)(&up, req, resp);
  }

  std::unique_ptr<v1::RuntimeService::Stub> stub_;
  std::string prefix_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-bench-cri-prefix: CRI forwarder that moves created pods under a cgroup prefix"};
  std::string listen, upstream, prefix;
  app.add_option("--listen", listen, "Socket to serve on (unix:///path)")->required();
  app.add_option("--upstream", upstream, "The runtime's CRI endpoint")->required();
  app.add_option("--prefix", prefix, "Cgroup path prefix, e.g. /kpleg-bench")->required();
  CLI11_PARSE(app, argc, argv);
  // Blocked before gRPC starts its threads, which inherit the mask: sigwait below takes them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  if (prefix.size() < 2 || prefix[0] != '/' || prefix.back() == '/') {
    std::fprintf(stderr, "kpleg-bench-cri-prefix: --prefix must look like /name, got '%s'\n", prefix.c_str());
    return 2;
  }
  auto up_target = kpleg::cri::grpc_target_for_endpoint(upstream);
  auto listen_target = kpleg::cri::grpc_target_for_endpoint(listen);
  if (!up_target || !listen_target) {
    std::fprintf(stderr, "kpleg-bench-cri-prefix: %s\n",
                 (!up_target ? up_target.error() : listen_target.error()).message.c_str());
    return 2;
  }
  std::error_code ec;
  std::filesystem::remove(kpleg::cri::socket_path_of(*listen_target), ec);  // a stale one of ours

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  PrefixingRuntime service(grpc::CreateCustomChannel(*up_target, grpc::InsecureChannelCredentials(), args),
                           prefix);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(*listen_target, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(16 << 20);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "kpleg-bench-cri-prefix: cannot listen on %s\n", listen_target->c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&sigs, &sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::filesystem::remove(kpleg::cri::socket_path_of(*listen_target), ec);
  return 0;
}

// kpleg-bench-cri-prefix: a CRI RuntimeService forwarder that moves the pods it creates under a
// cgroup prefix: a cgroup parent "/kubepods/..." in RunPodSandbox and CreateContainer becomes
// "<prefix>/kubepods/...". Every other call and field goes through unchanged (criforward: by
// method name and raw bytes, the caller's deadline capped at 5 minutes).
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
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include "cri/api.pb.h"
#include "cri/endpoint.h"
#include "criforward/forwarder.h"

namespace {

namespace v1 = runtime::v1;
using kpleg::criforward::CallHooks;
using kpleg::criforward::Gate;

std::string prefixed(const std::string& prefix, const std::string& parent) {
  if (parent.rfind("/kubepods", 0) == 0) return prefix + parent;
  return parent;
}

// Re-serialises the request with its cgroup parent moved under the prefix; `linux_of` picks the
// LinuxPodSandboxConfig the method carries (containerd derives a container's cgroup from the
// sandbox config CreateContainer carries).
template <typename Req, typename LinuxOf>
class Prefixing final : public CallHooks {
 public:
  Prefixing(const std::string& prefix, LinuxOf linux_of) : prefix_(prefix), linux_of_(linux_of) {}
  void before_forward(grpc::ByteBuffer& request, Gate gate) override {
    Req r;
    if (r.ParseFromString(kpleg::criforward::flatten(request))) {
      if (auto* l = linux_of_(r)) {
        l->set_cgroup_parent(prefixed(prefix_, l->cgroup_parent()));
        request = kpleg::criforward::to_buffer(r.SerializeAsString());
      }
    }
    gate.open();
  }

 private:
  const std::string& prefix_;
  LinuxOf linux_of_;
};

class PrefixHooks final : public kpleg::criforward::Hooks {
 public:
  explicit PrefixHooks(std::string prefix) : prefix_(std::move(prefix)) {}
  std::unique_ptr<CallHooks> call_hooks(const grpc::GenericCallbackServerContext& ctx) override {
    if (ctx.method() == "/runtime.v1.RuntimeService/RunPodSandbox") {
      return make<v1::RunPodSandboxRequest>([](v1::RunPodSandboxRequest& r) {
        return r.has_config() && r.config().has_linux() ? r.mutable_config()->mutable_linux()
                                                        : nullptr;
      });
    }
    if (ctx.method() == "/runtime.v1.RuntimeService/CreateContainer") {
      return make<v1::CreateContainerRequest>([](v1::CreateContainerRequest& r) {
        return r.has_sandbox_config() && r.sandbox_config().has_linux()
                   ? r.mutable_sandbox_config()->mutable_linux()
                   : nullptr;
      });
    }
    return nullptr;  // everything else goes through untouched
  }

 private:
  template <typename Req, typename F>
  std::unique_ptr<CallHooks> make(F linux_of) {
    return std::make_unique<Prefixing<Req, F>>(prefix_, linux_of);
  }
  std::string prefix_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kpleg-bench-cri-prefix: CRI forwarder that moves created pods under a cgroup prefix"};
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
    std::fprintf(stderr, "kpleg-bench-cri-prefix: --prefix must look like /name, got '%s'\n",
                 prefix.c_str());
    return 2;
  }
  auto up_target = kpleg::cri::grpc_target_for_endpoint(upstream);
  auto listen_target = kpleg::cri::grpc_target_for_endpoint(listen);
  if (!up_target || !listen_target) {
    std::fprintf(stderr, "kpleg-bench-cri-prefix: %s\n",
                 (!up_target ? up_target.error() : listen_target.error()).message.c_str());
    return 2;
  }
  PrefixHooks hooks(prefix);
  kpleg::criforward::ForwarderOptions fo;
  fo.who = "kpleg-bench-cri-prefix";
  fo.listen_target = *listen_target;
  fo.upstream_target = *up_target;
  fo.max_call_time = std::chrono::minutes(5);  // a forwarder must never hang forever
  fo.shutdown_grace = std::chrono::seconds(2);
  auto fwd = kpleg::criforward::Forwarder::start(fo, &hooks);
  if (!fwd) {
    std::fprintf(stderr, "kpleg-bench-cri-prefix: %s\n", fwd.error().message.c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&sigs, &sig);
  (*fwd)->stop();
  return 0;
}

// kpleg-load: creates pods and container churn through the CRI exactly as the kubelet would
// (cgroup parents, labels, annotations, metadata), so kpleg can be exercised and measured on a
// node without a kubelet. Every result is a JSON line on stdout; diagnostics go to stderr.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "cri/endpoint.h"
#include "cri/grpc_cri_client.h"
#include "kpleg-load/churn.h"
#include "kpleg-load/kubelet_pod.h"
#include "kpleg-load/load.h"

namespace kpleg::load {
namespace {

int cmd_version(cri::CriClient&, const v1::VersionResponse& v, const std::string& endpoint) {
  emit(json{{"runtime_name", v.runtime_name()},
            {"runtime_version", v.runtime_version()},
            {"runtime_api_version", v.runtime_api_version()},
            {"endpoint", endpoint}});
  return 0;
}

int cmd_run(cri::CriClient& cri, const PodOptions& o, int pods, int containers, bool start) {
  if (auto s = require_pod_network(cri, o); !s) return fail(s.error().message);
  auto qos = effective_qos(o);
  if (!qos) return fail(qos.error().message);
  auto command = split_command(o.command);
  if (!command) return fail("--command: " + command.error().message);
  Load load(cri);
  for (int i = 0; i < pods; ++i) {
    auto pod = load.create_pod(o, i, *qos);
    if (!pod) return fail("creating pod " + std::to_string(i) + ": " + pod.error().message);
    json created = json::array();
    for (int j = 0; j < containers; ++j) {
      ContainerSpec c;
      c.name = "c" + std::to_string(j);
      c.image = o.image;
      c.command = *command;
      c.memory_limit_bytes = o.memory_limit;
      auto id = load.start_container(*pod, c, nullptr, start);
      if (!id) {
        // Leave no half-made pod behind: the pods already printed are the caller's to clean.
        (void)load.remove_pod(pod->sandbox_id, pod->spec.uid, pod->spec.log_directory);
        return fail("pod " + pod->spec.name + ": container " + c.name + ": " + id.error().message);
      }
      created.push_back(json{{"name", c.name}, {"container_id", *id}});
    }
    emit(json{{"pod_uid", pod->spec.uid},
              {"pod_name", pod->spec.name},
              {"namespace", pod->spec.namespace_},
              {"sandbox_id", pod->sandbox_id},
              {"qos", qos_class_name(*qos)},
              {"cgroup_parent", pod->config.linux().cgroup_parent()},
              {"log_directory", pod->spec.log_directory},
              {"containers", created}});
  }
  return 0;
}

int cmd_start_container(cri::CriClient& cri, const std::string& id) {
  auto s = cri.start_container(id);
  if (!s) return fail(s.error().message);
  emit(json{{"op", "start-container"}, {"container_id", id}, {"ok", true}});
  return 0;
}

int cmd_stop_container(cri::CriClient& cri, const std::string& id, int64_t grace) {
  auto s = cri.stop_container(id, grace);
  if (!s) return fail(s.error().message);
  emit(json{{"op", "stop-container"}, {"container_id", id}, {"ok", true}});
  return 0;
}

int cmd_remove_container(cri::CriClient& cri, const std::string& id) {
  auto s = cri.remove_container(id);
  if (!s) return fail(s.error().message);
  emit(json{{"op", "remove-container"}, {"container_id", id}, {"ok", true}});
  return 0;
}

int cmd_stop_pod(cri::CriClient& cri, const std::string& id) {
  auto s = cri.stop_pod_sandbox(id);
  if (!s) return fail(s.error().message);
  emit(json{{"op", "stop-pod"}, {"sandbox_id", id}, {"ok", true}});
  return 0;
}

std::string annotation(const v1::PodSandboxStatus& s, std::string_view key) {
  auto it = s.annotations().find(std::string(key));
  return it == s.annotations().end() ? "" : it->second;
}

int cmd_remove_pod(cri::CriClient& cri, const std::string& id) {
  auto st = cri.pod_sandbox_status(id);
  if (!st) {
    if (st.error().code == grpc::StatusCode::NOT_FOUND) {
      // RemovePodSandbox is idempotent in the CRI; so is this.
      emit(json{{"op", "remove-pod"}, {"sandbox_id", id}, {"ok", true}, {"already_removed", true}});
      return 0;
    }
    return fail(st.error().message);
  }
  Load load(cri);
  auto s = load.remove_pod(id, st->metadata().uid(), annotation(*st, kLogDirectoryAnnotation));
  if (!s) return fail(s.error().message);
  emit(json{
      {"op", "remove-pod"}, {"sandbox_id", id}, {"pod_uid", st->metadata().uid()}, {"ok", true}});
  return 0;
}

int cmd_clean(cri::CriClient& cri, const std::string& namespace_) {
  v1::PodSandboxFilter filter;
  (*filter.mutable_label_selector())[std::string(kLoadLabel)] = "true";
  if (!namespace_.empty())
    (*filter.mutable_label_selector())[std::string(kPodNamespaceLabel)] = namespace_;
  auto pods = cri.list_pod_sandboxes(filter);
  if (!pods) return fail(pods.error().message);
  Load load(cri);
  int failures = 0;
  for (const auto& p : *pods) {
    auto it = p.annotations().find(std::string(kLogDirectoryAnnotation));
    std::string log_dir = it == p.annotations().end() ? "" : it->second;
    auto s = load.remove_pod(p.id(), p.metadata().uid(), log_dir);
    json line{{"op", "remove-pod"},
              {"sandbox_id", p.id()},
              {"pod_uid", p.metadata().uid()},
              {"ok", s.ok()}};
    if (!s) {
      line["error"] = s.error().message;
      ++failures;
    }
    emit(line);
  }
  emit(json{{"op", "clean"},
            {"pods_removed", static_cast<int>(pods->size()) - failures},
            {"failures", failures}});
  return failures == 0 ? 0 : fail(std::to_string(failures) + " pod(s) could not be removed");
}

void add_pod_options(CLI::App* cmd, PodOptions& o) {
  cmd->add_option("--namespace", o.namespace_, "Pod namespace")->capture_default_str();
  cmd->add_option("--name-prefix", o.name_prefix, "Pod names are <prefix>-<n>")
      ->capture_default_str();
  cmd->add_option("--qos", o.qos,
                  "guaranteed, burstable, besteffort, or auto (burstable with a memory limit)")
      ->capture_default_str();
  cmd->add_option("--image", o.image, "Container image (must be present in the runtime)")
      ->capture_default_str();
  cmd->add_option("--command", o.command, "Container command, split like a shell would")
      ->capture_default_str();
  cmd->add_option("--memory-limit", o.memory_limit, "Container memory limit in bytes (0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--pod-network", o.pod_network,
                "Give pods their own network namespace (needs CNI) instead of the host's");
  cmd->add_option("--log-root", o.log_root, "Directory under which pod log directories are made")
      ->capture_default_str();
  cmd->add_option("--runtime-handler", o.runtime_handler,
                  "Runtime handler of the pods (a RuntimeClass's handler; default: the runtime's "
                  "default)");
}

}  // namespace
}  // namespace kpleg::load

int main(int argc, char** argv) {
  using namespace kpleg::load;
  CLI::App app{
      "kpleg-load: creates pods and container churn through the CRI the way the kubelet does"};
  app.require_subcommand(1);

  const char* env_endpoint = std::getenv("KPLEG_RUNTIME_ENDPOINT");
  std::string endpoint = env_endpoint != nullptr && *env_endpoint != '\0'
                             ? env_endpoint
                             : std::string(kpleg::cri::kDefaultRuntimeEndpoint);
  int64_t call_timeout_ms = 20000;
  std::string log_level = "warn";
  app.add_option("--runtime-endpoint", endpoint,
                 "CRI endpoint (unix:///path or /path); default $KPLEG_RUNTIME_ENDPOINT")
      ->capture_default_str();
  app.add_option("--call-timeout-ms", call_timeout_ms, "Deadline of each CRI call")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  auto* version_cmd = app.add_subcommand("version", "Print the runtime's name and version");

  PodOptions run_opts;
  int run_pods = 1, run_containers = 1;
  auto* run_cmd =
      app.add_subcommand("run", "Create pods with running containers; one JSON line per pod");
  run_cmd->add_option("--pods", run_pods, "Number of pods")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  run_cmd->add_option("--containers", run_containers, "Containers per pod")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  bool run_no_start = false;
  run_cmd->add_flag("--no-start", run_no_start,
                    "Create the containers but do not start them (start-container does)");
  add_pod_options(run_cmd, run_opts);

  std::string container_id, sandbox_id;
  int64_t grace = 0;
  auto* start_c = app.add_subcommand("start-container", "Start a created container");
  start_c->add_option("CONTAINER_ID", container_id)->required();
  auto* stop_c = app.add_subcommand("stop-container", "Stop a container");
  stop_c->add_option("CONTAINER_ID", container_id)->required();
  stop_c->add_option("--grace-period", grace, "Seconds before the runtime kills (0: at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600}));
  auto* remove_c = app.add_subcommand("remove-container", "Remove a container");
  remove_c->add_option("CONTAINER_ID", container_id)->required();
  auto* stop_p = app.add_subcommand("stop-pod", "Stop a pod sandbox and its containers");
  stop_p->add_option("SANDBOX_ID", sandbox_id)->required();
  auto* remove_p = app.add_subcommand("remove-pod",
                                      "Kill its running containers, stop and remove a pod sandbox, "
                                      "its pod cgroup and logs");
  remove_p->add_option("SANDBOX_ID", sandbox_id)->required();

  PodOptions churn_pod_opts;
  churn_pod_opts.name_prefix = "churn";
  ChurnOptions churn;
  auto* churn_cmd = app.add_subcommand(
      "churn",
      "Start, stop and remove short-lived containers at a fixed rate; one JSON line per CRI call");
  churn_cmd->add_option("--rate", churn.rate, "Transitions (start, death, removal) per second")
      ->check(CLI::Range(0.1, 1000.0))
      ->capture_default_str();
  churn_cmd->add_option("--duration", churn.duration_s, "Seconds of churn")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  churn_cmd->add_option("--pods", churn.pods, "Pods the containers are spread over")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  churn_cmd->add_option("--max-live", churn.max_live, "Containers running at once")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  churn_cmd->add_flag("--open-loop", churn.open_loop,
                      "Start each tick on its schedule, not after the previous call returned");
  churn_cmd->add_option("--grace-period", churn.grace, "StopContainer grace period in seconds")
      ->check(CLI::Range(int64_t{0}, int64_t{60}));
  add_pod_options(churn_cmd, churn_pod_opts);

  std::string clean_namespace;
  auto* clean_cmd = app.add_subcommand("clean", "Stop and remove every pod kpleg-load created");
  clean_cmd->add_option("--namespace", clean_namespace, "Only pods of this namespace");

  CLI11_PARSE(app, argc, argv);

  if (auto s = kpleg::setup_logging(log_level, kpleg::LogFormat::kText); !s) {
    return fail(s.error().message);
  }
  kpleg::cri::GrpcCriClientOptions copts;
  copts.call_timeout = std::chrono::milliseconds(call_timeout_ms);
  if (churn.open_loop) copts.max_in_flight = 64;  // the open loop's calls overlap
  auto client = kpleg::cri::GrpcCriClient::create(endpoint, copts);
  if (!client) return fail("--runtime-endpoint: " + client.error().message);
  auto& cri = **client;
  auto version = cri.version();
  if (!version) {
    return fail("cannot reach the container runtime at " + cri.target() + ": " +
                version.error().message);
  }

  if (*version_cmd) return cmd_version(cri, *version, cri.target());
  if (*run_cmd) return cmd_run(cri, run_opts, run_pods, run_containers, !run_no_start);
  if (*start_c) return cmd_start_container(cri, container_id);
  if (*stop_c) return cmd_stop_container(cri, container_id, grace);
  if (*remove_c) return cmd_remove_container(cri, container_id);
  if (*stop_p) return cmd_stop_pod(cri, sandbox_id);
  if (*remove_p) return cmd_remove_pod(cri, sandbox_id);
  if (*churn_cmd) return cmd_churn(cri, churn_pod_opts, churn);
  if (*clean_cmd) return cmd_clean(cri, clean_namespace);
  return fail("no subcommand");
}

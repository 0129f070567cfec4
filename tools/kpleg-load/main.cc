// kpleg-load: creates pods and container churn through the CRI exactly as the kubelet would
// (cgroup parents, labels, annotations, metadata), so kpleg can be exercised and measured on a
// node without a kubelet. Every result is a JSON line on stdout; diagnostics go to stderr.
#include <time.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "cri/endpoint.h"
#include "cri/grpc_cri_client.h"
#include "kpleg-load/kubelet_pod.h"
#include "kpleg-load/pod_cgroups.h"

namespace kpleg::load {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void emit(const json& line) { std::cout << line.dump() << '\n' << std::flush; }

int fail(const std::string& message) {
  std::cerr << "kpleg-load: " << message << '\n';
  return 1;
}

std::string default_log_root() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kpleg-load/pods";
}

struct PodOptions {
  std::string namespace_ = "kpleg-load";
  std::string name_prefix = "load";
  std::string qos = "auto";
  std::string image{kDefaultImage};
  std::string command = "sleep 1000000";
  int64_t memory_limit = 0;
  bool pod_network = false;
  std::string log_root = default_log_root();
  std::string runtime_handler;  // "" the runtime's default
};

// A pod this process created: enough to create its containers and to tear it down.
struct CreatedPod {
  PodSpec spec;
  v1::PodSandboxConfig config;
  std::string sandbox_id;
};

class Load {
 public:
  explicit Load(cri::CriClient& cri) : cri_(cri) {}

  Result<CreatedPod> create_pod(const PodOptions& o, int index, QosClass qos) {
    CreatedPod pod;
    pod.spec.name = o.name_prefix + "-" + std::to_string(index);
    pod.spec.namespace_ = o.namespace_;
    pod.spec.uid = new_pod_uid();
    pod.spec.qos = qos;
    pod.spec.host_network = !o.pod_network;
    pod.spec.log_directory = pod_log_directory(o.log_root, pod.spec);
    std::error_code ec;
    fs::create_directories(pod.spec.log_directory, ec);
    if (ec) {
      return Error{ec.value(),
                   "creating log directory " + pod.spec.log_directory + ": " + ec.message()};
    }
    pod.config = sandbox_config(pod.spec);
    auto id = cri_.run_pod_sandbox(pod.config, o.runtime_handler);
    if (!id) {
      (void)remove_pod_leftovers(pod.spec.uid, pod.spec.log_directory);
      return id.error();
    }
    pod.sandbox_id = std::move(*id);
    return pod;
  }

  // Creates and (unless `start` is false) starts one container; a container whose start
  // failed is removed.
  Result<std::string> start_container(const CreatedPod& pod, const ContainerSpec& c,
                                      json* trace = nullptr, bool start = true) {
    std::error_code ec;
    fs::create_directories(pod.spec.log_directory + "/" + c.name, ec);  // the kubelet's job too
    auto config = container_config(pod.spec, c);
    int64_t t0 = realtime_ns();
    auto id = cri_.create_container(pod.sandbox_id, config, pod.config);
    int64_t t1 = realtime_ns();
    if (trace != nullptr) {
      emit_call(*trace, "CreateContainer", "", t0, t1, id ? *id : "",
                id ? Status{} : Status(id.error()));
    }
    if (!id) return id.error();
    if (!start) return id;
    t0 = realtime_ns();
    auto started = cri_.start_container(*id);
    t1 = realtime_ns();
    if (trace != nullptr) emit_call(*trace, "StartContainer", "started", t0, t1, *id, started);
    if (!started) {
      (void)cri_.remove_container(*id);
      return started.error();
    }
    return id;
  }

  // Stops and removes a pod sandbox (and so its containers), then does the kubelet's part:
  // the pod cgroup and the log directory. Its running containers are killed first, without a
  // grace period, as the kubelet kills a pod whose grace is over: a runtime's StopPodSandbox
  // may give each container a grace period of its own first (CRI-O waits 10 s for a PID 1 that
  // ignores SIGTERM, such as sleep).
  Status remove_pod(const std::string& sandbox_id, const std::string& pod_uid,
                    const std::string& log_directory) {
    v1::ContainerFilter running;
    running.set_pod_sandbox_id(sandbox_id);
    running.mutable_state()->set_state(v1::CONTAINER_RUNNING);
    if (auto cs = cri_.list_containers(running); cs.ok()) {
      for (const auto& c : *cs) (void)cri_.stop_container(c.id(), 0);
    }
    // A failed stop (e.g. the network teardown of a sandbox whose network setup failed) does
    // not end the attempt: the runtime may still be able to remove the sandbox.
    auto stopped = cri_.stop_pod_sandbox(sandbox_id);
    if (auto s = cri_.remove_pod_sandbox(sandbox_id); !s) {
      return stopped.ok() ? s
                          : Error{stopped.error().code,
                                  stopped.error().message + "; then " + s.error().message};
    }
    return remove_pod_leftovers(pod_uid, log_directory);
  }

  static void emit_call(const json& base, std::string_view call, std::string_view transition,
                        int64_t t_begin, int64_t t_end, const std::string& container_id,
                        const Status& result) {
    json line = base;
    line["call"] = call;
    if (!transition.empty()) line["transition"] = transition;
    if (!container_id.empty()) line["container_id"] = container_id;
    line["t_begin_ns"] = t_begin;
    line["t_end_ns"] = t_end;
    line["ok"] = result.ok();
    if (!result.ok()) line["error"] = result.error().message;
    emit(line);
  }

 private:
  static Status remove_pod_leftovers(const std::string& pod_uid, const std::string& log_directory) {
    auto removed = remove_pod_cgroups(pod_uid, std::chrono::seconds(5));
    // Only ever delete a directory this tool made for this pod.
    if (!log_directory.empty() && log_directory.ends_with("_" + pod_uid)) {
      std::error_code ec;
      fs::remove_all(log_directory, ec);
    }
    if (!removed) return removed.error();
    return {};
  }

  cri::CriClient& cri_;
};

// The kubelet starts no pod-network pod while the runtime reports NetworkReady=false, and for
// good reason: containerd 1.6 then keeps the failed sandbox and cannot remove it either (its
// network teardown fails the same way) until a CNI config appears.
Status require_pod_network(cri::CriClient& cri, const PodOptions& o) {
  if (!o.pod_network) return {};
  auto status = cri.status();
  if (!status) return status.error();
  for (const auto& c : status->conditions()) {
    if (c.type() == "NetworkReady" && !c.status()) {
      return Error{EHOSTUNREACH,
                   "--pod-network: the runtime's pod network is not ready (NetworkReady=false: " +
                       c.reason() + ": " + c.message() +
                       "); it needs a CNI config (scripts/testbed.sh up --cni)"};
    }
  }
  return {};
}

Result<QosClass> effective_qos(const PodOptions& o) {
  if (o.qos == "auto") return o.memory_limit > 0 ? QosClass::kBurstable : QosClass::kBestEffort;
  return parse_qos_class(o.qos);
}

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

struct ChurnOptions {
  double rate = 5.0;
  double duration_s = 10.0;
  int pods = 1;
  int max_live = 4;
  int64_t grace = 0;
};

// Container churn at a fixed rate of transitions. Each tick makes exactly one transition, in
// this order of preference: remove the oldest exited container (ContainerRemoved), stop the
// oldest running one once max_live are running (ContainerDied), else create and start a new
// one (ContainerStarted). In the steady state every container lives 3 * max_live ticks. The
// container keeps the kubelet's restart shape: one name per pod, attempt counting up.
int cmd_churn(cri::CriClient& cri, const PodOptions& o, const ChurnOptions& c) {
  if (auto s = require_pod_network(cri, o); !s) return fail(s.error().message);
  auto qos = effective_qos(o);
  if (!qos) return fail(qos.error().message);
  auto command = split_command(o.command);
  if (!command) return fail("--command: " + command.error().message);

  Load load(cri);
  std::vector<CreatedPod> pods;
  auto teardown_pods = [&] {
    int failures = 0;
    for (const auto& p : pods) {
      if (!load.remove_pod(p.sandbox_id, p.spec.uid, p.spec.log_directory)) ++failures;
    }
    return failures;
  };
  for (int i = 0; i < c.pods; ++i) {
    auto pod = load.create_pod(o, i, *qos);
    if (!pod) {
      teardown_pods();
      return fail("creating pod " + std::to_string(i) + ": " + pod.error().message);
    }
    emit(json{{"op", "pod"},
              {"pod_uid", pod->spec.uid},
              {"sandbox_id", pod->sandbox_id},
              {"cgroup_parent", pod->config.linux().cgroup_parent()}});
    pods.push_back(std::move(*pod));
  }

  struct Live {
    size_t pod;
    std::string id;
  };
  std::deque<Live> running, exited;
  std::vector<uint32_t> attempts(pods.size(), 0);
  uint64_t transitions = 0, errors = 0, consecutive_errors = 0;
  size_t next_pod = 0;
  auto base = [&](size_t pod) {
    return json{{"pod_uid", pods[pod].spec.uid}, {"sandbox_id", pods[pod].sandbox_id}};
  };

  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(1.0 / c.rate));
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(c.duration_s));
  constexpr uint64_t kMaxConsecutiveErrors = 10;
  bool gave_up = false;
  for (uint64_t tick = 0;; ++tick) {
    const auto at = t0 + tick * interval;
    if (at >= end) break;
    std::this_thread::sleep_until(at);  // pacing of the load, not synchronisation
    bool ok = true;
    if (!exited.empty()) {
      Live l = exited.front();
      exited.pop_front();
      int64_t b = realtime_ns();
      auto s = cri.remove_container(l.id);
      Load::emit_call(base(l.pod), "RemoveContainer", "removed", b, realtime_ns(), l.id, s);
      ok = s.ok();
    } else if (running.size() >= static_cast<size_t>(c.max_live)) {
      Live l = running.front();
      running.pop_front();
      int64_t b = realtime_ns();
      auto s = cri.stop_container(l.id, c.grace);
      Load::emit_call(base(l.pod), "StopContainer", "died", b, realtime_ns(), l.id, s);
      ok = s.ok();
      exited.push_back(l);  // removed on a later tick even if the stop failed
    } else {
      size_t p = next_pod++ % pods.size();
      ContainerSpec spec;
      spec.name = "churn";
      spec.attempt = attempts[p]++;
      spec.image = o.image;
      spec.command = *command;
      spec.memory_limit_bytes = o.memory_limit;
      json trace = base(p);
      auto id = load.start_container(pods[p], spec, &trace);
      ok = id.ok();
      if (ok) running.push_back(Live{p, *id});
    }
    if (ok) {
      ++transitions;
      consecutive_errors = 0;
    } else {
      ++errors;
      if (++consecutive_errors >= kMaxConsecutiveErrors) {
        gave_up = true;
        break;
      }
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Tear down: the containers go with their pods.
  int teardown_failures = teardown_pods();
  emit(json{{"op", "churn"},
            {"transitions", transitions},
            {"errors", errors},
            {"elapsed_s", elapsed},
            {"rate", c.rate},
            {"pods", pods.size()},
            {"teardown_failures", teardown_failures}});
  if (gave_up)
    return fail("gave up after " + std::to_string(kMaxConsecutiveErrors) +
                " failed CRI calls in a row");
  if (teardown_failures > 0)
    return fail(std::to_string(teardown_failures) + " pod(s) could not be removed");
  return errors == 0 ? 0 : 1;
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
  auto* remove_p =
      app.add_subcommand("remove-pod", "Kill its running containers, stop and remove a pod sandbox, "
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

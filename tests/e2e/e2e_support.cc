#include "e2e/e2e_support.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

namespace kpleg::testing {

Result<LaunchedPod> launch_pod(const std::string& endpoint, const std::string& ns,
                               const std::string& name, int containers, const std::string& command,
                               const std::vector<std::string>& extra) {
  (void)endpoint;  // run_kpleg_load targets the test bed itself
  std::vector<std::string> args{"run",
                                "--pods", "1",
                                "--containers", std::to_string(containers),
                                "--namespace", ns,
                                "--name-prefix", name,
                                "--command", command};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_kpleg_load(args);
  if (!r) return r.error();
  if (r->exit_code != 0) return Error{r->exit_code, "kpleg-load run failed: " + r->err};
  for (const auto& line : lines_of(r->out)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("sandbox_id")) continue;
    LaunchedPod p;
    p.uid = j["pod_uid"];
    p.name = j["pod_name"];
    p.sandbox_id = j["sandbox_id"];
    for (const auto& c : j["containers"]) p.container_ids.push_back(c["container_id"]);
    return p;
  }
  return Error{EINVAL, "kpleg-load run printed no pod: " + r->out};
}

Status load_op(const std::string& endpoint, const std::string& op, const std::string& id) {
  (void)endpoint;
  auto r = run_kpleg_load({op, id});
  if (!r) return r.error();
  if (r->exit_code != 0) return Error{r->exit_code, "kpleg-load " + op + " failed: " + r->err};
  return {};
}

Result<std::unique_ptr<KplegdProcess>> start_kplegd(const std::string& endpoint,
                                                    const std::string& mode,
                                                    const std::vector<std::string>& extra) {
  // Each daemon gets its own API socket and an ephemeral metrics port: tests run several.
  static int n = 0;
  std::string socket = "/tmp/kpleg-e2e-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
  // KPLEG_E2E_LOG_LEVEL=trace logs every look, for a failure that debug does not explain.
  const char* level = std::getenv("KPLEG_E2E_LOG_LEVEL");
  std::vector<std::string> args{"--runtime-endpoint", endpoint, "--mode", mode, "--print-events",
                                "json", "--log-level", level != nullptr ? level : "debug",
                                "--socket", socket,
                                "--metrics-address", "127.0.0.1:0"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto d = KplegdProcess::start(args);
  if (!d) return d.error();
  // Logged once the mode is chosen, the initial sync done and the API and metrics serve.
  const std::string ready = mode == "relist" ? "kplegd ready: relist mode"
                            : mode == "ebpf" ? "kplegd ready: ebpf mode"
                                             : "kplegd ready: ";
  if (!(*d)->wait_for_log(ready, std::chrono::seconds(20))) {
    auto status = (*d)->stop();
    return Error{EIO, "kplegd did not start (exit " + std::to_string(status) + "): " + (*d)->log()};
  }
  return d;
}

bool wait_types(KplegdProcess& d, const std::string& id, const std::vector<std::string>& want,
                std::chrono::milliseconds timeout) {
  d.wait_for([&](const auto& evs) { return types_of(evs, id).size() >= want.size(); }, timeout);
  return d.types_for(id) == want;
}

// posix_spawn of argv with stdout and stderr on the given descriptors (-1: /dev/null).
pid_t spawn_with(const std::vector<std::string>& argv, int out_fd, int err_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  else posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  else posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

}  // namespace kpleg::testing

// kpleg-load, the real binary, against the test bed; what it made is read back through the CRI
// with GrpcCriClient.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cri/grpc_cri_client.h"
#include "cri/testbed.h"

namespace kpleg::testing {
namespace {

using json = nlohmann::json;
namespace v1 = runtime::v1;

std::vector<json> json_lines(const std::string& out) {
  std::vector<json> lines;
  for (const auto& l : lines_of(out)) lines.push_back(json::parse(l));
  return lines;
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

using KpLegLoad = CriTestBedTest;

TEST_F(KpLegLoad, RunCreatesKubeletShapedPodsThatTheCriListsBack) {
  auto run = run_kpleg_load({"run", "--pods", "3", "--containers", "2", "--namespace", namespace_,
                             "--name-prefix", "web", "--command", "sh -c 'exec sleep 100000'"});
  ASSERT_TRUE(run.ok()) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->err;
  auto pods = json_lines(run->out);
  ASSERT_EQ(pods.size(), 3u) << run->out;

  auto client = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto& cri = **client;

  v1::PodSandboxFilter pod_filter;
  (*pod_filter.mutable_label_selector())["io.kubernetes.pod.namespace"] = namespace_;
  auto sandboxes = cri.list_pod_sandboxes(pod_filter);
  ASSERT_TRUE(sandboxes.ok()) << sandboxes.error().message;
  ASSERT_EQ(sandboxes->size(), 3u);
  std::map<std::string, v1::PodSandbox> by_id;
  for (auto& s : *sandboxes) by_id[s.id()] = s;

  v1::ContainerFilter container_filter;
  (*container_filter.mutable_label_selector())["io.kubernetes.pod.namespace"] = namespace_;
  auto containers = cri.list_containers(container_filter);
  ASSERT_TRUE(containers.ok()) << containers.error().message;
  EXPECT_EQ(containers->size(), 6u);
  std::map<std::string, v1::Container> containers_by_id;
  for (auto& c : *containers) containers_by_id[c.id()] = c;

  std::set<std::string> names;
  for (const auto& pod : pods) {
    const std::string uid = pod["pod_uid"];
    const std::string sandbox_id = pod["sandbox_id"];
    names.insert(pod["pod_name"].get<std::string>());
    EXPECT_EQ(pod["cgroup_parent"], "/kubepods/besteffort/pod" + uid);
    ASSERT_TRUE(by_id.count(sandbox_id)) << sandbox_id;
    const auto& s = by_id[sandbox_id];
    EXPECT_EQ(s.state(), v1::SANDBOX_READY);
    EXPECT_EQ(s.metadata().uid(), uid);
    EXPECT_EQ(s.metadata().namespace_(), namespace_);
    EXPECT_EQ(s.metadata().name(), pod["pod_name"]);
    EXPECT_EQ(s.labels().at("io.kubernetes.pod.uid"), uid);
    EXPECT_EQ(s.labels().at("io.kubernetes.pod.name"), pod["pod_name"]);
    EXPECT_EQ(s.labels().at("kpleg.io/load"), "true");
    EXPECT_GT(s.created_at(), 0);
    // runc made the pod cgroup on the cgroup2 tree too: that is where kpleg's ids come from.
    EXPECT_TRUE(exists("/sys/fs/cgroup/unified/kubepods/besteffort/pod" + uid) ||
                exists("/sys/fs/cgroup/kubepods/besteffort/pod" + uid));

    ASSERT_EQ(pod["containers"].size(), 2u);
    for (const auto& c : pod["containers"]) {
      const std::string id = c["container_id"];
      ASSERT_TRUE(containers_by_id.count(id)) << id;
      const auto& listed = containers_by_id[id];
      EXPECT_EQ(listed.pod_sandbox_id(), sandbox_id);
      EXPECT_EQ(listed.state(), v1::CONTAINER_RUNNING);
      EXPECT_EQ(listed.metadata().name(), c["name"]);
      EXPECT_EQ(listed.labels().at("io.kubernetes.container.name"), c["name"]);
      EXPECT_EQ(listed.labels().at("io.kubernetes.pod.uid"), uid);
      EXPECT_EQ(listed.labels().at("io.kubernetes.pod.namespace"), namespace_);

      auto status = cri.container_status(id);
      ASSERT_TRUE(status.ok()) << status.error().message;
      EXPECT_EQ(status->state(), v1::CONTAINER_RUNNING);
      EXPECT_GT(status->started_at(), 0);
      EXPECT_EQ(status->finished_at(), 0);
      EXPECT_EQ(status->annotations().at("io.kubernetes.container.restartCount"), "0");
      EXPECT_EQ(status->image().image(), "localhost/kpleg/busybox:1");
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"web-0", "web-1", "web-2"}));
}

TEST_F(KpLegLoad, StopAndRemoveSubcommandsDriveTheContainerAndPodLifecycle) {
  auto run = run_kpleg_load({"run", "--pods", "1", "--containers", "1", "--namespace", namespace_,
                             "--memory-limit", "67108864"});
  ASSERT_TRUE(run.ok()) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->err;
  auto pod = json_lines(run->out).at(0);
  const std::string uid = pod["pod_uid"], sandbox_id = pod["sandbox_id"];
  const std::string container_id = pod["containers"][0]["container_id"];
  EXPECT_EQ(pod["qos"], "burstable");
  EXPECT_EQ(pod["cgroup_parent"], "/kubepods/burstable/pod" + uid);

  auto client = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(client.ok());
  auto& cri = **client;
  auto status = cri.container_status(container_id);
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ(status->resources().linux().memory_limit_in_bytes(), 67108864);

  auto stop = run_kpleg_load({"stop-container", container_id});
  ASSERT_TRUE(stop.ok());
  ASSERT_EQ(stop->exit_code, 0) << stop->err;
  status = cri.container_status(container_id);
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ(status->state(), v1::CONTAINER_EXITED);
  EXPECT_EQ(status->exit_code(), 137);  // grace period 0: SIGKILL
  EXPECT_GT(status->finished_at(), status->started_at());

  auto remove = run_kpleg_load({"remove-container", container_id});
  ASSERT_TRUE(remove.ok());
  ASSERT_EQ(remove->exit_code, 0) << remove->err;
  status = cri.container_status(container_id);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, grpc::StatusCode::NOT_FOUND);

  auto stop_pod = run_kpleg_load({"stop-pod", sandbox_id});
  ASSERT_TRUE(stop_pod.ok());
  ASSERT_EQ(stop_pod->exit_code, 0) << stop_pod->err;
  auto sandbox = cri.pod_sandbox_status(sandbox_id);
  ASSERT_TRUE(sandbox.ok()) << sandbox.error().message;
  EXPECT_EQ(sandbox->state(), v1::SANDBOX_NOTREADY);

  auto remove_pod = run_kpleg_load({"remove-pod", sandbox_id});
  ASSERT_TRUE(remove_pod.ok());
  ASSERT_EQ(remove_pod->exit_code, 0) << remove_pod->err;
  sandbox = cri.pod_sandbox_status(sandbox_id);
  ASSERT_FALSE(sandbox.ok());
  EXPECT_EQ(sandbox.error().code, grpc::StatusCode::NOT_FOUND);
  // kpleg-load does the kubelet's share of pod removal: the pod cgroup and its logs are gone.
  EXPECT_FALSE(exists("/sys/fs/cgroup/unified/kubepods/burstable/pod" + uid));
  EXPECT_FALSE(exists("/sys/fs/cgroup/memory/kubepods/burstable/pod" + uid));
  EXPECT_FALSE(exists(pod["log_directory"].get<std::string>()));

  // Removal is idempotent, as in the CRI.
  auto again = run_kpleg_load({"remove-pod", sandbox_id});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->exit_code, 0) << again->err;
}

TEST_F(KpLegLoad, ChurnMakesTimedTransitionsAndLeavesNothingBehind) {
  auto churn = run_kpleg_load({"churn", "--rate", "10", "--duration", "2", "--pods", "2",
                               "--max-live", "2", "--namespace", namespace_});
  ASSERT_TRUE(churn.ok()) << churn.error().message;
  ASSERT_EQ(churn->exit_code, 0) << churn->err;
  auto lines = json_lines(churn->out);
  std::map<std::string, int> transitions;
  int64_t last_end = 0;
  for (const auto& l : lines) {
    if (!l.contains("call")) continue;
    EXPECT_TRUE(l["ok"].get<bool>()) << l.dump();
    EXPECT_LE(l["t_begin_ns"].get<int64_t>(), l["t_end_ns"].get<int64_t>());
    EXPECT_GE(l["t_begin_ns"].get<int64_t>(), last_end) << "calls overlap or go back in time";
    last_end = l["t_end_ns"];
    if (l.contains("transition")) ++transitions[l["transition"]];
  }
  ASSERT_FALSE(lines.empty());
  const auto& summary = lines.back();
  ASSERT_EQ(summary["op"], "churn") << summary.dump();
  EXPECT_EQ(summary["errors"], 0);
  EXPECT_EQ(summary["teardown_failures"], 0);
  // 10/s for 2 s: 20 ticks, each one transition.
  EXPECT_EQ(summary["transitions"], 20);
  EXPECT_EQ(transitions["started"] + transitions["died"] + transitions["removed"], 20);
  EXPECT_GT(transitions["died"], 0);
  EXPECT_GT(transitions["removed"], 0);

  auto client = cri::GrpcCriClient::create(endpoint_);
  ASSERT_TRUE(client.ok());
  v1::PodSandboxFilter filter;
  (*filter.mutable_label_selector())["io.kubernetes.pod.namespace"] = namespace_;
  auto left = (*client)->list_pod_sandboxes(filter);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << "churn left pods behind";
}

TEST(KpLegLoadNoRuntime, EverySubcommandFailsClearlyWhenTheRuntimeIsUnreachable) {
  const std::string endpoint = "unix:///tmp/kpleg-no-such-runtime.sock";
  const std::vector<std::vector<std::string>> subcommands = {
      {"version"},
      {"run", "--pods", "1"},
      {"stop-container", std::string(64, 'a')},
      {"remove-container", std::string(64, 'a')},
      {"stop-pod", std::string(64, 'a')},
      {"remove-pod", std::string(64, 'a')},
      {"churn", "--rate", "1", "--duration", "1"},
      {"clean"},
  };
  for (const auto& sub : subcommands) {
    std::vector<std::string> argv{KPLEG_LOAD_BIN, "--runtime-endpoint", endpoint};
    argv.insert(argv.end(), sub.begin(), sub.end());
    auto r = run_process(argv, std::chrono::seconds(30));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_NE(r->exit_code, 0) << sub[0];
    EXPECT_NE(r->err.find("kpleg-load: cannot reach the container runtime at " + endpoint),
              std::string::npos)
        << sub[0] << ": " << r->err;
    EXPECT_TRUE(r->out.empty()) << sub[0] << ": " << r->out;
  }
}

}  // namespace
}  // namespace kpleg::testing

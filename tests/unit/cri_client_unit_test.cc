// Pure logic of the cri component: endpoint parsing, call slots, call counters, and the proto
// subset's wire identity with the upstream CRI (field numbers are the contract, not names).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "cri/api.grpc.pb.h"
#include "cri/call_slots.h"
#include "cri/call_stats.h"
#include "cri/endpoint.h"

namespace kpleg::cri {
namespace {

using namespace std::chrono_literals;

TEST(RuntimeEndpoint, AcceptsUnixUrlsAndBarePaths) {
  EXPECT_EQ(*grpc_target_for_endpoint("unix:///run/containerd/containerd.sock"),
            "unix:///run/containerd/containerd.sock");
  EXPECT_EQ(*grpc_target_for_endpoint("unix:/run/crio/crio.sock"), "unix:///run/crio/crio.sock");
  EXPECT_EQ(*grpc_target_for_endpoint("/run/cri-dockerd.sock"), "unix:///run/cri-dockerd.sock");
}

TEST(RuntimeEndpoint, RejectsOtherSchemesRelativeAndEmptyPaths) {
  for (const char* bad : {"tcp://127.0.0.1:1234", "npipe:////./pipe/x", "", "unix://",
                          "run/containerd.sock", "unix://relative/x.sock"}) {
    auto r = grpc_target_for_endpoint(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, EINVAL);
    EXPECT_NE(r.error().message.find("endpoint"), std::string::npos) << r.error().message;
  }
}

TEST(RuntimeEndpoint, SocketPathOfTarget) {
  EXPECT_EQ(socket_path_of("unix:///a/b.sock"), "/a/b.sock");
}

TEST(CallSlots, BoundsConcurrentHolders) {
  CallSlots slots(2);
  auto far = CallSlots::Clock::now() + 1h;
  ASSERT_TRUE(slots.acquire_until(far));
  ASSERT_TRUE(slots.acquire_until(far));
  EXPECT_EQ(slots.in_use(), 2u);
  auto start = CallSlots::Clock::now();
  EXPECT_FALSE(slots.acquire_until(start + 50ms));
  EXPECT_GE(CallSlots::Clock::now() - start, 50ms);
  slots.release();
  EXPECT_TRUE(slots.acquire_until(CallSlots::Clock::now()));
}

TEST(CallSlots, WaiterGetsTheSlotWhenReleased) {
  CallSlots slots(1);
  ASSERT_TRUE(slots.acquire_until(CallSlots::Clock::now() + 1h));
  std::atomic<bool> got{false};
  std::thread waiter([&] { got = slots.acquire_until(CallSlots::Clock::now() + 10s); });
  slots.release();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(slots.in_use(), 1u);
}

TEST(CallSlots, ScopedSlotReleasesOnlyWhatItHeld) {
  CallSlots slots(1);
  {
    CallSlot a(slots, CallSlots::Clock::now() + 1h);
    ASSERT_TRUE(a.held());
    CallSlot b(slots, CallSlots::Clock::now());  // none free: gives up at once
    EXPECT_FALSE(b.held());
  }
  EXPECT_EQ(slots.in_use(), 0u);
}

TEST(CallStats, CountsByMethodAndCode) {
  CallStats stats;
  stats.record(CriMethod::kContainerStatus, 0);
  stats.record(CriMethod::kContainerStatus, 0);
  stats.record(CriMethod::kContainerStatus, 5);
  stats.record(CriMethod::kListContainers, 14);
  stats.record(CriMethod::kVersion, 99);  // outside gRPC's range: counted as UNKNOWN
  EXPECT_EQ(stats.count(CriMethod::kContainerStatus, 0), 2u);
  EXPECT_EQ(stats.count(CriMethod::kContainerStatus, 5), 1u);
  EXPECT_EQ(stats.total(CriMethod::kContainerStatus), 3u);
  EXPECT_EQ(stats.count(CriMethod::kListContainers, 14), 1u);
  EXPECT_EQ(stats.count(CriMethod::kVersion, 2), 1u);
  EXPECT_EQ(stats.total(CriMethod::kStatus), 0u);
}

TEST(CallStats, NamesAreTheCriAndGrpcNames) {
  std::set<std::string_view> names;
  for (size_t m = 0; m < kCriMethodCount; ++m) {
    auto name = cri_method_name(static_cast<CriMethod>(m));
    EXPECT_NE(name, "Unknown");
    names.insert(name);
    // Every counted method exists in the service under that exact name.
    EXPECT_NE(runtime::v1::VersionRequest::descriptor()
                  ->file()
                  ->FindServiceByName("RuntimeService")
                  ->FindMethodByName(std::string(name)),
              nullptr)
        << name;
    // And its path is the one gRPC puts on the wire for it.
    EXPECT_EQ(cri_method_path(static_cast<CriMethod>(m)),
              "/" + runtime::v1::VersionRequest::descriptor()
                        ->file()
                        ->FindServiceByName("RuntimeService")
                        ->full_name() +
                  "/" + std::string(name));
  }
  EXPECT_EQ(names.size(), kCriMethodCount);
  EXPECT_EQ(grpc_code_name(4), "DEADLINE_EXCEEDED");
  EXPECT_EQ(grpc_code_name(14), "UNAVAILABLE");
  EXPECT_EQ(grpc_code_name(-1), "UNKNOWN");
}

// The numbers below are the upstream CRI's (k8s.io/cri-api pkg/apis/runtime/v1/api.proto). A
// renumbered field would still compile and even round-trip between kpleg's own ends, and then
// silently read the wrong field from a real runtime; this is the check that catches it.
TEST(CriProtoSubset, FieldNumbersMatchUpstream) {
  struct Field {
    const char* message;
    const char* field;
    int number;
  };
  const Field fields[] = {
      {"VersionResponse", "runtime_api_version", 4},
      {"PodSandboxMetadata", "uid", 2},
      {"PodSandboxMetadata", "namespace", 3},
      {"PodSandboxMetadata", "attempt", 4},
      {"PodSandboxConfig", "labels", 6},
      {"PodSandboxConfig", "annotations", 7},
      {"PodSandboxConfig", "linux", 8},
      {"LinuxPodSandboxConfig", "cgroup_parent", 1},
      {"LinuxSandboxSecurityContext", "run_as_group", 8},
      {"LinuxSandboxSecurityContext", "privileged", 6},
      {"PodSandbox", "runtime_handler", 7},
      {"PodSandboxStatus", "annotations", 8},
      {"PodSandboxStatusResponse", "containers_statuses", 3},
      {"PodSandboxStatusResponse", "timestamp", 4},
      {"PodSandboxFilter", "label_selector", 3},
      {"ContainerConfig", "labels", 9},
      {"ContainerConfig", "log_path", 11},
      {"ContainerConfig", "linux", 15},
      {"LinuxContainerSecurityContext", "namespace_options", 3},
      {"LinuxContainerSecurityContext", "run_as_group", 12},
      {"LinuxContainerResources", "memory_limit_in_bytes", 4},
      {"LinuxContainerResources", "unified", 9},
      {"LinuxContainerResources", "memory_swap_limit_in_bytes", 10},
      {"ImageSpec", "user_specified_image", 18},
      {"ContainerFilter", "pod_sandbox_id", 3},
      {"ContainerFilter", "label_selector", 4},
      {"Container", "state", 6},
      {"Container", "annotations", 9},
      {"ContainerStatus", "started_at", 5},
      {"ContainerStatus", "finished_at", 6},
      {"ContainerStatus", "exit_code", 7},
      {"ContainerStatus", "reason", 10},
      {"ContainerStatus", "resources", 16},
      {"StopContainerRequest", "timeout", 2},
      {"ContainerEventResponse", "containers_statuses", 5},
  };
  const auto* file = runtime::v1::VersionRequest::descriptor()->file();
  EXPECT_EQ(file->package(), "runtime.v1");
  for (const auto& f : fields) {
    const auto* msg = file->FindMessageTypeByName(f.message);
    ASSERT_NE(msg, nullptr) << f.message;
    const auto* field = msg->FindFieldByName(f.field);
    ASSERT_NE(field, nullptr) << f.message << "." << f.field;
    EXPECT_EQ(field->number(), f.number) << f.message << "." << f.field;
  }
  EXPECT_EQ(runtime::v1::CONTAINER_EXITED, 2);
  EXPECT_EQ(runtime::v1::SANDBOX_NOTREADY, 1);
  EXPECT_EQ(runtime::v1::NODE, 2);
  EXPECT_EQ(runtime::v1::CONTAINER_DELETED_EVENT, 3);
}

}  // namespace
}  // namespace kpleg::cri

// The CRI endpoint's reading of a request for the stuck-call watchdog (request_subject.cc),
// against the generated parser: whatever bytes the kubelet (or anyone on the endpoint's socket)
// sends, it must not crash, and wherever the generated parser reads the request, the subject it
// names must be the field the runtime will act on. Input: one byte picks the method, the rest is
// the request.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <google/protobuf/stubs/logging.h>

#include "cri/api.pb.h"
#include "criendpoint/request_subject.h"
#include "require.h"

namespace {

namespace v1 = ::runtime::v1;
using kpleg::criendpoint::request_subject;

constexpr std::string_view kMethods[] = {
    "RunPodSandbox",   "CreateContainer", "ListContainers",  "ListPodSandbox",
    "StopPodSandbox",  "RemovePodSandbox", "PodSandboxStatus", "StartContainer",
    "StopContainer",   "RemoveContainer", "ContainerStatus", "ExecSync",
    "Version",         "NoSuchMethod"};

template <typename Request, typename Field>
void check_id(std::string_view bytes, const kpleg::cri::CallSubject& s, Field field) {
  Request req;
  if (req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    REQUIRE(s.id == (req.*field)());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The generated parser logs every string that is not UTF-8: noise at a fuzzer's rate.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view method = kMethods[data[0] % std::size(kMethods)];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string path = "/runtime.v1.RuntimeService/" + std::string(method);
  const kpleg::cri::CallSubject s = request_subject(path, bytes);
  // Another service's path names nothing, whatever its bytes.
  const auto other = request_subject("/runtime.v1.ImageService/" + std::string(method), bytes);
  REQUIRE(other.id.empty() && other.pod.uid.empty());

  if (method == "RunPodSandbox") {
    v1::RunPodSandboxRequest req;
    if (req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      REQUIRE(s.pod.uid == req.config().metadata().uid());
      REQUIRE(s.pod.name == req.config().metadata().name());
      REQUIRE(s.pod.namespace_ == req.config().metadata().namespace_());
    }
  } else if (method == "CreateContainer") {
    v1::CreateContainerRequest req;
    if (req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      REQUIRE(s.id == req.pod_sandbox_id());
      REQUIRE(s.pod.uid == req.sandbox_config().metadata().uid());
      REQUIRE(s.container_name == req.config().metadata().name());
    }
  } else if (method == "StopPodSandbox") {
    check_id<v1::StopPodSandboxRequest>(bytes, s, &v1::StopPodSandboxRequest::pod_sandbox_id);
  } else if (method == "RemovePodSandbox") {
    check_id<v1::RemovePodSandboxRequest>(bytes, s, &v1::RemovePodSandboxRequest::pod_sandbox_id);
  } else if (method == "PodSandboxStatus") {
    check_id<v1::PodSandboxStatusRequest>(bytes, s, &v1::PodSandboxStatusRequest::pod_sandbox_id);
  } else if (method == "StartContainer") {
    check_id<v1::StartContainerRequest>(bytes, s, &v1::StartContainerRequest::container_id);
  } else if (method == "StopContainer") {
    check_id<v1::StopContainerRequest>(bytes, s, &v1::StopContainerRequest::container_id);
  } else if (method == "RemoveContainer") {
    check_id<v1::RemoveContainerRequest>(bytes, s, &v1::RemoveContainerRequest::container_id);
  } else if (method == "ContainerStatus") {
    check_id<v1::ContainerStatusRequest>(bytes, s, &v1::ContainerStatusRequest::container_id);
  } else if (method == "Version" || method == "NoSuchMethod") {
    REQUIRE(s.id.empty() && s.pod.uid.empty());
  }
  return 0;
}

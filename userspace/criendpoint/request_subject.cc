#include "criendpoint/request_subject.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <array>

#include "cri/api.pb.h"

namespace kpleg::criendpoint {
namespace {

namespace v1 = ::runtime::v1;
using google::protobuf::internal::WireFormatLite;

// RuntimeService methods whose request's field 1 is the sandbox or container id they act on.
constexpr std::array<std::string_view, 17> kIdFirst = {
    "StopPodSandbox",  "RemovePodSandbox",         "PodSandboxStatus", "PortForward",
    "PodSandboxStats", "UpdatePodSandboxResources", "StartContainer",   "StopContainer",
    "RemoveContainer", "ContainerStatus",           "UpdateContainerResources",
    "ReopenContainerLog", "ExecSync", "Exec", "Attach", "ContainerStats", "CheckpointContainer"};

// Field 1 of a message when it is length-delimited (a string): "" otherwise. A field given more
// than once is its last value, as every protobuf parser (the runtime's too) reads it: the first
// one would name a sandbox or container the call does not act on.
std::string first_string_field(std::string_view bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  std::string last;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return last;
    if (WireFormatLite::GetTagFieldNumber(tag) == 1 &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::ReadString(&in, &last)) return {};
      continue;
    }
    if (!WireFormatLite::SkipField(&in, tag)) return {};
  }
}

// The pod a list's label selector picks, if it picks one by uid.
std::string label_uid(const google::protobuf::Map<std::string, std::string>& selector) {
  auto it = selector.find("io.kubernetes.pod.uid");
  return it == selector.end() ? std::string() : it->second;
}

}  // namespace

std::string_view short_method(std::string_view path) {
  for (auto prefix : {kRuntimeServicePrefix, kImageServicePrefix}) {
    if (path.substr(0, prefix.size()) == prefix) return path.substr(prefix.size());
  }
  return path;
}

cri::CallSubject request_subject(std::string_view path, std::string_view request) {
  cri::CallSubject s;
  if (path.substr(0, kRuntimeServicePrefix.size()) != kRuntimeServicePrefix) return s;
  const std::string_view method = path.substr(kRuntimeServicePrefix.size());
  if (method == "RunPodSandbox") {
    v1::RunPodSandboxRequest req;
    if (!req.ParseFromArray(request.data(), static_cast<int>(request.size()))) return s;
    const auto& md = req.config().metadata();
    s.pod.uid = md.uid();
    s.pod.name = md.name();
    s.pod.namespace_ = md.namespace_();
  } else if (method == "CreateContainer") {
    v1::CreateContainerRequest req;
    if (!req.ParseFromArray(request.data(), static_cast<int>(request.size()))) return s;
    s.id = req.pod_sandbox_id();
    const auto& md = req.sandbox_config().metadata();
    s.pod.uid = md.uid();
    s.pod.name = md.name();
    s.pod.namespace_ = md.namespace_();
    s.container_name = req.config().metadata().name();
  } else if (method == "ListContainers") {
    v1::ListContainersRequest req;
    if (!req.ParseFromArray(request.data(), static_cast<int>(request.size()))) return s;
    s.id = req.filter().pod_sandbox_id().empty() ? req.filter().id() : req.filter().pod_sandbox_id();
    s.pod.uid = label_uid(req.filter().label_selector());
  } else if (method == "ListPodSandbox") {
    v1::ListPodSandboxRequest req;
    if (!req.ParseFromArray(request.data(), static_cast<int>(request.size()))) return s;
    s.id = req.filter().id();
    s.pod.uid = label_uid(req.filter().label_selector());
  } else {
    for (auto m : kIdFirst) {
      if (m == method) {
        s.id = first_string_field(request);
        break;
      }
    }
  }
  return s;
}

}  // namespace kpleg::criendpoint

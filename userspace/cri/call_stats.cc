#include "cri/call_stats.h"

#include <array>
#include <string>

namespace kpleg::cri {

std::string_view cri_method_name(CriMethod method) {
  switch (method) {
    case CriMethod::kVersion:
      return "Version";
    case CriMethod::kStatus:
      return "Status";
    case CriMethod::kRunPodSandbox:
      return "RunPodSandbox";
    case CriMethod::kStopPodSandbox:
      return "StopPodSandbox";
    case CriMethod::kRemovePodSandbox:
      return "RemovePodSandbox";
    case CriMethod::kPodSandboxStatus:
      return "PodSandboxStatus";
    case CriMethod::kListPodSandbox:
      return "ListPodSandbox";
    case CriMethod::kCreateContainer:
      return "CreateContainer";
    case CriMethod::kStartContainer:
      return "StartContainer";
    case CriMethod::kStopContainer:
      return "StopContainer";
    case CriMethod::kRemoveContainer:
      return "RemoveContainer";
    case CriMethod::kListContainers:
      return "ListContainers";
    case CriMethod::kContainerStatus:
      return "ContainerStatus";
    case CriMethod::kGetContainerEvents:
      return "GetContainerEvents";
    case CriMethod::kCount:
      break;
  }
  return "Unknown";
}

std::string_view cri_method_path(CriMethod method) {
  static const auto paths = [] {
    std::array<std::string, kCriMethodCount> p;
    for (size_t i = 0; i < kCriMethodCount; ++i)
      p[i] = "/runtime.v1.RuntimeService/" + std::string(cri_method_name(static_cast<CriMethod>(i)));
    return p;
  }();
  size_t i = static_cast<size_t>(method);
  return i < kCriMethodCount ? std::string_view(paths[i]) : std::string_view();
}

std::string_view grpc_code_name(int code) {
  static constexpr std::string_view kNames[kGrpcStatusCodeCount] = {"OK",
                                                                    "CANCELLED",
                                                                    "UNKNOWN",
                                                                    "INVALID_ARGUMENT",
                                                                    "DEADLINE_EXCEEDED",
                                                                    "NOT_FOUND",
                                                                    "ALREADY_EXISTS",
                                                                    "PERMISSION_DENIED",
                                                                    "RESOURCE_EXHAUSTED",
                                                                    "FAILED_PRECONDITION",
                                                                    "ABORTED",
                                                                    "OUT_OF_RANGE",
                                                                    "UNIMPLEMENTED",
                                                                    "INTERNAL",
                                                                    "UNAVAILABLE",
                                                                    "DATA_LOSS",
                                                                    "UNAUTHENTICATED"};
  if (code < 0 || static_cast<size_t>(code) >= kGrpcStatusCodeCount) return "UNKNOWN";
  return kNames[code];
}

}  // namespace kpleg::cri

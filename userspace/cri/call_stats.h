// Counts of CRI calls by method and gRPC status code, and how many are in flight. Lock-free so
// that every call can record itself without contending; read by the metrics exporter.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace kpleg::cri {

enum class CriMethod : uint8_t {
  kVersion,
  kStatus,
  kRunPodSandbox,
  kStopPodSandbox,
  kRemovePodSandbox,
  kPodSandboxStatus,
  kListPodSandbox,
  kCreateContainer,
  kStartContainer,
  kStopContainer,
  kRemoveContainer,
  kListContainers,
  kContainerStatus,
  kGetContainerEvents,
  kCount,
};

inline constexpr size_t kCriMethodCount = static_cast<size_t>(CriMethod::kCount);
// grpc::StatusCode runs from OK (0) to UNAUTHENTICATED (16).
inline constexpr size_t kGrpcStatusCodeCount = 17;

// The CRI method name as the runtime and the kubelet's metrics spell it.
std::string_view cri_method_name(CriMethod method);
// The method's gRPC path, "/runtime.v1.RuntimeService/<name>": built once, no allocation per call.
std::string_view cri_method_path(CriMethod method);
// "OK", "DEADLINE_EXCEEDED", ...; "UNKNOWN" for codes outside the gRPC range.
std::string_view grpc_code_name(int code);

class CallStats {
 public:
  void record(CriMethod method, int grpc_code) {
    size_t c = (grpc_code >= 0 && static_cast<size_t>(grpc_code) < kGrpcStatusCodeCount)
                   ? static_cast<size_t>(grpc_code)
                   : 2;  // grpc::StatusCode::UNKNOWN
    calls_[static_cast<size_t>(method)][c].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t count(CriMethod method, int grpc_code) const {
    if (grpc_code < 0 || static_cast<size_t>(grpc_code) >= kGrpcStatusCodeCount) return 0;
    return calls_[static_cast<size_t>(method)][static_cast<size_t>(grpc_code)].load(
        std::memory_order_relaxed);
  }
  uint64_t total(CriMethod method) const {
    uint64_t sum = 0;
    for (const auto& c : calls_[static_cast<size_t>(method)])
      sum += c.load(std::memory_order_relaxed);
    return sum;
  }
  // Every call of every method, answered or not.
  uint64_t total() const {
    uint64_t sum = 0;
    for (size_t m = 0; m < kCriMethodCount; ++m) sum += total(static_cast<CriMethod>(m));
    return sum;
  }

 private:
  std::array<std::array<std::atomic<uint64_t>, kGrpcStatusCodeCount>, kCriMethodCount> calls_{};
};

}  // namespace kpleg::cri

// The service names kplegd's grpc.health.v1 answers for (the server and kplegctl share them).
#pragma once

namespace kpleg::api {

// The service name grpc.health.v1 reports for, besides the server-wide "": both answer
// readiness (whether kplegd's events can be trusted).
inline constexpr const char* kHealthServiceName = "kpleg.v1.PodLifecycle";
// The probes' services (kplegctl probe, or a Kubernetes grpc probe with this service):
// readiness, the same as "", and liveness (kplegd itself progresses), which a Check evaluates
// at once so that a stuck kplegd cannot answer from an old status.
inline constexpr const char* kReadinessService = "kplegd.readiness";
inline constexpr const char* kLivenessService = "kplegd.liveness";

}  // namespace kpleg::api

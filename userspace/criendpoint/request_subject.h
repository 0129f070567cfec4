// What a CRI request is about, read from its bytes for the stuck-call watchdog: the pod's
// metadata where the request carries it (RunPodSandbox, CreateContainer), else the sandbox or
// container id it names. Methods kpleg does not know are forwarded all the same; their subject
// is empty.
#pragma once

#include <string>
#include <string_view>

#include "cri/inflight_calls.h"

namespace kpleg::criendpoint {

inline constexpr std::string_view kRuntimeServicePrefix = "/runtime.v1.RuntimeService/";
inline constexpr std::string_view kImageServicePrefix = "/runtime.v1.ImageService/";
inline constexpr std::string_view kGetContainerEventsPath =
    "/runtime.v1.RuntimeService/GetContainerEvents";

// "/runtime.v1.RuntimeService/StopPodSandbox" -> "StopPodSandbox"; the path of any other
// service is kept whole.
std::string_view short_method(std::string_view path);

// Never fails: a request that does not parse has an empty subject.
cri::CallSubject request_subject(std::string_view path, std::string_view request);

}  // namespace kpleg::criendpoint

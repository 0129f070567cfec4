// Durations on the command line: "300s", "1s", "500ms", "2m", or a bare number of seconds.
#pragma once

#include <chrono>
#include <string>

#include "common/result.h"

namespace kpleg {

Result<std::chrono::milliseconds> parse_duration(const std::string& text);

}  // namespace kpleg

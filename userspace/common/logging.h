// Logging setup shared by every binary: spdlog to stderr, text or JSON lines.
#pragma once

#include <string>

#include "common/result.h"

namespace kpleg {

enum class LogFormat { kText, kJson };

// Configures the default spdlog logger (stderr). level: trace|debug|info|warn|error|off.
Status setup_logging(const std::string& level, LogFormat format);

}  // namespace kpleg

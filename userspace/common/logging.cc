#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace kpleg {

Status setup_logging(const std::string& level, LogFormat format) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return Error{EINVAL, "unknown log level '" + level +
                             "' (expected trace, debug, info, warn, error or off)"};
  }
  auto logger = spdlog::stderr_logger_mt("kpleg");
  if (format == LogFormat::kJson) {
    logger->set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%v"})", spdlog::pattern_time_type::utc);
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%f %^%l%$ %v");
  }
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return {};
}

}  // namespace kpleg

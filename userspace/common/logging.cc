#include "common/logging.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>

namespace kpleg {

namespace {

// One JSON object per line on stderr: {"ts":..., "level":..., "msg":...}, with the message
// escaped properly (a pattern-based JSON layout breaks on quotes in messages).
class JsonStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(msg.time.time_since_epoch());
    time_t secs = us.count() / 1'000'000;
    tm utc{};
    gmtime_r(&secs, &utc);
    char ts[40];
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &utc);
    snprintf(ts + n, sizeof(ts) - n, ".%06lldZ", static_cast<long long>(us.count() % 1'000'000));
    nlohmann::ordered_json j;
    j["ts"] = ts;
    j["level"] = std::string(spdlog::level::to_string_view(msg.level).data(),
                             spdlog::level::to_string_view(msg.level).size());
    j["msg"] = std::string(msg.payload.data(), msg.payload.size());
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { fflush(stderr); }
};

}  // namespace

Status setup_logging(const std::string& level, LogFormat format) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return Error{EINVAL, "unknown log level '" + level +
                             "' (expected trace, debug, info, warn, error or off)"};
  }
  std::shared_ptr<spdlog::logger> logger;
  if (format == LogFormat::kJson) {
    logger = std::make_shared<spdlog::logger>("kpleg", std::make_shared<JsonStderrSink>());
  } else {
    logger = std::make_shared<spdlog::logger>("kpleg", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%f %^%l%$ %v");
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  return {};
}

}  // namespace kpleg

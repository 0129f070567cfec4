#include "common/duration.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace kpleg {

Result<std::chrono::milliseconds> parse_duration(const std::string& text) {
  auto bad = [&] {
    return Error{EINVAL, "invalid duration '" + text + "' (expected e.g. 500ms, 2s, 5m)"};
  };
  if (text.empty()) return bad();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || !std::isfinite(v) || v <= 0) return bad();
  std::string unit(end);
  double ms;
  if (unit.empty() || unit == "s") {
    ms = v * 1000;
  } else if (unit == "ms") {
    ms = v;
  } else if (unit == "m") {
    ms = v * 60'000;
  } else if (unit == "h") {
    ms = v * 3'600'000;
  } else {
    return bad();
  }
  if (ms < 1 || ms > 1e12) return bad();
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace kpleg

// Tests that need root, BPF or a real containerd call KPLEG_REQUIRE_OR_SKIP(cond, reason).
// Unprivileged runs skip with the reason; with KPLEG_REQUIRE_PRIVILEGED=1 (as in CI) a
// missing prerequisite is a failure, so a skipped privileged test can never pass CI.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kpleg::testing {

inline bool privileged_required() {
  const char* v = std::getenv("KPLEG_REQUIRE_PRIVILEGED");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace kpleg::testing

#define KPLEG_REQUIRE_OR_SKIP(cond, reason)                                              \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      if (::kpleg::testing::privileged_required()) {                                     \
        FAIL() << "KPLEG_REQUIRE_PRIVILEGED=1 but prerequisite missing: " << (reason);   \
      } else {                                                                           \
        GTEST_SKIP() << (reason);                                                        \
      }                                                                                  \
    }                                                                                    \
  } while (0)

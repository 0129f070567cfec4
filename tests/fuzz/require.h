// The fuzz targets' invariant check: a broken invariant aborts, so libFuzzer keeps the input.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace kpleg::fuzz {

[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

}  // namespace kpleg::fuzz

#define REQUIRE(cond)                            \
  do {                                           \
    if (!(cond)) ::kpleg::fuzz::violated(#cond); \
  } while (0)

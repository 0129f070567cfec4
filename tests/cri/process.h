// Runs a program to completion with a deadline and captures its output: the CRI tests drive the
// real kpleg-load binary and scripts/testbed.sh exactly as a user would.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/result.h"

namespace kpleg::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string out;
  std::string err;
};

// Runs argv[0] (searched on PATH when it has no '/') with argv. A program still running at the
// deadline is killed and reported as an Error, so no test can hang on a stuck child.
Result<ProcessResult> run_process(const std::vector<std::string>& argv,
                                  std::chrono::milliseconds timeout);

// Non-empty lines of `text`.
std::vector<std::string> lines_of(const std::string& text);

}  // namespace kpleg::testing

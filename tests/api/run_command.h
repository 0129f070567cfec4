// Runs a program (kplegctl) as a user would, optionally as another user, with a deadline.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kpleg::apitest {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed by one; -1 when it could not run
  std::string out;
  std::string err;
  bool timed_out = false;
};

struct RunAs {
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;
};

// A program still running at the deadline is killed (timed_out = true): no test can hang.
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                          std::optional<RunAs> as = std::nullopt);

}  // namespace kpleg::apitest

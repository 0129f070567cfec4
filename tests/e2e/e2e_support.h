// Shared pieces of the end-to-end tests: launching kubelet-shaped pods through kpleg-load and
// running kplegd against the test bed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/result.h"
#include "cri/testbed.h"
#include "e2e/kplegd_process.h"

namespace kpleg::testing {

// Per-container event sequences the tests expect.
using Types = std::vector<std::string>;
inline const Types kStarted{"ContainerStarted"};
inline const Types kDied{"ContainerStarted", "ContainerDied"};
inline const Types kRemoved{"ContainerStarted", "ContainerDied", "ContainerRemoved"};

struct LaunchedPod {
  std::string uid;
  std::string name;
  std::string sandbox_id;
  std::vector<std::string> container_ids;
};

// `kpleg-load run` for one pod; extra args go after the subcommand.
Result<LaunchedPod> launch_pod(const std::string& endpoint, const std::string& ns,
                               const std::string& name, int containers, const std::string& command,
                               const std::vector<std::string>& extra = {});
// `kpleg-load <op> <id>` (stop-container, remove-container, stop-pod, remove-pod).
Status load_op(const std::string& endpoint, const std::string& op, const std::string& id);

// Starts kplegd in `mode` against the test bed and waits until its initial sync is done.
Result<std::unique_ptr<KplegdProcess>> start_kplegd(const std::string& endpoint,
                                                    const std::string& mode,
                                                    const std::vector<std::string>& extra = {});

// posix_spawn of argv with stdout and stderr on the given descriptors (-1: /dev/null); -1 when
// it could not be spawned.
pid_t spawn_with(const std::vector<std::string>& argv, int out_fd, int err_fd);

// Waits until the container's event types equal `want` (and fails fast when they can no longer).
bool wait_types(KplegdProcess& d, const std::string& id, const std::vector<std::string>& want,
                std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace kpleg::testing

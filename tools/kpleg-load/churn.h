// kpleg-load churn: container starts, deaths and removals at a fixed rate through the CRI,
// one JSON line per call.
#pragma once

#include <cstdint>

#include "cri/cri_client.h"
#include "kpleg-load/load.h"

namespace kpleg::load {

struct ChurnOptions {
  double rate = 5.0;
  double duration_s = 10.0;
  int pods = 1;
  int max_live = 4;
  int64_t grace = 0;
  // Each tick on a thread of its own, on its schedule, not after the previous call returned.
  bool open_loop = false;
};

// Container churn at a fixed rate of transitions. Each tick makes exactly one transition, in
// this order of preference: remove the oldest exited container (ContainerRemoved), stop the
// oldest running one once max_live are running (ContainerDied), else create and start a new
// one (ContainerStarted). In the steady state every container lives 3 * max_live ticks. The
// container keeps the kubelet's restart shape: one name per pod, attempt counting up.
// With open_loop, ticks do not wait for the calls before them; a tick that finds max_live starts
// still in flight is dropped and counted (the achieved rate is reported).
// Returns the process's exit status.
int cmd_churn(cri::CriClient& cri, const PodOptions& o, const ChurnOptions& c);

}  // namespace kpleg::load

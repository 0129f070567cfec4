// --removal-hints: what announces an exited container's removal to the tracker, so that its
// removal sweep goes soon after instead of on its back-off (pleg/removal_watcher.h). The source
// is the BPF program's rmdir hook (kernel) or an inotify watch of the runtime's per-container
// directories (auto), and its hints are trusted from the start only where the runtime is known
// to remove a directory named by the id on every removal.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cri/grpc_cri_client.h"
#include "kernel/bpf_program.h"
#include "kernel/dir_removal_watch.h"
#include "pleg/removal_watcher.h"
#include "pleg/tracker.h"

namespace kpleg::daemon {

enum class RemovalHintSource {
  kAuto,    // the runtime's per-container directories, by inotify (kernel/dir_removal_watch.h)
  kKernel,  // the BPF syscall tracepoints (costs every syscall on the node; docs/design.md)
  kOff,     // none: the periodic removal sweep
};

// The hint source attached, for the tracker's set_removal_hints; `hints` null: none.
struct RemovalHintsAttached {
  // auto: read on the tracker's loop, where it calls `on_removed`; destroyed there too
  // (Tracker::on_loop), after the tracker's set_removal_hints(nullptr).
  std::unique_ptr<kernel::DirRemovalWatch> dir_watch;
  std::unique_ptr<pleg::RemovalHints> hints;  // over the program or dir_watch
  bool trusted = false;
  bool after_removal = false;  // a hint comes once the directory is gone (inotify's)
};

struct RemovalHintsRequest {
  RemovalHintSource source = RemovalHintSource::kAuto;
  kernel::BpfProgram* program = nullptr;  // its hook is attached when source is kKernel
  std::vector<std::string> dirs;  // auto: --removal-hint-dir; none: the runtime's, from Status
  cri::GrpcCriClient* cri = nullptr;
  std::string runtime_name;          // from the runtime's Version answer
  pleg::Tracker* tracker = nullptr;  // auto: the watch is read on its loop
  // auto: a directory named `id` went; on the tracker's loop.
  std::function<void(const std::string& id)> on_removed;
};

// Attaches the source asked for; one that cannot be (no directories known, inotify failing)
// is logged and none is attached: exited containers are then swept for.
RemovalHintsAttached attach_removal_hints(RemovalHintsRequest req);

}  // namespace kpleg::daemon

#include "daemon/removal_hints.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace kpleg::daemon {

namespace {
// The tracker's removal hints over the BPF program's map of armed ids (--removal-hints kernel).
class KernelHints final : public pleg::RemovalHints {
 public:
  explicit KernelHints(kernel::BpfProgram& program) : program_(program) {}
  Arm watch(const std::string& id) override {
    if (!program_.watch_removal(id)) return Arm::kFailed;
    // Armed, then asked: a removal in between is hinted by the program.
    return program_.take_early_removal(id) ? Arm::kGone : Arm::kArmed;
  }
  void unwatch(const std::string& id) override { program_.unwatch_removal(id); }

 private:
  kernel::BpfProgram& program_;
};

// The tracker's removal hints over the inotify watch of the runtime's directories, which lives
// on the tracker's loop like the tracker's calls of it.
class DirWatchHints final : public pleg::RemovalHints {
 public:
  explicit DirWatchHints(kernel::DirRemovalWatch& watch) : watch_(watch) {}
  Arm watch(const std::string& id) override {
    switch (watch_.watch(id)) {
      case kernel::DirRemovalWatch::Arm::kArmed: return Arm::kArmed;
      case kernel::DirRemovalWatch::Arm::kGone: return Arm::kGone;
      case kernel::DirRemovalWatch::Arm::kNotAnId: break;
    }
    return Arm::kFailed;
  }
  void unwatch(const std::string& id) override { watch_.unwatch(id); }
  void take_held() override { watch_.take_held(); }
  void set_paused(bool paused) override { watch_.set_paused(paused); }

 private:
  kernel::DirRemovalWatch& watch_;
};
}  // namespace

RemovalHintsAttached attach_removal_hints(RemovalHintsRequest req) {
  RemovalHintsAttached out;
  std::string source;
  // Hints trusted from the start: on a runtime known to remove a directory named by the id on
  // every removal, seen where it keeps it (the kernel sees them all; containerd names its own).
  // Directories given by --removal-hint-dir are trusted once a hinted removal is confirmed.
  bool layout_known = true;
  if (auto* p = req.program; p != nullptr && p->removal_hints_attached()) {
    // Attached when the kernel options ask for it (--removal-hints kernel).
    out.hints = std::make_unique<KernelHints>(*p);
    source = "the kernel's rmdir of a directory named by the id";
  } else if (req.source == RemovalHintSource::kAuto) {
    std::vector<std::string> dirs = std::move(req.dirs);
    layout_known = dirs.empty();
    if (dirs.empty()) {
      auto info = req.cri->status_info();
      if (info) dirs = kernel::removal_dirs_from_status_info(*info);
      if (dirs.empty()) {
        spdlog::info("removal hint: {} names no per-container directory{}: exited containers "
                     "are swept for (--removal-hint-dir names them)",
                     req.runtime_name, info ? "" : " (Status: " + info.error().message + ")");
        return out;
      }
    }
    // On the tracker's loop: its hints are taken there as they are read, with no thread of its own.
    auto watch = req.tracker->on_loop([&](cri::Reactor& loop) {
      return kernel::DirRemovalWatch::start(loop, dirs, std::move(req.on_removed));
    });
    if (!watch) {
      spdlog::warn("removal hint: {}: exited containers are swept for", watch.error().message);
      return out;
    }
    out.dir_watch = std::move(*watch);
    out.hints = std::make_unique<DirWatchHints>(*out.dir_watch);
    out.after_removal = true;
    source = "the removal of their directory in ";
    for (size_t i = 0; i < dirs.size(); ++i) source += (i ? ", " : "") + dirs[i];
  } else {
    return out;
  }
  // containerd and CRI-O remove a directory named by the id on every RemoveContainer and
  // RemovePodSandbox (measured).
  out.trusted =
      layout_known && (req.runtime_name == "containerd" || req.runtime_name == "cri-o");
  spdlog::info("removal hint attached: exited containers' removals are announced by {} ({})",
               source,
               out.trusted ? "trusted for " + req.runtime_name
                           : "trusted once a hinted removal is confirmed");
  return out;
}

}  // namespace kpleg::daemon

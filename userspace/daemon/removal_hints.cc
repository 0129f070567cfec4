#include "daemon/removal_hints.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace kpleg::daemon {

namespace {
// The tracker's removal hints over their source's arm and disarm.
class RemovalHintsOver : public pleg::RemovalHints {
 public:
  RemovalHintsOver(std::function<Arm(const std::string&)> arm,
                   std::function<void(const std::string&)> disarm,
                   std::function<void()> take_held = nullptr,
                   std::function<void(bool)> set_paused = nullptr)
      : arm_(std::move(arm)),
        disarm_(std::move(disarm)),
        take_held_(std::move(take_held)),
        set_paused_(std::move(set_paused)) {}
  Arm watch(const std::string& id) override { return arm_(id); }
  void unwatch(const std::string& id) override { disarm_(id); }
  void take_held() override {
    if (take_held_) take_held_();
  }
  void set_paused(bool paused) override {
    if (set_paused_) set_paused_(paused);
  }

 private:
  std::function<Arm(const std::string&)> arm_;
  std::function<void(const std::string&)> disarm_;
  std::function<void()> take_held_;
  std::function<void(bool)> set_paused_;
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
    out.hints = std::make_unique<RemovalHintsOver>(
        [p](const std::string& id) {
          if (!p->watch_removal(id)) return pleg::RemovalHints::Arm::kFailed;
          // Armed, then asked: a removal in between is hinted by the program.
          return p->take_early_removal(id) ? pleg::RemovalHints::Arm::kGone
                                           : pleg::RemovalHints::Arm::kArmed;
        },
        [p](const std::string& id) { p->unwatch_removal(id); });
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
    auto* w = out.dir_watch.get();
    out.hints = std::make_unique<RemovalHintsOver>(
        [w](const std::string& id) {
          switch (w->watch(id)) {
            case kernel::DirRemovalWatch::Arm::kArmed: return pleg::RemovalHints::Arm::kArmed;
            case kernel::DirRemovalWatch::Arm::kGone: return pleg::RemovalHints::Arm::kGone;
            case kernel::DirRemovalWatch::Arm::kNotAnId: break;
          }
          return pleg::RemovalHints::Arm::kFailed;
        },
        [w](const std::string& id) { w->unwatch(id); }, [w] { w->take_held(); },
        [w](bool paused) { w->set_paused(paused); });
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

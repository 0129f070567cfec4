#include "daemon/kernel_upkeep.h"

#include <spdlog/spdlog.h>

#include <string>

namespace kpleg::daemon {

void KernelUpkeep::resync() {
  if (!kernel_.live()) return;
  const auto ks = kernel_.stats();
  const bool lost = ks.lost_reported != lost_at_last_resync_;
  lost_at_last_resync_ = ks.lost_reported;
  if (ks.untracked_cgroups > 0 || lost) {
    // The hook reported no mkdir below an untracked cgroup, and a lost record may have been
    // any mkdir or rmdir: the index learns those from the tree, before the kernel starts
    // reporting their execs and exits. One walk per reconcile, and reconciles are spaced.
    if (auto st = index_.seed(ks.cgroup2_mount); !st)
      spdlog::warn("resync: re-reading the cgroup tree: {}", st.error().message);
  } else if (const size_t dropped = index_.drop_vanished(); dropped > 0) {
    // Their rmdir records never came (lost, or the cgroup was not tracked then).
    spdlog::info("resync: {} cgroup index entries of cgroups that no longer exist dropped",
                 dropped);
  }
  auto r = kernel_.resync_tracked();
  if (!r) {
    spdlog::warn("resync of the tracked-cgroup map failed: {}", r.error().message);
    return;
  }
  if (r->added > 0 || r->stale > 0) {
    spdlog::info(
        "resync of the tracked-cgroup map: {} cgroups tracked that were missing, {} "
        "entries of vanished cgroups removed",
        r->added, r->stale);
  }
  if (!r->walk_complete)
    spdlog::warn("resync: part of the cgroup tree could not be read; stale entries kept");
  ctx_.metrics.on_stale_tracked_removed(r->stale);
  if (ctx_.health.note_untracked(r->still_full > 0)) {
    if (r->still_full == 0) spdlog::info("every cgroup under a tracked root is tracked again");
    ctx_.health_changed();
  }
}

std::string KernelUpkeep::why_not_tracked(std::optional<uint64_t> cgroup,
                                          const kernel::KernelSourceStats& ks) {
  if (!cgroup) return "no cgroup of it on this host matches the kubelet's layout";
  // Below a tracked root? Then the map was full or its pod over budget when it was made.
  bool below_root = false;
  if (auto entry = index_.lookup(*cgroup)) {
    const std::string& p = entry->path;
    for (const auto& root : ctx_.opts.kernel.bpf.root_names) {
      for (size_t at = p.find("/" + root); at != std::string::npos;
           at = p.find("/" + root, at + 1)) {
        const size_t end = at + 1 + root.size();
        if (end == p.size() || p[end] == '/') below_root = true;
      }
    }
  }
  if (!below_root) return "its cgroup is not below a tracked root (--cgroup-root)";
  if (ks.untracked_cgroups > 0)
    return "the tracked-cgroup map was full when its cgroup was made (--max-tracked-cgroups)";
  if (ks.bpf.over_budget > 0)
    return "its cgroup was made while its pod was over its budget (--max-cgroups-per-pod)";
  return "its cgroup is below a tracked root but not tracked";
}

void KernelUpkeep::check_coverage(const std::vector<pleg::RuntimeContainer>& view) {
  // A running container is covered when its cgroup is indexed and tracked in the kernel. One
  // that is not either lives under a root the BPF programs do not track (--cgroup-root), or
  // has no cgroup of its own on this host (a VM-based or user-space kernel runtime: kata,
  // gVisor), so no exec or exit of it will ever be seen; or the map had no room for it, or
  // its pod was over its budget when it was made.
  auto* program = kernel_.program();
  if (!program) return;  // stopped
  size_t uncovered = 0;
  std::string example;
  const auto ks = kernel_.stats();
  for (const auto& rc : view) {
    if (rc.state != pleg::ContainerState::kRunning) continue;
    auto cgroup = index_.find_container(rc.id);
    if (cgroup && program->is_tracked(*cgroup)) continue;
    if (uncovered++ > 0) continue;
    example = std::string(rc.sandbox ? "sandbox " : "container ") + rc.pod.namespace_ + "/" +
              rc.pod.name + (rc.sandbox ? "" : "/" + rc.name) + " (" + rc.id.substr(0, 12) +
              "): " + why_not_tracked(cgroup, ks);
  }
  ctx_.metrics.on_coverage(uncovered);
  const size_t before = ctx_.health.note_uncovered(uncovered, example);
  if (uncovered > 0 && before == 0) {
    spdlog::warn(
        "{} running containers and sandboxes are not seen by the kernel path, e.g. {}; "
        "their events come only from the reconcile",
        uncovered, example);
  } else if (uncovered == 0 && before > 0) {
    spdlog::info("every running container is seen by the kernel path again");
  }
  if ((uncovered > 0) != (before > 0)) ctx_.health_changed();
}

}  // namespace kpleg::daemon

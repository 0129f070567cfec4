#include "daemon/over_budget_log.h"

#include <spdlog/spdlog.h>

namespace kpleg::daemon {

std::string OverBudgetLog::pod_uid_of(const kernel::CgroupMkdir& mk) const {
  if (auto parent = index_.lookup(mk.parent_cgroup_id); parent && !parent->identity.pod_uid.empty())
    return parent->identity.pod_uid;
  for (std::string p = mk.path; !p.empty();) {
    if (auto id = cgroup::parse_cgroup_path(p); id && !id->pod_uid.empty()) return id->pod_uid;
    const auto slash = p.rfind('/');
    if (slash == std::string::npos || slash == 0) break;
    p.resize(slash);
  }
  return "";
}

bool OverBudgetLog::due(const std::string& key) {
  // One line per pod per 30 s: a pod stays over its budget as long as its loop runs.
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(mu_);
  if (logged_.size() > 1024) logged_.clear();
  auto [it, fresh] = logged_.try_emplace(key, now);
  if (fresh) return true;
  if (now - it->second < std::chrono::seconds(30)) return false;
  it->second = now;
  return true;
}

void OverBudgetLog::on_over_budget(const kernel::CgroupMkdir& mk) {
  const std::string pod_uid = pod_uid_of(mk);
  if (!due(pod_uid.empty() ? mk.path : pod_uid)) return;
  std::string name;
  if (!pod_uid.empty()) {
    for (const auto& c : tracker_.containers()) {
      if (c.pod.uid != pod_uid) continue;
      name = c.pod.namespace_ + "/" + c.pod.name + " ";
      break;
    }
  }
  uint64_t refused = 0;
  if (auto* program = kernel_.program()) {
    if (auto parent = program->tracked_entry(mk.parent_cgroup_id)) {
      for (const auto& [pod, budget] : program->pod_budgets())
        if (pod == parent->pod_id) refused = budget.refused;
    }
  }
  spdlog::warn(
      "pod {}({}) is over its cgroup budget ({} cgroups tracked below it, {} mkdirs a "
      "second): {} of its cgroups not tracked so far, e.g. {}; what runs in them is "
      "not seen, every other pod is",
      name, pod_uid.empty() ? "pod uid not found" : "uid " + pod_uid, limits_.max_cgroups_per_pod,
      limits_.max_mkdirs_per_pod_per_sec, refused, mk.path);
}

}  // namespace kpleg::daemon

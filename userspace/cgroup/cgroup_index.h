// CgroupIndex owns the map from cgroup2 id to the pod/container that runs in that cgroup.
//
// A cgroup2 id is the inode number of the cgroup's directory in the cgroup2 hierarchy: what
// bpf_get_current_cgroup_id() returns and what the cgroup_mkdir/rmdir tracepoints report. The
// index is seeded once from the tree and then kept current from those kernel events, so the
// kernel source can attribute an exec/exit to a container without touching the filesystem.
// Only directories whose path parses (cgroup_path.h) are recorded: roots, QoS levels, pods,
// containers/sandboxes and CRI-O's conmon cgroups (marked Kind::kIgnored); and every cgroup
// below a container's, as nested in that container (Kind::kNested).
//
// Thread-safe: events, lookups and a (re)seed may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cgroup/cgroup_path.h"
#include "common/result.h"

namespace kpleg::cgroup {

class CgroupIndex {
 public:
  struct Entry {
    std::string path;  // relative to the cgroup2 root, starting with '/'
    CgroupIdentity identity;

    bool operator==(const Entry&) const = default;
  };

  CgroupIndex() = default;
  CgroupIndex(const CgroupIndex&) = delete;
  CgroupIndex& operator=(const CgroupIndex&) = delete;

  // Walks the cgroup2 tree mounted at `cgroup2_mount` and replaces the index with every
  // directory whose path parses. Container subtrees and trees already rejected below a
  // kubepods root are not descended into (nothing below them can parse). Events that arrive
  // while the walk runs are applied on top of its result in arrival order, so a directory
  // created or removed during the walk ends up right either way. Fails only when the mount
  // itself cannot be read; unreadable or vanished subdirectories are skipped (and logged).
  Status seed(const std::string& cgroup2_mount);

  // From the cgroup_mkdir event (cgroup2 hierarchy only). Returns whether the cgroup is now
  // indexed: its parent `parent_id` is a container's (or nested in one), which makes it
  // Kind::kNested, or its path parsed. Otherwise any stale entry for `id` is dropped.
  bool on_mkdir(std::uint64_t id, std::string_view path, std::uint64_t parent_id = 0);
  // From the cgroup_rmdir (or cgroup_release) event.
  void on_rmdir(std::uint64_t id);

  // A cgroup the index never heard of, though the kernel reports processes in it: its mkdir
  // record was lost (a ring-buffer overflow). Finds it without walking the tree: `parent_of`
  // names a cgroup's parent (the kernel's tracked map remembers it), up to the first ancestor
  // the index knows; then one directory listing per missing level finds each child by its id,
  // and indexes it as its mkdir would have. Returns the cgroup's entry when its path parses (or
  // it is nested in a container), nullopt otherwise (not a pod's cgroup, gone, or no ancestor
  // known). Needs a seed first (the mount).
  using ParentOf = std::function<std::optional<std::uint64_t>(std::uint64_t id)>;
  std::optional<Entry> resolve(std::uint64_t id, const ParentOf& parent_of);

  // Drops every entry whose directory no longer exists or now belongs to another cgroup (a
  // missed rmdir: a lost record). One stat per entry, no walk. Returns how many were dropped.
  std::size_t drop_vanished();

  std::optional<Entry> lookup(std::uint64_t id) const;
  // Reverse lookup for Kind::kContainerOrSandbox entries (conmon cgroups are not containers).
  // When several cgroups claim one container id, the oldest (the smallest id: cgroup2 ids grow
  // with creation) is the container's: the runtime made it before anyone could learn the id, so
  // a look-alike path made later, e.g. .../kubepods/pod<uid>/<id> in a user's delegated subtree,
  // never takes the container's place.
  std::optional<std::uint64_t> find_container(std::string_view container_id) const;
  std::size_t size() const;
  // Every entry, e.g. to fill the kernel's map of tracked cgroup ids after a seed.
  std::vector<std::pair<std::uint64_t, Entry>> snapshot() const;

 private:
  struct Tables {
    std::unordered_map<std::uint64_t, Entry> by_id;
    // Every cgroup that claims a container id: one normally, more when a missed rmdir left a
    // stale one or a workload made a look-alike path. The oldest answers (see find_container).
    std::unordered_map<std::string, std::vector<std::uint64_t>> by_container;

    void insert(std::uint64_t id, Entry entry);
    void erase(std::uint64_t id);
  };
  // An event seen while a seed's walk was running; nullopt entry = the cgroup is gone.
  struct PendingEvent {
    std::uint64_t id;
    std::optional<Entry> entry;
  };

  void apply(std::uint64_t id, std::optional<Entry> entry);

  std::mutex seed_mu_;  // one seed at a time
  std::string mount_;   // of the last seed; set under seed_mu_ and mu_
  mutable std::shared_mutex mu_;
  Tables tables_;
  bool seeding_ = false;
  std::vector<PendingEvent> pending_;
};

}  // namespace kpleg::cgroup

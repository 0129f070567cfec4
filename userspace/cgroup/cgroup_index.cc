#include "cgroup/cgroup_index.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <spdlog/spdlog.h>

namespace kpleg::cgroup {
namespace {

class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

std::string child_path(const std::string& parent, std::string_view name) {
  std::string path = parent == "/" ? std::string() : parent;
  path += '/';
  path += name;
  return path;
}

struct WalkProblems {
  std::size_t count = 0;
  std::string first;

  void add(int err, const std::string& what) {
    if (count++ == 0) first = Error::from_errno(err, what).message;
  }
};

// A directory still to scan, with the container it is in (for nested cgroups), if any.
struct ToVisit {
  std::string path;
  std::optional<CgroupIdentity> container;
};

// What a cgroup below `parent`'s is: nested in the same container, when `parent` is a
// container's (or already nested in one).
std::optional<CgroupIdentity> nested_in(const CgroupIdentity& parent) {
  if (parent.kind != Kind::kContainerOrSandbox && parent.kind != Kind::kNested) return {};
  CgroupIdentity nested = parent;
  nested.kind = Kind::kNested;
  return nested;
}

// Lists the directory `path` (relative to the mount, open as `dir_fd`), records the children
// that parse (or are nested in `container`) and queues the ones below which something could
// still be recorded.
void scan_directory(int dir_fd, dev_t mount_dev, const std::string& path,
                    const std::optional<CgroupIdentity>& container,
                    std::vector<std::pair<std::uint64_t, CgroupIndex::Entry>>* found,
                    std::vector<ToVisit>* to_visit, WalkProblems* problems) {
  UniqueFd owned(dir_fd);
  DIR* dir = ::fdopendir(owned.get());
  if (dir == nullptr) {
    problems->add(errno, "fdopendir " + path);
    return;
  }
  owned.release();  // closedir closes it
  while (true) {
    errno = 0;
    const dirent* de = ::readdir(dir);
    if (de == nullptr) {
      // ENOENT: the directory was removed while we read it; nothing left to find.
      if (errno != 0 && errno != ENOENT) problems->add(errno, "readdir " + path);
      break;
    }
    const std::string_view name = de->d_name;
    if (name == "." || name == "..") continue;
    // cgroup interface files (cgroup.procs, cpu.max, ...) are regular files.
    if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) continue;

    const std::string child = child_path(path, name);
    auto identity = container ? nested_in(*container) : parse_cgroup_path(child);
    const bool descend = identity ? identity->kind != Kind::kIgnored
                                  : may_contain_pod_cgroups(child);
    if (!identity && !descend) continue;

    struct stat st {};
    if (::fstatat(::dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) problems->add(errno, "stat " + child);
      continue;
    }
    // Another filesystem mounted inside the tree has its own inode numbers: they are not
    // cgroup ids of this hierarchy.
    if (!S_ISDIR(st.st_mode) || st.st_dev != mount_dev) continue;
    std::optional<CgroupIdentity> inside;
    if (identity) {
      inside = nested_in(*identity);
      found->emplace_back(st.st_ino, CgroupIndex::Entry{child, std::move(*identity)});
    }
    if (descend) to_visit->push_back({child, std::move(inside)});
  }
  ::closedir(dir);
}

}  // namespace

void CgroupIndex::Tables::insert(std::uint64_t id, Entry entry) {
  erase(id);
  if (entry.identity.kind == Kind::kContainerOrSandbox) {
    by_container[entry.identity.container_id].push_back(id);
  }
  by_id.emplace(id, std::move(entry));
}

void CgroupIndex::Tables::erase(std::uint64_t id) {
  auto it = by_id.find(id);
  if (it == by_id.end()) return;
  if (it->second.identity.kind == Kind::kContainerOrSandbox) {
    auto rev = by_container.find(it->second.identity.container_id);
    // Only this cgroup's claim: another one may claim the container id too, and keeps it.
    if (rev != by_container.end()) {
      auto& ids = rev->second;
      ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
      if (ids.empty()) by_container.erase(rev);
    }
  }
  by_id.erase(it);
}

Status CgroupIndex::seed(const std::string& cgroup2_mount) {
  std::lock_guard seed_lock(seed_mu_);

  UniqueFd root(::open(cgroup2_mount.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0) return Error::from_errno(errno, "open cgroup2 mount " + cgroup2_mount);
  struct stat root_st {};
  if (::fstat(root.get(), &root_st) != 0) {
    return Error::from_errno(errno, "stat cgroup2 mount " + cgroup2_mount);
  }

  {
    // From here on events are both applied and logged: the walk below may or may not see the
    // directories they describe, and replaying them over its result settles it.
    std::unique_lock lock(mu_);
    seeding_ = true;
    pending_.clear();
    mount_ = cgroup2_mount;
  }

  std::vector<std::pair<std::uint64_t, Entry>> found;
  WalkProblems problems;
  std::vector<ToVisit> to_visit;
  // The mount itself ("/") never parses; its children are scanned from the already open fd.
  scan_directory(::dup(root.get()), root_st.st_dev, "/", std::nullopt, &found, &to_visit,
                 &problems);
  while (!to_visit.empty()) {
    ToVisit next = std::move(to_visit.back());
    to_visit.pop_back();
    const std::string& path = next.path;
    const int fd =
        ::openat(root.get(), path.c_str() + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) problems.add(errno, "open " + cgroup2_mount + path);
      continue;
    }
    scan_directory(fd, root_st.st_dev, path, next.container, &found, &to_visit, &problems);
  }

  Tables fresh;
  for (auto& [id, entry] : found) fresh.insert(id, std::move(entry));

  std::size_t indexed = 0;
  {
    std::unique_lock lock(mu_);
    for (auto& event : pending_) {
      if (event.entry) {
        fresh.insert(event.id, std::move(*event.entry));
      } else {
        fresh.erase(event.id);
      }
    }
    pending_.clear();
    seeding_ = false;
    tables_ = std::move(fresh);
    indexed = tables_.by_id.size();
  }

  if (problems.count > 0) {
    spdlog::warn("cgroup index: skipped {} unreadable cgroup directories under {} (first: {})",
                 problems.count, cgroup2_mount, problems.first);
  }
  spdlog::debug("cgroup index: seeded {} cgroups from {}", indexed, cgroup2_mount);
  return {};
}

void CgroupIndex::apply(std::uint64_t id, std::optional<Entry> entry) {
  std::unique_lock lock(mu_);
  if (seeding_) pending_.push_back(PendingEvent{id, entry});
  if (entry) {
    tables_.insert(id, std::move(*entry));
  } else {
    tables_.erase(id);
  }
}

bool CgroupIndex::on_mkdir(std::uint64_t id, std::string_view path, std::uint64_t parent_id) {
  std::optional<CgroupIdentity> identity;
  if (parent_id != 0) {
    std::shared_lock lock(mu_);
    auto parent = tables_.by_id.find(parent_id);
    if (parent != tables_.by_id.end()) identity = nested_in(parent->second.identity);
  }
  if (!identity) identity = parse_cgroup_path(path);
  if (!identity) {
    apply(id, std::nullopt);
    return false;
  }
  apply(id, Entry{std::string(path), std::move(*identity)});
  return true;
}

void CgroupIndex::on_rmdir(std::uint64_t id) { apply(id, std::nullopt); }

std::optional<CgroupIndex::Entry> CgroupIndex::resolve(std::uint64_t id,
                                                       const ParentOf& parent_of) {
  std::string mount;
  {
    std::shared_lock lock(mu_);
    if (auto it = tables_.by_id.find(id); it != tables_.by_id.end()) return it->second;
    mount = mount_;
  }
  if (mount.empty()) return std::nullopt;
  // Up to the first ancestor the index knows: the cgroup's chain of ids, nearest first.
  constexpr int kMaxDepth = 64;
  std::vector<std::uint64_t> chain{id};
  std::optional<Entry> known;
  while (!known) {
    if (chain.size() > kMaxDepth) return std::nullopt;
    auto parent = parent_of(chain.back());
    if (!parent) return std::nullopt;
    known = lookup(*parent);
    if (!known) chain.push_back(*parent);
  }
  // Down again, one listing per level: the child of `path` whose inode is the next id.
  std::string path = known->path;
  std::uint64_t parent_id = parent_of(chain.back()).value_or(0);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const std::string dir_path = mount + (path == "/" ? "" : path);
    DIR* dir = ::opendir(dir_path.c_str());
    if (dir == nullptr) return std::nullopt;
    std::optional<std::string> child;
    while (const dirent* de = ::readdir(dir)) {
      if (de->d_ino != *it) continue;
      const std::string_view name = de->d_name;
      if (name == "." || name == "..") continue;
      struct stat st {};
      if (::fstatat(::dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISDIR(st.st_mode) && st.st_ino == *it) {
        child = child_path(path, name);
        break;
      }
    }
    ::closedir(dir);
    if (!child) return std::nullopt;  // gone meanwhile
    on_mkdir(*it, *child, parent_id);  // indexes it when it parses or is nested
    path = *child;
    parent_id = *it;
  }
  return lookup(id);
}

std::size_t CgroupIndex::drop_vanished() {
  std::vector<std::pair<std::uint64_t, std::string>> entries;
  std::string mount;
  {
    std::shared_lock lock(mu_);
    mount = mount_;
    entries.reserve(tables_.by_id.size());
    for (const auto& [id, e] : tables_.by_id) entries.emplace_back(id, e.path);
  }
  if (mount.empty()) return 0;
  std::size_t dropped = 0;
  for (const auto& [id, path] : entries) {
    struct stat st {};
    const std::string full = mount + path;
    if (::stat(full.c_str(), &st) == 0) {
      if (st.st_ino == id) continue;
    } else if (errno != ENOENT && errno != ENOTDIR) {
      continue;  // unreadable now, not known to be gone
    }
    // Gone, or the path is another (younger) cgroup's now: this id exists no more.
    std::unique_lock lock(mu_);
    auto it = tables_.by_id.find(id);
    if (it == tables_.by_id.end() || it->second.path != path) continue;
    if (seeding_) pending_.push_back(PendingEvent{id, std::nullopt});
    tables_.erase(id);
    ++dropped;
  }
  return dropped;
}

std::optional<CgroupIndex::Entry> CgroupIndex::lookup(std::uint64_t id) const {
  std::shared_lock lock(mu_);
  auto it = tables_.by_id.find(id);
  if (it == tables_.by_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::uint64_t> CgroupIndex::find_container(std::string_view container_id) const {
  std::shared_lock lock(mu_);
  auto it = tables_.by_container.find(std::string(container_id));
  if (it == tables_.by_container.end()) return std::nullopt;
  return *std::min_element(it->second.begin(), it->second.end());
}

std::size_t CgroupIndex::size() const {
  std::shared_lock lock(mu_);
  return tables_.by_id.size();
}

std::vector<std::pair<std::uint64_t, CgroupIndex::Entry>> CgroupIndex::snapshot() const {
  std::shared_lock lock(mu_);
  return {tables_.by_id.begin(), tables_.by_id.end()};
}

}  // namespace kpleg::cgroup

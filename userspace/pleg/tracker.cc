#include "pleg/tracker.h"

#include <spdlog/spdlog.h>

#include <sys/epoll.h>

#include <unordered_map>
#include <variant>

namespace kpleg::pleg {

Tracker::Tracker(cri::CriClient& cri, cgroup::CgroupIndex& index, EventSink& sink,
                 TrackerOptions opts)
    : index_(index),
      core_(cri, sink, opts, loop_),
      confirmer_(core_),
      removal_(core_),
      diff_(core_, removal_) {
  core_.set_hooks({
      .exited = [this](Record& rec) { removal_.join(rec); },
      .runtime_events_live = [this](bool live) { removal_.on_runtime_events_live(live); },
      .deleted_event = [this](const std::string& id) { removal_.on_deleted_event(id); },
  });
  loop_.start("kpleg-loop");
}

Tracker::~Tracker() { stop(); }

void Tracker::stop() {
  core_.stop();  // the looks in flight end (their answers are dropped)
  loop_.stop();
}

void Tracker::on_runtime_event(const cri::v1::ContainerEventResponse& ev) {
  // Decoded where it was read; the loop takes what it says.
  auto report = observation_of(ev);
  if (loop_.in_loop()) return take_runtime_event(report);
  loop_.post([this, report = std::move(report)] { take_runtime_event(report); });
}

void Tracker::take_runtime_event(const std::optional<Observation>& report) {
  if (!report) {
    confirmer_.set_live(true);
    ++core_.stats().runtime_events_unmatched;
    return;
  }
  confirmer_.on_report(*report);
}

std::unique_ptr<RuntimeEvents> Tracker::runtime_events(RuntimeEvents::Options opts) {
  if (!loop_.call([this] { return core_.async_calls() != nullptr; })) return nullptr;
  // Read as events come only while a signal waits for one; else they are read together.
  opts.hold_off = core_.opts().runtime_event_hold_off;
  opts.wanted = [this] { return confirmer_.awaiting_events(); };
  opts.set_reader = [this](std::function<void(bool)> reader) {
    core_.set_event_reader(std::move(reader));
  };
  return std::make_unique<RuntimeEvents>(
      loop_,
      [this](RuntimeEvents::OnEvent on_event, std::function<void(Status)> on_end)
          -> std::unique_ptr<cri::AsyncStatusCalls::Stream> {
        if (core_.async_calls() == nullptr) return nullptr;  // stopped
        return core_.async_calls()->container_events(std::move(on_event), std::move(on_end));
      },
      [this](cri::v1::ContainerEventResponse& ev) { on_runtime_event(ev); },
      [this] { confirmer_.set_live(false); }, opts);
}

void Tracker::runtime_events_stopped() {
  loop_.post([this] { confirmer_.set_live(false); });
}

void Tracker::set_inconsistency_handler(std::function<void(const std::string&)> fn) {
  loop_.call([&] { core_.set_inconsistency_handler(std::move(fn)); });
}

void Tracker::set_cgroup_parents(cgroup::CgroupIndex::ParentOf parent_of) {
  loop_.call([&] { parent_of_ = std::move(parent_of); });
}

void Tracker::set_wake_after(Confirmer::WakeAfter set) {
  loop_.call([&] { confirmer_.set_wake_after(std::move(set)); });
}

void Tracker::set_exit_wakeup(std::function<void(bool wake)> set) {
  loop_.call([&] {
    confirmer_.exit_wakeup().set_switch([set = std::move(set)](bool wake) {
      spdlog::info("{}", wake ? "tracker: an init's exit came without its cgroup's rmdir in time: "
                          "exits wake the loop again"
                        : "tracker: the runtime removes a container's cgroup right after its "
                          "init dies: an exit now wakes nobody, the rmdir brings it along");
      set(wake);
    });
  });
}

void Tracker::set_removal_hints(RemovalHints* hints, bool trusted, bool after_removal) {
  loop_.call([&] { removal_.set_hints(hints, trusted, after_removal); });
}

void Tracker::on_removal_hint(const std::string& id) {
  if (loop_.in_loop()) {
    removal_.on_hint(id);
    return;
  }
  loop_.post([this, id] { removal_.on_hint(id); });
}

void Tracker::watch(int fd, std::function<void()> on_readable, const char* what,
                    bool first_at_wakeup) {
  loop_.call([&] {
    if (first_at_wakeup) loop_.set_first_at_wakeup(on_readable);
    loop_.watch(fd, EPOLLIN, [f = std::move(on_readable)](uint32_t) { f(); }, what);
  });
}

void Tracker::on_kernel_event(const kernel::KernelEvent& ev) {
  if (loop_.in_loop()) {
    handle(ev);
    return;
  }
  loop_.post([this, ev] { handle(ev); });
}

void Tracker::handle(const kernel::KernelEvent& ev) {
  if (auto* hint = std::get_if<kernel::RemovalHint>(&ev.body)) {
    removal_.on_hint(hint->id);
    return;
  }
  if (auto* mk = std::get_if<kernel::CgroupMkdir>(&ev.body)) {
    index_.on_mkdir(mk->cgroup_id, mk->path, mk->parent_cgroup_id);
    return;
  }
  const bool rmdir = std::holds_alternative<kernel::CgroupRmdir>(ev.body);
  auto entry = rmdir ? index_.lookup(ev.cgroup_id()) : entry_of(ev);
  // The container's own cgroup is the oldest that claims its id; a younger one is a look-alike
  // (found before an rmdir drops the claim).
  std::optional<uint64_t> holder;
  if (entry && entry->identity.kind == cgroup::Kind::kContainerOrSandbox)
    holder = index_.find_container(entry->identity.container_id);
  if (rmdir) {
    index_.on_rmdir(ev.cgroup_id());
    unresolved_.erase(ev.cgroup_id());
  }
  if (!entry) return;
  // A cgroup below a container's (nested) belongs to that container and costs nothing.
  if (entry->identity.kind != cgroup::Kind::kContainerOrSandbox) return;
  if (holder && *holder != ev.cgroup_id()) {
    // Costs nothing either: no look, no retry for the real container, no reconcile.
    ++core_.stats().lookalike_signals;
    uint64_t left_out = 0;
    if (lookalike_log_.allow(left_out)) {
      spdlog::warn("cgroup {} claims container {} of pod {}, whose cgroup is older: its {} is "
                   "ignored ({} more like it since the last such line)",
                   entry->path, entry->identity.container_id.substr(0, 12),
                   entry->identity.pod_uid, ev.kind(), left_out);
    }
    return;
  }

  Confirmer::Signal signal;
  if (std::holds_alternative<kernel::ProcessExec>(ev.body)) {
    signal = Confirmer::Signal::kExec;
  } else if (auto* exit = std::get_if<kernel::ProcessExit>(&ev.body)) {
    signal = exit->oom_killed ? Confirmer::Signal::kExitOom : Confirmer::Signal::kExit;
  } else if (std::holds_alternative<kernel::OomKill>(ev.body)) {
    // Counted and traced only: it names the cgroup of the task whose allocation failed, not
    // the victim's; the victim's exit carries the OOM kill (ProcessExit::oom_killed).
    return;
  } else {
    signal = Confirmer::Signal::kRmdir;
  }
  const auto at = made_at(ev.ktime_ns);
  confirmer_.on_signal(
      entry->identity.container_id, entry->identity.pod_uid, signal,
      kernel::monotonic_to_realtime_ns(
          uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count())),
      at);
}

Confirmer::Clock::time_point Tracker::made_at(uint64_t ktime_ns) {
  // The BPF programs' clock (CLOCK_MONOTONIC) is the loop's (steady_clock on Linux). A time in
  // the future, or older than kTrustedAge, is not one of theirs (a record made up by hand): now.
  const auto now = Confirmer::Clock::now();
  const Confirmer::Clock::time_point at{std::chrono::nanoseconds(ktime_ns)};
  return at <= now && now - at <= kTrustedAge ? at : now;
}

std::optional<cgroup::CgroupIndex::Entry> Tracker::entry_of(const kernel::KernelEvent& ev) {
  const uint64_t id = ev.cgroup_id();
  if (auto entry = index_.lookup(id)) return entry;
  ++core_.stats().unresolved_signals;
  // Asked once already: a workload's exec loop in such a cgroup must not relist the node on
  // every exec.
  if (unresolved_.count(id) > 0) {
    ++core_.stats().unresolved_repeats;
    return std::nullopt;
  }
  // Most likely its mkdir record was lost: the kernel tracks it, the index never heard of it.
  // Found from its parent, it is indexed, and this signal is an ordinary one.
  if (parent_of_) {
    if (auto entry = index_.resolve(id, parent_of_)) {
      ++core_.stats().resolved_cgroups;
      return entry;
    }
  }
  if (unresolved_.size() >= kMaxUnresolved) unresolved_.clear();
  unresolved_.insert(id);
  core_.inconsistent("kernel " + std::string(ev.kind()) + " for unknown cgroup " +
                     std::to_string(id));
  return std::nullopt;
}

void Tracker::reconcile(const std::vector<RuntimeContainer>& view, bool initial) {
  ReconcileDiff::Inspected inspected;
  if (initial) {
    // The start-up sync's looks, one per container, are made here, off the loop.
    auto reported = loop_.call([&] {
      std::unordered_map<std::string, int> out;
      for (const auto& rc : view)
        if (const Record* rec = core_.table().find(rc.id)) out.emplace(rc.id, rank(rec->reported));
      return out;
    });
    inspected = ReconcileDiff::inspect(core_.cri(), view, [&](const std::string& id) {
      auto it = reported.find(id);
      return it == reported.end() ? -1 : it->second;
    });
  }
  loop_.call([&] { diff_.apply(view, initial, inspected); });
}

TrackerStats Tracker::stats() const {
  return loop_.call([this] {
    TrackerStats st = core_.stats();
    st.records = core_.table().size();
    st.runtime_events_live = core_.runtime_events_live();
    st.runtime_events_cover_removals = !removal_.events_miss_removals();
    st.removal_hints_trusted = removal_.hints_trusted();
    st.exit_wakes = confirmer_.exit_wakeup().waking();
    st.exit_wakeups_off = confirmer_.exit_wakeup().turned_off();
    st.exit_wakeups_restored = confirmer_.exit_wakeup().turned_on();
    st.loop_woken_by.insert(loop_.woken_by().begin(), loop_.woken_by().end());
    return st;
  });
}

std::vector<Observation> Tracker::containers() const {
  return loop_.call([this] { return core_.table().confirmed(); });
}

std::pair<uint64_t, std::vector<Observation>> Tracker::containers_at(
    const std::function<uint64_t()>& seq_now) const {
  // On the loop, every event of the state read has been published, and none after it.
  return loop_.call([&] { return std::make_pair(seq_now(), core_.table().confirmed()); });
}

std::vector<PodTrouble> Tracker::troubled_pods() const {
  return loop_.call([this] { return core_.troubled_pods(); });
}

}  // namespace kpleg::pleg

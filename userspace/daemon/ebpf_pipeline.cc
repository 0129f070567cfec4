#include "daemon/ebpf_pipeline.h"

#include <spdlog/spdlog.h>

#include <string>
#include <utility>

#include "cgroup/cgroup_index.h"
#include "daemon/kernel_upkeep.h"
#include "daemon/over_budget_log.h"
#include "daemon/removal_hints.h"
#include "daemon/state_snapshot.h"
#include "kernel/dir_removal_watch.h"
#include "kernel/kernel_source.h"
#include "pleg/reconciler.h"
#include "pleg/runtime_events.h"
#include "pleg/tracker.h"

namespace kpleg::daemon {

namespace {

kernel::KernelSourceOptions kernel_options(const DaemonOptions& opts) {
  kernel::KernelSourceOptions ko = opts.kernel;
  ko.bpf.removal_hint = opts.removal_hints == RemovalHintSource::kKernel;
  ko.own_thread = false;  // the ring buffer is read on the tracker's loop (start())
  return ko;
}

class EbpfPipeline final : public Pipeline {
 public:
  explicit EbpfPipeline(const PipelineContext& ctx)
      : ctx_(ctx),
        tracker_(ctx.cri, index_, ctx.bus),
        reconciler_(ctx.cri, tracker_, ctx.opts.reconcile_period),
        kernel_(kernel_options(ctx.opts)),
        over_budget_(index_, tracker_, kernel_, ctx.opts.kernel.bpf),
        upkeep_(ctx_, kernel_, index_) {}
  ~EbpfPipeline() override { stop(); }

  Status start();

  Mode mode() const override { return Mode::kEbpf; }
  void stop() override;

  api::StateSnapshot snapshot() override {
    auto [seq, containers] = tracker_.containers_at([this] { return ctx_.bus.last_seq(); });
    return snapshot_of(seq, containers);
  }

  void describe(HealthPolicy::Components& c) override {
    c.ebpf = true;
    c.kernel = &kernel_;
    c.reconciler = &reconciler_;
    c.tracker = &tracker_;
  }

  void describe(MetricsMirror::Sources& s) override {
    s.ebpf = true;
    s.tracker = &tracker_;
    s.runtime_events = runtime_events_.get();
    s.kernel = &kernel_;
  }

  void add_stats(api::DaemonStats& s) override;

  void runtime_reconnected() override {
    reconciler_.request("runtime reconnect");
    if (runtime_events_) runtime_events_->retry_now();
  }

 private:
  kernel::KernelSink sink();
  void on_kernel_event(const kernel::KernelEvent& ev) {
    ctx_.metrics.on_kernel_event(ev);
    tracker_.on_kernel_event(ev);
  }
  // The removal hint of --removal-hints (kernel: the program's; auto: the runtime's dirs).
  void start_removal_hints();
  // Confirmation by the runtime's GetContainerEvents stream, where it is served.
  void start_runtime_events();

  const PipelineContext ctx_;
  cgroup::CgroupIndex index_;
  pleg::Tracker tracker_;
  pleg::Reconciler reconciler_;
  kernel::BpfKernelSource kernel_;
  OverBudgetLog over_budget_;
  KernelUpkeep upkeep_;
  std::unique_ptr<kernel::DirRemovalWatch> removal_dirs_;  // --removal-hints auto
  std::unique_ptr<pleg::RemovalHints> removal_hints_;    // over kernel_'s program or removal_dirs_
  std::unique_ptr<pleg::RuntimeEvents> runtime_events_;  // --runtime-events auto
  bool stopped_ = false;
};

kernel::KernelSink EbpfPipeline::sink() {
  kernel::KernelSink sink;
  sink.on_event = [this](const kernel::KernelEvent& ev) { on_kernel_event(ev); };
  sink.on_loss = [this](uint64_t n) {
    ctx_.metrics.on_records_lost(n);
    const bool reason_appears = ctx_.health.note_records_lost(n);
    reconciler_.request("kernel events lost: " + std::to_string(n));
    if (reason_appears) ctx_.health_changed();
  };
  sink.on_untracked = [this](const std::string& path) {
    // Whatever happens in that cgroup is unseen: the reconcile finds its containers now, and
    // the resync that follows tracks it as soon as there is room.
    reconciler_.request("cgroup " + path + " not tracked: the tracked-cgroup map is full");
    if (ctx_.health.note_untracked(true)) ctx_.health_changed();
  };
  sink.on_over_budget = [this](const kernel::CgroupMkdir& mk) { over_budget_.on_over_budget(mk); };
  sink.on_stopped = [this] { ctx_.health_changed(); };
  return sink;
}

Status EbpfPipeline::start() {
  // In ebpf mode the reconcile is kpleg's relist: the kubelet's relist metrics describe it.
  reconciler_.set_on_run([this](const pleg::ReconcilerStats& rs, bool ok) {
    ctx_.metrics.on_reconcile(rs, ok);
    ctx_.health_changed();
  });
  reconciler_.set_on_view(
      [this](const std::vector<pleg::RuntimeContainer>& view) { upkeep_.after_reconcile(view); });
  tracker_.set_inconsistency_handler(
      [this](const std::string& why) { reconciler_.request("tracker: " + why); });
  // A signal for a cgroup the index missed is resolved from the kernel's record of its parent
  // before it costs a reconcile.
  tracker_.set_cgroup_parents([this](uint64_t id) { return kernel_.tracked_parent(id); });

  if (auto st = kernel_.start(sink()); !st) return st;
  // The index is seeded after the kernel source attached, so that no mkdir falls between.
  if (auto st = index_.seed(kernel_.stats().cgroup2_mount); !st) return st;
  // Read first at every wakeup too: an exec's or an rmdir's record may wake nobody until the
  // wake timer (kernel::BpfProgram::set_wake_after), and comes before what woke the loop.
  tracker_.watch(kernel_.ring_fd(), [this] { kernel_.consume(); }, "ring buffer", true);
  if (auto* program = kernel_.program(); program != nullptr) {
    tracker_.set_exit_wakeup([program](bool wake) { program->set_exit_wakeup(wake); });
    if (program->wake_timer()) {
      tracker_.set_wake_after([program](std::chrono::milliseconds exec,
                                        std::chrono::milliseconds rmdir) {
        program->set_wake_after(exec, rmdir);
      });
    }
  }
  // Nothing fails after this (no fallback leaves it behind), and before the initial sync, so
  // that the exited containers it finds are armed.
  start_removal_hints();
  if (auto st = reconciler_.start(ctx_.opts.cri_timeout); !st) {
    spdlog::warn("initial sync failed ({}); going on in the background", st.error().message);
  }
  // After the initial sync: the stream's backlog then finds the records it may confirm.
  if (ctx_.opts.runtime_events) start_runtime_events();
  spdlog::info(
      "running in ebpf mode (reconcile every {} s)",
      std::chrono::duration_cast<std::chrono::seconds>(ctx_.opts.reconcile_period).count());
  return {};
}

void EbpfPipeline::start_removal_hints() {
  auto attached = attach_removal_hints({
      .source = ctx_.opts.removal_hints,
      .program = kernel_.program(),
      .dirs = ctx_.opts.removal_hint_dirs,
      .cri = &ctx_.cri,
      .runtime_name = ctx_.runtime_name,
      .tracker = &tracker_,
      .on_removed =
          [this](const std::string& id) {
            // On the tracker's loop, where the watch is read: taken at once. Counted with the
            // kernel's own hints (kpleg_kernel_events_total{kind="removal_hint"}).
            ctx_.metrics.on_removal_hint();
            tracker_.on_removal_hint(id);
          },
  });
  removal_dirs_ = std::move(attached.dir_watch);
  removal_hints_ = std::move(attached.hints);
  if (removal_hints_)
    tracker_.set_removal_hints(removal_hints_.get(), attached.trusted, attached.after_removal);
}

void EbpfPipeline::start_runtime_events() {
  // Read on the tracker's loop where the client can; else on a thread of its own.
  runtime_events_ = tracker_.runtime_events();
  if (!runtime_events_) {
    runtime_events_ = std::make_unique<pleg::RuntimeEvents>(
        [this](cri::CancelToken& cancel, const pleg::RuntimeEvents::OnEvent& on_event) {
          return ctx_.cri.container_events(cancel, on_event);
        },
        [this](cri::v1::ContainerEventResponse& ev) { tracker_.on_runtime_event(ev); },
        [this] { tracker_.runtime_events_stopped(); });
  }
  runtime_events_->start();
}

void EbpfPipeline::stop() {
  if (std::exchange(stopped_, true)) return;
  // What reads the kernel's state (the reconcile's upkeep reads the BPF map) stops before the
  // kernel source goes.
  if (runtime_events_) runtime_events_->stop();
  reconciler_.stop();
  tracker_.set_removal_hints(nullptr);  // the program goes with the kernel source
  // The inotify watch lives on the tracker's loop: it goes there.
  tracker_.on_loop([this](cri::Reactor&) { removal_dirs_.reset(); });
  tracker_.stop();  // its loop reads the kernel source's ring buffer
  kernel_.stop();
}

void EbpfPipeline::add_stats(api::DaemonStats& s) {
  const auto ks = kernel_.stats();
  s.kernel_events = ks.received;
  s.lost_kernel_events = ks.bpf.ringbuf_drops;
  const auto ts = tracker_.stats();
  s.corrections = ts.corrections_total();
  s.confirm_retries = ts.confirm_retries;
  s.loop_wakeups_by_cause = ts.loop_woken_by;
  const auto rs = reconciler_.stats();
  s.relists = rs.runs;
  if (rs.last_success) {
    s.last_reconcile_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(rs.last_success->time_since_epoch())
            .count();
  }
}

}  // namespace

Result<std::unique_ptr<Pipeline>> start_ebpf_pipeline(const PipelineContext& ctx) {
  auto p = std::make_unique<EbpfPipeline>(ctx);
  if (auto st = p->start(); !st) return st.error();
  return std::unique_ptr<Pipeline>(std::move(p));
}

}  // namespace kpleg::daemon

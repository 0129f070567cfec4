#include "daemon/relist_pipeline.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "daemon/state_snapshot.h"
#include "pleg/generic_relist.h"

namespace kpleg::daemon {

namespace {

class RelistPipeline final : public Pipeline {
 public:
  RelistPipeline(const PipelineContext& ctx, std::string fallback_reason)
      : ctx_(ctx),
        fallback_reason_(std::move(fallback_reason)),
        relist_(ctx.cri, ctx.bus, options()) {}
  ~RelistPipeline() override { stop(); }

  void start() {
    relist_.start();
    spdlog::info("running in relist mode (every {} ms)", ctx_.opts.relist_period.count());
  }

  Mode mode() const override { return Mode::kRelist; }

  void stop() override {
    if (std::exchange(stopped_, true)) return;
    relist_.stop();
  }

  api::StateSnapshot snapshot() override {
    // The records of the last relist, with the sequence number of the last event published for
    // them.
    auto [seq, pods] = relist_.pods_at([this] { return ctx_.bus.last_seq(); });
    return snapshot_of(seq, std::move(pods));
  }

  void describe(HealthPolicy::Components& c) override {
    c.relist = &relist_;
    c.fallback_reason = fallback_reason_;
  }

  void describe(MetricsMirror::Sources&) override {}  // its metrics come at each relist

  void add_stats(api::DaemonStats& s) override {
    auto rs = relist_.stats();
    s.relists = rs.relists;
    s.last_reconcile_ns = rs.last_success_ns;
  }

  void runtime_reconnected() override {}  // the next relist comes within its period anyway

 private:
  pleg::GenericRelistOptions options() {
    pleg::GenericRelistOptions ro;
    ro.period = ctx_.opts.relist_period;
    ro.health_threshold = ctx_.opts.relist_health_threshold;
    ro.on_relist = [this](const pleg::RelistStats& rs) { ctx_.metrics.on_relist(rs); };
    return ro;
  }

  const PipelineContext ctx_;
  const std::string fallback_reason_;
  pleg::GenericRelist relist_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<Pipeline> start_relist_pipeline(const PipelineContext& ctx,
                                                std::string fallback_reason) {
  auto p = std::make_unique<RelistPipeline>(ctx, std::move(fallback_reason));
  p->start();
  return p;
}

}  // namespace kpleg::daemon

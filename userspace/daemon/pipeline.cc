#include "daemon/pipeline.h"

#include <spdlog/spdlog.h>

#include "daemon/ebpf_pipeline.h"
#include "daemon/relist_pipeline.h"

namespace kpleg::daemon {

const char* to_string(Mode m) {
  switch (m) {
    case Mode::kAuto:
      return "auto";
    case Mode::kEbpf:
      return "ebpf";
    case Mode::kRelist:
      return "relist";
  }
  return "?";
}

Result<std::unique_ptr<Pipeline>> start_pipeline(const PipelineContext& ctx) {
  if (ctx.opts.mode == Mode::kRelist) return start_relist_pipeline(ctx, "");
  auto ebpf = start_ebpf_pipeline(ctx);
  if (ebpf || ctx.opts.mode == Mode::kEbpf) return ebpf;
  // auto: the kernel path cannot run here (what it had built is gone with it); the relist
  // pipeline keeps the node's events flowing, and health names why.
  spdlog::warn("mode auto: kernel event source unavailable ({}); running in relist mode",
               ebpf.error().message);
  return start_relist_pipeline(ctx, ebpf.error().message);
}

}  // namespace kpleg::daemon

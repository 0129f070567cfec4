// grpcidle left out of the build (KPLEG_GRPCIDLE=OFF, or AUTO with a gRPC other than the one it
// was written for): gRPC's timers stay as gRPC has them.
#include "grpcidle/grpc_idle.h"

namespace kpleg::grpcidle {

std::string install() { return "grpcidle is not built in (" KPLEG_GRPCIDLE_OFF_REASON ")"; }

}  // namespace kpleg::grpcidle

// Makes gRPC 1.51's background threads sleep while nothing is due. Call it first thing in main,
// before any gRPC object exists.
//
// It replaces gRPC's timer implementation through internal symbols that grpc_idle.cc declares
// itself, as gRPC 1.51 exports them: with any other gRPC it would be undefined behaviour. So it
// is built only against gRPC 1.51 (the CMake option KPLEG_GRPCIDLE, default AUTO: see
// CMakeLists.txt here); otherwise, or with -DKPLEG_GRPCIDLE=OFF, a stub is built whose install()
// only says why it did nothing, and kplegd runs as well, its gRPC timer threads waking about
// once a second while idle. At run time install() also leaves gRPC as it is, and says so, when
// the gRPC core library loaded is not the one it was compiled for (grpc_version_string()), or
// when gRPC was initialised before.
//
// Why: both of gRPC 1.51's timer lists (iomgr's, run by the "grpc_global_timer" threads, and the
// default EventEngine's, run by its "timer_manager" thread) are sharded (2 shards per core), and
// a shard with no timer due within its window reports "window end + 1 ms" as its next deadline,
// the window being at most 1 s. So each list wakes its thread at least once a second, and up to
// once per shard per second when the shards' windows drift apart, with no timer pending at all.
// No channel argument or environment variable changes that.
//
// What it does:
// - iomgr timers: keeps gRPC's own timer list (timers are added, cancelled and run by it as
//   before) but tracks the pending deadlines itself, and tells the timer threads to sleep until
//   the earliest real one instead of the next window end; a timer added earlier than that wakes
//   them, as gRPC does for an earlier timer. A check that left a due timer unrun (gRPC's check
//   trusts a per-thread copy of its earliest deadline, refreshed only by a kick the thread
//   took) is made again at once with that copy dropped, instead of sleeping past the timer.
// - the default EventEngine: replaced by one that only runs closures and timers, on one thread
//   that sleeps until the next timer is due. In 1.51, with the default experiments, gRPC uses
//   its EventEngine for nothing else (iomgr does all I/O); connecting, listening and DNS through
//   it fail with UNIMPLEMENTED.
#pragma once

#include <string>

namespace kpleg::grpcidle {

// "" when both were installed; otherwise one line saying why nothing was, for the log.
std::string install();

}  // namespace kpleg::grpcidle

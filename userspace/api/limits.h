// The API server's fixed bounds and timings, shared by the server and its services; the ones a
// user sets are ApiServerOptions (options.h).
#pragma once

#include <chrono>
#include <cstddef>

namespace kpleg::api {

// On TCP (grpc++'s sync server; the unix socket's server reads every connection and sees a
// client go at once): how often an idle Watch looks up from its subscription to notice that its
// client went away
// (a write to a gone client fails at once, so this only matters while no event comes). gRPC's
// sync API has no notification of a cancelled call: ServerContext::IsCancelled() is the only way
// to learn it, so a handler that waits for events has to look now and then. Each look is a
// wakeup of an otherwise idle daemon, hence a minute. A gone client's stream holds its slot, its
// thread and its subscription until then, unless an event comes first, or a new stream finds
// every slot taken: that has every open stream look at once (StreamSlots::take). A server stop
// does not wait for it either: stop() cancels every open subscription.
inline constexpr auto kWatchPoll = std::chrono::milliseconds(60'000);
// How long an idle sync-server polling thread waits before it looks again (ApiServer::start).
inline constexpr int kSyncPollerTimeoutMs = 3600 * 1000;
// TCP server threads for unary calls (List, Stats, InflightCalls, health Check) beside the streams.
inline constexpr size_t kUnaryThreads = 16;
// Requests are a few filters: anything bigger is refused by gRPC before a handler sees it.
inline constexpr int kMaxRequestBytes = 4096;

}  // namespace kpleg::api

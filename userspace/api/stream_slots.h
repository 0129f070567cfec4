// A bound on the API's long-lived streams (Watch and grpc.health Watch), in all and per client:
// each stream holds a subscription (and on TCP a sync server thread) for as long as it is open,
// so an unbounded number would be unbounded memory and threads, and one client holding every place (say, Watches whose filters match
// nothing) would lock every other consumer out. A client is what client_of() names
// (client_identity.h): a certificate's identity, a TCP peer's address, a unix socket peer's
// process.
//
// On TCP, a stream whose client cancelled it keeps its slot until its handler notices, and an idle
// handler looks only once a minute (so that an idle daemon does not wake up). Without more,
// a client that opens and cancels streams (a consumer reconnecting, kplegctl runs) would have the
// next stream refused RESOURCE_EXHAUSTED for up to a minute although none of its streams is open
// any more. So when no slot is free, take() first has the open streams look at their clients
// now (the reclaim hook) and waits a moment for the ones that went away to give theirs back.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace grpc {
class ServerContext;
}

namespace kpleg::api {

class StreamSlots {
 public:
  // `per_client_limit` above `limit` is `limit`.
  StreamSlots(size_t limit, size_t per_client_limit)
      : limit_(limit), per_client_limit_(std::min(per_client_limit, limit)) {}
  // `reclaim` asks every open stream to check at once whether its client went away; set before
  // the server serves.
  void set_reclaim(std::function<void()> reclaim) { reclaim_ = std::move(reclaim); }
  // Names the client a call comes from (client_of); set before the server serves.
  void set_client_namer(std::function<std::string(const grpc::ServerContext&)> namer) {
    namer_ = std::move(namer);
  }
  std::string client_of(const grpc::ServerContext& ctx) const { return namer_ ? namer_(ctx) : ""; }

  enum class Taken { kYes, kServerFull, kClientFull };
  // Takes a slot for `client`: at once when one is free to it; otherwise after the reclaim hook
  // freed one, waiting at most `wait`. Else which bound was in the way (the server's, when both).
  Taken take(const std::string& client, std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    std::unique_lock l(mu_);
    for (;;) {
      const size_t held = held_by(client);
      if (used_ < limit_ && held < per_client_limit_) {
        ++used_;
        ++per_client_[client];
        return Taken::kYes;
      }
      if (!reclaim_ || std::chrono::steady_clock::now() >= deadline)
        return used_ >= limit_ ? Taken::kServerFull : Taken::kClientFull;
      // Asked again every few milliseconds: a cancellation still on its way to the server when
      // the streams looked is seen at the next round.
      l.unlock();
      reclaim_();
      l.lock();
      freed_.wait_until(l, std::min(deadline, std::chrono::steady_clock::now() + kReclaimRound),
                        [&] { return used_ < limit_ && held_by(client) < per_client_limit_; });
    }
  }
  void give(const std::string& client) {
    {
      std::lock_guard l(mu_);
      --used_;
      if (auto it = per_client_.find(client); it != per_client_.end() && --it->second == 0)
        per_client_.erase(it);
    }
    freed_.notify_all();
  }
  size_t limit() const { return limit_; }
  size_t per_client_limit() const { return per_client_limit_; }
  size_t used() const {
    std::lock_guard l(mu_);
    return used_;
  }

  // How long a stream waits for a slot to come back from a cancelled stream before it is refused.
  static constexpr std::chrono::milliseconds kReclaimWait{200};

 private:
  size_t held_by(const std::string& client) const {
    auto it = per_client_.find(client);
    return it == per_client_.end() ? 0 : it->second;
  }
  static constexpr std::chrono::milliseconds kReclaimRound{5};
  const size_t limit_;
  const size_t per_client_limit_;
  std::function<void()> reclaim_;
  std::function<std::string(const grpc::ServerContext&)> namer_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  size_t used_ = 0;
  std::unordered_map<std::string, size_t> per_client_;
};

// Holds one slot for a scope (taken: whether it got one).
class StreamSlot {
 public:
  // `wait`: how long to wait for a slot that a cancelled stream gives back (take()).
  StreamSlot(StreamSlots* slots, std::string client,
             std::chrono::milliseconds wait = StreamSlots::kReclaimWait)
      : slots_(slots),
        client_(std::move(client)),
        taken_(slots == nullptr ? StreamSlots::Taken::kYes : slots->take(client_, wait)) {}
  ~StreamSlot() { release(); }
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;
  bool taken() const { return taken_ == StreamSlots::Taken::kYes; }
  // Refused because this client holds its share already (not because the server is full).
  bool client_full() const { return taken_ == StreamSlots::Taken::kClientFull; }
  const std::string& client() const { return client_; }
  // Gives the slot back before the scope ends (a cut-off Watch still unwinding); idempotent,
  // safe from another thread.
  void release() {
    if (slots_ != nullptr && taken() && !released_.exchange(true)) slots_->give(client_);
  }

 private:
  StreamSlots* slots_;
  const std::string client_;
  const StreamSlots::Taken taken_;
  std::atomic<bool> released_{false};
};

}  // namespace kpleg::api

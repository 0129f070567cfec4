#include "common/logging.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/thread_name.h"

namespace kpleg {

namespace {

// What the writer thread and the sink share. It is never freed: the writer may be blocked in
// write(2) on a stderr nobody reads when the process exits, and must not be waited for then.
struct LogQueue {
  std::mutex mu;
  std::condition_variable cv;       // a line is queued
  std::condition_variable drained;  // the queue emptied
  std::deque<std::string> lines;
  size_t bytes = 0;
  uint64_t dropped = 0;  // lines dropped since the last report
  bool writing = false;  // the writer holds a batch
};

// Lines queued beyond this are dropped (and counted, and reported once stderr moves again).
constexpr size_t kMaxQueuedBytes = 1 << 20;
// How long a flush (at exit, or flush_on) waits for stderr to take the queued lines.
constexpr auto kFlushWait = std::chrono::milliseconds(500);

void write_all(const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // stderr closed or broken: the line is lost, nothing else to do
    }
    off += size_t(n);
  }
}

void writer_loop(LogQueue* q) {
  // Signals are for the threads that handle them (kplegd's main thread waits for SIGTERM with
  // sigwait): this thread is started before main blocks them, and a SIGTERM delivered here
  // during start-up would kill the process by the default action instead of shutting it down.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::unique_lock lk(q->mu);
  for (;;) {
    q->cv.wait(lk, [q] { return !q->lines.empty() || q->dropped > 0; });
    std::deque<std::string> batch;
    batch.swap(q->lines);
    q->bytes = 0;
    const uint64_t dropped = std::exchange(q->dropped, 0);
    q->writing = true;
    lk.unlock();
    std::string out;
    for (auto& l : batch) out += l;
    if (dropped > 0) {
      out += "kplegd: " + std::to_string(dropped) +
             " log lines dropped: stderr was not read fast enough\n";
    }
    write_all(out);
    lk.lock();
    q->writing = false;
    if (q->lines.empty()) q->drained.notify_all();
  }
}

// spdlog's sink for kplegd: every thread only formats its line and queues it; one writer thread
// writes to stderr. A stderr that is not read (a stalled pipe, a hung terminal, a full log
// collector) then never blocks the ring-buffer consumer, the workers or shutdown: lines beyond
// the queue are dropped and counted. Text lines use the pattern; JSON lines are one object each
// ({"ts":..., "level":..., "msg":...}, the message escaped properly, which a pattern-based JSON
// layout would break on quotes).
class QueuedStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit QueuedStderrSink(bool json) : json_(json), q_(new LogQueue) {
    named_thread("kpleg-log", [q = q_] { writer_loop(q); }).detach();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string line = json_ ? json_line(msg) : text_line(msg);
    std::lock_guard lk(q_->mu);
    if (q_->bytes + line.size() > kMaxQueuedBytes) {
      ++q_->dropped;
      return;
    }
    q_->bytes += line.size();
    q_->lines.push_back(std::move(line));
    q_->cv.notify_one();
  }
  void flush_() override {
    std::unique_lock lk(q_->mu);
    q_->drained.wait_for(lk, kFlushWait, [this] { return q_->lines.empty() && !q_->writing; });
  }

 private:
  std::string text_line(const spdlog::details::log_msg& msg) {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    return std::string(buf.data(), buf.size());
  }
  static std::string json_line(const spdlog::details::log_msg& msg) {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(msg.time.time_since_epoch());
    time_t secs = us.count() / 1'000'000;
    tm utc{};
    gmtime_r(&secs, &utc);
    char ts[40];
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &utc);
    snprintf(ts + n, sizeof(ts) - n, ".%06lldZ", static_cast<long long>(us.count() % 1'000'000));
    nlohmann::ordered_json j;
    j["ts"] = ts;
    j["level"] = std::string(spdlog::level::to_string_view(msg.level).data(),
                             spdlog::level::to_string_view(msg.level).size());
    j["msg"] = std::string(msg.payload.data(), msg.payload.size());
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }

  const bool json_;
  LogQueue* q_;  // shared with the detached writer; never freed (see LogQueue)
};

}  // namespace

Status setup_logging(const std::string& level, LogFormat format) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return Error{EINVAL, "unknown log level '" + level +
                             "' (expected trace, debug, info, warn, error or off)"};
  }
  auto sink = std::make_shared<QueuedStderrSink>(format == LogFormat::kJson);
  auto logger = std::make_shared<spdlog::logger>("kpleg", sink);
  if (format == LogFormat::kText) logger->set_pattern("%Y-%m-%dT%H:%M:%S.%f %^%l%$ %v");
  logger->set_level(lvl);
  // Lines are written as they come (by the writer thread); an explicit flush (at exit) waits a
  // little for them.
  logger->flush_on(spdlog::level::off);
  spdlog::set_default_logger(logger);
  // A process that logs its error and returns from main (a bad flag, a kernel path that cannot
  // start) must not exit before the writer thread has written that line. Registered after the
  // logger registry exists, so it runs before the registry is destroyed.
  static std::once_flag at_exit;
  std::call_once(at_exit, [] {
    std::atexit([] {
      if (auto* l = spdlog::default_logger_raw()) l->flush();
    });
  });
  return {};
}

}  // namespace kpleg

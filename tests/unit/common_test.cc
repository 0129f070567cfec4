// Duration flags, the JSON log format, thread names.
#include <gtest/gtest.h>

#include <future>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/duration.h"
#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace kpleg {
namespace {

using namespace std::chrono_literals;

TEST(LogLimiter, WritesOneLinePerPeriodAndCountsTheRest) {
  LogLimiter l(10s);
  const auto t0 = LogLimiter::Clock::time_point{} + 1h;
  uint64_t left_out = 99;
  EXPECT_TRUE(l.allow(left_out, t0));
  EXPECT_EQ(left_out, 0u);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(l.allow(left_out, t0 + 1s));
  EXPECT_FALSE(l.allow(left_out, t0 + 9s));
  EXPECT_TRUE(l.allow(left_out, t0 + 10s));
  EXPECT_EQ(left_out, 1001u) << "the next line says how many were left out";
  EXPECT_TRUE(l.allow(left_out, t0 + 25s));
  EXPECT_EQ(left_out, 0u);
}

// A thread carries its name once named_thread returns, before it has run a line: whoever looks
// at the process after its start-up (`top -H` after "ready") sees every thread named.
TEST(ThreadName, ANamedThreadCarriesItsNameBeforeItRuns) {
  std::promise<void> go;
  auto gate = go.get_future().share();
  std::string inside;
  std::thread t = named_thread("kpleg-test-name", [gate, &inside] {
    gate.wait();
    inside = thread_name();
  });
  char buf[16] = {};
  ASSERT_EQ(pthread_getname_np(t.native_handle(), buf, sizeof(buf)), 0);
  EXPECT_STREQ(buf, "kpleg-test-name");
  go.set_value();
  t.join();
  EXPECT_EQ(inside, "kpleg-test-name");
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(*parse_duration("300s"), 300s);
  EXPECT_EQ(*parse_duration("1"), 1s);
  EXPECT_EQ(*parse_duration("500ms"), 500ms);
  EXPECT_EQ(*parse_duration("2m"), 120s);
  EXPECT_EQ(*parse_duration("1.5s"), 1500ms);
  EXPECT_EQ(*parse_duration("1h"), 3600s);
}

TEST(ParseDuration, RejectsNonsense) {
  for (const char* bad : {"", "soon", "-1s", "0", "0s", "5x", "1e30s", "nan", "s", "0.1ms"}) {
    auto d = parse_duration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) EXPECT_NE(d.error().message.find("invalid duration"), std::string::npos);
  }
}

TEST(Logging, RejectsUnknownLevel) { EXPECT_FALSE(setup_logging("loud", LogFormat::kText).ok()); }

TEST(Logging, JsonLinesEscapeTheMessage) {
  // Capture stderr in a pipe.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int saved = dup(2);
  dup2(fds[1], 2);
  ASSERT_TRUE(setup_logging("info", LogFormat::kJson).ok());
  spdlog::info("path \"{}\" has\ta tab", "/x");
  spdlog::debug("not shown");
  spdlog::default_logger()->flush();  // waits for the writer thread
  dup2(saved, 2);
  close(fds[1]);
  char buf[4096];
  ssize_t n = read(fds[0], buf, sizeof(buf));
  close(fds[0]);
  ASSERT_GT(n, 0);
  std::string out(buf, n);
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["msg"], "path \"/x\" has\ta tab");
  EXPECT_EQ(j["ts"].get<std::string>().back(), 'Z');
}

// A stderr nobody reads (a stalled pipe, a hung log collector) must not block the threads that
// log: lines beyond the queue are dropped, counted, and reported once stderr moves again.
TEST(Logging, AStderrNobodyReadsNeverBlocksTheLoggingThreads) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int saved = dup(2);
  dup2(fds[1], 2);
  ASSERT_TRUE(setup_logging("info", LogFormat::kText).ok());
  const std::string filler(1000, 'x');
  auto logging = std::async(std::launch::async, [&] {
    // 20 MB: far beyond the pipe (64 KiB) and the queue (1 MiB).
    for (int i = 0; i < 20000; ++i) spdlog::info("line {} {}", i, filler);
  });
  const bool finished = logging.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  // Now read: the writer thread moves again and reports what it dropped.
  std::string out;
  char buf[65536];
  while (out.find("log lines dropped") == std::string::npos) {
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  dup2(saved, 2);
  close(fds[1]);
  close(fds[0]);
  if (!finished) logging.wait();
  EXPECT_TRUE(finished) << "logging blocked on a stderr nobody read";
  EXPECT_NE(out.find("log lines dropped: stderr was not read fast enough"), std::string::npos);
}

// The line a process logs just before it exits (its reason for exiting) reaches stderr: the
// writer thread is given its time at exit.
TEST(Logging, TheLastLineBeforeExitIsWritten) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    if (!setup_logging("info", LogFormat::kText).ok()) _exit(3);
    spdlog::error("the reason for exiting");
    exit(1);  // as returning from main does
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(out.find("the reason for exiting"), std::string::npos) << "stderr: " << out;
}

}  // namespace
}  // namespace kpleg

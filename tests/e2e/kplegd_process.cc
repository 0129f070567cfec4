#include "e2e/kplegd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

#include "support/eventually.h"

namespace kpleg::testing {

std::string kplegd_binary() { return KPLEGD_BIN; }

std::vector<std::string> types_of(const std::vector<nlohmann::json>& events,
                                  const std::string& container_id) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    if (e.value("container_id", "") == container_id) out.push_back(e.value("type", ""));
  }
  return out;
}

Result<std::unique_ptr<KplegdProcess>> KplegdProcess::start(const std::vector<std::string>& args) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    return Error::from_errno(errno, "pipe");
  std::vector<std::string> argv{kplegd_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return Error::from_errno(errno, "fork");
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    // Let the daemon have default signal handling whatever the test runner set.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  auto p = std::unique_ptr<KplegdProcess>(new KplegdProcess());
  p->pid_ = pid;
  for (size_t i = 1; i < argv.size(); ++i) p->args_ += (i > 1 ? " " : "") + argv[i];
  p->out_reader_ = std::thread([raw = p.get(), fd = out[0]] { raw->read_loop(fd, true); });
  p->err_reader_ = std::thread([raw = p.get(), fd = err[0]] { raw->read_loop(fd, false); });
  return p;
}

void KplegdProcess::read_loop(int fd, bool is_stdout) {
  std::string buf;
  char chunk[4096];
  while (true) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    std::lock_guard lk(mu_);
    if (!is_stdout) {
      log_.append(chunk, n);
    } else {
      buf.append(chunk, n);
      size_t pos;
      while ((pos = buf.find('\n')) != std::string::npos) {
        auto line = buf.substr(0, pos);
        buf.erase(0, pos + 1);
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded()) events_.push_back(std::move(j));
      }
    }
    cv_.notify_all();
  }
  close(fd);
}

bool KplegdProcess::wait_for(const std::function<bool(const std::vector<nlohmann::json>&)>& pred,
                             std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return pred(events_); });
}

bool KplegdProcess::wait_for_log(const std::string& text, std::chrono::milliseconds timeout,
                                 size_t times) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] {
    size_t n = 0;
    for (auto at = log_.find(text); at != std::string::npos && n < times;
         at = log_.find(text, at + 1))
      ++n;
    return n >= times;
  });
}

std::vector<nlohmann::json> KplegdProcess::events() const {
  std::lock_guard lk(mu_);
  return events_;
}

std::vector<std::string> KplegdProcess::types_for(const std::string& container_id) const {
  std::lock_guard lk(mu_);
  return types_of(events_, container_id);
}

std::string KplegdProcess::log() const {
  std::lock_guard lk(mu_);
  return log_;
}

std::optional<int> KplegdProcess::wait_exit(std::chrono::milliseconds timeout) {
  if (exit_status_) return exit_status_;
  int status = 0;
  // Polled (waitpid WNOHANG): nothing here announces the child's exit.
  if (!eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout,
                  std::chrono::milliseconds(10)))
    return std::nullopt;
  exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
  return exit_status_;
}

int KplegdProcess::stop(std::chrono::milliseconds timeout) {
  if (exit_status_) return *exit_status_;
  kill(pid_, SIGTERM);
  if (auto s = wait_exit(timeout)) return *s;
  kill(pid_, SIGKILL);
  return wait_exit(std::chrono::seconds(5)).value_or(-1);
}

KplegdProcess::~KplegdProcess() {
  if (!exit_status_ && pid_ > 0) stop();
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
  // A failed test shows what the daemon said and sent: its log and its events.
  if (::testing::Test::HasFailure()) {
    std::lock_guard lk(mu_);
    std::cerr << "---- kplegd " << args_ << " (pid " << pid_ << ", exit "
              << (exit_status_ ? std::to_string(*exit_status_) : "?") << ") log:\n"
              << log_ << "---- its " << events_.size() << " events:\n";
    for (const auto& e : events_) {
      std::cerr << e.value("emit_ts_ns", uint64_t{0}) / 1000000 % 100000000 << "ms "
                << e.value("type", "") << " " << e.value("container_id", "").substr(0, 12) << " "
                << e.value("pod_name", "") << "/" << e.value("container_name", "")
                << " source=" << e.value("source", "")
                << (e.value("correction", false) ? " correction" : "") << "\n";
    }
    std::cerr << "----\n";
  }
}

}  // namespace kpleg::testing

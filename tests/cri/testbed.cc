#include "cri/testbed.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#ifndef KPLEG_SOURCE_DIR
#error "KPLEG_SOURCE_DIR must name the source tree (scripts/testbed.sh)"
#endif
#ifndef KPLEG_LOAD_BIN
#error "KPLEG_LOAD_BIN must name the kpleg-load binary"
#endif

namespace kpleg::testing {
namespace {

constexpr auto kTestBedUpTimeout =
    std::chrono::minutes(5);  // first run builds and imports the image (and builds containerd 2.x)

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/sbin:/usr/bin:/sbin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// The runtime the test bed runs: $KPLEG_TESTBED_RUNTIME (containerd-1.6 or containerd-2), or the
// script's default when unset.
std::string requested_runtime() {
  const char* env = std::getenv("KPLEG_TESTBED_RUNTIME");
  return env != nullptr ? env : "";
}

std::string value_after(const std::string& text, const std::string& key) {
  for (const auto& line : lines_of(text)) {
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  }
  return "";
}

}  // namespace

TestBed& TestBed::instance() {
  static TestBed bed;
  return bed;
}

std::string TestBed::script() const {
  return std::string(KPLEG_SOURCE_DIR) + "/scripts/testbed.sh";
}

TestBed::TestBed() {
  if (geteuid() != 0) {
    reason_ = "needs root: a real containerd, runc and cgroups";
    return;
  }
  if (const char* env = std::getenv("KPLEG_RUNTIME_ENDPOINT"); env != nullptr && *env != '\0') {
    endpoint_ = env;
    available_ = true;
    return;
  }
  // containerd 2.x comes from scripts/runtimes.sh's cache, which `up` fills; only 1.6 is Debian's.
  const auto runtime = requested_runtime();
  const bool debian_containerd = runtime.empty() || runtime == "containerd-1.6";
  if (!on_path("runc") || (debian_containerd && !on_path("containerd"))) {
    reason_ = "containerd/runc not installed (scripts/install-deps.sh installs them)";
    return;
  }
  if (!std::filesystem::exists(script())) {
    reason_ = script() + " is missing";
    return;
  }
  auto ep = up();
  if (!ep) {
    reason_ = "the test bed did not come up: " + ep.error().message;
    return;
  }
  endpoint_ = *ep;
  available_ = true;
}

Result<std::string> TestBed::up() const {
  std::vector<std::string> argv{script(), "up"};
  if (const auto runtime = requested_runtime(); !runtime.empty()) {
    argv.insert(argv.end(), {"--runtime", runtime});
  }
  auto r = run_process(argv, kTestBedUpTimeout);
  if (!r) return r.error();
  if (r->exit_code != 0) {
    return Error{r->exit_code,
                 "scripts/testbed.sh up exited " + std::to_string(r->exit_code) + ": " + r->err};
  }
  auto ep = value_after(r->out, "KPLEG_RUNTIME_ENDPOINT=");
  if (ep.empty()) return Error{EINVAL, "scripts/testbed.sh up printed no endpoint: " + r->out};
  return ep;
}

Result<pid_t> TestBed::containerd_pid() const {
  auto r = run_process({script(), "status"}, std::chrono::seconds(30));
  if (!r) return r.error();
  if (r->exit_code != 0) {
    return Error{ESRCH, "scripts/testbed.sh status: test bed not up (exit " +
                            std::to_string(r->exit_code) + "): " + r->out + r->err};
  }
  auto pid = value_after(r->out, "pid: ");
  if (pid.empty()) return Error{EINVAL, "scripts/testbed.sh status printed no pid: " + r->out};
  return static_cast<pid_t>(std::stol(pid));
}

Result<std::string> TestBed::root_dir() const {
  auto r = run_process({script(), "status"}, std::chrono::seconds(30));
  if (!r) return r.error();
  if (r->exit_code != 0) {
    return Error{ESRCH, "scripts/testbed.sh status: test bed not up (exit " +
                            std::to_string(r->exit_code) + "): " + r->out + r->err};
  }
  auto root = value_after(r->out, "root: ");
  if (root.empty()) return Error{EINVAL, "scripts/testbed.sh status printed no root: " + r->out};
  return root;
}

std::string TestBed::runtime() const {
  auto r = requested_runtime();
  return r.empty() ? "containerd-1.6" : r;
}

bool TestBed::endpoint_is_test_bed() const {
  auto r = run_process({script(), "status"}, std::chrono::seconds(30));
  return r && r->exit_code == 0 && value_after(r->out, "endpoint: ") == endpoint_;
}

Result<ProcessResult> run_kpleg_load(const std::vector<std::string>& args,
                                     std::chrono::milliseconds timeout) {
  std::vector<std::string> argv{KPLEG_LOAD_BIN};
  if (TestBed::instance().available()) {
    argv.push_back("--runtime-endpoint");
    argv.push_back(TestBed::instance().endpoint());
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, timeout);
}

std::string unique_namespace(const std::string& test_name) {
  std::string ns = "kpleg-test-";
  for (char c : test_name) {
    if (ns.size() >= 40) break;
    ns += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-';
  }
  std::mt19937 rng{std::random_device{}()};
  ns += "-" + std::to_string(getpid()) + "-" + std::to_string(rng() % 100000);
  return ns;
}

void CriTestBedTest::TearDown() {
  if (namespace_.empty()) return;
  auto r = run_kpleg_load({"clean", "--namespace", namespace_});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->exit_code, 0) << "cleaning up namespace " << namespace_ << ": " << r->err;
}

}  // namespace kpleg::testing

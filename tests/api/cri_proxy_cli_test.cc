// kpleg-cri-proxy's command line, the real binary: how a stall is asked for, and the errors of
// a bad one. (What each stall does to the calls is tested in tests/unit/cri_proxy_test.cc.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "run_command.h"

namespace kpleg::apitest {
namespace {

using namespace std::chrono_literals;

CommandResult proxy(std::vector<std::string> args) {
  const std::string listen = "/tmp/kpleg-proxy-cli-" + std::to_string(getpid()) + ".sock";
  std::vector<std::string> argv{KPLEG_CRI_PROXY_BIN, "--listen", listen};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_command(argv, 20s);
  unlink(listen.c_str());
  return r;
}

TEST(CriProxyCliTest, ABadLateAnswerDelayIsNamedInTheError) {
  auto r = proxy({"--stall-pod", "uid-1", "--stall-late", "soon"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("kpleg-cri-proxy: --stall-late: invalid duration 'soon'"), std::string::npos)
      << r.err;
}

TEST(CriProxyCliTest, OneStallModeAtATimeAndEachNeedsItsPod) {
  auto both = proxy({"--stall-pod", "uid-1", "--stall-late", "1s", "--stall-delay", "1s"});
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  auto hang = proxy({"--stall-pod", "uid-1", "--stall-late", "1s", "--stall-hang"});
  EXPECT_EQ(hang.exit_code, 2) << hang.err;
  EXPECT_NE(hang.err.find("excludes"), std::string::npos) << hang.err;
  auto no_pod = proxy({"--stall-late", "1s"});
  EXPECT_EQ(no_pod.exit_code, 2) << no_pod.err;
  EXPECT_NE(no_pod.err.find("--stall-late requires --stall-pod"), std::string::npos) << no_pod.err;
}

// A good stall is taken: the proxy goes on to its upstream (absent here, so it stops there).
TEST(CriProxyCliTest, AGoodLateAnswerStallIsTaken) {
  auto r = proxy({"--stall-pod", "uid-1", "--stall-late", "1500ms", "--upstream",
                  "unix:///nonexistent/kpleg-no-runtime.sock", "--upstream-timeout", "200ms"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.find("--stall-late"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did not answer Version"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kpleg::apitest

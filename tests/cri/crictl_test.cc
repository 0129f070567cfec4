// crictl, the CRI command-line client users type (built by scripts/crictl.sh, on PATH when
// scripts/test.sh runs the tests), against the test bed: it sees kpleg-load's pod and
// container as the runtime reports them, and stops and removes them. docs/testbed.md shows the
// same commands.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cri/process.h"
#include "cri/testbed.h"
#include "support/privileged.h"

namespace kpleg::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

class Crictl : public CriTestBedTest {
 protected:
  void SetUp() override {
    CriTestBedTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    KPLEG_REQUIRE_OR_SKIP(system("command -v crictl >/dev/null 2>&1") == 0,
                          "crictl is not on PATH (scripts/crictl.sh builds it; scripts/test.sh "
                          "puts it on PATH)");
  }
  // `crictl --runtime-endpoint <test bed> args...`, its stdout parsed as JSON.
  json crictl(std::vector<std::string> args) {
    args.insert(args.begin(), {"crictl", "--runtime-endpoint", endpoint_, "--timeout", "10s"});
    auto r = run_process(args, 30s);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (!r.ok()) return json();
    EXPECT_EQ(r->exit_code, 0) << r->err;
    auto j = json::parse(r->out, nullptr, false);
    return j.is_discarded() ? json(r->out) : j;
  }
};

TEST_F(Crictl, SeesStopsAndRemovesWhatKpLegLoadStarted) {
  auto run = run_kpleg_load({"run", "--pods", "1", "--containers", "1", "--namespace", namespace_});
  ASSERT_TRUE(run.ok()) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->err;
  auto pod = json::parse(lines_of(run->out).at(0));
  const std::string sandbox_id = pod["sandbox_id"], container_id = pod["containers"][0]["container_id"];

  auto version = crictl({"version"});  // plain text: "RuntimeApiVersion:  v1"
  ASSERT_TRUE(version.is_string()) << version.dump();
  EXPECT_NE(version.get<std::string>().find("RuntimeApiVersion:  v1"), std::string::npos)
      << version.dump();

  auto pods = crictl({"pods", "--namespace", namespace_, "-o", "json"});
  ASSERT_TRUE(pods.contains("items")) << pods.dump();
  ASSERT_EQ(pods["items"].size(), 1u) << pods.dump();
  EXPECT_EQ(pods["items"][0]["id"], sandbox_id);
  EXPECT_EQ(pods["items"][0]["state"], "SANDBOX_READY");

  auto ps = crictl({"ps", "--pod", sandbox_id, "-o", "json"});
  ASSERT_EQ(ps["containers"].size(), 1u) << ps.dump();
  EXPECT_EQ(ps["containers"][0]["id"], container_id);
  EXPECT_EQ(ps["containers"][0]["state"], "CONTAINER_RUNNING");

  crictl({"stop", "--timeout", "0", container_id});
  auto inspect = crictl({"inspect", "-o", "json", container_id});
  EXPECT_EQ(inspect["status"]["state"], "CONTAINER_EXITED") << inspect.dump();

  crictl({"rm", container_id});
  crictl({"stopp", sandbox_id});
  crictl({"rmp", sandbox_id});
  auto gone = crictl({"pods", "--namespace", namespace_, "-o", "json"});
  EXPECT_TRUE(gone["items"].empty()) << gone.dump();
}

}  // namespace
}  // namespace kpleg::testing

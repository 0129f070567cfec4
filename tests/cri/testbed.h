// The real CRI runtime the cri tests talk to: the shared test bed (scripts/testbed.sh, a
// private containerd + runc), or whatever $KPLEG_RUNTIME_ENDPOINT names. Tests use the
// CriTestBedTest fixture, which skips (or, with KPLEG_REQUIRE_PRIVILEGED=1, fails) when there
// is no runtime to be had: not root, containerd not installed, or the test bed would not start.
//
// The test bed is brought up once per test process and left up: it is shared by every CRI and
// end-to-end test, and `scripts/testbed.sh down` is the way to take it down.
//
// $KPLEG_TESTBED_RUNTIME (containerd-1.6, the default, or containerd-2) is passed to `up` as
// --runtime; `up` fails when the test bed is already up with the other runtime.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/result.h"
#include "cri/process.h"
#include "support/privileged.h"

namespace kpleg::testing {

class TestBed {
 public:
  static TestBed& instance();

  bool available() const { return available_; }
  const std::string& unavailable_reason() const { return reason_; }
  // unix:///path of the runtime's CRI socket.
  const std::string& endpoint() const { return endpoint_; }

  // `scripts/testbed.sh up`: starts containerd if it is not running (e.g. after a test killed
  // it). Returns the endpoint it printed.
  Result<std::string> up() const;
  // The running test bed's containerd, from `scripts/testbed.sh status`.
  Result<pid_t> containerd_pid() const;
  // The running test bed's containerd root directory (it differs between runtimes), from
  // `scripts/testbed.sh status`.
  Result<std::string> root_dir() const;
  // The runtime the test bed runs: containerd-1.6 (the default) or containerd-2
  // ($KPLEG_TESTBED_RUNTIME).
  std::string runtime() const;
  // Whether endpoint() is the test bed's own socket (and not some other runtime named by
  // $KPLEG_RUNTIME_ENDPOINT), i.e. whether the test bed can restart it.
  bool endpoint_is_test_bed() const;

 private:
  TestBed();
  std::string script() const;

  bool available_ = false;
  std::string reason_;
  std::string endpoint_;
};

// Runs the kpleg-load binary built with this tree against the test bed.
Result<ProcessResult> run_kpleg_load(const std::vector<std::string>& args,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A pod namespace no other test run uses, so that `kpleg-load clean --namespace` removes only
// this test's pods even when others share the runtime.
std::string unique_namespace(const std::string& test_name);

class CriTestBedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& bed = TestBed::instance();
    KPLEG_REQUIRE_OR_SKIP(bed.available(), bed.unavailable_reason());
    endpoint_ = bed.endpoint();
    namespace_ = unique_namespace(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  // Removes every pod this test created (also when it failed half way).
  void TearDown() override;

  std::string endpoint_;
  std::string namespace_;
};

}  // namespace kpleg::testing

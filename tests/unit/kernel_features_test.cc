// A kernel too old for the BPF programs: preflight names the missing feature, the kernel and the
// version that brought it, and relist mode as the fallback (the daemon's auto mode then runs
// relist mode with that reason: FaultsTest.AutoFallsBackToRelistWhenBpfCannotLoad).
#include <gtest/gtest.h>

#include "kernel/kernel_source.h"

namespace kpleg::kernel {
namespace {

constexpr KernelFeatures kAll{.ringbuf = true, .lru_hash = true};

TEST(KernelFeatures, AKernelWithEverythingPasses) {
  EXPECT_TRUE(check_kernel_features(kAll, "5.10.0-32-amd64").ok());
}

TEST(KernelFeatures, NoRingBufferBefore58IsTheReasonForRelistMode) {
  // Linux 5.4 (Ubuntu 20.04's GA kernel): tp_btf, but no ring buffer.
  KernelFeatures f = kAll;
  f.ringbuf = false;
  auto st = check_kernel_features(f, "5.4.0-200-generic");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EOPNOTSUPP);
  EXPECT_EQ(st.error().message,
            "Linux 5.4.0-200-generic has no BPF ring buffer (BPF_MAP_TYPE_RINGBUF) (Linux 5.8+); "
            "the kernel event source cannot start, relist mode (--mode=relist) is the fallback");
}

TEST(KernelFeatures, NoLruHashNamesIt) {
  KernelFeatures f = kAll;
  f.lru_hash = false;
  auto st = check_kernel_features(f, "4.9.0-19-amd64");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("LRU hash"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("(Linux 4.10+)"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("4.9.0-19-amd64"), std::string::npos) << st.error().message;
}

TEST(KernelFeatures, TheFirstMissingFeatureIsNamed) {
  auto st = check_kernel_features(KernelFeatures{}, "4.9.0");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("ring buffer"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace kpleg::kernel

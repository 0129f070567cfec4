// Decoding of raw ring-buffer records: every malformed record is rejected with a counted
// reason, never a crash or a misread.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernel/kernel_event.h"

namespace kpleg::kernel {
namespace {

template <typename Raw>
std::vector<std::byte> bytes_of(const Raw& raw) {
  std::vector<std::byte> b(sizeof(Raw));
  std::memcpy(b.data(), &raw, sizeof(Raw));
  return b;
}

kpleg_exit_event exit_record() {
  kpleg_exit_event r{};
  r.hdr.type = KPLEG_EVENT_EXIT;
  r.hdr.size = sizeof(r);
  r.hdr.ktime_ns = 123456789;
  r.cgroup_id = 4242;
  r.pid = 77;
  r.exit_code = 3;
  return r;
}

TEST(KernelEventDecode, ExitRecord) {
  DecodeStats stats;
  auto ev = decode_event(bytes_of(exit_record()), &stats);
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  EXPECT_EQ(ev->ktime_ns, 123456789u);
  EXPECT_STREQ(ev->kind(), "exit");
  EXPECT_EQ(ev->cgroup_id(), 4242u);
  const auto& x = std::get<ProcessExit>(ev->body);
  EXPECT_EQ(x.pid, 77u);
  EXPECT_EQ(x.exit_code, 3u);
  EXPECT_EQ(x.signal, 0u);
  EXPECT_FALSE(x.core_dumped);
  EXPECT_EQ(stats.total(), 0u);
}

TEST(KernelEventDecode, CgroupRecordPathIsBoundedByPathLen) {
  kpleg_cgroup_event r{};
  r.hdr.type = KPLEG_EVENT_CGROUP_MKDIR;
  r.hdr.size = sizeof(r);
  r.cgroup_id = 9;
  r.parent_cgroup_id = 8;
  r.level = 3;
  const char* p = "/kubepods/burstable/podx";
  std::memcpy(r.path, p, strlen(p));
  r.path_len = 10;  // shorter than the string: the decoder must trust path_len, not the NUL
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok());
  const auto& m = std::get<CgroupMkdir>(ev->body);
  EXPECT_EQ(m.path, "/kubepods/");
  EXPECT_EQ(m.parent_cgroup_id, 8u);
  EXPECT_EQ(m.level, 3u);
  EXPECT_FALSE(m.path_truncated);
  EXPECT_FALSE(m.untracked);
}

TEST(KernelEventDecode, MkdirThatFoundTheTrackedMapFullSaysSo) {
  kpleg_cgroup_event r{};
  r.hdr.type = KPLEG_EVENT_CGROUP_MKDIR;
  r.hdr.size = sizeof(r);
  r.hdr.flags = KPLEG_FLAG_UNTRACKED;
  r.cgroup_id = 9;
  std::strcpy(r.path, "/kubepods/podx");
  r.path_len = 14;
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE(std::get<CgroupMkdir>(ev->body).untracked);
  EXPECT_NE(to_json_line(*ev).find("\"untracked\":true"), std::string::npos) << to_json_line(*ev);
}

TEST(KernelEventDecode, CgroupRecordWithoutTerminatorAndHugePathLen) {
  kpleg_cgroup_event r{};
  r.hdr.type = KPLEG_EVENT_CGROUP_RMDIR;
  r.hdr.size = sizeof(r);
  r.hdr.flags = KPLEG_FLAG_PATH_TRUNCATED;
  std::memset(r.path, 'x', sizeof(r.path));  // no NUL anywhere
  r.path_len = 0xffffffff;
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok());
  const auto& m = std::get<CgroupRmdir>(ev->body);
  EXPECT_EQ(m.path.size(), sizeof(r.path));
  EXPECT_TRUE(m.path_truncated);
}

TEST(KernelEventDecode, ExecRecordStringsWithoutTerminator) {
  kpleg_exec_event r{};
  r.hdr.type = KPLEG_EVENT_EXEC;
  r.hdr.size = sizeof(r);
  r.pid = 5;
  std::memset(r.comm, 'c', sizeof(r.comm));
  std::memset(r.filename, 'f', sizeof(r.filename));
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok());
  const auto& e = std::get<ProcessExec>(ev->body);
  EXPECT_EQ(e.comm, std::string(KPLEG_COMM_MAX, 'c'));
  EXPECT_EQ(e.filename, std::string(KPLEG_FILENAME_MAX, 'f'));
}

TEST(KernelEventDecode, SignalAndCoreDump) {
  auto r = exit_record();
  r.exit_code = 0;
  r.signal = 9;
  r.hdr.flags = KPLEG_FLAG_CORE_DUMPED;
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(std::get<ProcessExit>(ev->body).signal, 9u);
  EXPECT_TRUE(std::get<ProcessExit>(ev->body).core_dumped);
}

TEST(KernelEventDecode, OomRecord) {
  kpleg_oom_event r{};
  r.hdr.type = KPLEG_EVENT_OOM;
  r.hdr.size = sizeof(r);
  r.cgroup_id = 11;
  r.victim_pid = 99;
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(std::get<OomKill>(ev->body).victim_pid, 99u);
  EXPECT_STREQ(ev->kind(), "oom");
}

TEST(KernelEventDecode, RemovalHintRecord) {
  kpleg_removal_hint_event r{};
  r.hdr.type = KPLEG_EVENT_REMOVAL_HINT;
  r.hdr.size = sizeof(r);
  const std::string id(64, 'b');
  std::memcpy(r.id, id.data(), sizeof(r.id));  // not NUL-terminated
  auto ev = decode_event(bytes_of(r));
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  EXPECT_EQ(std::get<RemovalHint>(ev->body).id, id);
  EXPECT_EQ(ev->cgroup_id(), 0u);
  EXPECT_STREQ(ev->kind(), "removal_hint");
  EXPECT_NE(to_json_line(*ev).find("\"id\":\"" + id + "\""), std::string::npos) << to_json_line(*ev);
  // A record one byte short of the id is rejected, not read past.
  auto short_rec = bytes_of(r);
  short_rec.pop_back();
  kpleg_event_header hdr;
  std::memcpy(&hdr, short_rec.data(), sizeof(hdr));
  hdr.size = short_rec.size();
  std::memcpy(short_rec.data(), &hdr, sizeof(hdr));
  EXPECT_FALSE(decode_event(short_rec).ok());
}

TEST(KernelEventDecode, RejectsEveryTruncation) {
  DecodeStats stats;
  auto full = bytes_of(exit_record());
  for (size_t n = 0; n < full.size(); ++n) {
    auto ev = decode_event(std::span(full.data(), n), &stats);
    EXPECT_FALSE(ev.ok()) << "accepted a record cut to " << n << " bytes";
    EXPECT_EQ(ev.ok() ? 0 : ev.error().code, EBADMSG);
  }
  EXPECT_EQ(stats.get(DecodeErrorKind::kTruncated), full.size());
  EXPECT_EQ(stats.total(), full.size());
}

TEST(KernelEventDecode, RejectsHeaderSizeBeyondRecord) {
  DecodeStats stats;
  auto r = exit_record();
  r.hdr.size = sizeof(r) + 64;
  EXPECT_FALSE(decode_event(bytes_of(r), &stats).ok());
  EXPECT_EQ(stats.get(DecodeErrorKind::kTruncated), 1u);
}

TEST(KernelEventDecode, RejectsSizeMismatch) {
  DecodeStats stats;
  auto r = exit_record();
  r.hdr.size = sizeof(kpleg_oom_event);  // claims a smaller layout than its type has
  EXPECT_FALSE(decode_event(bytes_of(r), &stats).ok());
  EXPECT_EQ(stats.get(DecodeErrorKind::kSizeMismatch), 1u);
}

TEST(KernelEventDecode, RejectsOversized) {
  DecodeStats stats;
  std::vector<std::byte> big(kMaxRecordSize + 4096);
  auto r = exit_record();
  std::memcpy(big.data(), &r, sizeof(r));
  EXPECT_FALSE(decode_event(big, &stats).ok());
  EXPECT_EQ(stats.get(DecodeErrorKind::kOversized), 1u);
}

TEST(KernelEventDecode, RejectsUnknownTypes) {
  DecodeStats stats;
  for (uint16_t type : {uint16_t(0), uint16_t(KPLEG_EVENT_TYPE_MAX), uint16_t(0xffff)}) {
    auto r = exit_record();
    r.hdr.type = type;
    EXPECT_FALSE(decode_event(bytes_of(r), &stats).ok()) << "type " << type;
  }
  EXPECT_EQ(stats.get(DecodeErrorKind::kUnknownType), 3u);
}

TEST(KernelEventDecode, GarbageNeverCrashes) {
  DecodeStats stats;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> buf(x % (kMaxRecordSize + 64));
    for (auto& b : buf) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b = std::byte(x);
    }
    if (decode_event(buf, &stats).ok()) ++accepted;
  }
  EXPECT_EQ(accepted + stats.total(), 20000u);
}

TEST(KernelEventJson, TraceLineHasTheDocumentedFields) {
  auto ev = decode_event(bytes_of(exit_record()));
  ASSERT_TRUE(ev.ok());
  auto line = to_json_line(*ev);
  EXPECT_EQ(line, R"({"cgroup_id":4242,"exit_code":3,"kind":"exit","ktime_ns":123456789,"pid":77,"signal":0})");
}

}  // namespace
}  // namespace kpleg::kernel

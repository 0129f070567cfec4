// The API server's frame bookkeeping for quiet connections (api/h2_frame_cursor.h): where the
// bytes given to nghttp2 end among the client's frames, and which waiting bytes the publishing
// thread may take.
#include "api/h2_frame_cursor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kpleg::api::h2 {
namespace {

std::vector<uint8_t> frame(uint8_t type, size_t payload) {
  std::vector<uint8_t> f = {uint8_t(payload >> 16), uint8_t(payload >> 8), uint8_t(payload), type,
                            0, 0, 0, 0, 1};
  f.resize(f.size() + payload, 0xab);
  return f;
}

void append(std::vector<uint8_t>& to, const std::vector<uint8_t>& bytes) {
  to.insert(to.end(), bytes.begin(), bytes.end());
}

constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3, kPing = 0x6, kWindowUpdate = 0x8;

TEST(H2FrameCursor, FollowsThePrefaceAndFramesHoweverTheBytesAreSplit) {
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  std::vector<uint8_t> in(preface.begin(), preface.end());
  append(in, frame(0x4, 12));  // SETTINGS
  append(in, frame(kHeaders, 40));
  append(in, frame(kData, 0));
  append(in, frame(kWindowUpdate, 4));
  for (size_t chunk : {size_t(1), size_t(5), size_t(9), size_t(1000)}) {
    FrameCursor c;
    for (size_t at = 0; at < in.size(); at += chunk) {
      EXPECT_FALSE(at > 0 && at < 24 && c.at_boundary()) << "inside the preface, chunk " << chunk;
      c.feed(in.data() + at, std::min(chunk, in.size() - at));
    }
    EXPECT_TRUE(c.at_boundary()) << "chunk " << chunk;
    const uint8_t partial[] = {0, 0, 4, kWindowUpdate, 0};
    c.feed(partial, sizeof partial);
    EXPECT_FALSE(c.at_boundary()) << "half a header, chunk " << chunk;
  }
  FrameCursor c;
  c.feed(in.data(), in.size() - 2);
  EXPECT_FALSE(c.at_boundary()) << "half a payload";
}

TEST(H2FrameCursor, TakesOnlyTheWholeFlowControlFramesAtTheFront) {
  std::vector<uint8_t> in;
  append(in, frame(kWindowUpdate, 4));
  append(in, frame(kWindowUpdate, 4));
  append(in, frame(kPing, 8));
  const size_t flow = in.size();
  EXPECT_EQ(whole_flow_control_frames(in.data(), in.size()), flow);
  append(in, frame(kHeaders, 30));  // a new call: left for the server's thread
  append(in, frame(kWindowUpdate, 4));
  EXPECT_EQ(whole_flow_control_frames(in.data(), in.size()), flow);
  std::vector<uint8_t> cancel = frame(kRstStream, 4);
  EXPECT_EQ(whole_flow_control_frames(cancel.data(), cancel.size()), 0u);
  // A frame not wholly there stays, header or payload.
  for (size_t cut = 1; cut <= 17; ++cut)
    EXPECT_EQ(whole_flow_control_frames(in.data(), flow - cut), flow - 17) << "cut " << cut;
  EXPECT_EQ(whole_flow_control_frames(in.data(), 0), 0u);
}

}  // namespace
}  // namespace kpleg::api::h2

// Where the bytes a connection gave nghttp2 stand in the client's HTTP/2 frames, and which of
// the bytes waiting on its socket are whole flow-control frames. A quiet connection
// (h2_connection.h) is read by the publishing thread, which takes only those: it must start
// at a frame's first byte, and leave anything else to the server's thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kpleg::api::h2 {

inline constexpr size_t kFrameHeaderBytes = 9;
inline constexpr size_t kClientPrefaceBytes = 24;  // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

inline size_t frame_payload_length(const uint8_t* header) {
  return (size_t(header[0]) << 16) | (size_t(header[1]) << 8) | size_t(header[2]);
}

class FrameCursor {
 public:
  void feed(const uint8_t* p, size_t n) {
    while (n > 0) {
      size_t k;
      if (preface_left_ > 0) {
        k = std::min(n, preface_left_);
        preface_left_ -= k;
      } else if (payload_left_ > 0) {
        k = std::min(n, payload_left_);
        payload_left_ -= k;
      } else {
        k = std::min(n, kFrameHeaderBytes - have_);
        std::memcpy(header_ + have_, p, k);
        have_ += k;
        if (have_ == kFrameHeaderBytes) {
          payload_left_ = frame_payload_length(header_);
          have_ = 0;
        }
      }
      p += k;
      n -= k;
    }
  }
  // The next byte is a frame's first.
  bool at_boundary() const { return preface_left_ == 0 && have_ == 0 && payload_left_ == 0; }

 private:
  size_t preface_left_ = kClientPrefaceBytes;
  uint8_t header_[kFrameHeaderBytes] = {};
  size_t have_ = 0;
  size_t payload_left_ = 0;
};

// How many of the `n` bytes at `p` (starting at a frame's first byte) are whole WINDOW_UPDATE
// and PING frames, up to the first frame of another type or a frame not wholly there.
inline size_t whole_flow_control_frames(const uint8_t* p, size_t n) {
  constexpr uint8_t kPing = 0x6, kWindowUpdate = 0x8;
  size_t at = 0;
  while (n - at >= kFrameHeaderBytes) {
    const uint8_t type = p[at + 3];
    const size_t len = frame_payload_length(p + at);
    if ((type != kWindowUpdate && type != kPing) || n - at - kFrameHeaderBytes < len) break;
    at += kFrameHeaderBytes + len;
  }
  return at;
}

}  // namespace kpleg::api::h2

// What the nghttp2 clients (h2_stream.cc, h2_unary.cc, h2_unary_mux.cc) share: the gRPC HTTP/2
// protocol's status rules (a response's status from its headers, trailers and end), its
// grpc-timeout and message framing, and a header helper.
// Header-only; the API's HTTP/2 server (api/h2_stream.h) uses its header helper too.
#pragma once

#include <grpcpp/support/status_code_enum.h>
#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace kpleg::cri::h2 {

using grpc::StatusCode;

// Percent-decoding of grpc-message (the gRPC HTTP/2 protocol's only escaping).
inline std::string percent_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size()) {
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(in[i]);
  }
  return out;
}

// The gRPC code for a response that carried no grpc-status (the gRPC HTTP/2 protocol's table).
inline int code_for_http_status(int http) {
  switch (http) {
    case 400:
      return StatusCode::INTERNAL;
    case 401:
      return StatusCode::UNAUTHENTICATED;
    case 403:
      return StatusCode::PERMISSION_DENIED;
    case 404:
      return StatusCode::UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
      return StatusCode::UNAVAILABLE;
    default:
      return StatusCode::UNKNOWN;
  }
}

// A call's response as far as its status goes: fed every header of the response's stream and
// its close, it says how the call ended, with the gRPC HTTP/2 protocol's rules.
struct ResponseStatus {
  int http_status = 0;
  std::optional<int> grpc_status;
  std::string grpc_message;
  bool closed = false;
  uint32_t reset_code = 0;

  void on_header(std::string_view name, std::string_view value) {
    if (name == ":status") {
      http_status = std::atoi(std::string(value).c_str());
    } else if (name == "grpc-status") {
      grpc_status = std::atoi(std::string(value).c_str());
    } else if (name == "grpc-message") {
      grpc_message = percent_decode(value);
    }
  }
  void on_close(uint32_t error_code) {
    closed = true;
    reset_code = error_code;
  }
  // OK when the response ended with grpc-status 0; else the reason, in the order the protocol
  // gives: the connection closed first, a grpc-status, a reset, an HTTP status, nothing.
  Status status() const {
    if (!closed) return Error{StatusCode::UNAVAILABLE, "the runtime closed the connection"};
    if (grpc_status) {
      if (*grpc_status == 0) return {};
      return Error{*grpc_status, grpc_message.empty() ? "(no message)" : grpc_message};
    }
    if (reset_code != 0) {
      return Error{reset_code == NGHTTP2_REFUSED_STREAM ? int(StatusCode::UNAVAILABLE)
                                                        : int(StatusCode::INTERNAL),
                   "the runtime reset the stream (HTTP/2 error " +
                       std::string(nghttp2_http2_strerror(reset_code)) + ")"};
    }
    if (http_status != 200) {
      return Error{code_for_http_status(http_status),
                   "the runtime answered HTTP status " + std::to_string(http_status)};
    }
    return Error{StatusCode::INTERNAL, "the response ended without a gRPC status"};
  }
};

inline nghttp2_nv header(const char* name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), std::strlen(name),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

// A request body sent whole, as nghttp2's data source reads it: the next part of `body` after
// `sent` into `buf`, the stream's end with the last part.
inline ssize_t send_body(const std::string& body, size_t& sent, uint8_t* buf, size_t len,
                         uint32_t* flags) {
  const size_t n = std::min(len, body.size() - sent);
  std::memcpy(buf, body.data() + sent, n);
  sent += n;
  if (sent == body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

// grpc-timeout: at most 8 digits, in the coarsest unit that keeps the deadline.
inline std::string grpc_timeout(std::chrono::steady_clock::duration left) {
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  if (ms < 1) ms = 1;
  if (ms < 100'000'000) return std::to_string(ms) + "m";
  return std::to_string(std::min<int64_t>(ms / 1000, 99'999'999)) + "S";
}

// Appends `message` to `out` in gRPC's framing: a compressed flag (0), the length (4 bytes,
// big-endian), then the message.
inline void append_message(std::string& out, std::string_view message) {
  const auto size = uint32_t(message.size());
  const char prefix[5] = {0, char(size >> 24), char(size >> 16), char(size >> 8), char(size)};
  out.append(prefix, 5);
  out.append(message);
}

// A unary answer's body, `data`, as its one message: gRPC's framing is a compressed flag
// (1 byte), the length (4 bytes, big-endian), then the message.
inline Result<std::string> take_message(std::string& data) {
  if (data.size() < 5)
    return Error{StatusCode::INTERNAL, "the runtime's answer carried no message"};
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const uint32_t size =
      (uint32_t(p[1]) << 24) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 8) | uint32_t(p[4]);
  if (p[0] != 0)
    return Error{StatusCode::INTERNAL,
                 "the runtime sent a compressed message, which was not asked for"};
  if (data.size() != 5 + size)
    return Error{StatusCode::INTERNAL, "the runtime's answer is not one whole message"};
  data.erase(0, 5);
  return std::move(data);
}

}  // namespace kpleg::cri::h2

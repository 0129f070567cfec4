// What the two nghttp2 clients (h2_stream.cc, h2_unary.cc) share: the gRPC HTTP/2 protocol's
// status rules and a header helper. Internal to kpleg_cri.
#pragma once

#include <grpcpp/support/status_code_enum.h>
#include <nghttp2/nghttp2.h>

#include <cstring>
#include <string>
#include <string_view>

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
    case 400: return StatusCode::INTERNAL;
    case 401: return StatusCode::UNAUTHENTICATED;
    case 403: return StatusCode::PERMISSION_DENIED;
    case 404: return StatusCode::UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504: return StatusCode::UNAVAILABLE;
    default: return StatusCode::UNKNOWN;
  }
}

inline nghttp2_nv header(const char* name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())),
                    std::strlen(name), value.size(), NGHTTP2_NV_FLAG_NONE};
}

}  // namespace kpleg::cri::h2

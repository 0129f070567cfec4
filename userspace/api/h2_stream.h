// What a connection (h2_connection.h) keeps per HTTP/2 stream, i.e. per call. Internal to
// h2_connection.cc and h2_streams.cc; every field is under the connection's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <cstring>
#include <string>
#include <string_view>

#include "api/h2_connection.h"
#include "cri/h2_common.h"
#include "bus/event_bus.h"
#include "grpc/health/v1/health.pb.h"

namespace kpleg::api::h2 {

using cri::h2::header;

using cri::h2::append_message;

struct Connection::Stream {
  enum class Kind { kUnary, kWatch, kHealthWatch };

  explicit Stream(int32_t stream_id) : id(stream_id) {}
  const int32_t id;

  // The request, as it arrives.
  std::string path;
  bool post = false;
  bool grpc_content = false;  // content-type application/grpc[+proto]
  std::string encoding;       // grpc-encoding: how a compressed message is compressed
  std::string body;           // framed request message(s), up to a bound
  size_t body_bytes = 0;      // all the body's bytes, kept or not
  bool handed_out = false;    // given to a handler

  // The response: once `responding`, nghttp2 reads `out` through read_body; after it, the
  // trailers of `end` (grpc-status, grpc-message).
  Kind kind = Kind::kUnary;
  bool responding = false;
  std::string out;
  size_t out_taken = 0;
  std::optional<std::pair<int, std::string>> end;
  bool gone = false;  // nghttp2 closed the stream

  // Watch: the subscription the data source takes events from, the stream slot (given back as
  // soon as the stream is cut off), and when a cut-off stream whose consumer reads nothing is
  // reset.
  bus::Subscription sub;
  std::unique_ptr<StreamSlot> slot;
  std::optional<Connection::Clock::time_point> reap_at;

  // grpc.health Watch: the service and the status last written.
  std::string health_service;
  int health_sent = -1;
};

struct Connection::Call {
  std::shared_ptr<Stream> stream;
  std::string path;
  std::string message;  // the request message, unframed
  std::optional<std::pair<int, std::string>> refused;  // a malformed or oversized request
};

}  // namespace kpleg::api::h2

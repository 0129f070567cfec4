// kplegd's own HTTP/2 client (cri/h2_unary.cc, cri/h2_stream.cc) against a hostile runtime: the
// input is every byte the runtime's side of the connection sends (frames, HPACK, gRPC message
// prefixes), after which it closes its side. Whatever it sends, a unary call and a stream must
// end (no hang: a short deadline, or the stream's end at the connection's close), with a status
// or an answer within the size limit, and never crash. The first byte picks unary or stream.
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cri/cancel_token.h"
#include "cri/h2_stream.h"
#include "cri/h2_unary.h"
#include "require.h"

namespace {

constexpr size_t kMaxMessage = 64 * 1024;
std::string g_socket;
int g_listener = -1;

// The runtime's side: every connection made gets the input and then the end of its stream.
class HostileRuntime {
 public:
  HostileRuntime(const uint8_t* data, size_t size)
      : bytes_(reinterpret_cast<const char*>(data), size), thread_([this] { serve(); }) {}
  ~HostileRuntime() {
    stop_.store(true);
    thread_.join();
    for (int fd : conns_) close(fd);
  }

 private:
  void serve() {
    while (!stop_.load()) {
      pollfd p{g_listener, POLLIN, 0};
      if (poll(&p, 1, 2) <= 0) continue;
      const int c = accept4(g_listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      conns_.push_back(c);
      // What the client sends is never read: its preface and request fit the socket's buffer.
      for (size_t off = 0; off < bytes_.size();) {
        const ssize_t n = send(c, bytes_.data() + off, bytes_.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      shutdown(c, SHUT_WR);
    }
  }
  const std::string bytes_;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;
  std::thread thread_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  signal(SIGPIPE, SIG_IGN);
  char dir[] = "/tmp/kpleg-h2-fuzz-XXXXXX";
  if (mkdtemp(dir) == nullptr) abort();
  g_socket = std::string(dir) + "/runtime.sock";
  g_listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, g_socket.c_str(), sizeof addr.sun_path - 1);
  if (bind(g_listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(g_listener, 16) != 0)
    abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool stream = data[0] & 1;
  HostileRuntime runtime(data + 1, size - 1);
  const auto started = std::chrono::steady_clock::now();
  if (!stream) {
    kpleg::cri::H2UnaryConnection conn(g_socket, {.max_message_bytes = kMaxMessage});
    auto r = conn.call("/runtime.v1.RuntimeService/ContainerStatus", std::string("\n\x03" "abc"),
                       started + std::chrono::milliseconds(100), nullptr);
    if (r.ok()) REQUIRE(r->size() <= kMaxMessage);
    else REQUIRE(!r.error().message.empty());
  } else {
    kpleg::cri::CancelToken cancel;
    size_t messages = 0;
    // The runtime closes its side after the input: the stream must end by itself.
    auto st = kpleg::cri::h2_server_stream(
        g_socket, "/runtime.v1.RuntimeService/GetContainerEvents", "", cancel,
        [&](std::string_view m) {
          REQUIRE(m.size() <= kMaxMessage);
          ++messages;
          return true;
        },
        {.max_message_bytes = kMaxMessage});
    REQUIRE(st.ok() || !st.error().message.empty());
    REQUIRE(messages <= size);
  }
  REQUIRE(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  return 0;
}

// kpleg's own unary gRPC calls over HTTP/2 (cri/h2_unary.h) against a real grpc++ server on a
// unix socket: the answer, many calls over one connection, the server's status and message,
// the deadline (and that the server is told it), cancellation, a server restarted between calls
// (the call is made again on a new connection), no server at all, the size limit, and the pool
// under calls from several threads. The server's PINGs (held back, then answered after a later
// request) against a small nghttp2 server that sends one with every answer.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <string>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "cri/api.grpc.pb.h"
#include "cri/h2_unary.h"
#include "support/eventually.h"

namespace kpleg::cri {
namespace {

using namespace std::chrono_literals;
namespace v1 = ::runtime::v1;
using Clock = std::chrono::steady_clock;
constexpr std::string_view kStatus = "/runtime.v1.RuntimeService/ContainerStatus";

// ContainerStatus answers with the id asked for; "missing" is NOT_FOUND, "slow" sleeps until
// the client goes away (or 5 s), "big" answers with a 1 MiB label. It records the deadline
// the server saw.
class StatusService final : public v1::RuntimeService::Service {
 public:
  grpc::Status ContainerStatus(grpc::ServerContext* ctx, const v1::ContainerStatusRequest* req,
                               v1::ContainerStatusResponse* resp) override {
    ++calls;
    last_deadline_left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                ctx->deadline() - std::chrono::system_clock::now())
                                .count();
    if (req->container_id() == "missing")
      return {grpc::StatusCode::NOT_FOUND, "an error occurred when try to find container \"missing\": 100% not found"};
    if (req->container_id() == "slow") {
      (void)testing::eventually([&] { return ctx->IsCancelled(); }, 5s, 5ms);
      return grpc::Status::CANCELLED;
    }
    resp->mutable_status()->set_id(req->container_id());
    resp->mutable_status()->set_state(v1::CONTAINER_EXITED);
    resp->mutable_status()->set_exit_code(137);
    if (req->container_id() == "big")
      (*resp->mutable_status()->mutable_labels())["big"] = std::string(1 << 20, 'x');
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
  std::atomic<int64_t> last_deadline_left_ms{0};
};

std::string socket_path() {
  static int n = 0;
  return "/tmp/kpleg-h2u-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
}

struct Server {
  std::string path;
  StatusService service;
  std::unique_ptr<grpc::Server> server;
  explicit Server(std::string p = socket_path()) : path(std::move(p)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Server() { stop(); }
  void stop() {
    if (!server) return;
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    server.reset();
    unlink(path.c_str());
  }
};

std::string request(const std::string& id) {
  v1::ContainerStatusRequest r;
  r.set_container_id(id);
  return r.SerializeAsString();
}

Result<v1::ContainerStatus> status(H2UnaryConnection& c, const std::string& id,
                                   Clock::duration timeout = 2s, CancelToken* cancel = nullptr) {
  auto r = c.call(kStatus, request(id), Clock::now() + timeout, cancel);
  if (!r) return r.error();
  v1::ContainerStatusResponse resp;
  if (!resp.ParseFromString(*r)) return Error{-1, "does not parse"};
  return resp.status();
}

TEST(H2UnaryTest, AnswersManyCallsOverOneConnection) {
  Server server;
  H2UnaryConnection c(server.path);
  for (int i = 0; i < 300; ++i) {
    auto st = status(c, "c" + std::to_string(i));
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->id(), "c" + std::to_string(i));
    EXPECT_EQ(st->state(), v1::CONTAINER_EXITED);
    EXPECT_EQ(st->exit_code(), 137);
  }
  EXPECT_EQ(c.connects(), 1u);
  EXPECT_EQ(server.service.calls.load(), 300);
}

TEST(H2UnaryTest, TheServersStatusAndMessageComeBackAndTheConnectionStays) {
  Server server;
  H2UnaryConnection c(server.path);
  auto st = status(c, "missing");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, int(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(st.error().message,
            "an error occurred when try to find container \"missing\": 100% not found");
  ASSERT_TRUE(status(c, "after").ok());
  EXPECT_EQ(c.connects(), 1u);
}

TEST(H2UnaryTest, TheServerIsToldTheDeadline) {
  Server server;
  H2UnaryConnection c(server.path);
  ASSERT_TRUE(status(c, "x", 1500ms).ok());
  EXPECT_GT(server.service.last_deadline_left_ms.load(), 1000);
  EXPECT_LE(server.service.last_deadline_left_ms.load(), 1500);
}

TEST(H2UnaryTest, ACallPastItsDeadlineFailsThenTheNextOneWorks) {
  Server server;
  H2UnaryConnection c(server.path);
  const auto start = Clock::now();
  auto st = status(c, "slow", 300ms);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, int(grpc::StatusCode::DEADLINE_EXCEEDED)) << st.error().message;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1500ms);
  auto next = status(c, "next");
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(next->id(), "next");
}

TEST(H2UnaryTest, CancelEndsACallThatWaits) {
  Server server;
  H2UnaryConnection c(server.path);
  CancelToken cancel;
  std::atomic<bool> done{false};
  Result<v1::ContainerStatus> st = Error{};
  std::thread t([&] {
    st = status(c, "slow", 10s, &cancel);
    done = true;
  });
  ASSERT_TRUE(testing::eventually([&] { return server.service.calls.load() == 1; }, 5s));
  EXPECT_FALSE(done.load());
  cancel.cancel();
  EXPECT_TRUE(testing::eventually([&] { return done.load(); }, 2s));
  t.join();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, int(grpc::StatusCode::CANCELLED));
  // A cancelled token fails the next call at once, without sending it.
  auto later = status(c, "later", 2s, &cancel);
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.error().code, int(grpc::StatusCode::CANCELLED));
  EXPECT_EQ(server.service.calls.load(), 1);
}

// The runtime restarted while the connection was idle: the next call notices the closed
// connection and is made on a new one, instead of failing.
TEST(H2UnaryTest, AServerRestartedBetweenCallsIsReconnectedTo) {
  auto server = std::make_unique<Server>();
  const std::string path = server->path;
  H2UnaryConnection c(path);
  ASSERT_TRUE(status(c, "before").ok());
  server.reset();
  auto down = status(c, "while-down");
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().code, int(grpc::StatusCode::UNAVAILABLE));
  EXPECT_NE(down.error().message.find(path), std::string::npos) << down.error().message;
  server = std::make_unique<Server>(path);
  auto after = status(c, "after");
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_EQ(after->id(), "after");
  EXPECT_EQ(c.connects(), 2u);
}

// The same, with the server gone and back between two calls and nothing in between: the call
// on the connection the old server closed is made again on a new one.
TEST(H2UnaryTest, AConnectionClosedWhileIdleIsReplacedWithoutFailingTheCall) {
  auto server = std::make_unique<Server>();
  const std::string path = server->path;
  H2UnaryConnection c(path);
  ASSERT_TRUE(status(c, "before").ok());
  server.reset();
  server = std::make_unique<Server>(path);
  auto after = status(c, "after");
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_EQ(c.connects(), 2u);
}

TEST(H2UnaryTest, NoServerIsUnavailableAndNamesTheSocket) {
  const std::string path = socket_path();
  H2UnaryConnection c(path);
  const auto start = Clock::now();
  auto st = status(c, "x", 5s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, int(grpc::StatusCode::UNAVAILABLE));
  EXPECT_NE(st.error().message.find(path), std::string::npos) << st.error().message;
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(H2UnaryTest, AnAnswerOverTheLimitFailsTheCall) {
  Server server;
  H2UnaryOptions o;
  o.max_message_bytes = 64 * 1024;
  H2UnaryConnection c(server.path, o);
  auto st = status(c, "big");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, int(grpc::StatusCode::RESOURCE_EXHAUSTED)) << st.error().message;
  ASSERT_TRUE(status(c, "small").ok());
  H2UnaryConnection roomy(server.path);
  auto big = status(roomy, "big");
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big->labels().at("big").size(), size_t(1) << 20);
}

TEST(H2UnaryTest, AServerWithoutTheMethodIsUnimplemented) {
  Server server;
  H2UnaryConnection c(server.path);
  auto r = c.call("/runtime.v1.RuntimeService/NoSuchMethod", "", Clock::now() + 2s, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, int(grpc::StatusCode::UNIMPLEMENTED)) << r.error().message;
}

TEST(H2UnaryTest, ThePoolServesThreadsWithAConnectionEachAtMost) {
  Server server;
  H2UnaryPool pool(server.path, 4);
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string id = std::to_string(t) + "-" + std::to_string(i);
        auto r = pool.call(kStatus, request(id), Clock::now() + 2s, nullptr);
        v1::ContainerStatusResponse resp;
        if (!r || !resp.ParseFromString(*r) || resp.status().id() != id) ++wrong;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(server.service.calls.load(), 800);
  EXPECT_GE(pool.connects(), 1u);
  EXPECT_LE(pool.connects(), 4u);
}

// A gRPC server on nghttp2, one connection at a time, that sends a PING (payload: the number of
// the request) before each answer, as a gRPC-Go server's bandwidth estimator does. It logs, in
// the order it read them, each request ("req N") and each PING answer ("ack N").
class PingingServer {
 public:
  PingingServer() : path_(socket_path()) {
    lfd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    if (bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd_, 4) != 0)
      ADD_FAILURE() << "listen on " << path_ << ": " << std::strerror(errno);
    if (pipe(stop_) != 0) ADD_FAILURE() << "pipe";
    thread_ = std::thread([this] { serve(); });
  }
  ~PingingServer() {
    (void)!write(stop_[1], "x", 1);
    thread_.join();
    close(lfd_);
    close(stop_[0]);
    close(stop_[1]);
    unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> log() const {
    std::lock_guard lk(mu_);
    return log_;
  }

 private:
  struct Conn {
    PingingServer* server;
    nghttp2_session* session = nullptr;
    std::string body;  // the framed answer
    size_t sent = 0;
  };

  static int on_frame(nghttp2_session* session, const nghttp2_frame* f, void* user) {
    auto* c = static_cast<Conn*>(user);
    if (f->hd.type == NGHTTP2_PING && (f->hd.flags & NGHTTP2_FLAG_ACK)) {
      uint64_t n = 0;
      std::memcpy(&n, f->ping.opaque_data, sizeof(n));
      c->server->add("ack " + std::to_string(n));
      return 0;
    }
    // A request's end (its DATA, with END_STREAM): a PING, then the answer.
    if (f->hd.type != NGHTTP2_DATA || !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
    const uint64_t n = c->server->requests_++;
    c->server->add("req " + std::to_string(n));
    uint8_t payload[8];
    std::memcpy(payload, &n, sizeof(payload));
    nghttp2_submit_ping(session, NGHTTP2_FLAG_NONE, payload);
    v1::ContainerStatusResponse resp;
    resp.mutable_status()->set_id("c" + std::to_string(n));
    const std::string msg = resp.SerializeAsString();
    c->body.assign(5, '\0');
    c->body[4] = char(msg.size());
    c->body += msg;
    c->sent = 0;
    const nghttp2_nv headers[] = {nv(":status", "200"), nv("content-type", "application/grpc")};
    nghttp2_data_provider data{};
    data.read_callback = [](nghttp2_session* s, int32_t id, uint8_t* buf, size_t len,
                            uint32_t* flags, nghttp2_data_source*, void* u) -> ssize_t {
      auto* c = static_cast<Conn*>(u);
      const size_t n = std::min(len, c->body.size() - c->sent);
      std::memcpy(buf, c->body.data() + c->sent, n);
      c->sent += n;
      if (c->sent == c->body.size()) {
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        const nghttp2_nv trailers[] = {nv("grpc-status", "0")};
        nghttp2_submit_trailer(s, id, trailers, 1);
      }
      return ssize_t(n);
    };
    nghttp2_submit_response(session, f->hd.stream_id, headers, 2, &data);
    return 0;
  }
  static nghttp2_nv nv(const char* name, const char* value) {
    return {const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(name)),
            const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(value)), std::strlen(name),
            std::strlen(value), NGHTTP2_NV_FLAG_NONE};
  }
  void add(std::string line) {
    std::lock_guard lk(mu_);
    log_.push_back(std::move(line));
  }

  void serve() {
    for (;;) {
      pollfd p[2] = {{lfd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (poll(p, 2, -1) < 0 || (p[1].revents & POLLIN)) return;
      const int fd = accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      if (!talk(fd)) {
        close(fd);
        return;
      }
      close(fd);
    }
  }
  // One connection until the client closes it; false when told to stop.
  bool talk(int fd) {
    Conn c{this};
    nghttp2_session_callbacks* cbs = nullptr;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame);
    nghttp2_session_server_new(&c.session, cbs, &c);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(c.session, NGHTTP2_FLAG_NONE, nullptr, 0);
    bool go_on = true;
    for (;;) {
      const uint8_t* out = nullptr;
      for (ssize_t n; (n = nghttp2_session_mem_send(c.session, &out)) > 0;)
        if (send(fd, out, size_t(n), MSG_NOSIGNAL) != n) break;
      pollfd p[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (poll(p, 2, -1) < 0) break;
      if (p[1].revents & POLLIN) {
        go_on = false;
        break;
      }
      char buf[16384];
      const ssize_t got = recv(fd, buf, sizeof(buf), 0);
      if (got <= 0) break;
      if (nghttp2_session_mem_recv(c.session, reinterpret_cast<uint8_t*>(buf), size_t(got)) < 0)
        break;
    }
    nghttp2_session_del(c.session);
    return go_on;
  }

  const std::string path_;
  int lfd_ = -1;
  int stop_[2] = {-1, -1};
  uint64_t requests_ = 0;  // on the server's thread
  mutable std::mutex mu_;
  std::vector<std::string> log_;
  std::thread thread_;
};

// Each call brings a PING: with no hold, its answer goes out after the next request, not before
// it (a gRPC-Go server then sends its next PING one request later, not with every request).
TEST(H2UnaryTest, TheServersPingIsAnsweredAfterTheNextRequest) {
  PingingServer server;
  H2UnaryOptions o;
  o.ping_ack_hold = std::chrono::milliseconds(0);
  H2UnaryConnection c(server.path(), o);
  for (int i = 0; i < 3; ++i) {
    auto st = status(c, "x");
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->id(), "c" + std::to_string(i));
  }
  ASSERT_TRUE(testing::eventually([&] { return server.log().size() == 5; }, 2s));
  EXPECT_EQ(server.log(),
            (std::vector<std::string>{"req 0", "req 1", "ack 0", "req 2", "ack 1"}));
  EXPECT_EQ(c.connects(), 1u);
}

// With a hold, a PING is answered with the first request made once it is that old, and every
// PING due by then with it; a younger one stays held.
TEST(H2UnaryTest, AHeldPingIsAnsweredWithTheFirstRequestOnceItIsOld) {
  PingingServer server;
  H2UnaryOptions o;
  o.ping_ack_hold = std::chrono::milliseconds(1000);
  H2UnaryConnection c(server.path(), o);
  const auto first = Clock::now();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(status(c, "x").ok());
  // The server logs a request before it answers: everything before the answer is in the log.
  EXPECT_EQ(server.log(), (std::vector<std::string>{"req 0", "req 1", "req 2"}));
  // Every PING came with its answer: all three have been read by now.
  const auto read = Clock::now();
  ASSERT_LT(read - first, 900ms);
  // The hold is the behaviour under test: let it pass.
  std::this_thread::sleep_until(read + 1000ms);
  ASSERT_TRUE(status(c, "x").ok());
  ASSERT_TRUE(testing::eventually([&] { return server.log().size() >= 7; }, 2s));
  EXPECT_EQ(server.log(), (std::vector<std::string>{"req 0", "req 1", "req 2", "req 3", "ack 0",
                                                    "ack 1", "ack 2"}));
}

}  // namespace
}  // namespace kpleg::cri

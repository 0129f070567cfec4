// The nghttp2 reader of a server stream against a real grpc++ server on a unix socket: every
// message in order (large ones spanning frames included), the server's status and message,
// UNIMPLEMENTED for a server without the method, cancellation of a read that waits, a server
// that is not there or never answers, and the message size limit. The same read on an event
// loop (H2StreamReader): every message and the end, on the loop's thread, none of it blocking it.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "cri/api.grpc.pb.h"
#include "cri/h2_stream.h"
#include "pleg/event_loop.h"
#include "support/eventually.h"

namespace kpleg::cri {
namespace {

using namespace std::chrono_literals;
namespace v1 = ::runtime::v1;
constexpr std::string_view kMethod = "/runtime.v1.RuntimeService/GetContainerEvents";

// What the test server's GetContainerEvents does.
struct Script {
  int events = 0;
  size_t big_label_bytes = 0;      // one more event with a label this large
  bool wait_for_cancel = false;    // then block until the client goes away
  std::chrono::milliseconds first_after{0};  // send nothing at all for this long first
  std::chrono::milliseconds gap{0};          // between one event and the next
  int events_after_wait = 0;                 // then this many more events
  grpc::Status end = grpc::Status::OK;
};

class EventsService final : public v1::RuntimeService::Service {
 public:
  explicit EventsService(Script s) : s_(std::move(s)) {}
  grpc::Status GetContainerEvents(grpc::ServerContext* ctx, const v1::GetEventsRequest*,
                                  grpc::ServerWriter<v1::ContainerEventResponse>* w) override {
    std::this_thread::sleep_for(s_.first_after);  // a quiet runtime
    for (int i = 0; i < s_.events + s_.events_after_wait; ++i) {
      if (i > 0) std::this_thread::sleep_for(s_.gap);
      v1::ContainerEventResponse ev;
      ev.set_container_id("c" + std::to_string(i));
      ev.set_container_event_type(v1::CONTAINER_STOPPED_EVENT);
      ev.set_created_at(1000 + i);
      auto* st = ev.add_containers_statuses();
      st->set_id(ev.container_id());
      st->set_exit_code(i % 256);
      (*st->mutable_labels())["io.kubernetes.pod.uid"] = "uid-" + std::to_string(i);
      if (!w->Write(ev)) return grpc::Status::CANCELLED;
    }
    if (s_.big_label_bytes > 0) {
      v1::ContainerEventResponse ev;
      ev.set_container_id("big");
      (*ev.add_containers_statuses()->mutable_labels())["big"] = std::string(s_.big_label_bytes, 'x');
      w->Write(ev);
    }
    if (s_.wait_for_cancel) (void)testing::eventually([&] { return ctx->IsCancelled(); }, 60s, 5ms);
    return s_.end;
  }

 private:
  Script s_;
};

std::string socket_path() {
  static int n = 0;
  return "/tmp/kpleg-h2-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
}

struct Server {
  std::string path = socket_path();
  std::unique_ptr<v1::RuntimeService::Service> service;
  std::unique_ptr<grpc::Server> server;
  // Without a script: the generated service's own GetContainerEvents, which is UNIMPLEMENTED.
  explicit Server(std::optional<Script> script) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
    if (script) {
      service = std::make_unique<EventsService>(*script);
    } else {
      service = std::make_unique<v1::RuntimeService::Service>();
    }
    b.RegisterService(service.get());
    server = b.BuildAndStart();
  }
  ~Server() {
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    unlink(path.c_str());
  }
};

struct Read {
  std::vector<v1::ContainerEventResponse> events;
  Status status;
};

Read read_all(const std::string& path, CancelToken& cancel, H2StreamOptions opts = {},
              std::function<void()> after_each = {}) {
  Read r;
  r.status = h2_server_stream(
      path, kMethod, v1::GetEventsRequest{}.SerializeAsString(), cancel,
      [&](std::string_view m) {
        v1::ContainerEventResponse ev;
        if (!ev.ParseFromArray(m.data(), int(m.size()))) return false;
        r.events.push_back(std::move(ev));
        if (after_each) after_each();
        return true;
      },
      opts);
  return r;
}

TEST(H2StreamTest, EveryMessageArrivesInOrderThenTheServersStatusAndMessage) {
  Script s;
  s.events = 2000;
  s.big_label_bytes = 200 * 1024;  // spans many HTTP/2 frames
  s.end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away: 100% done");
  Server server(s);
  CancelToken cancel;
  auto r = read_all(server.path, cancel);
  ASSERT_EQ(r.events.size(), 2001u);
  for (int i = 0; i < 2000; ++i) {
    const auto& ev = r.events[i];
    ASSERT_EQ(ev.container_id(), "c" + std::to_string(i));
    EXPECT_EQ(ev.created_at(), 1000 + i);
    EXPECT_EQ(ev.container_event_type(), v1::CONTAINER_STOPPED_EVENT);
    ASSERT_EQ(ev.containers_statuses_size(), 1);
    EXPECT_EQ(ev.containers_statuses(0).exit_code(), i % 256);
    EXPECT_EQ(ev.containers_statuses(0).labels().at("io.kubernetes.pod.uid"), "uid-" + std::to_string(i));
  }
  EXPECT_EQ(r.events.back().containers_statuses(0).labels().at("big").size(), 200u * 1024);
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.error().code, int(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(r.status.error().message, "going away: 100% done");
}

TEST(H2StreamTest, AStreamTheServerEndsWithOkIsOk) {
  Script s;
  s.events = 3;
  Server server(s);
  CancelToken cancel;
  auto r = read_all(server.path, cancel);
  EXPECT_EQ(r.events.size(), 3u);
  EXPECT_TRUE(r.status.ok()) << r.status.error().message;
}

TEST(H2StreamTest, AServerWithoutTheMethodIsUnimplemented) {
  Server server(std::nullopt);
  CancelToken cancel;
  auto r = read_all(server.path, cancel);
  EXPECT_TRUE(r.events.empty());
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.error().code, int(grpc::StatusCode::UNIMPLEMENTED)) << r.status.error().message;
}

TEST(H2StreamTest, CancelEndsAReadThatWaitsForTheNextMessage) {
  Script s;
  s.events = 1;
  s.wait_for_cancel = true;
  Server server(s);
  CancelToken cancel;
  std::atomic<bool> got{false};
  std::thread canceller([&] {
    kpleg::testing::eventually([&] { return got.load(); }, 10s);
    cancel.cancel();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = read_all(server.path, cancel, {}, [&] { got = true; });
  canceller.join();
  EXPECT_EQ(r.events.size(), 1u);
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.error().code, int(grpc::StatusCode::CANCELLED));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(H2StreamTest, NoServerIsUnavailableAndNamesTheSocket) {
  CancelToken cancel;
  auto r = read_all("/tmp/kpleg-h2-test-nonexistent.sock", cancel);
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.error().code, int(grpc::StatusCode::UNAVAILABLE));
  EXPECT_NE(r.status.error().message.find("/tmp/kpleg-h2-test-nonexistent.sock"), std::string::npos)
      << r.status.error().message;
}

TEST(H2StreamTest, AQuietServerIsWaitedForWithoutADeadline) {
  // Like grpc-go, grpc++ sends the response headers with the first message: a runtime with no
  // event to send says nothing at all, and the stream must stay open.
  Script s;
  s.events = 0;
  s.first_after = 1500ms;
  s.events_after_wait = 1;
  Server server(s);
  CancelToken cancel;
  auto r = read_all(server.path, cancel);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_TRUE(r.status.ok()) << r.status.error().message;
}

TEST(H2StreamTest, AServerThatNeverAnswersIsWaitedForUntilCancelled) {
  const std::string path = socket_path();
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, path.c_str());
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(lfd, 4), 0);  // accepted by the kernel, never read or answered
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(300ms);  // the call must still be waiting then
    cancel.cancel();
  });
  auto r = read_all(path, cancel);
  canceller.join();
  close(lfd);
  unlink(path.c_str());
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.error().code, int(grpc::StatusCode::CANCELLED)) << r.status.error().message;
}

TEST(H2StreamTest, AMessageOverTheLimitEndsTheCall) {
  Script s;
  s.events = 2;
  s.big_label_bytes = 64 * 1024;
  Server server(s);
  CancelToken cancel;
  H2StreamOptions o;
  o.max_message_bytes = 16 * 1024;
  auto r = read_all(server.path, cancel, o);
  EXPECT_EQ(r.events.size(), 2u) << "the messages before it arrive";
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.error().code, int(grpc::StatusCode::RESOURCE_EXHAUSTED)) << r.status.error().message;
}

TEST(H2StreamTest, AMessageThatDoesNotParseEndsTheCall) {
  Script s;
  s.events = 5;
  Server server(s);
  CancelToken cancel;
  int seen = 0;
  auto st = h2_server_stream(server.path, kMethod, "", cancel,
                             [&](std::string_view) { return ++seen < 3; });
  EXPECT_EQ(seen, 3);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, int(grpc::StatusCode::INTERNAL));
}

TEST(H2StreamTest, OnAnEventLoopEveryMessageAndTheEndArriveOnTheLoop) {
  Script s;
  s.events = 500;
  s.big_label_bytes = 200 * 1024;
  s.end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away");
  Server server(s);
  pleg::EventLoop loop;
  loop.start("test-loop");
  std::unique_ptr<H2StreamReader> reader;
  std::atomic<int> received{0};
  std::atomic<bool> on_loop{true}, ended{false};
  Status end;
  loop.call([&] {
    reader = std::make_unique<H2StreamReader>(loop);
    reader->start(
        server.path, kMethod, v1::GetEventsRequest{}.SerializeAsString(),
        [&](std::string_view m) {
          v1::ContainerEventResponse ev;
          if (!ev.ParseFromArray(m.data(), int(m.size()))) return false;
          if (ev.container_id() != "c" + std::to_string(received.load()) && received < 500)
            return false;
          if (!loop.in_loop()) on_loop = false;
          ++received;
          return true;
        },
        [&](Status st) {
          if (!loop.in_loop()) on_loop = false;
          end = st;
          ended = true;
        });
  });
  // The loop stays free meanwhile: a call made now is answered.
  EXPECT_EQ(loop.call([] { return 1; }), 1);
  ASSERT_TRUE(testing::eventually([&] { return ended.load(); }, 10s));
  EXPECT_EQ(received.load(), 501);
  EXPECT_TRUE(on_loop.load());
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, int(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(end.error().message, "going away");
  loop.call([&] { reader.reset(); });
  loop.stop();
}

// A reader held off after its first message reads nothing until the hold ends, then the rest
// together; resume() ends a hold at once.
struct HeldRead {
  pleg::EventLoop loop;
  std::unique_ptr<H2StreamReader> reader;
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> at;  // each message's arrival
  std::chrono::steady_clock::time_point held_at;

  HeldRead(const std::string& path, std::chrono::milliseconds hold) {
    loop.start("test-loop");
    loop.call([&, hold] {
      reader = std::make_unique<H2StreamReader>(loop);
      reader->start(
          path, kMethod, v1::GetEventsRequest{}.SerializeAsString(),
          [this, hold](std::string_view) {
            const auto now = std::chrono::steady_clock::now();
            std::lock_guard lk(mu);
            at.push_back(now);
            if (at.size() == 1) {
              held_at = now;
              reader->hold(now + hold);
            }
            return true;
          },
          [](Status) {});
    });
  }
  ~HeldRead() {
    loop.call([&] { reader.reset(); });
    loop.stop();
  }
  size_t received() {
    std::lock_guard lk(mu);
    return at.size();
  }
};

// `n` events 50 ms apart, then the stream stays open.
Script spaced(int n) {
  Script s;
  s.events = n;
  s.gap = 50ms;
  s.wait_for_cancel = true;
  return s;
}

TEST(H2StreamTest, AHeldReaderReadsWhatCameMeanwhileTogetherWhenTheHoldEnds) {
  Server server(spaced(3));
  HeldRead r(server.path, 600ms);
  ASSERT_TRUE(testing::eventually([&] { return r.received() == 3; }, 10s));
  std::lock_guard lk(r.mu);
  // The 2nd and 3rd were sent 50 and 100 ms after the 1st: both waited for the hold's end.
  EXPECT_GE(r.at[1] - r.held_at, 550ms);
  EXPECT_LT(r.at[2] - r.at[1], 50ms) << "read apart, not together";
}

// The hold's end waits up to a quarter of the hold for another of the loop's wakeups, and goes
// with the first that comes.
TEST(H2StreamTest, AHoldsEndGoesWithTheLoopsNextWakeupOrAQuarterOfTheHoldLater) {
  // A hold of 800 ms ends with the loop's first wakeup from 800 ms on, at 1,000 ms at the
  // latest: the bounds below leave 170 ms either way for a loaded machine.
  {
    Server server(spaced(2));
    HeldRead r(server.path, 800ms);
    ASSERT_TRUE(testing::eventually([&] { return r.received() == 2; }, 10s));
    std::lock_guard lk(r.mu);
    EXPECT_GE(r.at[1] - r.held_at, 990ms) << "nothing else woke the loop: the hold's end waited";
  }
  Server server(spaced(2));
  HeldRead r(server.path, 800ms);
  ASSERT_TRUE(testing::eventually([&] { return r.received() == 1; }, 10s));
  const auto held_at = [&] {
    std::lock_guard lk(r.mu);
    return r.held_at;
  }();
  r.loop.call([&] { r.loop.at(held_at + 820ms, [] {}, "another"); });
  ASSERT_TRUE(testing::eventually([&] { return r.received() == 2; }, 10s));
  std::lock_guard lk(r.mu);
  EXPECT_GE(r.at[1] - held_at, 820ms);
  EXPECT_LT(r.at[1] - held_at, 990ms) << "the hold's end did not go with the loop's wakeup";
}

TEST(H2StreamTest, ResumeEndsAHoldAtOnce) {
  Server server(spaced(2));
  HeldRead r(server.path, 60s);
  ASSERT_TRUE(testing::eventually([&] { return r.received() == 1; }, 10s));
  // The 2nd is sent 50 ms after the 1st and waits in the socket.
  EXPECT_FALSE(testing::eventually([&] { return r.received() == 2; }, 300ms)) << "not held";
  r.loop.call([&] { r.reader->resume(); });
  EXPECT_TRUE(testing::eventually([&] { return r.received() == 2; }, 5s));
}

TEST(H2StreamTest, ReadQueuedHandsOnWhatCameWhileHeldAtOnce) {
  Server server(spaced(2));
  HeldRead r(server.path, 60s);
  ASSERT_TRUE(testing::eventually([&] { return r.received() == 1; }, 10s));
  EXPECT_FALSE(testing::eventually([&] { return r.received() == 2; }, 300ms)) << "not held";
  // Within the call: no turn of the loop in between.
  EXPECT_EQ(r.loop.call([&] {
    r.reader->read_queued();
    return r.received();
  }),
            2u);
}

}  // namespace
}  // namespace kpleg::cri

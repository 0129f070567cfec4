// kpleg-bench-watch-write: what one Watch event costs the serving process on its way to a
// consumer, by the way the server writes it:
//   sync      grpc++'s synchronous API, as kplegd's Watch does: a handler thread per stream,
//             woken for each event by the publisher, writes it and waits for the write;
//             gRPC set up as kplegd sets it up (its poll engine, grpcidle, one poller);
//   callback  grpc++'s callback API: the publisher starts the write itself (StartWrite) and
//             gRPC completes it (OnWriteDone);
//   async     grpc++'s asynchronous API for the Watch method alone, the publisher as the stream's
//             only writer: it starts each write (which gRPC does on its thread, inline) and
//             collects the completions without waiting, at its next event; the stream's call is
//             bound to a completion queue no thread waits on, and the new-call queue does not
//             listen, so no thread of gRPC's own is woken by a write;
//   direct    no grpc++: one connection served with nghttp2, each event framed and handed to
//             send(2) on the publisher's thread, and one thread blocked in poll(2) for what the
//             consumer sends (its request, SETTINGS, WINDOW_UPDATEs, PINGs). A sketch of a
//             writer of kplegd's own, to know its floor: one stream, no TLS, no limits.
// The consumer is a child process that reads the stream with grpc++ (which sends a
// WINDOW_UPDATE after every message it reads) or with kpleg's nghttp2 reader (cri/h2_stream.h,
// a 16 MiB window: an update almost never). The publisher (the main thread) sends --events
// events --gap-ms apart without waiting for their writes, as kplegd's publisher does under
// churn; it waits once, at the end, until every event was written. Per thread of the serving
// process: runs (schedstat's timeslices, i.e. wakeups) and CPU per event. The publisher's
// thread is reported apart: its sleeps between events are the benchmark's pacing, where
// kplegd's publishing thread is awake anyway.
//
// Prints one JSON object; exits 1 when the consumer did not read every event.
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <nghttp2/nghttp2.h>
#include <nlohmann/json.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cri/h2_common.h"
#include "cri/h2_stream.h"
#include "grpcidle/grpc_idle.h"
#include "kpleg/v1/pleg.grpc.pb.h"

namespace {

namespace v1 = kpleg::v1;
using namespace std::chrono_literals;

struct TaskStat {
  std::string name;
  long runs = 0;
  long on_cpu_ns = 0;
};

// Every thread of this process by tid: its name, timeslices run and time on a CPU.
std::map<long, TaskStat> task_stats() {
  std::map<long, TaskStat> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (auto* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(dir + "/comm"), sched(dir + "/schedstat");
    TaskStat t;
    long wait_ns = 0;
    if (!std::getline(comm, t.name) || !(sched >> t.on_cpu_ns >> wait_ns >> t.runs)) continue;
    out[std::stol(e->d_name)] = t;
  }
  closedir(d);
  return out;
}

v1::Event event_numbered(uint64_t n) {
  v1::Event ev;
  ev.set_seq(n + 1);
  ev.set_pod_uid("6b1f3b8e-6f4e-4f43-9d59-2d3c1f0e9a11");
  ev.set_container_id(std::string(64, 'c'));
  ev.set_pod_name("web-7d4b9c8f6-x2kqp");
  ev.set_pod_namespace("default");
  ev.set_container_name("app");
  ev.set_type(v1::EVENT_TYPE_CONTAINER_STARTED);
  ev.set_kernel_ts_ns(1'700'000'000'000'000'000 + n);
  return ev;
}

// What the publisher waits on: the stream in place, and (only at the end) every event written.
struct Progress {
  explicit Progress(uint64_t n) : events(n) {}
  const uint64_t events;
  std::mutex mu;
  std::condition_variable cv;
  bool connected = false;
  std::atomic<uint64_t> written{0};
  // Counts a written event; the publisher is woken by the last one only, so that it costs the
  // writer nothing per event (kplegd's publisher does not wait for its events' writes).
  void count_written() {
    if (written.fetch_add(1) + 1 == events) set([] {});
  }
  void set(const std::function<void()>& f) {
    {
      std::lock_guard lk(mu);
      f();
    }
    cv.notify_all();
  }
  bool wait(const std::function<bool()>& pred) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 10s, pred);
  }
};

// The writer kplegd's Watch uses: the handler thread takes each event from a queue.
class SyncWatch final : public v1::PodLifecycle::Service {
 public:
  explicit SyncWatch(Progress& p) : progress_(p) {}
  void publish(std::optional<uint64_t> n) {  // nullopt ends the stream
    {
      std::lock_guard lk(mu_);
      queue_.push_back(n);
    }
    cv_.notify_one();
  }
  grpc::Status Watch(grpc::ServerContext*, const v1::WatchRequest*,
                     grpc::ServerWriter<v1::Event>* writer) override {
    writer->SendInitialMetadata();
    progress_.set([&] { progress_.connected = true; });
    for (;;) {
      std::optional<uint64_t> n;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !queue_.empty(); });
        n = queue_.front();
        queue_.pop_front();
      }
      if (!n) return grpc::Status::OK;
      if (!writer->Write(event_numbered(*n))) return grpc::Status::CANCELLED;
      progress_.count_written();
    }
  }

 private:
  Progress& progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::optional<uint64_t>> queue_;
};

// The callback API: the publisher's thread starts each write; one asked for while another is
// in flight waits for it, and OnWriteDone starts it.
class CallbackWatch final : public v1::PodLifecycle::CallbackService {
  class Reactor final : public grpc::ServerWriteReactor<v1::Event> {
   public:
    explicit Reactor(Progress& p) : progress_(p) { StartSendInitialMetadata(); }
    void publish(std::optional<uint64_t> n) {  // nullopt ends the stream
      std::lock_guard lk(mu_);
      if (writing_) {
        pending_.push_back(n);
        return;
      }
      start(n);
    }
    void OnSendInitialMetadataDone(bool) override {
      progress_.set([&] { progress_.connected = true; });
    }
    void OnWriteDone(bool) override {
      progress_.count_written();
      std::lock_guard lk(mu_);
      writing_ = false;
      if (pending_.empty()) return;
      auto n = pending_.front();
      pending_.pop_front();
      start(n);
    }
    void OnDone() override { delete this; }

   private:
    void start(std::optional<uint64_t> n) {  // mu_ held
      if (!n) {
        Finish(grpc::Status::OK);
        return;
      }
      writing_ = true;
      current_ = event_numbered(*n);
      StartWrite(&current_);
    }
    Progress& progress_;
    std::mutex mu_;
    bool writing_ = false;
    std::deque<std::optional<uint64_t>> pending_;
    v1::Event current_;
  };

 public:
  explicit CallbackWatch(Progress& p) : progress_(p) {}
  grpc::ServerWriteReactor<v1::Event>* Watch(grpc::CallbackServerContext*,
                                             const v1::WatchRequest*) override {
    auto* r = new Reactor(progress_);  // may call back at once: made before the lock
    std::lock_guard lk(progress_.mu);
    reactor_ = r;
    return r;
  }
  Reactor* reactor() {
    std::lock_guard lk(progress_.mu);
    return reactor_;
  }

 private:
  Progress& progress_;
  Reactor* reactor_ = nullptr;
};

// The async writer: see the top of the file.
class AsyncWatch {
 public:
  using Service = v1::PodLifecycle::WithAsyncMethod_Watch<v1::PodLifecycle::Service>;
  explicit AsyncWatch(Progress& p) : progress_(p) {}
  ~AsyncWatch() {
    join();
    call_cq_.Shutdown();
    void* tag;
    bool ok;
    while (call_cq_.Next(&tag, &ok)) {
    }
  }
  // After the new-call queue was shut down, before it goes.
  void join() {
    if (acceptor_.joinable()) acceptor_.join();
  }
  Service& service() { return service_; }

  // After the server started: asks for the consumer's call, which a thread waits for.
  void start(grpc::ServerCompletionQueue* notify) {
    service_.RequestWatch(&ctx_, &request_, &writer_, &call_cq_, notify, this);
    acceptor_ = std::thread([this, notify] {
      void* tag;
      bool ok;
      if (notify->Next(&tag, &ok) && ok) {
        writer_.SendInitialMetadata(&metadata_tag_);
        progress_.set([&] { progress_.connected = true; });
      }
      while (notify->Next(&tag, &ok)) {  // until the queue shuts down
      }
    });
  }

  void publish(std::optional<uint64_t> n) {  // nullopt ends the stream
    collect(std::chrono::system_clock::time_point{});
    pending_.push_back(n);
    next();
  }
  // Waits for the writes still in flight (the end of the run), `until` at most.
  void wait_written(std::chrono::steady_clock::time_point until) {
    while (progress_.written.load() < progress_.events && std::chrono::steady_clock::now() < until)
      collect(std::chrono::system_clock::now() + 10ms);
  }

 private:
  // The completions there are, waiting for them until `until`.
  void collect(std::chrono::system_clock::time_point until) {
    void* tag;
    bool ok;
    while (call_cq_.AsyncNext(&tag, &ok, until) == grpc::CompletionQueue::GOT_EVENT) {
      if (tag == &write_tag_) {
        writing_ = false;
        if (ok) progress_.count_written();
        next();
      }
      until = std::chrono::system_clock::time_point{};
    }
  }
  void next() {
    if (writing_ || finished_ || pending_.empty()) return;
    auto n = pending_.front();
    pending_.pop_front();
    if (!n) {
      finished_ = true;
      writer_.Finish(grpc::Status::OK, &finish_tag_);
      return;
    }
    writing_ = true;
    current_ = event_numbered(*n);
    writer_.Write(current_, &write_tag_);
  }

  Progress& progress_;
  Service service_;
  grpc::ServerContext ctx_;
  v1::WatchRequest request_;
  grpc::ServerAsyncWriter<v1::Event> writer_{&ctx_};
  grpc::CompletionQueue call_cq_;
  std::thread acceptor_;
  int metadata_tag_ = 0, write_tag_ = 0, finish_tag_ = 0;
  bool writing_ = false, finished_ = false;
  std::deque<std::optional<uint64_t>> pending_;
  v1::Event current_;
};

// The direct writer: see the top of the file.
class DirectWatch {
 public:
  explicit DirectWatch(Progress& p) : progress_(p) {}
  ~DirectWatch() {
    if (reader_.joinable()) {
      {
        std::lock_guard lk(mu_);
        stopping_ = true;
      }
      shutdown(listen_fd_, SHUT_RDWR);  // ends an accept() still waiting
      uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
      reader_.join();
    }
    if (session_) nghttp2_session_del(session_);
    for (int fd : {fd_, listen_fd_, wake_fd_})
      if (fd >= 0) close(fd);
  }

  bool listen_on(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (listen_fd_ < 0 || wake_fd_ < 0 ||
        bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 1) != 0)
      return false;
    reader_ = std::thread([this] { serve(); });
    return true;
  }

  void publish(std::optional<uint64_t> n) {  // nullopt ends the stream
    std::lock_guard lk(mu_);
    if (n) {
      const std::string msg = event_numbered(*n).SerializeAsString();
      const auto size = uint32_t(msg.size());
      const char prefix[5] = {0, char(size >> 24), char(size >> 16), char(size >> 8), char(size)};
      out_.append(prefix, 5);
      out_.append(msg);
      ++unsent_;
    } else {
      ending_ = true;
    }
    nghttp2_session_resume_data(session_, stream_);
    nghttp2_session_send(session_);
    if (nghttp2_session_want_write(session_)) {  // the socket is full: the reader's poll sends
      uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
    }
  }

 private:
  static ssize_t on_send(nghttp2_session*, const uint8_t* data, size_t len, int, void* user) {
    auto* w = static_cast<DirectWatch*>(user);
    ssize_t n = send(w->fd_, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return NGHTTP2_ERR_WOULDBLOCK;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  // The request's end: the response's headers, then its messages as they come.
  static int on_frame(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
    auto* w = static_cast<DirectWatch*>(user);
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM) || w->stream_ >= 0)
      return 0;
    w->stream_ = frame->hd.stream_id;
    const nghttp2_nv headers[] = {kpleg::cri::h2::header(":status", "200"),
                                  kpleg::cri::h2::header("content-type", "application/grpc")};
    nghttp2_data_provider body{};
    body.read_callback = read_body;
    nghttp2_submit_response(session, w->stream_, headers, std::size(headers), &body);
    w->progress_.set([&] { w->progress_.connected = true; });
    return 0;
  }
  static ssize_t read_body(nghttp2_session* session, int32_t stream, uint8_t* buf, size_t len,
                           uint32_t* flags, nghttp2_data_source*, void* user) {
    auto* w = static_cast<DirectWatch*>(user);
    if (w->out_.empty()) {
      if (!w->ending_) return NGHTTP2_ERR_DEFERRED;
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      const nghttp2_nv trailers[] = {kpleg::cri::h2::header("grpc-status", "0")};
      nghttp2_submit_trailer(session, stream, trailers, std::size(trailers));
      return 0;
    }
    const size_t n = std::min(len, w->out_.size());
    std::memcpy(buf, w->out_.data(), n);
    w->out_.erase(0, n);
    if (w->out_.empty()) {
      for (; w->unsent_ > 0; --w->unsent_) w->progress_.count_written();
    }
    return ssize_t(n);
  }

  void serve() {
    pthread_setname_np(pthread_self(), "direct-reader");
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    {
      std::lock_guard lk(mu_);
      fd_ = fd;
      if (stopping_) return;
      nghttp2_session_callbacks* cbs = nullptr;
      nghttp2_session_callbacks_new(&cbs);
      nghttp2_session_callbacks_set_send_callback(cbs, on_send);
      nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame);
      nghttp2_session_server_new(&session_, cbs, this);
      nghttp2_session_callbacks_del(cbs);
      const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1}};
      nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, 1);
      nghttp2_session_send(session_);
    }
    char buf[16 * 1024];
    for (;;) {
      short events = POLLIN;
      {
        std::lock_guard lk(mu_);
        if (nghttp2_session_want_write(session_)) events |= POLLOUT;
      }
      pollfd fds[2] = {{fd_, events, 0}, {wake_fd_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof(v));
        std::lock_guard lk(mu_);
        if (stopping_) return;
      }
      std::lock_guard lk(mu_);
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t got = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
        if (got == 0) return;  // the consumer went
        if (got > 0 && nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(buf),
                                                size_t(got)) < 0)
          return;
      }
      nghttp2_session_send(session_);
    }
  }

  Progress& progress_;
  int listen_fd_ = -1, fd_ = -1, wake_fd_ = -1;
  std::mutex mu_;  // the session and what it sends
  nghttp2_session* session_ = nullptr;
  int32_t stream_ = -1;
  std::string out_;   // framed messages not given to nghttp2 yet
  uint64_t unsent_ = 0;  // messages in out_
  bool ending_ = false;
  bool stopping_ = false;
  std::thread reader_;
};

// The consumer, in the child: reads until the stream ends; exits 0 when it read `events`.
[[noreturn]] void consume(const std::string& socket, const std::string& reader, uint64_t events) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (access(socket.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);  // the parent binds the socket after the fork
  uint64_t read = 0;
  if (reader == "h2") {
    kpleg::cri::CancelToken cancel;
    for (;;) {
      auto st = kpleg::cri::h2_server_stream(socket, "/kpleg.v1.PodLifecycle/Watch",
                                             v1::WatchRequest{}.SerializeAsString(), cancel,
                                             [&](std::string_view m) {
                                               v1::Event ev;
                                               if (!ev.ParseFromArray(m.data(), int(m.size())))
                                                 return false;
                                               ++read;
                                               return true;
                                             });
      // The socket may be bound before it listens: connect again until the deadline.
      if (!st && read == 0 && st.error().code == grpc::StatusCode::UNAVAILABLE &&
          std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      if (!st)
        std::fprintf(stderr, "kpleg-bench-watch-write: reader: %s\n", st.error().message.c_str());
      break;
    }
  } else {
    auto stub = v1::PodLifecycle::NewStub(
        grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto stream = stub->Watch(&ctx, v1::WatchRequest{});
    v1::Event ev;
    while (stream->Read(&ev)) ++read;
    auto st = stream->Finish();
    if (!st.ok())
      std::fprintf(stderr, "kpleg-bench-watch-write: reader: %s\n", st.error_message().c_str());
  }
  std::_Exit(read == events ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kpleg-bench-watch-write: the serving process's cost of one Watch event, by writer"};
  std::string writer = "sync", reader = "grpc";
  uint64_t events = 200;
  int gap_ms = 50;
  app.add_option("--writer", writer, "sync (kplegd's Watch), callback, async or direct")
      ->check(CLI::IsMember({"sync", "callback", "async", "direct"}))
      ->capture_default_str();
  app.add_option("--reader", reader, "The consumer: grpc (grpc++) or h2 (kpleg's nghttp2 reader)")
      ->check(CLI::IsMember({"grpc", "h2"}))
      ->capture_default_str();
  app.add_option("--events", events, "Events to publish")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--gap-ms", gap_ms, "Pause between events")
      ->check(CLI::Range(0, 10'000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  setenv("GRPC_POLL_STRATEGY", "poll", 0);  // as kplegd (cmd/kplegd/main.cc)
  // gRPC's background threads as in kplegd (grpcidle.h); before any gRPC object exists.
  if (auto note = kpleg::grpcidle::install(); !note.empty())
    std::fprintf(stderr, "kpleg-bench-watch-write: %s\n", note.c_str());

  const std::string socket = "/tmp/kpleg-bench-watch-write-" + std::to_string(getpid()) + ".sock";
  unlink(socket.c_str());
  // The consumer is forked before gRPC starts any thread here.
  const pid_t child = fork();
  if (child < 0) {
    std::perror("kpleg-bench-watch-write: fork");
    return 2;
  }
  if (child == 0) consume(socket, reader, events);

  Progress progress(events);
  SyncWatch sync_service(progress);
  CallbackWatch callback_service(progress);
  DirectWatch direct(progress);
  AsyncWatch async_service(progress);
  std::unique_ptr<grpc::ServerCompletionQueue> notify_cq;
  std::unique_ptr<grpc::Server> server;
  bool listening = false;
  if (writer == "direct") {
    listening = direct.listen_on(socket);
  } else {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + socket, grpc::InsecureServerCredentials());
    // kplegd's sync server options (api/api_server.cc): one poller, no periodic poller wakeup.
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC,
                                3600 * 1000);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1);
    if (writer == "sync") {
      builder.RegisterService(&sync_service);
    } else if (writer == "async") {
      builder.RegisterService(&async_service.service());
      notify_cq = builder.AddCompletionQueue(/*is_frequently_polled=*/false);
    } else {
      builder.RegisterService(&callback_service);
    }
    server = builder.BuildAndStart();
    listening = server != nullptr;
    if (listening && notify_cq) async_service.start(notify_cq.get());
  }
  if (!listening || !progress.wait([&] { return progress.connected; })) {
    std::fprintf(stderr, "kpleg-bench-watch-write: the consumer did not connect\n");
    kill(child, SIGKILL);
    return 2;
  }

  auto publish = [&](std::optional<uint64_t> n) {
    if (writer == "sync") {
      sync_service.publish(n);
    } else if (writer == "callback") {
      callback_service.reactor()->publish(n);
    } else if (writer == "async") {
      async_service.publish(n);
    } else {
      direct.publish(n);
    }
  };
  const long publisher = syscall(SYS_gettid);
  const auto before = task_stats();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t n = 0; n < events; ++n) {
    std::this_thread::sleep_until(t0 + std::chrono::milliseconds(gap_ms) * (n + 1));
    publish(n);
  }
  if (writer == "async") async_service.wait_written(std::chrono::steady_clock::now() + 10s);
  const bool stalled = !progress.wait([&] { return progress.written.load() == events; });
  // The consumer's flow-control frames for the last event come just after it.
  std::this_thread::sleep_for(std::chrono::milliseconds(std::max(gap_ms, 50)));
  const auto after = task_stats();

  publish(std::nullopt);
  int status = 0;
  waitpid(child, &status, 0);
  if (writer == "async") async_service.wait_written(std::chrono::steady_clock::now() + 1s);
  if (server) server->Shutdown(std::chrono::system_clock::now() + 1s);
  if (notify_cq) {
    notify_cq->Shutdown();
    async_service.join();
  }
  unlink(socket.c_str());
  const bool all_read = WIFEXITED(status) && WEXITSTATUS(status) == 0;

  nlohmann::json threads = nlohmann::json::array();
  double serving_runs = 0, serving_us = 0, publisher_runs = 0, publisher_us = 0;
  for (const auto& [tid, a] : after) {
    auto b = before.find(tid);
    const long runs = a.runs - (b == before.end() ? 0 : b->second.runs);
    const long ns = a.on_cpu_ns - (b == before.end() ? 0 : b->second.on_cpu_ns);
    if (runs == 0) continue;
    const double runs_per = double(runs) / double(events);
    const double us_per = double(ns) / 1e3 / double(events);
    threads.push_back({{"name", a.name}, {"publisher", tid == publisher},
                       {"runs_per_event", runs_per}, {"cpu_us_per_event", us_per}});
    if (tid == publisher) {
      publisher_runs = runs_per;
      publisher_us = us_per;
    } else {
      serving_runs += runs_per;
      serving_us += us_per;
    }
  }
  nlohmann::json out{{"writer", writer},
                     {"reader", reader},
                     {"events", events},
                     {"gap_ms", gap_ms},
                     {"all_read", all_read && !stalled},
                     {"other_threads_runs_per_event", serving_runs},
                     {"other_threads_cpu_us_per_event", serving_us},
                     {"publisher_runs_per_event", publisher_runs},
                     {"publisher_cpu_us_per_event", publisher_us},
                     {"threads", threads}};
  std::printf("%s\n", out.dump().c_str());
  if (!all_read || stalled) {
    std::fprintf(stderr, "kpleg-bench-watch-write: the consumer did not read every event\n");
    return 1;
  }
  return 0;
}

// kplegctl: the command-line consumer of kplegd's API (watch, list, health, stats, stuck, probe).
//
// Exit status: 0 success (health: healthy; stuck: no call that old; probe: passes); 1 an RPC
// failed, a watch ended with an error, health says unhealthy, stuck found calls, or the probe
// fails; 2 kplegd cannot be reached (not running, socket not accessible, unavailable).
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "api/client.h"
#include "api/health_names.h"
#include "common/duration.h"
#include "cmd/kplegctl/output.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kpleg/v1/pleg.grpc.pb.h"

namespace {

using namespace kpleg;

constexpr int kExitFailed = 1;
constexpr int kExitUnreachable = 2;

void print_line(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // a watch is read as it happens, often through a pipe
}

void print_text(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

std::string target(const api::ClientOptions& c) {
  return c.address.empty() ? "unix:" + c.socket_path : c.address;
}

int report_rpc_error(const char* what, const grpc::Status& st, const api::ClientOptions& c) {
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::fprintf(stderr, "kplegctl: cannot reach kplegd at %s: %s\n", target(c).c_str(),
                 st.error_message().c_str());
    return kExitUnreachable;
  }
  std::fprintf(stderr, "kplegctl: %s failed: %s\n", what, st.error_message().c_str());
  return kExitFailed;
}

struct WatchArgs {
  std::string output = "table";
  uint64_t from_seq = 0;
  std::string pod_uid;
  std::string pod_namespace;
  std::string instance_id;
  uint64_t count = 0;
};

int watch(v1::PodLifecycle::Stub& stub, const WatchArgs& a, const api::ClientOptions& conn) {
  v1::WatchRequest req;
  req.set_from_seq(a.from_seq);
  req.set_pod_uid(a.pod_uid);
  req.set_pod_namespace(a.pod_namespace);
  req.set_instance_id(a.instance_id);
  grpc::ClientContext ctx;
  auto reader = stub.Watch(&ctx, req);
  const bool json = a.output == "json";
  if (!json) print_line(kplegctl::event_table_header());

  v1::Event ev;
  uint64_t received = 0;
  uint64_t last_seq = a.from_seq;
  while (reader->Read(&ev)) {
    print_line(json ? kplegctl::event_json(ev) : kplegctl::event_table_row(ev));
    last_seq = ev.seq();  // for RESYNC too: the stream continues after its seq
    if (a.count != 0 && ++received >= a.count) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status st = reader->Finish();
  if (a.count != 0 && received >= a.count) return 0;
  if (st.ok()) return 0;
  if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    // The position is one in this daemon instance's stream: resuming needs both.
    std::string instance = a.instance_id;
    const auto& md = ctx.GetServerInitialMetadata();
    if (auto it = md.find("kpleg-instance-id"); it != md.end())
      instance.assign(it->second.data(), it->second.size());
    std::fprintf(stderr, "kplegctl: watch ended: %s (resume with --from-seq %llu --instance-id %s)\n",
                 st.error_message().c_str(), static_cast<unsigned long long>(last_seq),
                 instance.c_str());
    return kExitFailed;
  }
  return report_rpc_error("watch", st, conn);
}

void set_deadline(grpc::ClientContext& ctx, double timeout_s) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
}

// A Kubernetes exec probe through kplegd's API socket (no port, no host network): grpc.health.v1
// Check of the liveness or readiness service. startup is liveness: kplegd serves its API and
// its loops progress (a slow first sync does not fail it).
int probe(const std::shared_ptr<grpc::Channel>& channel, const std::string& which,
          const api::ClientOptions& conn, double timeout_s) {
  const bool ready = which == "ready";
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(ready ? api::kReadinessService : api::kLivenessService);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  set_deadline(ctx, timeout_s);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  if (auto st = stub->Check(&ctx, req, &resp); !st.ok())
    return report_rpc_error(("probe " + which).c_str(), st, conn);
  if (resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) return 0;
  // The kubelet keeps a failed probe's output in the pod's events: say why.
  print_line("kplegd: " + which + " probe failed");
  if (ready) {
    v1::StatsResponse stats;
    grpc::ClientContext sctx;
    set_deadline(sctx, timeout_s);
    if (v1::PodLifecycle::NewStub(channel)->Stats(&sctx, v1::StatsRequest{}, &stats).ok())
      for (const auto& r : stats.health_reasons()) print_line("- " + r);
  } else {
    print_line("- see kplegd's log, or GET /livez");
  }
  return kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kplegctl: watch and inspect pod lifecycle events from kplegd"};
  app.require_subcommand(1);

  api::ClientOptions conn;
  double timeout_s = 5;
  app.add_option("--socket", conn.socket_path, "kplegd's unix socket")->capture_default_str();
  app.add_option("--address", conn.address,
                 "host:port of kplegd --listen (TCP instead of the socket)");
  app.add_option("--tls-ca", conn.tls_ca_file, "CA certificate that signed kplegd's (PEM)");
  app.add_option("--tls-cert", conn.tls_cert_file, "Client certificate (PEM)");
  app.add_option("--tls-key", conn.tls_key_file, "Client private key (PEM)");
  app.add_option("--tls-server-name", conn.tls_server_name,
                 "Name to verify in kplegd's certificate, when not the --address host");
  app.add_flag("--insecure-tcp", conn.insecure_tcp, "Plain TCP (kplegd --insecure-tcp)");
  app.add_option("--timeout", timeout_s, "Seconds to wait for list, health and stats")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  WatchArgs wa;
  auto* watch_cmd = app.add_subcommand("watch", "Stream pod lifecycle events as they happen");
  watch_cmd->add_option("-o,--output", wa.output, "table or json (one object per line)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  auto* from_seq_opt =
      watch_cmd
          ->add_option("--from-seq", wa.from_seq,
                       "Start after this sequence number (from list, or the last one seen; "
                       "0 is the position before the instance's first event); without it, "
                       "only new events")
          ->capture_default_str();
  watch_cmd->add_option("--pod-uid", wa.pod_uid, "Only this pod");
  watch_cmd->add_option("--namespace", wa.pod_namespace, "Only pods in this namespace");
  auto* instance_opt = watch_cmd->add_option(
      "--instance-id", wa.instance_id,
      "The kplegd instance whose stream --from-seq is in (from list, or from a watch's end); "
      "another instance's (the daemon restarted) gives RESYNC first");
  // A position means nothing without the instance whose stream it is in.
  from_seq_opt->needs(instance_opt);
  watch_cmd->add_option("--count", wa.count, "Stop after this many events (0: never)");

  std::string list_output = "table", list_uid, list_ns;
  auto* list_cmd = app.add_subcommand("list", "Pods and containers as kplegd sees them now");
  list_cmd->add_option("-o,--output", list_output, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  list_cmd->add_option("--pod-uid", list_uid, "Only this pod");
  list_cmd->add_option("--namespace", list_ns, "Only pods in this namespace");

  auto* health_cmd =
      app.add_subcommand("health", "Exit 0 when kplegd is healthy, 1 (with the reasons) if not");

  std::string stats_output = "text";
  auto* stats_cmd = app.add_subcommand("stats", "kplegd's key numbers");
  stats_cmd->add_option("-o,--output", stats_output, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  std::string stuck_output = "table", stuck_age = "30s";
  auto* stuck_cmd = app.add_subcommand(
      "stuck", "CRI calls in flight longer than --older-than (kplegd's own and the kubelet's "
               "through kplegd --cri-listen), oldest first; exit 1 when there are any");
  stuck_cmd->add_option("--older-than", stuck_age, "Minimum age (e.g. 500ms, 30s, 2m); 0 lists all")
      ->capture_default_str();
  stuck_cmd->add_option("-o,--output", stuck_output, "table or json (one object per line)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();

  std::string probe_kind;
  auto* probe_cmd = app.add_subcommand(
      "probe", "Kubernetes exec probe: live (kplegd's own loops progress), ready (its events can "
               "be trusted) or startup (as live); exit 0 when it passes, 1 (with why) if not");
  probe_cmd->add_option("kind", probe_kind, "live, ready or startup")
      ->required()
      ->check(CLI::IsMember({"live", "ready", "startup"}));

  CLI11_PARSE(app, argc, argv);

  std::chrono::milliseconds stuck_min_age{0};
  if (*stuck_cmd) {
    if (stuck_age != "0") {
      auto age = parse_duration(stuck_age);
      if (!age) {
        std::fprintf(stderr, "kplegctl: --older-than: %s\n", age.error().message.c_str());
        return kExitFailed;
      }
      stuck_min_age = *age;
    }
  }

  auto channel = api::connect_channel(conn);
  if (!channel) {
    std::fprintf(stderr, "kplegctl: %s\n", channel.error().message.c_str());
    return api::is_unreachable(channel.error()) ? kExitUnreachable : kExitFailed;
  }
  if (*probe_cmd) return probe(*channel, probe_kind, conn, timeout_s);
  auto stub = v1::PodLifecycle::NewStub(*channel);

  if (*watch_cmd) return watch(*stub, wa, conn);

  if (*stuck_cmd) {
    v1::InflightCallsRequest req;
    req.set_min_age_ms(uint64_t(stuck_min_age.count()));
    v1::InflightCallsResponse resp;
    grpc::ClientContext ctx;
    set_deadline(ctx, timeout_s);
    if (auto st = stub->InflightCalls(&ctx, req, &resp); !st.ok())
      return report_rpc_error("stuck", st, conn);
    if (stuck_output == "json") {
      print_text(kplegctl::inflight_json(resp));
    } else if (resp.calls_size() == 0) {
      print_line("no CRI call in flight for " + stuck_age + " or longer");
    } else {
      print_text(kplegctl::inflight_table(resp));
    }
    return resp.calls_size() == 0 ? 0 : kExitFailed;
  }

  if (*list_cmd) {
    v1::ListRequest req;
    req.set_pod_uid(list_uid);
    req.set_pod_namespace(list_ns);
    v1::ListResponse resp;
    grpc::ClientContext ctx;
    set_deadline(ctx, timeout_s);
    if (auto st = stub->List(&ctx, req, &resp); !st.ok()) return report_rpc_error("list", st, conn);
    if (list_output == "json")
      print_line(kplegctl::list_json(resp));
    else
      print_text(kplegctl::list_table(resp));
    return 0;
  }

  // health and stats: the Stats RPC evaluates the daemon's health at call time, so the
  // verdict and its reasons come from one consistent reading.
  v1::StatsResponse resp;
  grpc::ClientContext ctx;
  set_deadline(ctx, timeout_s);
  if (auto st = stub->Stats(&ctx, v1::StatsRequest{}, &resp); !st.ok())
    return report_rpc_error(*health_cmd ? "health" : "stats", st, conn);
  if (*health_cmd) {
    if (resp.healthy()) {
      // Healthy, with what is degraded but not failing (a pod whose calls fail, containers
      // the kernel path cannot see), if anything.
      print_line("healthy");
      for (const auto& r : resp.health_reasons()) print_line("- " + r);
      return 0;
    }
    print_line("unhealthy");
    for (const auto& r : resp.health_reasons()) print_line("- " + r);
    return kExitFailed;
  }
  (void)stats_cmd;
  if (stats_output == "json")
    print_line(kplegctl::stats_json(resp));
  else
    print_text(kplegctl::stats_text(resp));
  return 0;
}

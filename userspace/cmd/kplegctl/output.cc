#include "cmd/kplegctl/output.h"

#include <time.h>

#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/convert.h"

namespace kpleg::kplegctl {
namespace {

using ordered_json = nlohmann::ordered_json;

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ordered_json status_json(const v1::ContainerStatus& s) {
  ordered_json j;
  j["state"] = state_name(s.state());
  j["created_at_ns"] = s.created_at_ns();
  j["started_at_ns"] = s.started_at_ns();
  j["finished_at_ns"] = s.finished_at_ns();
  j["exit_code"] = s.exit_code();
  j["reason"] = s.reason();
  j["message"] = s.message();
  return j;
}

std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }

// A protobuf map of counts by name, sorted by name (protobuf's map has no order).
template <typename ProtoMap>
std::map<std::string, uint64_t> sorted(const ProtoMap& m) {
  return {m.begin(), m.end()};
}

// The same as a JSON object, in that order.
template <typename ProtoMap>
ordered_json sorted_json(const ProtoMap& m) {
  ordered_json j = ordered_json::object();
  for (const auto& [k, n] : sorted(m)) j[k] = n;
  return j;
}

// Rows as lines of columns padded to the widest cell, two spaces apart.
template <size_t N>
std::string aligned(const std::vector<std::array<std::string, N>>& rows) {
  std::array<size_t, N> width{};
  for (const auto& r : rows)
    for (size_t i = 0; i < N; ++i) width[i] = std::max(width[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < N; ++i) {
      line += r[i];
      if (i + 1 < N) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string pod_ref(const std::string& ns, const std::string& name, const std::string& uid) {
  if (name.empty()) return uid.empty() ? "-" : uid;
  return ns.empty() ? name : ns + "/" + name;
}

std::string container_ref(const std::string& name, const std::string& id, bool sandbox) {
  if (sandbox) return "(sandbox " + id.substr(0, 12) + ")";
  return name.empty() ? id.substr(0, 12) : name;
}

}  // namespace

// kpleg's own names (pleg::to_string's, as kplegd logs them). A value that does not come back
// the same through kpleg's model is one kpleg does not know (UNSPECIFIED, or a newer server's).
std::string type_name(v1::EventType t) {
  const pleg::EventType known = api::from_proto(t);
  if (api::to_proto(known) != t) return fmt::format("Unknown({})", static_cast<int>(t));
  return pleg::to_string(known);
}

std::string source_name(v1::EventSource s) {
  const pleg::EventSource known = api::from_proto(s);
  return api::to_proto(known) == s ? pleg::to_string(known) : "";
}

std::string state_name(v1::ContainerState s) {
  const pleg::ContainerState known = api::from_proto(s);
  return api::to_proto(known) == s ? pleg::to_string(known) : "";
}

std::string clock_time(uint64_t unix_ns) {
  if (unix_ns == 0) return "-";
  time_t secs = static_cast<time_t>(unix_ns / 1'000'000'000ull);
  tm local{};
  localtime_r(&secs, &local);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", local.tm_hour, local.tm_min, local.tm_sec,
                     (unix_ns / 1'000'000ull) % 1000);
}

std::string event_json(const v1::Event& ev) {
  ordered_json j;
  j["seq"] = ev.seq();
  j["type"] = type_name(ev.type());
  j["pod_uid"] = ev.pod_uid();
  j["pod_name"] = ev.pod_name();
  j["pod_namespace"] = ev.pod_namespace();
  j["container_id"] = ev.container_id();
  j["container_name"] = ev.container_name();
  j["sandbox"] = ev.sandbox();
  j["exit_code"] = ev.exit_code();
  j["reason"] = ev.reason();
  j["source"] = source_name(ev.source());
  j["correction"] = ev.correction();
  j["kernel_ts_ns"] = ev.kernel_ts_ns();
  j["emit_ts_ns"] = ev.emit_ts_ns();
  if (ev.has_status()) j["status"] = status_json(ev.status());
  return dump(j);
}

// Fixed widths: a stream cannot be measured before it is printed.
static constexpr const char* kEventRow = "{:<12}  {:<16}  {:<36}  {:<24}  {:<14}  {:<9}  {}";

std::string event_table_header() {
  return fmt::format(kEventRow, "TIME", "TYPE", "NAMESPACE/POD", "CONTAINER", "EXIT/REASON",
                     "SOURCE", "SEQ");
}

std::string event_table_row(const v1::Event& ev) {
  if (ev.type() == v1::EVENT_TYPE_RESYNC)
    return fmt::format("{:<12}  {:<16}  {}", clock_time(ev.emit_ts_ns()), "Resync",
                       ev.reason().empty() ? "history lost: List again" : ev.reason());
  std::string exit = "-";
  if (ev.type() == v1::EVENT_TYPE_CONTAINER_DIED || ev.exit_code() != 0 || !ev.reason().empty())
    exit = ev.reason().empty() ? std::to_string(ev.exit_code())
                               : fmt::format("{} {}", ev.exit_code(), ev.reason());
  std::string source = or_dash(source_name(ev.source()));
  if (ev.correction()) source += "*";  // fixed by the reconciler
  return fmt::format(kEventRow, clock_time(ev.emit_ts_ns()), type_name(ev.type()),
                     pod_ref(ev.pod_namespace(), ev.pod_name(), ev.pod_uid()),
                     container_ref(ev.container_name(), ev.container_id(), ev.sandbox()), exit,
                     source, ev.seq());
}

std::string list_json(const v1::ListResponse& resp) {
  ordered_json j;
  j["seq"] = resp.seq();
  j["instance_id"] = resp.instance_id();
  j["pods"] = ordered_json::array();
  for (const auto& pod : resp.pods()) {
    ordered_json p;
    p["uid"] = pod.uid();
    p["name"] = pod.name();
    p["namespace"] = pod.namespace_();
    p["containers"] = ordered_json::array();
    for (const auto& c : pod.containers()) {
      ordered_json cj;
      cj["id"] = c.id();
      cj["name"] = c.name();
      cj["sandbox"] = c.sandbox();
      cj["status"] = status_json(c.status());
      p["containers"].push_back(std::move(cj));
    }
    j["pods"].push_back(std::move(p));
  }
  return dump(j);
}

std::string list_table(const v1::ListResponse& resp) {
  std::vector<std::array<std::string, 6>> rows;
  rows.push_back({"NAMESPACE/POD", "POD UID", "CONTAINER", "STATE", "EXIT/REASON", "STARTED"});
  for (const auto& pod : resp.pods()) {
    for (const auto& c : pod.containers()) {
      const auto& s = c.status();
      std::string exit = "-";
      if (s.state() == v1::CONTAINER_STATE_EXITED)
        exit = s.reason().empty() ? std::to_string(s.exit_code())
                                  : fmt::format("{} {}", s.exit_code(), s.reason());
      rows.push_back({pod_ref(pod.namespace_(), pod.name(), pod.uid()), pod.uid(),
                      container_ref(c.name(), c.id(), c.sandbox()), or_dash(state_name(s.state())),
                      exit, clock_time(static_cast<uint64_t>(s.started_at_ns()))});
    }
  }
  std::string out = aligned(rows);
  out += fmt::format(
      "{} pods; consistent with seq {} (watch --from-seq {} --instance-id {} to "
      "follow)\n",
      resp.pods_size(), resp.seq(), resp.seq(), resp.instance_id());
  return out;
}

namespace {

std::string age_text(uint64_t ms) {
  const uint64_t s = ms / 1000;
  if (s >= 3600) return fmt::format("{}h{}m{}s", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}m{}s", s / 60, s % 60);
  if (s >= 1) return fmt::format("{}.{}s", s, (ms % 1000) / 100);
  return fmt::format("{}ms", ms);
}

}  // namespace

std::string inflight_table(const v1::InflightCallsResponse& resp) {
  std::vector<std::array<std::string, 5>> rows;
  rows.push_back({"AGE", "METHOD", "NAMESPACE/POD", "CONTAINER", "ORIGIN"});
  for (const auto& c : resp.calls()) {
    std::string pod = c.pod_uid().empty() && c.pod_name().empty()
                          ? std::string("-")
                          : pod_ref(c.pod_namespace(), c.pod_name(), c.pod_uid());
    std::string container = !c.container_name().empty()
                                ? c.container_name() +
                                      (c.id().empty() ? "" : " (" + c.id().substr(0, 12) + ")")
                                : (c.id().empty() ? "-" : c.id().substr(0, 12));
    rows.push_back({age_text(c.age_ms()), c.method(), pod, container, c.origin()});
  }
  return aligned(rows);
}

std::string inflight_json(const v1::InflightCallsResponse& resp) {
  std::string out;
  for (const auto& c : resp.calls()) {
    ordered_json j;
    j["method"] = c.method();
    j["origin"] = c.origin();
    j["pod_uid"] = c.pod_uid();
    j["pod_name"] = c.pod_name();
    j["pod_namespace"] = c.pod_namespace();
    j["id"] = c.id();
    j["container_name"] = c.container_name();
    j["age_ms"] = c.age_ms();
    j["description"] = c.description();
    out += j.dump() + "\n";
  }
  return out;
}

std::string stats_json(const v1::StatsResponse& r) {
  ordered_json j;
  j["instance_id"] = r.instance_id();
  j["mode"] = r.mode();
  j["start_time_ns"] = r.start_time_ns();
  j["healthy"] = r.healthy();
  j["health_reasons"] = ordered_json::array();
  for (const auto& reason : r.health_reasons()) j["health_reasons"].push_back(reason);
  j["last_seq"] = r.last_seq();
  j["oldest_retained_seq"] = r.oldest_retained_seq();
  j["history_capacity"] = r.history_capacity();
  j["subscribers"] = r.subscribers();
  j["subscribers_cut_off"] = r.subscribers_cut_off();
  j["pods"] = r.pods();
  j["containers"] = r.containers();
  j["kernel_events"] = r.kernel_events();
  j["lost_kernel_events"] = r.lost_kernel_events();
  j["corrections"] = r.corrections();
  j["relists"] = r.relists();
  j["last_reconcile_ns"] = r.last_reconcile_ns();
  j["cri_calls"] = r.cri_calls();
  j["cri_calls_by_method"] = sorted_json(r.cri_calls_by_method());
  j["confirm_retries"] = r.confirm_retries();
  j["loop_wakeups_by_cause"] = sorted_json(r.loop_wakeups_by_cause());
  return dump(j);
}

std::string stats_text(const v1::StatsResponse& r) {
  std::string out;
  auto line = [&](const char* k, const std::string& v) { out += fmt::format("{:<22}{}\n", k, v); };
  line("instance:", r.instance_id());
  line("mode:", or_dash(r.mode()));
  line("healthy:", r.healthy() ? "yes" : "no");
  for (const auto& reason : r.health_reasons()) line("  reason:", reason);
  line("started:", r.start_time_ns() ? clock_time(r.start_time_ns()) : "-");
  line("last seq:", std::to_string(r.last_seq()));
  line("history:", fmt::format("{}..{} (capacity {})", r.oldest_retained_seq(), r.last_seq(),
                               r.history_capacity()));
  line("subscribers:",
       fmt::format("{} ({} cut off since start)", r.subscribers(), r.subscribers_cut_off()));
  line("pods:", std::to_string(r.pods()));
  line("containers:", std::to_string(r.containers()));
  line("kernel events:", std::to_string(r.kernel_events()));
  line("lost kernel events:", std::to_string(r.lost_kernel_events()));
  line("corrections:", std::to_string(r.corrections()));
  line("relists:", std::to_string(r.relists()));
  line("last reconcile:", clock_time(r.last_reconcile_ns()));
  line("CRI calls:", std::to_string(r.cri_calls()));
  for (const auto& [method, n] : sorted(r.cri_calls_by_method()))
    line(fmt::format("  {}:", method).c_str(), std::to_string(n));
  line("confirm retries:", std::to_string(r.confirm_retries()));
  if (r.loop_wakeups_by_cause_size() > 0) {
    const auto by_cause = sorted(r.loop_wakeups_by_cause());
    uint64_t total = 0;
    for (const auto& [cause, n] : by_cause) total += n;
    line("loop wakeups:", fmt::format("{} (by cause; one with several counts under each)", total));
    for (const auto& [cause, n] : by_cause)
      line(fmt::format("  {}:", cause).c_str(), std::to_string(n));
  }
  return out;
}

}  // namespace kpleg::kplegctl

#include "pleg/runtime_looks.h"

#include <grpcpp/support/status_code_enum.h>

#include "pleg/runtime_view.h"

namespace kpleg::pleg {

namespace {

bool is_not_found(const Error& e) { return e.code == grpc::StatusCode::NOT_FOUND; }

// `id` is the id asked for (or named by the runtime's event).
Observation observe(const std::string& id, const cri::v1::ContainerStatus& st) {
  Observation obs;
  obs.id = id;
  obs.snapshot = from_status(st);
  obs.state = obs.snapshot.state;
  obs.name = container_name(st);
  obs.pod = pod_identity(st, nullptr);
  return obs;
}

Observation observe(const std::string& id, const cri::v1::PodSandboxStatus& ps) {
  Observation obs;
  obs.id = id;
  obs.sandbox = true;
  obs.snapshot = from_status(ps);
  obs.state = obs.snapshot.state;
  obs.pod = pod_identity(ps);
  return obs;
}

Result<Observation> look_container(cri::CriClient& cri, const std::string& id) {
  auto st = cri.container_status(id);
  if (!st) return st.error();
  return observe(id, *st);
}

Result<Observation> look_sandbox(cri::CriClient& cri, const std::string& id) {
  auto ps = cri.pod_sandbox_status(id);
  if (!ps) return ps.error();
  return observe(id, *ps);
}

Observation nonexistent(const std::string& id, bool sandbox) {
  Observation obs;
  obs.id = id;
  obs.state = obs.snapshot.state = ContainerState::kNonExistent;
  obs.sandbox = sandbox;
  return obs;
}

}  // namespace

Result<std::vector<RuntimeContainer>> list_runtime(cri::CriClient& cri) {
  auto sandboxes = cri.list_pod_sandboxes({});
  if (!sandboxes) return sandboxes.error();
  auto containers = cri.list_containers({});
  if (!containers) return containers.error();

  std::vector<RuntimeContainer> out;
  for (const auto& [uid, pod] : build_snapshot(*sandboxes, *containers).pods) {
    for (const auto& c : pod.containers) out.push_back({c.id, c.sandbox, c.name, pod, c.state});
  }
  return out;
}

Result<Observation> look(cri::CriClient& cri, const std::string& id, bool kind_known,
                         bool sandbox) {
  for (int attempt = 0; attempt < (kind_known ? 1 : 2); ++attempt) {
    const bool as_sandbox = attempt == 0 ? sandbox : !sandbox;
    auto obs = as_sandbox ? look_sandbox(cri, id) : look_container(cri, id);
    if (obs || !is_not_found(obs.error())) return obs;
  }
  return nonexistent(id, sandbox);
}

void look_async(cri::AsyncStatusCalls& calls, const std::string& id, bool kind_known,
                bool sandbox, std::function<void(Result<Observation>)> done) {
  // As look(): the other kind only when the guessed one is not found.
  auto then = [&calls, id, kind_known, sandbox, done](auto r) mutable {
    if (r) return done(observe(id, *r));
    if (!is_not_found(r.error())) return done(r.error());
    if (kind_known) return done(nonexistent(id, sandbox));
    auto last = [id, sandbox, done = std::move(done)](auto r2) {
      if (r2) return done(observe(id, *r2));
      if (!is_not_found(r2.error())) return done(r2.error());
      done(nonexistent(id, sandbox));
    };
    if (sandbox) {
      calls.container_status(id, std::move(last));
    } else {
      calls.pod_sandbox_status(id, std::move(last));
    }
  };
  if (sandbox) {
    calls.pod_sandbox_status(id, std::move(then));
  } else {
    calls.container_status(id, std::move(then));
  }
}

std::optional<Observation> observation_of(const cri::v1::ContainerEventResponse& ev) {
  const std::string& id = ev.container_id();
  if (id.empty() || ev.container_event_type() == cri::v1::CONTAINER_CREATED_EVENT) return {};
  const bool sandbox = ev.has_pod_sandbox_status() && ev.pod_sandbox_status().id() == id;
  std::optional<Observation> obs;
  if (ev.container_event_type() == cri::v1::CONTAINER_DELETED_EVENT) {
    obs = nonexistent(id, sandbox);
  } else if (sandbox) {
    obs = observe(id, ev.pod_sandbox_status());
  } else {
    for (const auto& st : ev.containers_statuses()) {
      if (st.id() == id) {
        obs = observe(id, st);
        break;
      }
    }
  }
  if (obs) obs->reported_at_ns = ev.created_at();
  return obs;
}

}  // namespace kpleg::pleg

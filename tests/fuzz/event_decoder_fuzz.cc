// Differential fuzzing of decode_container_event() against the generated parser: whatever
// bytes the runtime's event stream carries, the selective decoder must not crash, and wherever
// the generated parser accepts a message, the decoder must accept it too and read the same
// values for every field kpleg uses (event_decoder.h lists them).
#include "require.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "cri/event_decoder.h"

namespace {

namespace v1 = ::runtime::v1;


template <typename M>
bool same_labels(const M& a, const M& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second != v) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view wire(reinterpret_cast<const char*>(data), size);
  v1::ContainerEventResponse d, full;
  const bool ok = kpleg::cri::decode_container_event(wire, d);
  if (!full.ParseFromArray(data, int(size))) return 0;
  REQUIRE(ok);
  REQUIRE(d.container_id() == full.container_id());
  REQUIRE(d.container_event_type() == full.container_event_type());
  REQUIRE(d.created_at() == full.created_at());
  if (full.container_event_type() == v1::CONTAINER_CREATED_EVENT) return 0;

  REQUIRE(d.has_pod_sandbox_status() == full.has_pod_sandbox_status());
  const auto& ds = d.pod_sandbox_status();
  const auto& fs = full.pod_sandbox_status();
  REQUIRE(ds.id() == fs.id());
  REQUIRE(ds.metadata().name() == fs.metadata().name());
  REQUIRE(ds.metadata().uid() == fs.metadata().uid());
  REQUIRE(ds.metadata().namespace_() == fs.metadata().namespace_());
  REQUIRE(ds.metadata().attempt() == fs.metadata().attempt());
  REQUIRE(ds.state() == fs.state());
  REQUIRE(ds.created_at() == fs.created_at());
  REQUIRE(same_labels(ds.labels(), fs.labels()));

  const v1::ContainerStatus* want = nullptr;
  for (const auto& st : full.containers_statuses()) {
    if (st.id() == full.container_id()) {
      want = &st;
      break;
    }
  }
  REQUIRE(d.containers_statuses_size() == (want != nullptr ? 1 : 0));
  if (want == nullptr) return 0;
  const auto& got = d.containers_statuses(0);
  REQUIRE(got.id() == want->id());
  REQUIRE(got.metadata().name() == want->metadata().name());
  REQUIRE(got.metadata().attempt() == want->metadata().attempt());
  REQUIRE(got.state() == want->state());
  REQUIRE(got.created_at() == want->created_at());
  REQUIRE(got.started_at() == want->started_at());
  REQUIRE(got.finished_at() == want->finished_at());
  REQUIRE(got.exit_code() == want->exit_code());
  REQUIRE(got.reason() == want->reason());
  REQUIRE(got.message() == want->message());
  REQUIRE(same_labels(got.labels(), want->labels()));
  return 0;
}

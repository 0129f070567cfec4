#include "cri/event_decoder.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <string>
#include <vector>

namespace kpleg::cri {
namespace {

namespace v1 = ::runtime::v1;
using google::protobuf::io::CodedInputStream;
using WFL = google::protobuf::internal::WireFormatLite;

// Reads one message's fields in turn; every accessor checks the wire type, so a field of an
// unexpected type is skipped like an unknown one.
class Fields {
 public:
  explicit Fields(std::string_view wire)
      : wire_(wire), in_(reinterpret_cast<const uint8_t*>(wire.data()), int(wire.size())) {}

  // The next field's number, 0 at the end; sets ok() false on malformed input.
  int next() {
    if (!pending_skip()) return 0;
    tag_ = in_.ReadTag();
    consumed_ = false;
    if (tag_ == 0) {
      // The end of the input, or a malformed tag (a bad varint, field number 0).
      ok_ = in_.CurrentPosition() == int(wire_.size());
      return 0;
    }
    return WFL::GetTagFieldNumber(tag_);
  }
  bool ok() const { return ok_; }

  bool varint(uint64_t& v) {
    if (WFL::GetTagWireType(tag_) != WFL::WIRETYPE_VARINT) return false;
    consumed_ = true;
    if (!in_.ReadVarint64(&v)) ok_ = false;
    return ok_;
  }
  // A length-delimited field, as a view into the input.
  bool bytes(std::string_view& v) {
    if (WFL::GetTagWireType(tag_) != WFL::WIRETYPE_LENGTH_DELIMITED) return false;
    consumed_ = true;
    uint32_t len = 0;
    if (!in_.ReadVarint32(&len)) return ok_ = false;
    const int at = in_.CurrentPosition();
    if (len > wire_.size() - size_t(at) || !in_.Skip(int(len))) return ok_ = false;
    v = wire_.substr(size_t(at), len);
    return true;
  }
  bool string(std::string* out) {
    std::string_view v;
    if (!bytes(v)) return false;
    out->assign(v.data(), v.size());
    return true;
  }

 private:
  // Skips the current field unless an accessor read it.
  bool pending_skip() {
    if (!ok_) return false;
    if (tag_ != 0 && !consumed_ && !WFL::SkipField(&in_, tag_)) ok_ = false;
    tag_ = 0;
    return ok_;
  }

  std::string_view wire_;
  CodedInputStream in_;
  uint32_t tag_ = 0;
  bool consumed_ = true;
  bool ok_ = true;
};

// map<string, string> entry: key = 1, value = 2.
bool decode_label(std::string_view wire, google::protobuf::Map<std::string, std::string>& labels) {
  Fields f(wire);
  std::string key, value;
  while (int n = f.next()) {
    if (n == 1) f.string(&key);
    if (n == 2) f.string(&value);
  }
  if (!f.ok()) return false;
  labels[key] = std::move(value);
  return true;
}

bool decode_container_metadata(std::string_view wire, v1::ContainerMetadata& m) {
  Fields f(wire);
  uint64_t v = 0;
  while (int n = f.next()) {
    if (n == 1) f.string(m.mutable_name());
    if (n == 2 && f.varint(v)) m.set_attempt(uint32_t(v));
  }
  return f.ok();
}

bool decode_sandbox_metadata(std::string_view wire, v1::PodSandboxMetadata& m) {
  Fields f(wire);
  uint64_t v = 0;
  while (int n = f.next()) {
    switch (n) {
      case 1: f.string(m.mutable_name()); break;
      case 2: f.string(m.mutable_uid()); break;
      case 3: f.string(m.mutable_namespace_()); break;
      case 4:
        if (f.varint(v)) m.set_attempt(uint32_t(v));
        break;
      default: break;
    }
  }
  return f.ok();
}

// Fields 1 to 4 mean the same in both statuses: id, metadata, state, created_at. Decodes field
// `n`, one of them; false only when its metadata is malformed.
template <typename State, typename Status, typename DecodeMetadata>
bool decode_status_head(Fields& f, int n, Status& s, DecodeMetadata decode_metadata) {
  uint64_t v = 0;
  std::string_view sub;
  switch (n) {
    case 1: f.string(s.mutable_id()); break;
    case 2:
      if (f.bytes(sub) && !decode_metadata(sub, *s.mutable_metadata())) return false;
      break;
    case 3:
      if (f.varint(v)) s.set_state(static_cast<State>(int(v)));
      break;
    case 4:
      if (f.varint(v)) s.set_created_at(int64_t(v));
      break;
    default: break;
  }
  return true;
}

bool decode_sandbox_status(std::string_view wire, v1::PodSandboxStatus& s) {
  Fields f(wire);
  std::string_view sub;
  while (int n = f.next()) {
    if (n <= 4) {
      if (!decode_status_head<v1::PodSandboxState>(f, n, s, decode_sandbox_metadata)) return false;
    } else if (n == 7) {
      if (f.bytes(sub) && !decode_label(sub, *s.mutable_labels())) return false;
    }  // else network, linux, annotations, runtime_handler, ...: skipped
  }
  return f.ok();
}

// The id (field 1, its last occurrence, as the generated parser keeps it) of a serialized
// ContainerStatus, without decoding the rest.
bool status_id(std::string_view wire, std::string_view& id) {
  Fields f(wire);
  id = {};
  std::string_view v;
  while (int n = f.next()) {
    if (n == 1 && f.bytes(v)) id = v;
  }
  return f.ok();
}

bool decode_container_status(std::string_view wire, v1::ContainerStatus& s) {
  Fields f(wire);
  uint64_t v = 0;
  std::string_view sub;
  while (int n = f.next()) {
    if (n <= 4) {
      if (!decode_status_head<v1::ContainerState>(f, n, s, decode_container_metadata)) return false;
      continue;
    }
    switch (n) {
      case 5:
        if (f.varint(v)) s.set_started_at(int64_t(v));
        break;
      case 6:
        if (f.varint(v)) s.set_finished_at(int64_t(v));
        break;
      case 7:
        if (f.varint(v)) s.set_exit_code(int32_t(v));
        break;
      case 10: f.string(s.mutable_reason()); break;
      case 11: f.string(s.mutable_message()); break;
      case 12:
        if (f.bytes(sub) && !decode_label(sub, *s.mutable_labels())) return false;
        break;
      default: break;  // image, annotations, mounts, log_path, resources, ...
    }
  }
  return f.ok();
}

}  // namespace

bool decode_container_event(std::string_view wire, v1::ContainerEventResponse& out) {
  out.Clear();
  Fields f(wire);
  uint64_t v = 0;
  // A message field that occurs more than once is merged, in order, as the generated parser does.
  std::vector<std::string_view> sandboxes;
  // Views of the statuses: the one of container_id is decoded once the whole event was read
  // (the fields may come in any order).
  std::vector<std::string_view> statuses;
  while (int n = f.next()) {
    switch (n) {
      case 1: f.string(out.mutable_container_id()); break;
      case 2:
        if (f.varint(v)) out.set_container_event_type(static_cast<v1::ContainerEventType>(int(v)));
        break;
      case 3:
        if (f.varint(v)) out.set_created_at(int64_t(v));
        break;
      case 4: {
        std::string_view s;
        if (f.bytes(s)) sandboxes.push_back(s);
        break;
      }
      case 5: {
        std::string_view s;
        if (f.bytes(s)) statuses.push_back(s);
        break;
      }
      default: break;
    }
  }
  if (!f.ok()) return false;
  if (out.container_event_type() == v1::CONTAINER_CREATED_EVENT) return true;
  for (auto s : sandboxes)
    if (!decode_sandbox_status(s, *out.mutable_pod_sandbox_status())) return false;
  for (auto s : statuses) {
    std::string_view id;
    if (!status_id(s, id)) return false;
    if (id != out.container_id()) continue;
    if (!decode_container_status(s, *out.add_containers_statuses())) return false;
    break;
  }
  return true;
}

bool decode_listed_ids(std::string_view wire, std::vector<std::string>& ids) {
  ids.clear();
  Fields f(wire);
  while (int field = f.next()) {
    std::string_view item;
    if (field != 1 || !f.bytes(item)) continue;
    Fields g(item);
    while (int inner = g.next()) {
      if (inner != 1) continue;
      std::string id;
      if (g.string(&id)) {
        ids.push_back(std::move(id));
        break;  // the rest of the item is not read
      }
    }
    if (!g.ok()) return false;
  }
  return f.ok();
}

}  // namespace kpleg::cri

#include "kpleg-load/kubelet_pod.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <random>

namespace kpleg::load {

Result<QosClass> parse_qos_class(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "guaranteed") return QosClass::kGuaranteed;
  if (lower == "burstable") return QosClass::kBurstable;
  if (lower == "besteffort") return QosClass::kBestEffort;
  return Error{EINVAL, "unknown QoS class '" + std::string(name) +
                           "' (expected guaranteed, burstable or besteffort)"};
}

std::string_view qos_class_name(QosClass qos) {
  switch (qos) {
    case QosClass::kGuaranteed:
      return "guaranteed";
    case QosClass::kBurstable:
      return "burstable";
    case QosClass::kBestEffort:
      return "besteffort";
  }
  return "besteffort";
}

std::string pod_cgroup_parent(QosClass qos, std::string_view pod_uid) {
  if (qos == QosClass::kGuaranteed) return fmt::format("/kubepods/pod{}", pod_uid);
  return fmt::format("/kubepods/{}/pod{}", qos_class_name(qos), pod_uid);
}

std::string new_pod_uid() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::array<uint8_t, 16> b{};
  uint64_t hi = rng(), lo = rng();
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(hi >> (8 * i));
    b[8 + i] = static_cast<uint8_t>(lo >> (8 * i));
  }
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return fmt::format(
      "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

Result<std::vector<std::string>> split_command(std::string_view line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 == line.size()) return Error{EINVAL, "command ends with a lone backslash"};
      word += line[++i];
    } else if (c == '\'') {
      auto end = line.find('\'', i + 1);
      if (end == std::string_view::npos) return Error{EINVAL, "unterminated ' quote in command"};
      word.append(line.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size() &&
            (line[j + 1] == '"' || line[j + 1] == '\\' || line[j + 1] == '$' ||
             line[j + 1] == '`')) {
          ++j;
        }
        word += line[j];
      }
      if (j == line.size()) return Error{EINVAL, "unterminated \" quote in command"};
      i = j;
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  if (words.empty()) return Error{EINVAL, "empty command"};
  return words;
}

namespace {

std::string rfc3339_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

v1::NamespaceOption namespace_options(const PodSpec& pod) {
  v1::NamespaceOption ns;
  ns.set_network(pod.host_network ? v1::NODE : v1::POD);
  ns.set_pid(v1::CONTAINER);  // the kubelet's choice for pods without shareProcessNamespace
  ns.set_ipc(v1::POD);
  return ns;
}

// The kubelet's oom_score_adj policy (pkg/kubelet/qos/policy.go) for a container that requests
// nothing: guaranteed pods are protected, best-effort ones die first.
int64_t oom_score_adj(QosClass qos) {
  switch (qos) {
    case QosClass::kGuaranteed:
      return -997;
    case QosClass::kBurstable:
      return 999;
    case QosClass::kBestEffort:
      return 1000;
  }
  return 1000;
}

}  // namespace

std::string pod_log_directory(std::string_view root, const PodSpec& pod) {
  return fmt::format("{}/{}_{}_{}", root, pod.namespace_, pod.name, pod.uid);
}

v1::PodSandboxConfig sandbox_config(const PodSpec& pod) {
  v1::PodSandboxConfig c;
  auto* md = c.mutable_metadata();
  md->set_name(pod.name);
  md->set_namespace_(pod.namespace_);
  md->set_uid(pod.uid);
  md->set_attempt(pod.attempt);
  if (!pod.host_network) c.set_hostname(pod.name);
  c.set_log_directory(pod.log_directory);

  auto& labels = *c.mutable_labels();
  labels[std::string(kPodNameLabel)] = pod.name;
  labels[std::string(kPodNamespaceLabel)] = pod.namespace_;
  labels[std::string(kPodUidLabel)] = pod.uid;
  labels[std::string(kLoadLabel)] = "true";

  auto& annotations = *c.mutable_annotations();
  annotations["kubernetes.io/config.source"] = "api";
  annotations["kubernetes.io/config.seen"] = rfc3339_now();
  annotations[std::string(kLogDirectoryAnnotation)] = pod.log_directory;

  auto* linux = c.mutable_linux();
  linux->set_cgroup_parent(pod_cgroup_parent(pod.qos, pod.uid));
  *linux->mutable_security_context()->mutable_namespace_options() = namespace_options(pod);
  return c;
}

v1::ContainerConfig container_config(const PodSpec& pod, const ContainerSpec& container) {
  v1::ContainerConfig c;
  c.mutable_metadata()->set_name(container.name);
  c.mutable_metadata()->set_attempt(container.attempt);
  c.mutable_image()->set_image(container.image);
  c.mutable_image()->set_user_specified_image(container.image);
  for (const auto& word : container.command) c.add_command(word);
  c.set_log_path(fmt::format("{}/{}.log", container.name, container.attempt));

  auto& labels = *c.mutable_labels();
  labels[std::string(kPodNameLabel)] = pod.name;
  labels[std::string(kPodNamespaceLabel)] = pod.namespace_;
  labels[std::string(kPodUidLabel)] = pod.uid;
  labels[std::string(kContainerNameLabel)] = container.name;

  // The kubelet's container annotations (pkg/kubelet/kuberuntime/labels.go); the hash stands
  // for the kubelet's hash of the container spec.
  auto& annotations = *c.mutable_annotations();
  std::string spec_key = container.image;
  for (const auto& w : container.command) spec_key += "\x1f" + w;
  annotations["io.kubernetes.container.hash"] =
      fmt::format("{:x}", std::hash<std::string>{}(spec_key)&0xffffffff);
  annotations["io.kubernetes.container.restartCount"] = std::to_string(container.attempt);
  annotations["io.kubernetes.container.terminationMessagePath"] = "/dev/termination-log";
  annotations["io.kubernetes.container.terminationMessagePolicy"] = "File";
  annotations["io.kubernetes.pod.terminationGracePeriod"] = "30";

  auto* linux = c.mutable_linux();
  auto* res = linux->mutable_resources();
  res->set_oom_score_adj(oom_score_adj(pod.qos));
  res->set_cpu_shares(pod.qos == QosClass::kBestEffort ? 2 : 1024);
  res->set_cpu_period(100000);
  if (container.memory_limit_bytes > 0)
    res->set_memory_limit_in_bytes(container.memory_limit_bytes);
  *linux->mutable_security_context()->mutable_namespace_options() = namespace_options(pod);
  return c;
}

}  // namespace kpleg::load

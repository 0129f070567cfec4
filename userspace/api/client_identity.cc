#include "api/client_identity.h"


#include <arpa/inet.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/server_context.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <optional>
#include <string_view>

namespace kpleg::api {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The address in one spelling (IPv4-mapped IPv6 stays IPv6, as Go compares them by bytes after
// To16: we keep the families apart, which only refuses more).
std::optional<std::string> canonical_ip(const std::string& s) {
  std::array<unsigned char, 16> bytes{};
  char out[INET6_ADDRSTRLEN] = {};
  if (inet_pton(AF_INET, s.c_str(), bytes.data()) == 1)
    return inet_ntop(AF_INET, bytes.data(), out, sizeof out) ? std::optional(std::string(out))
                                                             : std::nullopt;
  if (inet_pton(AF_INET6, s.c_str(), bytes.data()) == 1)
    return inet_ntop(AF_INET6, bytes.data(), out, sizeof out) ? std::optional(std::string(out))
                                                              : std::nullopt;
  return std::nullopt;
}

std::vector<std::string_view> labels(std::string_view name) {
  std::vector<std::string_view> out;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    out.push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

// Go's matchHostnames: the certificate's name may start with a "*" label that stands for exactly
// one non-empty label of the allowed name; comparison ignores case and one trailing dot.
bool dns_matches(std::string pattern, std::string host) {
  pattern = lower(pattern);
  host = lower(host);
  if (!host.empty() && host.back() == '.') host.pop_back();
  if (!pattern.empty() && pattern.back() == '.') pattern.pop_back();
  if (pattern.empty() || host.empty()) return false;
  const auto p = labels(pattern), h = labels(host);
  if (p.size() != h.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i == 0 && p[i] == "*" && !h[i].empty()) continue;
    if (p[i] != h[i]) return false;
  }
  return true;
}

bool contains(const std::vector<std::string>& names, auto&& same) {
  return std::any_of(names.begin(), names.end(), same);
}

}  // namespace

Result<AllowedIdentity> AllowedIdentity::parse(const std::string& flag_value) {
  auto bad = [&](const std::string& why) {
    return Error{EINVAL, "--tls-client-allow " + flag_value + ": " + why};
  };
  static constexpr std::pair<std::string_view, IdentityKind> kTypes[] = {
      {"DNS:", IdentityKind::kDns},     {"IP:", IdentityKind::kIp},
      {"URI:", IdentityKind::kUri},     {"email:", IdentityKind::kEmail},
      {"CN:", IdentityKind::kCommonName}};
  AllowedIdentity id{IdentityKind::kDns, flag_value, flag_value};
  bool typed = false;
  for (const auto& [prefix, kind] : kTypes) {
    if (lower(flag_value.substr(0, prefix.size())) == lower(prefix)) {
      id.kind = kind;
      id.value = flag_value.substr(prefix.size());
      typed = true;
      break;
    }
  }
  if (!typed) {
    const auto colon = flag_value.find(':');
    // An untyped IPv6 literal has colons; anything else with a colon before a dot or slash is
    // a type we do not know.
    if (colon != std::string::npos && !canonical_ip(flag_value) &&
        flag_value.find_first_of("./") > colon)
      return bad("unknown type \"" + flag_value.substr(0, colon + 1) +
                 "\" (DNS:, IP:, URI:, email: or CN:)");
    if (canonical_ip(flag_value)) id.kind = IdentityKind::kIp;
  }
  if (id.value.empty()) return bad("empty name");
  if (id.kind == IdentityKind::kIp) {
    auto ip = canonical_ip(id.value);
    if (!ip) return bad("not an IP address");
    id.value = *ip;
  }
  if (id.kind == IdentityKind::kDns && id.value.find('*') != std::string::npos)
    return bad("a wildcard names no client; list the name the client certificate covers");
  return id;
}

bool identity_allowed(const std::vector<AllowedIdentity>& allowed, const PresentedIdentity& peer) {
  for (const auto& a : allowed) {
    switch (a.kind) {
      case IdentityKind::kDns:
        if (contains(peer.dns, [&](const std::string& n) { return dns_matches(n, a.value); }))
          return true;
        break;
      case IdentityKind::kIp:
        if (contains(peer.ip, [&](const std::string& n) { return canonical_ip(n) == a.value; }))
          return true;
        break;
      case IdentityKind::kUri:
        if (contains(peer.uri, [&](const std::string& n) { return n == a.value; })) return true;
        break;
      case IdentityKind::kEmail:
        if (contains(peer.email, [&](const std::string& n) { return lower(n) == lower(a.value); }))
          return true;
        break;
      case IdentityKind::kCommonName:
        if (!peer.common_name.empty() && peer.common_name == a.value) return true;
        break;
    }
  }
  return false;
}

std::string describe(const PresentedIdentity& peer) {
  std::string out;
  auto add = [&](const char* type, const std::string& name) {
    out += (out.empty() ? "" : ", ") + std::string(type) + name;
  };
  for (const auto& n : peer.dns) add("DNS:", n);
  for (const auto& n : peer.ip) add("IP:", n);
  for (const auto& n : peer.uri) add("URI:", n);
  for (const auto& n : peer.email) add("email:", n);
  if (!peer.common_name.empty()) add("CN:", peer.common_name);
  return out.empty() ? "no names" : out;
}

PresentedIdentity presented_by(const grpc::AuthContext& auth) {
  PresentedIdentity peer;
  auto values = [&](const char* property, std::vector<std::string>& into) {
    for (const auto& v : auth.FindPropertyValues(property)) into.emplace_back(v.data(), v.size());
  };
  values(GRPC_PEER_DNS_PROPERTY_NAME, peer.dns);
  values(GRPC_PEER_IP_PROPERTY_NAME, peer.ip);
  values(GRPC_PEER_URI_PROPERTY_NAME, peer.uri);
  values(GRPC_PEER_EMAIL_PROPERTY_NAME, peer.email);
  if (auto cn = auth.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME); !cn.empty())
    peer.common_name.assign(cn.front().data(), cn.front().size());
  return peer;
}

std::string client_of(const std::string& grpc_peer, const PresentedIdentity* certificate) {
  if (certificate != nullptr) return "certificate " + describe(*certificate);
  // "ipv4:10.0.0.1:43210", "ipv6:[fd00::1]:43210": the address without the port.
  if (grpc_peer.starts_with("ipv4:") || grpc_peer.starts_with("ipv6:")) {
    const auto colon = grpc_peer.rfind(':');
    return colon > 5 ? grpc_peer.substr(0, colon) : grpc_peer;
  }
  return grpc_peer;
}

std::string client_of(const ucred& peer) {
  return "pid " + std::to_string(peer.pid) + ", uid " + std::to_string(peer.uid);
}

std::string client_of(const grpc::ServerContext& ctx) {
  const auto auth = ctx.auth_context();
  if (auth && auth->IsPeerAuthenticated() &&
      !auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty()) {
    const PresentedIdentity cert = presented_by(*auth);
    return client_of(ctx.peer(), &cert);
  }
  return client_of(ctx.peer(), nullptr);
}

}  // namespace kpleg::api

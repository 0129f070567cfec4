// --tls-client-allow's matching rules (api/client_identity.h): a name of one kind never matches
// a name of another kind, and an untyped name never matches a common name.
#include "api/client_identity.h"

#include <gtest/gtest.h>

namespace kpleg::api {
namespace {

std::vector<AllowedIdentity> allow(std::initializer_list<const char*> names) {
  std::vector<AllowedIdentity> out;
  for (const char* n : names) {
    auto id = AllowedIdentity::parse(n);
    EXPECT_TRUE(id.ok()) << n << ": " << id.error().message;
    if (id) out.push_back(*id);
  }
  return out;
}

TEST(ClientIdentity, UntypedNameMatchesDnsEntriesButNeverTheCommonName) {
  const auto a = allow({"agent.kpleg"});
  EXPECT_TRUE(identity_allowed(a, {.dns = {"agent.kpleg"}}));
  EXPECT_TRUE(identity_allowed(a, {.dns = {"Agent.KPLEG."}})) << "case and a trailing dot";
  EXPECT_FALSE(identity_allowed(a, {.common_name = "agent.kpleg"}))
      << "Kubernetes clients stopped reading the CN";
  EXPECT_FALSE(identity_allowed(a, {.dns = {"other.kpleg"}, .common_name = "agent.kpleg"}));
  EXPECT_FALSE(identity_allowed(a, {.uri = {"agent.kpleg"}, .email = {"agent.kpleg"}}));
}

TEST(ClientIdentity, UntypedAddressMatchesIpEntriesAsAddresses) {
  const auto a = allow({"::1", "10.0.0.7"});
  EXPECT_EQ(a[0].kind, IdentityKind::kIp);
  EXPECT_TRUE(identity_allowed(a, {.ip = {"0:0:0:0:0:0:0:1"}}));
  EXPECT_TRUE(identity_allowed(a, {.ip = {"10.0.0.7"}}));
  EXPECT_FALSE(identity_allowed(a, {.dns = {"10.0.0.7"}})) << "a DNS entry is not an address";
  EXPECT_FALSE(identity_allowed(a, {.ip = {"10.0.0.70"}}));
}

TEST(ClientIdentity, TypedNamesMatchOnlyTheirKind) {
  const auto a = allow({"CN:system:node:n1", "URI:spiffe://cluster/ns/kpleg/sa/reader",
                        "email:Ops@Example.org", "DNS:agent"});
  EXPECT_TRUE(identity_allowed(a, {.common_name = "system:node:n1"}));
  EXPECT_TRUE(identity_allowed(a, {.dns = {"x"}, .common_name = "system:node:n1"}))
      << "CN: matches whatever SANs the certificate has";
  EXPECT_FALSE(identity_allowed(a, {.dns = {"system:node:n1"}}));
  EXPECT_TRUE(identity_allowed(a, {.uri = {"spiffe://cluster/ns/kpleg/sa/reader"}}));
  EXPECT_FALSE(identity_allowed(a, {.uri = {"spiffe://cluster/ns/kpleg/sa/Reader"}}));
  EXPECT_FALSE(identity_allowed(a, {.dns = {"spiffe://cluster/ns/kpleg/sa/reader"}}));
  EXPECT_TRUE(identity_allowed(a, {.email = {"ops@example.org"}}));
  EXPECT_FALSE(identity_allowed(a, {.common_name = "ops@example.org"}));
  EXPECT_TRUE(identity_allowed(a, {.dns = {"agent"}}));
  EXPECT_FALSE(identity_allowed(a, {.common_name = "agent"}));
}

TEST(ClientIdentity, CertificateWildcardCoversOneLeftmostLabel) {
  const auto a = allow({"agent.node1.kpleg"});
  EXPECT_TRUE(identity_allowed(a, {.dns = {"*.node1.kpleg"}}));
  EXPECT_FALSE(identity_allowed(a, {.dns = {"*.kpleg"}})) << "one label only";
  EXPECT_FALSE(identity_allowed(a, {.dns = {"agent.*.kpleg"}})) << "leftmost label only";
}

TEST(ClientIdentity, BadValuesAreRefusedWithTheReason) {
  auto why = [](const char* v) {
    auto id = AllowedIdentity::parse(v);
    return id ? std::string("accepted") : id.error().message;
  };
  EXPECT_EQ(why("IP:agent"), "--tls-client-allow IP:agent: not an IP address");
  EXPECT_EQ(why("DNS:"), "--tls-client-allow DNS:: empty name");
  EXPECT_EQ(why("SAN:agent"),
            "--tls-client-allow SAN:agent: unknown type \"SAN:\" (DNS:, IP:, URI:, email: or CN:)");
  EXPECT_EQ(why("spiffe://x/y"),
            "--tls-client-allow spiffe://x/y: unknown type \"spiffe:\" (DNS:, IP:, URI:, email: "
            "or CN:)");
  EXPECT_NE(why("*.kpleg").find("a wildcard names no client"), std::string::npos);
  EXPECT_EQ(why("dns:agent"), "accepted") << "types are case-insensitive";
}

TEST(ClientIdentity, RefusalNamesWhatTheCertificatePresented) {
  EXPECT_EQ(describe({.dns = {"a"}, .ip = {"10.0.0.1"}, .common_name = "b"}),
            "DNS:a, IP:10.0.0.1, CN:b");
  EXPECT_EQ(describe({}), "no names");
}

}  // namespace
}  // namespace kpleg::api

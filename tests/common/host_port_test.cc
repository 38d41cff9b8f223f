#include "ddp/common/host_port.h"

#include <gtest/gtest.h>

#include "ddp/common/error.h"

namespace ddp {
namespace {

TEST(SplitHostPort, SplitsHostsPortsAndBracketedIpv6) {
  HostPort plain = split_host_port("node1", "test");
  EXPECT_EQ(plain.host, "node1");
  EXPECT_FALSE(plain.port);

  HostPort with_port = split_host_port("node1:29400", "test");
  EXPECT_EQ(with_port.host, "node1");
  ASSERT_TRUE(with_port.port);
  EXPECT_EQ(*with_port.port, "29400");

  HostPort v6 = split_host_port("[::1]:2379", "test");
  EXPECT_EQ(v6.host, "::1");
  ASSERT_TRUE(v6.port);
  EXPECT_EQ(*v6.port, "2379");

  HostPort v6_alone = split_host_port("[fe80::1]", "test");
  EXPECT_EQ(v6_alone.host, "fe80::1");
  EXPECT_FALSE(v6_alone.port);

  // More than one colon without brackets: a bare IPv6 address, all host.
  HostPort bare = split_host_port("::1", "test");
  EXPECT_EQ(bare.host, "::1");
  EXPECT_FALSE(bare.port);
}

TEST(SplitHostPort, AColonWithNothingAfterItIsAnEmptyPort) {
  HostPort host = split_host_port("node1:", "test");
  EXPECT_EQ(host.host, "node1");
  ASSERT_TRUE(host.port);
  EXPECT_EQ(*host.port, "");
  HostPort v6 = split_host_port("[::1]:", "test");
  EXPECT_EQ(v6.host, "::1");
  ASSERT_TRUE(v6.port);
  EXPECT_EQ(*v6.port, "");
  // An empty host is the caller's to refuse.
  EXPECT_EQ(split_host_port(":80", "test").host, "");
  EXPECT_EQ(split_host_port("", "test").host, "");
}

TEST(SplitHostPort, RefusesBadBracketsNamingTheOriginAndTheText) {
  try {
    split_host_port("[::1", "origin");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("origin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unclosed '[' in '[::1'"), std::string::npos) << e.what();
  }
  try {
    split_host_port("[::1]x", "origin");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad endpoint '[::1]x'"), std::string::npos) << e.what();
  }
}

TEST(JoinHostPort, BracketsIpv6Hosts) {
  EXPECT_EQ(join_host_port("node1", "29400"), "node1:29400");
  EXPECT_EQ(join_host_port("::1", "2379"), "[::1]:2379");
  EXPECT_EQ(join_host_port("10.0.0.1", ""), "10.0.0.1:");
}

}  // namespace
}  // namespace ddp

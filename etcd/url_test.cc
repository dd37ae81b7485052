#include "etcd/url.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::etcd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseEtcdUrlTest, EndpointsAndPrefix) {
  absl::StatusOr<EtcdUrl> url =
      ParseEtcdUrl("etcd://10.0.0.1:2379,10.0.0.2:2379,etcd-3.example:22379/shardline");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_THAT(url->endpoints,
              ElementsAre("10.0.0.1:2379", "10.0.0.2:2379", "etcd-3.example:22379"));
  EXPECT_EQ(url->prefix, "/shardline/");
  EXPECT_EQ(url->ToString(), "etcd://10.0.0.1:2379,10.0.0.2:2379,etcd-3.example:22379/shardline");
}

TEST(ParseEtcdUrlTest, NestedPathIpv6AndTrailingSlash) {
  absl::StatusOr<EtcdUrl> url = ParseEtcdUrl("etcd://[::1]:2379,[fe80::2]:2380/team-a/prod.v_2/");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_THAT(url->endpoints, ElementsAre("[::1]:2379", "[fe80::2]:2380"));
  EXPECT_EQ(url->prefix, "/team-a/prod.v_2/");
  EXPECT_EQ(url->ToString(), "etcd://[::1]:2379,[fe80::2]:2380/team-a/prod.v_2");
}

TEST(ParseEtcdUrlTest, LimitsAreInclusive) {
  std::vector<std::string> sixteen;
  for (int i = 0; i < kMaxEndpoints; ++i) sixteen.push_back(absl::StrCat("127.0.0.1:", 2000 + i));
  // "/" + path + "/" is exactly kMaxPrefixBytes.
  const std::string path(kMaxPrefixBytes - 2, 'p');
  absl::StatusOr<EtcdUrl> url =
      ParseEtcdUrl(absl::StrCat("etcd://", absl::StrJoin(sixteen, ","), "/", path));
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->endpoints.size(), 16u);
  EXPECT_EQ(url->prefix.size(), static_cast<size_t>(kMaxPrefixBytes));
  EXPECT_TRUE(ParseEtcdUrl("etcd://h:1/p").ok());
  EXPECT_TRUE(ParseEtcdUrl("etcd://h:65535/p").ok());
}

struct BadUrl {
  const char* url;
  const char* says;
};

class BadEtcdUrlTest : public ::testing::TestWithParam<BadUrl> {};

TEST_P(BadEtcdUrlTest, IsRefusedNamingTheFlagAndTheProblem) {
  absl::StatusOr<EtcdUrl> url = ParseEtcdUrl(GetParam().url, "--state");
  ASSERT_FALSE(url.ok()) << GetParam().url;
  EXPECT_EQ(url.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(url.status().message(), HasSubstr("--state"));
  EXPECT_THAT(url.status().message(), HasSubstr(GetParam().says));
}

INSTANTIATE_TEST_SUITE_P(
    EveryErrorOfTheHeader, BadEtcdUrlTest,
    ::testing::Values(
        BadUrl{"http://127.0.0.1:2379/shardline", "does not start with etcd://"},
        BadUrl{"/var/lib/shardline/state.db", "does not start with etcd://"},
        BadUrl{"etcd://", "names no endpoint"},
        BadUrl{"etcd:///shardline", "names no endpoint"},
        BadUrl{"etcd://127.0.0.1/shardline", "has no :PORT"},
        BadUrl{"etcd://:2379/shardline", "has no HOST"},
        BadUrl{"etcd://127.0.0.1:/shardline", "has an empty port"},
        BadUrl{"etcd://127.0.0.1:0/shardline", "outside 1..65535"},
        BadUrl{"etcd://127.0.0.1:65536/shardline", "outside 1..65535"},
        BadUrl{"etcd://127.0.0.1:123456/shardline", "outside 1..65535"},
        BadUrl{"etcd://127.0.0.1:23x/shardline", "not a number"},
        BadUrl{"etcd://127.0.0.1:-1/shardline", "not a number"},
        BadUrl{"etcd://user@127.0.0.1:2379/shardline", "not allowed in a host name"},
        BadUrl{"etcd://::1:2379/shardline", "IPv6 address without brackets"},
        BadUrl{"etcd://[::1:2379/shardline", "'[' without ']'"},
        BadUrl{"etcd://[]:2379/shardline", "empty IPv6 address"},
        BadUrl{"etcd://[::g]:2379/shardline", "not allowed in an IPv6 address"},
        BadUrl{"etcd://[127.0.0.1]:2379/shardline", "brackets around a non-IPv6 host"},
        BadUrl{"etcd://[::1]/shardline", "no :PORT after the IPv6 address"},
        BadUrl{"etcd://a:1,,b:2/shardline", "endpoint 2 of --state"},
        BadUrl{"etcd://a:1,b:2,/shardline", "endpoint 3 of --state"},
        BadUrl{"etcd://a:1,b:2,A:1/shardline", "twice"},
        BadUrl{"etcd://a:1", "has no /PREFIX"},
        BadUrl{"etcd://a:1/", "has no /PREFIX"},
        BadUrl{"etcd://a:1//", "empty PREFIX segment"},
        BadUrl{"etcd://a:1/x//y", "empty PREFIX segment"},
        BadUrl{"etcd://a:1//x", "empty PREFIX segment"},
        BadUrl{"etcd://a:1/shard line", "outside [A-Za-z0-9._-/]"},
        BadUrl{"etcd://a:1/shard%2Fline", "outside [A-Za-z0-9._-/]"},
        BadUrl{"etcd://a:1/\xc3\xa9t\xc3\xa9", "outside [A-Za-z0-9._-/]"},
        BadUrl{"etcd://a:1/shardline?x=1", "query or fragment"},
        BadUrl{"etcd://a:1/shardline#top", "query or fragment"},
        BadUrl{"etcd://a:1?x/shardline", "query or fragment"}));

TEST(ParseEtcdUrlTest, TooManyEndpoints) {
  std::vector<std::string> seventeen;
  for (int i = 0; i <= kMaxEndpoints; ++i) {
    seventeen.push_back(absl::StrCat("127.0.0.1:", 2000 + i));
  }
  absl::StatusOr<EtcdUrl> url =
      ParseEtcdUrl(absl::StrCat("etcd://", absl::StrJoin(seventeen, ","), "/p"), "--state");
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(url.status().message(), HasSubstr("17 endpoints, more than the 16 allowed"));
}

TEST(ParseEtcdUrlTest, PrefixTooLong) {
  const std::string path(kMaxPrefixBytes - 1, 'p');  // 257 bytes with the slashes
  absl::StatusOr<EtcdUrl> url = ParseEtcdUrl(absl::StrCat("etcd://h:1/", path), "--state");
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(url.status().message(), HasSubstr("PREFIX of 257 bytes"));
}

TEST(ParseEtcdUrlTest, NamesTheGivenFlag) {
  absl::StatusOr<EtcdUrl> url = ParseEtcdUrl("etcd://h/p", "--replica-state");
  ASSERT_FALSE(url.ok());
  EXPECT_THAT(url.status().message(), HasSubstr("--replica-state"));
  EXPECT_THAT(url.status().message(), HasSubstr("e.g. 127.0.0.1:2379"));
}

TEST(CheckEndpointTest, AcceptsAndRefuses) {
  EXPECT_TRUE(CheckEndpoint("127.0.0.1:2379", "e").ok());
  EXPECT_TRUE(CheckEndpoint("localhost:1", "e").ok());
  EXPECT_TRUE(CheckEndpoint("[::1]:2379", "e").ok());
  absl::Status empty = CheckEndpoint("", "etcd endpoint 1");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("etcd endpoint 1 '' is empty"));
  EXPECT_THAT(CheckEndpoint("h:2379/x", "e").message(), HasSubstr("not a number"));
  EXPECT_THAT(CheckEndpoint("h:99999", "e").message(), HasSubstr("outside 1..65535"));
}

}  // namespace
}  // namespace shardline::etcd

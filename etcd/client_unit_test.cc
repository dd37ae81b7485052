// etcd::Client without an etcd: PrefixRangeEnd, Connect's checks, and what
// a call says when no member is reachable.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "etcd/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::etcd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(PrefixRangeEndTest, IncrementsTheLastByte) {
  EXPECT_EQ(PrefixRangeEnd("/shardline/"), "/shardline0");  // '/' + 1 == '0'
  EXPECT_EQ(PrefixRangeEnd("a"), "b");
  EXPECT_EQ(PrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(PrefixRangeEnd("a\xff\xff"), "b");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\0", 2)), "a\x01");
}

TEST(PrefixRangeEndTest, NoUpperBoundGivesTheZeroByte) {
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
  EXPECT_EQ(PrefixRangeEnd("\xff\xff"), std::string(1, '\0'));
}

TEST(ConnectTest, RefusesBadOptions) {
  absl::StatusOr<std::unique_ptr<Client>> none = Client::Connect({});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("no endpoints"));

  ClientOptions bad;
  bad.endpoints = {"127.0.0.1:2379", "127.0.0.1"};
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(bad);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("etcd endpoint 2 '127.0.0.1' has no :PORT"));

  ClientOptions zero;
  zero.endpoints = {"127.0.0.1:2379"};
  zero.timeout = absl::ZeroDuration();
  EXPECT_EQ(Client::Connect(zero).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeEtcdCredentialsTest, CertWithoutKeyIsRefused) {
  auto creds = MakeEtcdCredentials("", "/nonexistent/cert.pem", "");
  EXPECT_EQ(creds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(creds.status().message(), HasSubstr("--etcd-cert is set without --etcd-key"));
  auto missing = MakeEtcdCredentials("/nonexistent/ca.pem", "", "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--etcd-ca"));
}

// A loopback port nobody listens on (bound, then closed).
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(UnreachableTest, EveryCallNamesEachEndpointAndFailsWithinTheTimeout) {
  ClientOptions options;
  const std::string a = absl::StrCat("127.0.0.1:", ClosedPort());
  const std::string b = absl::StrCat("127.0.0.1:", ClosedPort());
  options.endpoints = {a, b};
  options.timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Client>> etcd = Client::Connect(options);
  ASSERT_TRUE(etcd.ok()) << etcd.status();

  const absl::Time start = absl::Now();
  etcdserverpb::RangeRequest range;
  range.set_key("k");
  absl::StatusOr<etcdserverpb::RangeResponse> r = (*etcd)->Range(range);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(std::string(r.status().message()), StartsWith("etcd at "));
  EXPECT_THAT(r.status().message(), HasSubstr(a + ": connection refused"));
  EXPECT_THAT(r.status().message(), HasSubstr(b + ": connection refused"));

  etcdserverpb::TxnRequest txn;
  absl::StatusOr<etcdserverpb::TxnResponse> t = (*etcd)->Txn(txn);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr(a + ": not connected"));
  EXPECT_THAT(t.status().message(), HasSubstr(b + ": not connected"));

  EXPECT_EQ((*etcd)->LeaseGrant(absl::Seconds(2)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*etcd)->LeaseKeepAliveOnce(1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));

  std::vector<MemberStatus> status = (*etcd)->Status(absl::Milliseconds(500));
  ASSERT_EQ(status.size(), 2u);
  EXPECT_EQ(status[0].endpoint, a);
  EXPECT_FALSE(status[0].status.ok());
  EXPECT_FALSE(status[0].is_leader());
  EXPECT_THAT(std::string(status[1].status.message()), StartsWith("etcd at " + b));
}

}  // namespace
}  // namespace shardline::etcd

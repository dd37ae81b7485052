// etcd::Client against a real 3-member etcd 3.4 cluster (testing/
// etcd_cluster.h): key ranges, transactions, leases, member status, and
// what a call does when one member, then two, are gone.
#include "etcd/client.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/etcd_cluster.h"

namespace shardline::etcd {
namespace {

using ::shardline::testing::EtcdCluster;
using ::testing::HasSubstr;

std::unique_ptr<EtcdCluster> StartCluster() {
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start();
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

std::unique_ptr<Client> ConnectTo(const std::vector<std::string>& endpoints,
                                  absl::Duration timeout = absl::Seconds(2)) {
  ClientOptions options;
  options.endpoints = endpoints;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

etcdserverpb::TxnRequest PutTxn(const std::string& key, const std::string& value,
                                int64_t lease = 0) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  return txn;
}

// The value of `key`, "" when absent; a failed Range fails the test.
std::string Get(Client& etcd, const std::string& key, int64_t* create_revision = nullptr) {
  etcdserverpb::RangeRequest r;
  r.set_key(key);
  absl::StatusOr<etcdserverpb::RangeResponse> got = etcd.Range(r);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok() || got->kvs_size() == 0) return "";
  if (create_revision != nullptr) *create_revision = got->kvs(0).create_revision();
  return got->kvs(0).value();
}

int LeaderIndex(Client& etcd) {
  std::vector<MemberStatus> status = etcd.Status();
  for (size_t i = 0; i < status.size(); ++i) {
    if (status[i].is_leader()) return static_cast<int>(i);
  }
  return -1;
}

TEST(EtcdClientTest, RangeTxnStatusAndLeases) {
  std::unique_ptr<EtcdCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<Client> etcd = ConnectTo(cluster->endpoints());
  ASSERT_NE(etcd, nullptr);

  // Txn: a put, then a compare that holds and one that does not.
  absl::StatusOr<etcdserverpb::TxnResponse> put = etcd->Txn(PutTxn("/t/a", "1"));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(put->succeeded());
  int64_t created = 0;
  EXPECT_EQ(Get(*etcd, "/t/a", &created), "1");
  EXPECT_EQ(created, put->header().revision());

  etcdserverpb::TxnRequest cas = PutTxn("/t/a", "2");
  etcdserverpb::Compare* c = cas.add_compare();
  c->set_key("/t/a");
  c->set_target(etcdserverpb::Compare::VALUE);
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_value("1");
  cas.add_failure()->mutable_request_range()->set_key("/t/a");
  absl::StatusOr<etcdserverpb::TxnResponse> first = etcd->Txn(cas);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded());
  absl::StatusOr<etcdserverpb::TxnResponse> second = etcd->Txn(cas);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->succeeded());
  ASSERT_EQ(second->responses_size(), 1);
  ASSERT_EQ(second->responses(0).response_range().kvs_size(), 1);
  EXPECT_EQ(second->responses(0).response_range().kvs(0).value(), "2");
  EXPECT_EQ(second->responses(0).response_range().kvs(0).create_revision(), created);

  // Two puts of one key in one Txn: etcd refuses it as malformed.
  etcdserverpb::TxnRequest twice = PutTxn("/t/b", "x");
  *twice.add_success() = twice.success(0);
  absl::StatusOr<etcdserverpb::TxnResponse> dup = etcd->Txn(twice);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument) << dup.status();
  EXPECT_THAT(std::string(dup.status().message()), ::testing::StartsWith("etcd at "));
  EXPECT_THAT(dup.status().message(), HasSubstr("duplicate key"));

  // RangePrefix pages at one revision.
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(etcd->Txn(PutTxn(absl::StrCat("/p/k", i), absl::StrCat("v", i))).ok());
  }
  ASSERT_TRUE(etcd->Txn(PutTxn("/pother", "not under /p/")).ok());
  int64_t revision = 0;
  absl::StatusOr<std::vector<etcdserverpb::KeyValue>> all =
      etcd->RangePrefix("/p/", &revision, /*page=*/3);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ((*all)[i].key(), absl::StrCat("/p/k", i));
    EXPECT_EQ((*all)[i].value(), absl::StrCat("v", i));
  }
  EXPECT_GT(revision, 0);

  // Status: every member answers, one leader, all agree which.
  std::vector<MemberStatus> status = etcd->Status();
  ASSERT_EQ(status.size(), 3u);
  int leaders = 0;
  for (const MemberStatus& m : status) {
    EXPECT_TRUE(m.status.ok()) << m.status;
    EXPECT_EQ(m.version, "3.4.23");
    EXPECT_NE(m.member_id, 0u);
    EXPECT_EQ(m.leader_id, status[0].leader_id);
    EXPECT_GT(m.raft_term, 0u);
    EXPECT_GT(m.db_size_bytes, 0);
    leaders += m.is_leader() ? 1 : 0;
  }
  EXPECT_EQ(leaders, 1);

  // A lease kept alive outlives its TTL; its key goes when it expires.
  absl::StatusOr<int64_t> lease = etcd->LeaseGrant(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(etcd->Txn(PutTxn("/lease/held", "x", *lease)).ok());
  const absl::Time granted = absl::Now();
  while (absl::Now() - granted < absl::Seconds(3)) {
    absl::StatusOr<absl::Duration> ttl = etcd->LeaseKeepAliveOnce(*lease);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(400));
  }
  EXPECT_EQ(Get(*etcd, "/lease/held"), "x");
  absl::StatusOr<absl::Duration> left = etcd->LeaseTimeToLive(*lease);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_LE(*left, absl::Seconds(2));
  const absl::Time last_keepalive = absl::Now();
  while (!Get(*etcd, "/lease/held").empty() && absl::Now() - last_keepalive < absl::Seconds(8)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  const absl::Duration expired_after = absl::Now() - last_keepalive;
  EXPECT_EQ(Get(*etcd, "/lease/held"), "") << "still there after " << expired_after;
  EXPECT_GE(expired_after, absl::Seconds(1));
  absl::StatusOr<absl::Duration> gone = etcd->LeaseKeepAliveOnce(*lease);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_THAT(gone.status().message(), HasSubstr("expired or was revoked"));
  EXPECT_EQ(etcd->LeaseTimeToLive(*lease).status().code(), absl::StatusCode::kNotFound);

  // Revoking deletes the lease's keys at once; revoking again is OK.
  absl::StatusOr<int64_t> other = etcd->LeaseGrant(absl::Seconds(30));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(etcd->Txn(PutTxn("/lease/revoked", "y", *other)).ok());
  EXPECT_EQ(Get(*etcd, "/lease/revoked"), "y");
  EXPECT_TRUE(etcd->LeaseRevoke(*other).ok());
  EXPECT_EQ(Get(*etcd, "/lease/revoked"), "");
  EXPECT_TRUE(etcd->LeaseRevoke(*other).ok());
}

TEST(EtcdClientTest, OneMemberDownCallsStillSucceed) {
  std::unique_ptr<EtcdCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<Client> etcd = ConnectTo(cluster->endpoints());
  ASSERT_NE(etcd, nullptr);
  ASSERT_TRUE(etcd->Txn(PutTxn("/k", "before")).ok());
  absl::StatusOr<int64_t> lease = etcd->LeaseGrant(absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();

  // The client's current endpoint is the first; kill that member (the
  // leader or not: the other two keep a quorum either way).
  const int leader_before = LeaderIndex(*etcd);
  cluster->Kill(0);
  // While a new leader is elected (when member 0 led), calls may be
  // refused for up to an election; after that every call must succeed.
  const absl::Time killed = absl::Now();
  absl::Status range_status;
  while (absl::Now() - killed < absl::Seconds(10)) {
    etcdserverpb::RangeRequest r;
    r.set_key("/k");
    range_status = etcd->Range(r).status();
    if (range_status.ok()) break;
    // Only a lost leader may cost time.
    if (leader_before != 0) FAIL() << "member " << leader_before << " leads: " << range_status;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(range_status.ok()) << range_status << "\n" << cluster->LogTails();
  EXPECT_EQ(Get(*etcd, "/k"), "before");
  absl::StatusOr<etcdserverpb::TxnResponse> put = etcd->Txn(PutTxn("/k", "after"));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(Get(*etcd, "/k"), "after");
  absl::StatusOr<absl::Duration> ttl = etcd->LeaseKeepAliveOnce(*lease);
  EXPECT_TRUE(ttl.ok()) << ttl.status();
  absl::StatusOr<int64_t> granted = etcd->LeaseGrant(absl::Seconds(2));
  EXPECT_TRUE(granted.ok()) << granted.status();

  std::vector<MemberStatus> status = etcd->Status(absl::Milliseconds(500));
  EXPECT_FALSE(status[0].status.ok());
  EXPECT_THAT(status[0].status.message(), HasSubstr(cluster->endpoint(0)));
  EXPECT_TRUE(status[1].status.ok()) << status[1].status;
  EXPECT_TRUE(status[2].status.ok()) << status[2].status;

  // A client that knows only the dead member says so.
  std::unique_ptr<Client> lone = ConnectTo({cluster->endpoint(0)});
  etcdserverpb::RangeRequest r;
  r.set_key("/k");
  absl::Status s = lone->Range(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(cluster->endpoint(0) + ": connection refused"));

  // Back on its data directory, it serves the newest value.
  absl::Status restart = cluster->Restart(0);
  ASSERT_TRUE(restart.ok()) << restart;
  std::unique_ptr<Client> restarted = ConnectTo({cluster->endpoint(0)});
  EXPECT_EQ(Get(*restarted, "/k"), "after");
}

TEST(EtcdClientTest, PausedMemberCostsOneShareOfTheTimeout) {
  std::unique_ptr<EtcdCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<Client> probe = ConnectTo(cluster->endpoints());
  ASSERT_NE(probe, nullptr);
  const int leader = LeaderIndex(*probe);
  ASSERT_GE(leader, 0);
  // A follower first, so the rest keeps its leader while it is paused.
  const int follower = (leader + 1) % 3;
  std::vector<std::string> order = {cluster->endpoint(follower)};
  for (int i = 0; i < 3; ++i) {
    if (i != follower) order.push_back(cluster->endpoint(i));
  }
  const absl::Duration timeout = absl::Seconds(3);
  std::unique_ptr<Client> etcd = ConnectTo(order, timeout);
  ASSERT_NE(etcd, nullptr);
  ASSERT_TRUE(etcd->Txn(PutTxn("/k", "v1")).ok());  // connected to the follower

  // Paused, it holds the connection and answers nothing: the Range waits
  // its share (a third of the timeout), then the next member answers.
  cluster->Pause(follower);
  const absl::Time start = absl::Now();
  EXPECT_EQ(Get(*etcd, "/k"), "v1");
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, timeout / 3 - absl::Milliseconds(50));
  EXPECT_LT(took, timeout);
  // The next member is current now: a Txn goes there at once.
  const absl::Time txn_start = absl::Now();
  ASSERT_TRUE(etcd->Txn(PutTxn("/k", "v2")).ok());
  EXPECT_LT(absl::Now() - txn_start, timeout / 3);
  cluster->Resume(follower);
  EXPECT_EQ(Get(*etcd, "/k"), "v2");
}

TEST(EtcdClientTest, NoQuorumIsUnavailableWithinTheTimeoutThenRecovers) {
  std::unique_ptr<EtcdCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const absl::Duration timeout = absl::Seconds(2);
  std::unique_ptr<Client> etcd = ConnectTo(cluster->endpoints(), timeout);
  ASSERT_NE(etcd, nullptr);
  ASSERT_TRUE(etcd->Txn(PutTxn("/k", "v1")).ok());

  cluster->Kill(0);
  cluster->Kill(1);
  // Member 2 notices within an election timeout (1 s) that it has no
  // leader (a leader steps down, etcd's check-quorum); from then on every
  // call is refused at once. Until then a call may time out instead.
  const absl::Time killed = absl::Now();
  absl::Status s;
  while (absl::Now() - killed < absl::Seconds(10)) {
    etcdserverpb::RangeRequest r;
    r.set_key("/k");
    const absl::Time start = absl::Now();
    s = etcd->Range(r).status();
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(s.ok());
    EXPECT_LT(took, timeout + absl::Milliseconds(500)) << s;
    if (absl::IsUnavailable(s)) break;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("etcd at "));
  EXPECT_THAT(s.message(), HasSubstr(cluster->endpoint(0) + ": connection refused"));
  EXPECT_THAT(s.message(), HasSubstr(cluster->endpoint(1) + ": connection refused"));
  EXPECT_THAT(s.message(), HasSubstr(cluster->endpoint(2) + ": etcdserver: no leader"));
  EXPECT_THAT(s.message(), HasSubstr("quorum"));

  // A serializable read is the member's own copy: it needs no leader.
  etcdserverpb::RangeRequest local;
  local.set_key("/k");
  local.set_serializable(true);
  absl::StatusOr<etcdserverpb::RangeResponse> stale = etcd->Range(local);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_EQ(stale->kvs_size(), 1);
  EXPECT_EQ(stale->kvs(0).value(), "v1");

  // Writes too, quickly now.
  const absl::Time start = absl::Now();
  absl::Status txn = etcd->Txn(PutTxn("/k", "v2")).status();
  EXPECT_EQ(txn.code(), absl::StatusCode::kUnavailable) << txn;
  EXPECT_THAT(txn.message(), HasSubstr("no leader"));
  absl::Status grant = etcd->LeaseGrant(absl::Seconds(2)).status();
  EXPECT_EQ(grant.code(), absl::StatusCode::kUnavailable) << grant;
  EXPECT_LT(absl::Now() - start, timeout);

  // Restart(0) returns when member 0 serves again with member 2, i.e.
  // when the cluster has a quorum.
  for (int i : {0, 1}) {
    absl::Status restart = cluster->Restart(i);
    ASSERT_TRUE(restart.ok()) << restart;
  }
  absl::StatusOr<etcdserverpb::TxnResponse> put = etcd->Txn(PutTxn("/k", "v3"));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(Get(*etcd, "/k"), "v3");
  EXPECT_TRUE(etcd->LeaseGrant(absl::Seconds(2)).ok());
}

}  // namespace
}  // namespace shardline::etcd

// LeaderElection against a real 3-member etcd cluster on loopback
// (testing/etcd_cluster.h): one leader at a time, a successor as soon as
// the leader stops or its lease is gone, and a leader that cannot reach
// etcd stops leading within its lease.
#include "server/leader_election.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "etcd/client.h"
#include "gtest/gtest.h"
#include "testing/etcd_cluster.h"

namespace shardline::server {
namespace {

constexpr absl::Duration kTtl = absl::Seconds(2);

// What the callbacks of one election saw.
struct Seen {
  absl::Mutex mu;
  std::vector<LeaderTerm> terms ABSL_GUARDED_BY(mu);
  std::vector<std::string> deposed ABSL_GUARDED_BY(mu);
};

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> cluster = testing::EtcdCluster::Start();
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    etcd::ClientOptions options;
    options.endpoints = cluster_->endpoints();
    options.timeout = kTtl / 4;
    absl::StatusOr<std::unique_ptr<etcd::Client>> client = etcd::Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_ = *std::move(client);
  }

  // Election i ("r<i>" at "10.0.0.<i>:7070") on prefix "/e/".
  void Add(int i) {
    ElectionOptions options;
    options.prefix = "/e/";
    options.self.set_replica_id(absl::StrCat("r", i));
    options.self.set_address(absl::StrCat("10.0.0.", i, ":7070"));
    options.lease_ttl = kTtl;
    seen_.push_back(std::make_unique<Seen>());
    Seen* seen = seen_.back().get();
    elections_.push_back(std::make_unique<LeaderElection>(etcd_.get(), options));
    elections_.back()->Start({[seen](const LeaderTerm& t) {
                                absl::MutexLock lock(&seen->mu);
                                seen->terms.push_back(t);
                              },
                              [seen](const std::string& why) {
                                absl::MutexLock lock(&seen->mu);
                                seen->deposed.push_back(why);
                              }});
  }

  // The one election leading (-1: none, -2: more than one).
  int Leading() {
    int leader = -1;
    for (size_t i = 0; i < elections_.size(); ++i) {
      if (elections_[i] != nullptr && elections_[i]->leading()) {
        leader = leader == -1 ? static_cast<int>(i) : -2;
      }
    }
    return leader;
  }

  // `overlap_ok`: the old leader may still believe it leads (its lease was
  // revoked behind its back; it learns at its next keep-alive, and its
  // writes are fenced meanwhile).
  int WaitForLeader(absl::Duration timeout, int other_than = -1, bool overlap_ok = false) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const int l = Leading();
      if (l >= 0 && l != other_than) return l;
      if (overlap_ok && l == -2) {
        for (size_t i = 0; i < elections_.size(); ++i) {
          if (static_cast<int>(i) != other_than && elections_[i]->leading()) return i;
        }
      }
      EXPECT_NE(l, -2) << "two leaders at once";
      absl::SleepFor(absl::Milliseconds(10));
    }
    return -1;
  }

  // The first term election i was told of (`elected` runs just after
  // leading() turns true, so wait for it).
  LeaderTerm FirstTerm(int i) {
    for (absl::Time until = absl::Now() + absl::Seconds(5); absl::Now() < until;) {
      {
        absl::MutexLock lock(&seen_[i]->mu);
        if (!seen_[i]->terms.empty()) return seen_[i]->terms[0];
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    ADD_FAILURE() << "election " << i << " leads but was never told";
    return LeaderTerm();
  }

  void TearDown() override {
    for (auto& e : elections_) e.reset();
  }

  std::unique_ptr<testing::EtcdCluster> cluster_;
  std::unique_ptr<etcd::Client> etcd_;
  std::vector<std::unique_ptr<Seen>> seen_;
  std::vector<std::unique_ptr<LeaderElection>> elections_;
};

TEST_F(LeaderElectionTest, OneLeaderFollowersKnowItAndAStoppedLeaderIsReplacedAtOnce) {
  for (int i = 0; i < 3; ++i) Add(i);
  const int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  // Followers name the leader.
  for (absl::Time until = absl::Now() + absl::Seconds(5); absl::Now() < until;) {
    bool all = true;
    for (auto& e : elections_) {
      std::optional<v1::Replica> l = e->Leader();
      all = all && l.has_value() && l->replica_id() == absl::StrCat("r", leader);
    }
    if (all) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (int i = 0; i < 3; ++i) {
    std::optional<v1::Replica> l = elections_[i]->Leader();
    ASSERT_TRUE(l.has_value()) << i;
    EXPECT_EQ(l->address(), absl::StrCat("10.0.0.", leader, ":7070"));
    EXPECT_EQ(elections_[i]->Self().role(),
              i == leader ? v1::REPLICA_ROLE_LEADER : v1::REPLICA_ROLE_FOLLOWER);
  }
  EXPECT_TRUE(elections_[leader]->LeaseValid());
  // Every replica is registered; the leader first.
  absl::StatusOr<std::vector<v1::Replica>> replicas = elections_[0]->Replicas();
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  ASSERT_EQ(replicas->size(), 3u);
  EXPECT_EQ((*replicas)[0].replica_id(), absl::StrCat("r", leader));
  EXPECT_EQ((*replicas)[0].role(), v1::REPLICA_ROLE_LEADER);
  const LeaderTerm first = FirstTerm(leader);
  EXPECT_EQ(first.leader_key, "/e/leader");
  EXPECT_GT(first.revision, 0);
  // Stop revokes the lease: a successor well before the TTL.
  const absl::Time stopped = absl::Now();
  elections_[leader]->Stop();
  const int next = WaitForLeader(absl::Seconds(10), leader);
  ASSERT_GE(next, 0);
  EXPECT_LT(absl::Now() - stopped, kTtl);
  {
    absl::MutexLock lock(&seen_[leader]->mu);
    ASSERT_EQ(seen_[leader]->deposed.size(), 1u);
    EXPECT_EQ(seen_[leader]->deposed[0], "shutting down");
  }
  // A new term: its revision fences the old one's writes.
  EXPECT_GT(FirstTerm(next).revision, first.revision);
}

TEST_F(LeaderElectionTest, RevokedLeaseDeposesTheLeaderAndAnotherIsElected) {
  Add(0);
  Add(1);
  const int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  const int64_t lease = FirstTerm(leader).lease;
  ASSERT_NE(lease, 0);
  // Revoked behind the leader's back (an operator, or etcd restored from a
  // backup): it learns at its next keep-alive, a third of the TTL later.
  ASSERT_TRUE(etcd_->LeaseRevoke(lease).ok());
  const int next = WaitForLeader(absl::Seconds(10), leader, /*overlap_ok=*/true);
  ASSERT_GE(next, 0);
  auto deposed = [&] {
    absl::MutexLock lock(&seen_[leader]->mu);
    return !seen_[leader]->deposed.empty();
  };
  for (absl::Time until = absl::Now() + absl::Seconds(5); !deposed() && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::MutexLock lock(&seen_[leader]->mu);
  ASSERT_EQ(seen_[leader]->deposed.size(), 1u);
  EXPECT_TRUE(absl::StrContains(seen_[leader]->deposed[0], "lease")) << seen_[leader]->deposed[0];
}

TEST_F(LeaderElectionTest, ResignHandsOverAndTheResignedFollows) {
  Add(0);
  Add(1);
  const int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  elections_[leader]->Resign("a state write failed (test)");
  const int next = WaitForLeader(absl::Seconds(10), leader);
  ASSERT_GE(next, 0);
  {
    absl::MutexLock lock(&seen_[leader]->mu);
    ASSERT_EQ(seen_[leader]->deposed.size(), 1u);
    EXPECT_EQ(seen_[leader]->deposed[0], "a state write failed (test)");
  }
  // It does not stand again at once, and follows the new leader.
  for (absl::Time until = absl::Now() + absl::Seconds(5); absl::Now() < until;) {
    std::optional<v1::Replica> l = elections_[leader]->Leader();
    if (l.has_value() && l->replica_id() == absl::StrCat("r", next)) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::optional<v1::Replica> l = elections_[leader]->Leader();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->replica_id(), absl::StrCat("r", next));
  EXPECT_EQ(Leading(), next);
}

// etcd loses its quorum (two of three members killed): the leader's
// keep-alives fail, and it stops serving (LeaseValid) within its lease TTL
// of the last keep-alive that succeeded, not whenever etcd answers again.
// It is not deposed: etcd keeps leases while it has no raft leader and
// renews them all when it elects one, so once the quorum is back the same
// term serves on.
TEST_F(LeaderElectionTest, LeaderWithoutEtcdQuorumStopsServingWithinItsLeaseThenResumes) {
  Add(0);
  const int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_EQ(leader, 0);
  cluster_->Kill(1);
  cluster_->Kill(2);
  const absl::Time paused = absl::Now();
  while (elections_[0]->LeaseValid() && absl::Now() - paused < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(elections_[0]->LeaseValid());
  // The survivor, if it was etcd's raft leader, renews leases itself (a
  // renewal does not go through raft) until it notices it has no quorum,
  // one election timeout (1 s) later; from its last renewal on, the lease
  // is valid for the TTL.
  EXPECT_LE(absl::Now() - paused, kTtl + absl::Seconds(2));
  absl::SleepFor(kTtl);
  EXPECT_FALSE(elections_[0]->LeaseValid());
  EXPECT_FALSE(elections_[0]->LastError().empty());
  ASSERT_TRUE(cluster_->Restart(1).ok());
  ASSERT_TRUE(cluster_->Restart(2).ok());
  for (absl::Time until = absl::Now() + absl::Seconds(20);
       !elections_[0]->LeaseValid() && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(elections_[0]->LeaseValid());
  absl::MutexLock lock(&seen_[0]->mu);
  EXPECT_TRUE(seen_[0]->deposed.empty()) << seen_[0]->deposed[0];
  EXPECT_EQ(seen_[0]->terms.size(), 1u);
}

}  // namespace
}  // namespace shardline::server

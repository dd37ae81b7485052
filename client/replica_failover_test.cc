// The client library against several coordinator replicas (real gRPC
// servers in-process: testing/fake_replica.h): the address list, following a
// follower's leader hint, moving on past a dead replica, no retry of a
// non-idempotent call after an ambiguous failure (UNAVAILABLE, or CANCELLED
// by the coordinator), the error at the deadline,
// GetStatus from any replica; and that one address keeps one attempt.
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/coordinator_channels.h"
#include "client/coordinator_client.h"
#include "client/grpc_call.h"
#include "common/flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_replica.h"

namespace shardline::client {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using testing::FakeReplica;
using ::testing::HasSubstr;
using ::testing::Not;

ConnectionOptions Options(const std::vector<std::string>& addresses,
                          absl::Duration timeout = absl::Seconds(5)) {
  ConnectionOptions o;
  o.address = absl::StrJoin(addresses, ",");
  o.address_source = "--coordinator";
  o.timeout = timeout;
  return o;
}

CoordinatorClients Connect(const ConnectionOptions& o) {
  absl::StatusOr<CoordinatorClients> clients = ConnectCoordinator(o);
  EXPECT_TRUE(clients.ok()) << clients.status();
  return clients.ok() ? *std::move(clients) : CoordinatorClients{};
}

absl::StatusOr<v1::Job> GetJob(CoordinatorClients& clients) {
  v1::GetJobRequest req;
  req.set_job_id("job");
  return clients.jobs->GetJob(req);
}

// `n` distinct addresses where nothing listens: replicas that served and
// stopped.
std::vector<std::string> DeadAddresses(int n) {
  std::vector<std::unique_ptr<FakeReplica>> gone;
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    gone.push_back(std::make_unique<FakeReplica>("gone"));
    out.push_back(gone.back()->address());
  }
  for (auto& r : gone) r->Stop();
  return out;
}
std::string DeadAddress() { return DeadAddresses(1)[0]; }

TEST(ParseCoordinatorAddressesTest, OneOrSeveralInOrder) {
  EXPECT_THAT(*ParseCoordinatorAddresses("127.0.0.1:7070", "--coordinator"),
              ElementsAre("127.0.0.1:7070"));
  EXPECT_THAT(*ParseCoordinatorAddresses("c1:7070, c2:7071 ,[::1]:7072", "--coordinator"),
              ElementsAre("c1:7070", "c2:7071", "[::1]:7072"));
}

TEST(ParseCoordinatorAddressesTest, ErrorsNameTheFlagAndTheEntry) {
  auto error = [](const std::string& list) {
    return ParseCoordinatorAddresses(list, "--coordinator").status();
  };
  EXPECT_EQ(error("c1:7070,,c2:7070").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(error("c1:7070,,c2:7070").message(),
              HasSubstr("--coordinator='c1:7070,,c2:7070' has an empty address at position 2"));
  EXPECT_THAT(error("c1:7070,").message(), HasSubstr("empty address at position 2"));
  EXPECT_THAT(error("").message(), HasSubstr("--coordinator is empty"));
  EXPECT_THAT(error("c1:7070,c2").message(),
              HasSubstr("--coordinator address 2='c2' is not HOST:PORT"));
  EXPECT_THAT(error("c1:7070,c1:7070").message(), HasSubstr("--coordinator lists c1:7070 twice"));
  // One address reads as before lists existed.
  EXPECT_THAT(error("localhost").message(),
              HasSubstr("--coordinator='localhost' is not HOST:PORT"));
  std::vector<std::string> many;
  for (int i = 0; i <= static_cast<int>(kMaxCoordinatorAddresses); ++i) {
    many.push_back(absl::StrCat("c", i, ":7070"));
  }
  EXPECT_THAT(error(absl::StrJoin(many, ",")).message(),
              HasSubstr("--coordinator lists 17 addresses; at most 16"));
}

TEST(ConnectionFlagsTest, ListFromTheEnvironmentIsCheckedAndKept) {
  ArgParser parser("test");
  ConnectionFlags flags;
  flags.Register(parser);
  ASSERT_TRUE(parser.Parse({}).ok());
  auto env = [](const char* list) {
    return [list](const char* name) -> const char* {
      return std::string(name) == kCoordinatorEnv ? list : nullptr;
    };
  };
  absl::StatusOr<ConnectionOptions> ok = flags.Resolve(parser, env(" a:1, b:2"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->address, "a:1,b:2");
  EXPECT_EQ(ok->address_source, "SHARDLINE_COORDINATOR");
  absl::Status bad = flags.Resolve(parser, env("a:1,a:1")).status();
  EXPECT_THAT(bad.message(), HasSubstr("SHARDLINE_COORDINATOR lists a:1 twice"));
}

TEST(ClassifyTest, WhatAFailureSaysAboutWhereToGo) {
  using internal::Classify;
  grpc::Status refused(grpc::StatusCode::UNAVAILABLE,
                       "failed to connect to all addresses; last error: UNKNOWN: "
                       "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused");
  EXPECT_TRUE(Classify(refused, nullptr).nothing_done);
  EXPECT_TRUE(
      Classify({grpc::StatusCode::UNAVAILABLE, "not the leader: no leader is known"}, nullptr)
          .nothing_done);
  EXPECT_FALSE(Classify({grpc::StatusCode::UNAVAILABLE, "Socket closed"}, nullptr).nothing_done);
  EXPECT_FALSE(Classify({grpc::StatusCode::ABORTED, "not the leader"}, nullptr).nothing_done);
  EXPECT_EQ(Classify({grpc::StatusCode::UNAVAILABLE, "x"}, nullptr).leader_hint, "");
}

TEST(ReplicaFailoverTest, FollowsTheHintOnTheFirstCallAndStaysWithTheLeader) {
  FakeReplica follower("follower"), leader("leader");
  leader.Lead();
  follower.Follow(leader.address());
  CoordinatorClients clients = Connect(Options({follower.address(), leader.address()}));
  absl::StatusOr<v1::Job> job = GetJob(clients);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase_reason(), "leader");
  EXPECT_EQ(follower.Calls("GetJob"), 1);
  EXPECT_EQ(leader.Calls("GetJob"), 1);
  // The next call, and every client of the bundle, goes to the leader.
  ASSERT_TRUE(GetJob(clients).ok());
  v1::KvSetRequest set;
  set.set_key("k");
  ASSERT_TRUE(clients.rendezvous->KvSet(set, nullptr).ok());
  EXPECT_EQ(follower.Calls("GetJob"), 1);
  EXPECT_EQ(follower.Calls("KvSet"), 0);
  EXPECT_EQ(leader.Calls("GetJob"), 2);
  EXPECT_EQ(leader.Calls("KvSet"), 1);
}

TEST(ReplicaFailoverTest, HintToAnAddressNotInTheListIsFollowed) {
  FakeReplica follower("follower"), leader("leader");
  leader.Lead();
  follower.Follow(leader.address());
  CoordinatorClients clients = Connect(Options({follower.address()}));
  absl::StatusOr<v1::Job> job = GetJob(clients);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase_reason(), "leader");
}

TEST(ReplicaFailoverTest, DeadReplicaFirstReachesTheLeader) {
  FakeReplica leader("leader");
  leader.Lead();
  CoordinatorClients clients = Connect(Options({DeadAddress(), leader.address()}));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Job> job = GetJob(clients);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase_reason(), "leader");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ReplicaFailoverTest, LeaderMovesAndTheHintsAreFollowed) {
  FakeReplica a("a"), b("b"), c("c");
  a.Lead();
  b.Follow(a.address());
  c.Follow(a.address());
  CoordinatorClients clients = Connect(Options({a.address(), b.address(), c.address()}));
  ASSERT_EQ(GetJob(clients)->phase_reason(), "a");
  // a loses the election to c.
  a.Follow(c.address());
  b.Follow(c.address());
  c.Lead();
  absl::StatusOr<v1::Job> job = GetJob(clients);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase_reason(), "c");
  EXPECT_EQ(a.Calls("GetJob"), 2);
  EXPECT_EQ(b.Calls("GetJob"), 0);
  // Then to b; a's hint is stale (it still names c), c's is current.
  a.Follow(c.address());
  c.Follow(b.address());
  b.Lead();
  job = GetJob(clients);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase_reason(), "b");
  EXPECT_EQ(c.Calls("GetJob"), 2);
  EXPECT_EQ(a.Calls("GetJob"), 2);  // the client asked c, the leader it knew
}

TEST(ReplicaFailoverTest, NoLeaderFailsAtTheDeadlineNamingEveryReplica) {
  FakeReplica a("a"), b("b");
  a.NoLeader();
  b.NoLeader();
  CoordinatorClients clients = Connect(Options({a.address(), b.address()}, absl::Seconds(1)));
  const absl::Time start = absl::Now();
  absl::Status s = GetJob(clients).status();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("no leader is known"), HasSubstr(a.address()),
                                 HasSubstr(b.address()), HasSubstr("replicas tried")));
  // It kept trying (backoff between rounds) until the deadline was near.
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_GE(a.Calls("GetJob"), 3);
  EXPECT_GE(b.Calls("GetJob"), 3);
}

TEST(ReplicaFailoverTest, FailoverWithinTheDeadlineIsBridged) {
  FakeReplica a("a"), b("b");
  a.NoLeader();
  b.NoLeader();
  CoordinatorClients clients = Connect(Options({a.address(), b.address()}, absl::Seconds(5)));
  std::thread elect([&] {
    absl::SleepFor(absl::Milliseconds(700));
    a.Follow(b.address());
    b.Lead();
  });
  absl::StatusOr<v1::Job> job = GetJob(clients);
  elect.join();
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase_reason(), "b");
}

// Many callers of one bundle while the leadership moves around three
// replicas (with moments where the hints point at each other): every call
// reaches a leader within its deadline.
TEST(ReplicaFailoverTest, ConcurrentCallsFollowTheLeaderAsItMoves) {
  FakeReplica a("a"), b("b"), c("c");
  FakeReplica* replicas[] = {&a, &b, &c};
  a.Lead();
  b.Follow(a.address());
  c.Follow(a.address());
  CoordinatorClients clients =
      Connect(Options({a.address(), b.address(), c.address()}, absl::Seconds(10)));
  std::atomic<bool> done{false};
  std::thread mover([&] {
    for (int turn = 1; !done.load(); ++turn) {
      FakeReplica* next = replicas[turn % 3];
      for (FakeReplica* r : replicas) {
        if (r != next) r->Follow(next->address());
      }
      next->Lead();
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  std::vector<std::string> failures(8);
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        absl::StatusOr<v1::Job> job = GetJob(clients);
        if (!job.ok()) {
          failures[t] = std::string(job.status().message());
          return;
        }
        ++ok;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  done = true;
  mover.join();
  EXPECT_EQ(ok.load(), 8 * 40);
  EXPECT_THAT(failures, ::testing::Each(""));
  EXPECT_GT(a.Calls("GetJob") + b.Calls("GetJob") + c.Calls("GetJob"), 8 * 40);
}

TEST(ReplicaFailoverTest, LeadersOwnErrorComesBackAsItIs) {
  FakeReplica follower("follower"), leader("leader");
  leader.Lead();
  follower.Follow(leader.address());
  CoordinatorClients clients = Connect(Options({follower.address(), leader.address()}));
  v1::GetJobRequest req;
  req.set_job_id("missing");
  absl::Status s = clients.jobs->GetJob(req).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no job missing");
  EXPECT_EQ(leader.Calls("GetJob"), 1);
}

TEST(ReplicaFailoverTest, CancelTokenEndsTheWaitBetweenReplicas) {
  FakeReplica a("a"), b("b");
  a.NoLeader();
  b.NoLeader();
  CoordinatorClients clients = Connect(Options({a.address(), b.address()}, absl::Seconds(30)));
  CancelToken cancel;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancel.Cancel("the generation ended");
  });
  const absl::Time start = absl::Now();
  v1::KvSetRequest set;
  set.set_key("k");
  absl::Status s = clients.rendezvous->KvSet(set, &cancel).status();
  canceller.join();
  // (The message names the reason when the cancel came during a wait, as
  // it almost always does here; gRPC's when it came during an attempt.)
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_GE(a.Calls("KvSet"), 2);  // it was retrying until then
}

// The two ambiguous failures of a replica that did the write: it answers
// UNAVAILABLE without a hint (its lease ran out while answering), or the
// call ends CANCELLED without the client asking (a leader stepping down
// cancels the calls still open after its grace; the client reads it as
// UNAVAILABLE, client/grpc_call.h ServerEnded).
struct AmbiguousFailure {
  const char* name;
  void (FakeReplica::*make)();
  const char* message;  // in the error of a call not sent again
};
constexpr AmbiguousFailure kAmbiguousFailures[] = {
    {"unavailable", &FakeReplica::StepDownAfterWrites, "lost its leader lease"},
    {"cancelled", &FakeReplica::CancelAfterWrites,
     "ended the call without an answer (CANCELLED"},
};

TEST(ReplicaFailoverTest, NonIdempotentCallIsNotRetriedAfterAnAmbiguousFailure) {
  for (const AmbiguousFailure& failure : kAmbiguousFailures) {
    SCOPED_TRACE(failure.name);
    FakeReplica a("a"), b("b");
    (a.*failure.make)();  // does the add, then fails ambiguously
    b.Lead();
    CoordinatorClients clients = Connect(Options({a.address(), b.address()}));
    v1::KvAddRequest add;
    add.set_key("counter");
    add.set_delta(1);
    absl::Status s = clients.rendezvous->KvAdd(add, nullptr).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr(a.address()));
    EXPECT_THAT(s.message(), HasSubstr(failure.message));
    EXPECT_EQ(a.Counter("counter"), 1);
    EXPECT_EQ(b.Calls("KvAdd"), 0);  // not sent again: it might add twice
    // The next call goes to the next replica.
    absl::StatusOr<v1::KvAddResponse> again = clients.rendezvous->KvAdd(add, nullptr);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(b.Counter("counter"), 1);
    EXPECT_EQ(a.Calls("KvAdd"), 1);
  }
}

TEST(ReplicaFailoverTest, IdempotentCallIsRetriedAfterAnAmbiguousFailure) {
  for (const AmbiguousFailure& failure : kAmbiguousFailures) {
    SCOPED_TRACE(failure.name);
    FakeReplica a("a"), b("b");
    (a.*failure.make)();
    b.Lead();
    CoordinatorClients clients = Connect(Options({a.address(), b.address()}));
    v1::KvSetRequest set;
    set.set_key("k");
    absl::Status s = clients.rendezvous->KvSet(set, nullptr).status();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(a.Calls("KvSet"), 1);
    EXPECT_EQ(b.Calls("KvSet"), 1);
  }
}

// With one address, a call the coordinator cancelled is one attempt that
// ends UNAVAILABLE (a CANCELLED the client asked for stays CANCELLED:
// ServerEndedTest).
TEST(ReplicaFailoverTest, CallTheCoordinatorCancelledIsOneAttemptWithOneAddress) {
  FakeReplica c("c");
  c.CancelAfterWrites();
  CoordinatorClients one = Connect(Options({c.address()}));
  v1::KvSetRequest set;
  set.set_key("k");
  absl::Status single = one.rendezvous->KvSet(set, nullptr).status();
  EXPECT_EQ(single.code(), absl::StatusCode::kUnavailable) << single;
  EXPECT_EQ(c.Calls("KvSet"), 1);
}

TEST(ServerEndedTest, OnlyACancelTheClientDidNotAskForBecomesUnavailable) {
  const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "Cancelled");
  grpc::Status s = internal::ServerEnded(cancelled, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("may have been done"));
  EXPECT_FALSE(internal::Classify(s, nullptr).nothing_done);
  CancelToken token;
  EXPECT_EQ(internal::ServerEnded(cancelled, &token).error_code(), grpc::StatusCode::UNAVAILABLE);
  token.Cancel("the worker is stopping");
  EXPECT_EQ(internal::ServerEnded(cancelled, &token).error_code(), grpc::StatusCode::CANCELLED);
  const grpc::Status other(grpc::StatusCode::ABORTED, "generation over");
  EXPECT_EQ(internal::ServerEnded(other, nullptr).error_code(), grpc::StatusCode::ABORTED);
}

TEST(ReplicaFailoverTest, WatchJobOpensOnTheLeader) {
  FakeReplica follower("follower"), leader("leader");
  leader.Lead();
  follower.Follow(leader.address());
  CoordinatorClients clients = Connect(Options({follower.address(), leader.address()}));
  v1::WatchJobRequest req;
  req.set_job_id("job");
  req.set_after_sequence(4);
  std::vector<uint64_t> seen;
  absl::Status s = clients.jobs->WatchJob(req, [&](const v1::JobEvent& e) {
    seen.push_back(e.sequence());
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(seen, ElementsAre(5u));
  EXPECT_EQ(follower.Calls("WatchJob"), 1);
  EXPECT_EQ(leader.Calls("WatchJob"), 1);
}

TEST(ReplicaFailoverTest, GetStatusAsksAnyReplicaWithoutMovingTheLeaderGuess) {
  FakeReplica follower("follower"), leader("leader");
  leader.Lead();
  follower.Follow(leader.address());
  v1::CoordinatorStatus status;
  status.set_replica_id("follower");
  status.set_leader_address(leader.address());
  follower.SetStatus(status);
  CoordinatorClients clients =
      Connect(Options({DeadAddress(), follower.address(), leader.address()}));
  absl::StatusOr<v1::CoordinatorStatus> got = clients.coordinator->GetStatus({});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->replica_id(), "follower");
  EXPECT_EQ(leader.Calls("GetStatus"), 0);
}

TEST(ReplicaFailoverTest, NoReplicaAnswersGetStatus) {
  const std::vector<std::string> dead = DeadAddresses(2);
  const std::string& a = dead[0];
  const std::string& b = dead[1];
  CoordinatorClients clients = Connect(Options({a, b}, absl::Seconds(1)));
  absl::Status s = clients.coordinator->GetStatus({}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("cannot reach the coordinator at"), HasSubstr(a), HasSubstr(b),
                    HasSubstr("replicas tried"),
                    AnyOf(HasSubstr("connection refused"), HasSubstr("could not connect"))));
}

// One address: one attempt per call and the message of before replicas
// (client/connection.h FromGrpcStatus), even when the answer is "not the
// leader" without a hint.
TEST(ReplicaFailoverTest, OneAddressMakesOneAttempt) {
  FakeReplica a("a");
  a.NoLeader();
  CoordinatorClients clients = Connect(Options({a.address()}, absl::Seconds(5)));
  const absl::Time start = absl::Now();
  absl::Status s = GetJob(clients).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), absl::StrCat("the coordinator at ", a.address(),
                                      " is unavailable: not the leader: no leader is known "
                                      "(election in progress); retry shortly"));
  EXPECT_EQ(a.Calls("GetJob"), 1);
  // Refused: at once, naming the flag, no list of replicas.
  CoordinatorClients dead = Connect(Options({DeadAddress()}, absl::Seconds(5)));
  s = GetJob(dead).status();
  EXPECT_THAT(s.message(), AllOf(HasSubstr("connection refused"), HasSubstr("--coordinator"),
                                 Not(HasSubstr("replicas tried"))));
}

TEST(CoordinatorChannelsTest, GuessMovesOnAndFollowsHints) {
  absl::StatusOr<std::shared_ptr<CoordinatorChannels>> made =
      CoordinatorChannels::Create(Options({"a:1", "b:2", "c:3"}));
  ASSERT_TRUE(made.ok()) << made.status();
  CoordinatorChannels& channels = **made;
  EXPECT_EQ(channels.Leader().address, "a:1");
  EXPECT_EQ(channels.MoveOn(0).address, "b:2");
  EXPECT_EQ(channels.MoveOn(0).address, "b:2");  // already moved on by another call
  EXPECT_EQ(channels.MoveOn(1).address, "c:3");
  EXPECT_EQ(channels.MoveOn(2).address, "a:1");  // wraps
  EXPECT_EQ(channels.FollowHint("b:2")->index, 1u);
  EXPECT_EQ(channels.Leader().address, "b:2");
  EXPECT_FALSE(channels.FollowHint("not an address").has_value());
  EXPECT_EQ(channels.Leader().address, "b:2");
  std::optional<CoordinatorChannels::Replica> learned = channels.FollowHint("d:4");
  ASSERT_TRUE(learned.has_value());
  EXPECT_EQ(learned->index, 3u);
  EXPECT_EQ(channels.size(), 4u);
  EXPECT_THAT(channels.configured(), ElementsAre("a:1", "b:2", "c:3"));
  for (size_t i = 0; i < kMaxLearnedAddresses + 4; ++i) {
    channels.FollowHint(absl::StrCat("e", i, ":5"));
  }
  EXPECT_EQ(channels.size(), 3 + kMaxLearnedAddresses);
}

}  // namespace
}  // namespace shardline::client

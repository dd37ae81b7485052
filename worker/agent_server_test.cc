// WorkerAgent end to end: the client library's gRPC clients against a real
// in-process coordinator (gRPC on 127.0.0.1:0), agents on threads, real
// time: join, Session stream, assignments and generation changes as the
// coordinator really makes them. The agent's own logic is tested on fakes
// in worker/agent_test.cc.
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/coordinator_client.h"
#include "testing/fake_replica.h"
#include "testing/worker_harness.h"
#include "worker/agent.h"

namespace shardline::worker {
namespace {

using testing::CoordinatorHarness;
using testing::SmallSpec;

const Clock& RealTime() {
  static const RealClock clock;
  return clock;
}

WorkerAgentOptions Options(const CoordinatorHarness& h, const std::string& job,
                           const std::string& worker_id, const std::string& token = "") {
  WorkerAgentOptions o;
  o.connection.address = h.address();
  o.connection.token = token;
  o.connection.timeout = absl::Seconds(5);
  o.job_id = job;
  o.worker_id = worker_id;
  o.host = "localhost";
  o.device = "cpu";
  o.connect_timeout = absl::Seconds(5);
  return o;
}

std::vector<std::unique_ptr<WorkerAgent>> ConnectAgents(const CoordinatorHarness& h,
                                                        const std::string& job, int n,
                                                        const std::string& token = "") {
  std::vector<std::unique_ptr<WorkerAgent>> agents;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::unique_ptr<WorkerAgent>> a = WorkerAgent::Create(
        Options(h, job, absl::StrCat("node", i, ":cpu"), token), h.Clients(token), &RealTime());
    EXPECT_TRUE(a.ok()) << a.status();
    agents.push_back(*std::move(a));
    absl::Status s = agents.back()->Connect();
    EXPECT_TRUE(s.ok()) << s;
  }
  return agents;
}

// Every agent's assignment, waited for on one thread per agent.
std::vector<absl::StatusOr<v1::Assignment>> Assignments(
    const std::vector<WorkerAgent*>& agents, absl::Duration timeout = absl::Seconds(20)) {
  std::vector<absl::StatusOr<v1::Assignment>> out(agents.size(), absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = agents[i]->WaitForAssignment(timeout); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<WorkerAgent*> Raw(const std::vector<std::unique_ptr<WorkerAgent>>& agents) {
  std::vector<WorkerAgent*> out;
  for (const auto& a : agents) out.push_back(a.get());
  return out;
}

TEST(WorkerAgentTest, AgentsJoinAndGetUniqueRanks) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(3, 3, 3));
  auto agents = ConnectAgents(h, "job", 3);
  std::set<uint32_t> ranks;
  std::set<uint64_t> incarnations;
  for (const auto& a : Assignments(Raw(agents))) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->generation(), 1u);
    EXPECT_EQ(a->world_size(), 3u);
    EXPECT_FALSE(a->spare());
    ranks.insert(a->rank());
  }
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1, 2}));
  for (const auto& a : agents) {
    EXPECT_NE(a->incarnation(), 0u);
    incarnations.insert(a->incarnation());
    EXPECT_EQ(a->fence().generation(), 1u);
    EXPECT_FALSE(a->generation_over());
  }
  EXPECT_EQ(incarnations.size(), 3u);
  for (const auto& a : agents) EXPECT_TRUE(a->Leave("test done").ok());
}

// Given every replica's address, a follower first: the agent's first call
// follows the follower's leader hint, and its Session stream, heartbeats and
// assignment all go to the leader (client/coordinator_channels.h).
TEST(WorkerAgentTest, AgentGivenReplicasFollowsTheLeaderHint) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  client::testing::FakeReplica follower("follower");
  follower.Follow(h.address());
  WorkerAgentOptions o = Options(h, "job", "node0:cpu");
  o.connection.address = absl::StrCat(follower.address(), ",", h.address());
  absl::StatusOr<client::CoordinatorClients> clients = client::ConnectCoordinator(o.connection);
  ASSERT_TRUE(clients.ok()) << clients.status();
  absl::StatusOr<std::unique_ptr<WorkerAgent>> agent =
      WorkerAgent::Create(o, *clients, &RealTime());
  ASSERT_TRUE(agent.ok()) << agent.status();
  absl::Status connected = (*agent)->Connect();
  ASSERT_TRUE(connected.ok()) << connected;
  std::vector<absl::StatusOr<v1::Assignment>> assignment = Assignments({agent->get()});
  ASSERT_TRUE(assignment[0].ok()) << assignment[0].status();
  EXPECT_EQ(assignment[0]->generation(), 1u);
  EXPECT_EQ(assignment[0]->world_size(), 1u);
  EXPECT_EQ(follower.Calls("JoinJob"), 1);
  EXPECT_EQ(follower.Calls("Session"), 0);
  EXPECT_EQ(follower.Calls("GetAssignment"), 0);
  EXPECT_TRUE((*agent)->Leave("test done").ok());
  EXPECT_EQ(follower.Calls("LeaveJob"), 0);
}

// Destroying an agent breaks its stream: the survivors are told to restart,
// re-join in place (same incarnation) and get generation 2 assignments.
TEST(WorkerAgentTest, SurvivorsRejoinAfterAnAgentDies) {
  CoordinatorHarness h;
  // global_batch 6: dp 3 with three workers, dp 2 with two.
  h.CreateJob("job", SmallSpec(2, 3, 6));
  auto agents = ConnectAgents(h, "job", 3);
  std::vector<uint64_t> incarnations;
  for (const auto& a : agents) incarnations.push_back(a->incarnation());
  // The callback (where a process aborts its communicators) runs after the
  // generation is marked over and before the re-join.
  std::atomic<int> callbacks{0};
  std::atomic<int> callbacks_before_rejoin{0};
  for (const auto& a : agents) {
    WorkerAgent* agent = a.get();
    a->SetDirectiveCallback([&, agent](const v1::Directive& d) {
      if (!d.has_restart_at_generation()) return;
      callbacks.fetch_add(1);
      if (agent->generation_over() && agent->generation() == 1) {
        callbacks_before_rejoin.fetch_add(1);
      }
    });
  }
  for (const auto& a : Assignments(Raw(agents))) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->world_size(), 3u);
  }

  agents.pop_back();  // "node2:cpu" dies.

  for (const auto& a : agents) {
    std::optional<v1::Directive> d;
    while ((d = a->NextDirective(absl::Seconds(10))).has_value() &&
           !d->has_restart_at_generation()) {
    }
    ASSERT_TRUE(d.has_value()) << a->worker_id() << " saw no RESTART_AT_GENERATION";
    EXPECT_EQ(d->restart_at_generation().generation(), 2u);
  }
  std::set<uint32_t> ranks;
  for (const auto& a : Assignments(Raw(agents))) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->generation(), 2u);
    EXPECT_EQ(a->world_size(), 2u);
    ranks.insert(a->rank());
  }
  EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1}));
  EXPECT_EQ(callbacks.load(), 2);
  EXPECT_EQ(callbacks_before_rejoin.load(), 2);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(agents[i]->incarnation(), incarnations[i]);
    EXPECT_EQ(agents[i]->generation(), 2u);
  }
  auto members = h.Members("job");
  EXPECT_EQ(members["node2:cpu"].state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(members["node0:cpu"].state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(members["node0:cpu"].incarnation(), incarnations[0]);
}

// A worker reporting an error ends the generation; everybody re-forms.
TEST(WorkerAgentTest, ReportErrorRestartsTheGeneration) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(2, 2, 2));
  auto agents = ConnectAgents(h, "job", 2);
  for (const auto& a : Assignments(Raw(agents))) ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<v1::Directive> d = agents[0]->ReportError(
      absl::StatusCode::kDeadlineExceeded, "all_reduce timed out", "all_reduce dp/0", std::nullopt);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->has_restart_at_generation());
  // Both learn it (node0 from the answer, node1 from its stream) before
  // asking for the next assignment.
  for (const auto& a : agents) {
    std::optional<v1::Directive> r;
    while ((r = a->NextDirective(absl::Seconds(10))).has_value() &&
           !r->has_restart_at_generation()) {
    }
    ASSERT_TRUE(r.has_value()) << a->worker_id();
  }
  for (const auto& a : Assignments(Raw(agents))) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->generation(), 2u);
    EXPECT_EQ(a->world_size(), 2u);
  }
  // A late report of a failure in generation 1 (the other rank's report
  // ended it first) is refused; it does not end generation 2.
  absl::StatusOr<v1::Directive> late = agents[1]->ReportError(
      absl::StatusCode::kDataLoss, "restoring ckpt-x: missing", "train", std::nullopt,
      /*generation=*/1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_EQ(agents[1]->generation(), 2u);
  EXPECT_FALSE(agents[1]->generation_over());
  for (const auto& [id, m] : h.Members("job")) {
    EXPECT_EQ(m.generation(), 2u) << id;
    EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE) << id;
  }
}

}  // namespace
}  // namespace shardline::worker

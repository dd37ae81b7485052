// WorkerAgent on a FakeWorkerClient (testing/fake_worker_client.h) and a
// FakeClock: every heartbeat, retry and timeout happens at an exact fake
// time, and the tests advance time only once the agent is known to wait for
// it (FakeClock::AwaitWaiterAt). worker/agent_server_test.cc runs a few
// cases against the real in-process coordinator.
#include "worker/agent.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_worker_client.h"

namespace shardline::worker {
namespace {

using client::testing::FakeWorkerClient;
using client::testing::kForever;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kInterval = absl::Seconds(5);

// The directives the agent delivered through its callback, in order.
class DirectiveLog {
 public:
  WorkerAgent::DirectiveCallback Callback() {
    return [this](const v1::Directive& d) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(d);
    };
  }
  // Blocks (real time, bounded) until `n` directives were delivered.
  bool Await(size_t n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }
  std::vector<v1::Directive> seen() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::Directive> seen_ ABSL_GUARDED_BY(mu_);
};

v1::Directive Checkpoint(uint64_t step) {
  v1::Directive d;
  d.mutable_checkpoint()->set_step(step);
  return d;
}

v1::Directive Restart(uint64_t generation, const std::string& reason) {
  v1::Directive d;
  d.mutable_restart_at_generation()->set_generation(generation);
  d.mutable_restart_at_generation()->set_reason(reason);
  return d;
}

v1::Assignment Rank(uint32_t rank, uint32_t world_size) {
  v1::Assignment a;
  a.set_rank(rank);
  a.set_world_size(world_size);
  return a;
}

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() : workers_(std::make_shared<FakeWorkerClient>(&clock_)), t0_(clock_.Now()) {
    v1::JobSpec spec;
    spec.mutable_elastic()->mutable_heartbeat_interval()->set_seconds(
        absl::ToInt64Seconds(kInterval));
    workers_->SetSpec(spec);
  }

  WorkerAgentOptions Options() const {
    WorkerAgentOptions o;
    o.connection.address = "fake:7070";
    o.connection.address_source = "--coordinator";
    o.connection.timeout = absl::Seconds(10);
    o.job_id = "job";
    o.worker_id = "w0";
    o.incarnation = 77;
    o.host = "host0";
    o.device = "cpu";
    o.backend = v1::BACKEND_GLOO;
    o.connect_timeout = absl::Seconds(10);
    o.backoff.seed = 1;
    return o;
  }

  std::unique_ptr<WorkerAgent> Agent(const WorkerAgentOptions& o) {
    client::CoordinatorClients clients;
    clients.workers = workers_;
    absl::StatusOr<std::unique_ptr<WorkerAgent>> agent = WorkerAgent::Create(o, clients, &clock_);
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (!agent.ok()) return nullptr;
    (*agent)->SetDirectiveCallback(log_.Callback());
    return *std::move(agent);
  }

  // An agent that connected at t0, sent its first heartbeat and waits for
  // the next one (due at t0 + kInterval).
  std::unique_ptr<WorkerAgent> Connected() {
    std::unique_ptr<WorkerAgent> agent = Agent(Options());
    if (agent == nullptr) return nullptr;
    const absl::Status s = agent->Connect();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(workers_->AwaitCalls("Heartbeat", 1));
    EXPECT_TRUE(clock_.AwaitWaiterAt(t0_ + kInterval));
    return agent;
  }

  // The delays a Backoff with the agent's options gives, in order.
  std::vector<absl::Duration> Delays(int n) const {
    Backoff backoff(Options().backoff);
    std::vector<absl::Duration> out;
    for (int i = 0; i < n; ++i) out.push_back(backoff.Next());
    return out;
  }

  FakeClock clock_;
  std::shared_ptr<FakeWorkerClient> workers_;
  const absl::Time t0_;
  DirectiveLog log_;
};

// --- Connect ---------------------------------------------------------------

TEST_F(AgentTest, ConnectJoinsOpensTheSessionAndHeartbeats) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  EXPECT_THAT(workers_->CallNames(), ElementsAre("JoinJob", "Session", "Heartbeat"));
  const v1::JoinJobRequest join = workers_->joins().at(0);
  EXPECT_EQ(join.worker().job_id(), "job");
  EXPECT_EQ(join.worker().worker_id(), "w0");
  EXPECT_EQ(join.worker().incarnation(), 77u);
  EXPECT_EQ(join.host(), "host0");
  EXPECT_EQ(join.device(), "cpu");
  EXPECT_EQ(join.backend(), v1::BACKEND_GLOO);
  EXPECT_EQ(agent->generation(), 1u);
  EXPECT_FALSE(agent->generation_over());
  EXPECT_EQ(agent->spec().elastic().heartbeat_interval().seconds(), 5);
  const v1::Fence fence = agent->fence();
  EXPECT_EQ(fence.worker().worker_id(), "w0");
  EXPECT_EQ(fence.worker().incarnation(), 77u);
  EXPECT_EQ(fence.generation(), 1u);
  const v1::HeartbeatRequest beat = workers_->heartbeats().at(0);
  EXPECT_EQ(beat.fence().generation(), 1u);
  EXPECT_EQ(beat.state(), v1::WORKER_STATE_WAITING);
  EXPECT_EQ(beat.step(), 0u);
  EXPECT_THAT(workers_->CallTimes("Heartbeat"), ElementsAre(t0_));
  EXPECT_TRUE(log_.seen().empty());
}

TEST_F(AgentTest, ConnectTwiceFails) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  EXPECT_EQ(agent->Connect().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(workers_->CallCount("JoinJob"), 1);
}

TEST_F(AgentTest, AnExternalJobIsRefusedAndTheJoinTakenBack) {
  v1::JobSpec spec;
  spec.mutable_external()->set_framework("torchrun");
  workers_->SetSpec(spec);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  ASSERT_NE(agent, nullptr);
  const absl::Status s = agent->Connect();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("job 'job' is an external workload (spec.external, "
                                     "framework 'torchrun'): shardline-worker trains GPT jobs"));
  // No session, no heartbeat: the join is left at once.
  EXPECT_THAT(workers_->CallNames(), ElementsAre("JoinJob", "LeaveJob"));
}

TEST_F(AgentTest, CreateChecksItsOptions) {
  WorkerAgentOptions o = Options();
  o.job_id = "";
  client::CoordinatorClients clients;
  clients.workers = workers_;
  EXPECT_THAT(WorkerAgent::Create(o, clients, &clock_).status().message(), HasSubstr("--job"));
  o = Options();
  o.worker_id = "";
  EXPECT_THAT(WorkerAgent::Create(o, clients, &clock_).status().message(),
              HasSubstr("--worker-id"));
  EXPECT_EQ(WorkerAgent::Create(Options(), client::CoordinatorClients(), &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(AgentTest, UnavailableJoinIsRetriedWithJitteredBackoffUntilConnectTimeout) {
  workers_->FailNext("JoinJob", absl::UnavailableError("the coordinator is starting"), kForever);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  absl::Status connected;
  std::thread connect([&] { connected = agent->Connect(); });
  // Retries while the next delay still ends within the 10 s connect timeout.
  std::vector<absl::Time> expected = {t0_};
  absl::Duration elapsed;
  for (absl::Duration d : Delays(100)) {
    if (elapsed + d > absl::Seconds(10)) break;
    elapsed += d;
    expected.push_back(t0_ + elapsed);
    ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + elapsed));
    clock_.Advance(d);
  }
  connect.join();
  EXPECT_EQ(connected.code(), absl::StatusCode::kUnavailable) << connected;
  EXPECT_THAT(connected.message(), HasSubstr("the coordinator is starting"));
  EXPECT_EQ(workers_->CallTimes("JoinJob"), expected);
  // Jitter: not the fixed 100 ms, 200 ms, 400 ms... of a plain doubling.
  EXPECT_NE(expected[1] - expected[0], absl::Milliseconds(100));
  EXPECT_EQ(workers_->CallCount("Session"), 0);
}

TEST_F(AgentTest, DeadlineExceededJoinIsRetriedToo) {
  workers_->FailNext("JoinJob", absl::DeadlineExceededError("no answer"));
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  absl::Status connected;
  std::thread connect([&] { connected = agent->Connect(); });
  const absl::Duration d = Delays(1)[0];
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d));
  clock_.Advance(d);
  connect.join();
  EXPECT_TRUE(connected.ok()) << connected;
  EXPECT_THAT(workers_->CallTimes("JoinJob"), ElementsAre(t0_, t0_ + d));
}

TEST_F(AgentTest, UnknownJobSaysWhichFlag) {
  workers_->FailNext("JoinJob", absl::NotFoundError("no job 'nope'"));
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  const absl::Status s = agent->Connect();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("no job 'nope'"));
  EXPECT_THAT(s.message(), HasSubstr("fake:7070"));
  EXPECT_THAT(s.message(), HasSubstr("--job"));
  EXPECT_EQ(workers_->CallCount("JoinJob"), 1);  // not retried
}

TEST_F(AgentTest, RefusedTokenOnJoinIsNotRetried) {
  workers_->FailNext("JoinJob", absl::UnauthenticatedError("unknown token; pass --token"));
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  const absl::Status s = agent->Connect();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("--token"));
  EXPECT_EQ(workers_->CallCount("JoinJob"), 1);
}

TEST_F(AgentTest, ConnectToAFinishedJobFails) {
  workers_->SetPhase(v1::JOB_PHASE_COMPLETED);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  const absl::Status s = agent->Connect();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("job 'job' is JOB_PHASE_COMPLETED"));
  EXPECT_EQ(workers_->CallCount("Session"), 0);
}

TEST_F(AgentTest, SessionRefusedAtFirstFailsConnect) {
  workers_->FailNext("Session", absl::PermissionDeniedError("another job's token"));
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  const absl::Status s = agent->Connect();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("another job's token"));
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 0);
}

// UNAVAILABLE streams are reopened with growing jittered delays until one
// opens; Connect waits for it.
TEST_F(AgentTest, SessionIsReopenedWithJitteredBackoffUntilItOpens) {
  workers_->FailNext("Session", absl::UnavailableError("connection reset"), 3);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  absl::Status connected;
  std::thread connect([&] { connected = agent->Connect(); });
  const std::vector<absl::Duration> d = Delays(3);
  absl::Time t = t0_;
  for (absl::Duration delay : d) {
    t += delay;
    ASSERT_TRUE(clock_.AwaitWaiterAt(t));
    clock_.Advance(delay);
  }
  connect.join();
  EXPECT_TRUE(connected.ok()) << connected;
  EXPECT_THAT(workers_->CallTimes("Session"),
              ElementsAre(t0_, t0_ + d[0], t0_ + d[0] + d[1], t0_ + d[0] + d[1] + d[2]));
  // Each delay lies in its window [b / 2, b], b = 100 ms, 200 ms, 400 ms.
  for (int i = 0; i < 3; ++i) {
    const absl::Duration b = absl::Milliseconds(100) * (1 << i);
    EXPECT_GE(d[i], b / 2) << i;
    EXPECT_LE(d[i], b) << i;
  }
}

TEST_F(AgentTest, SessionThatNeverOpensFailsConnectAtItsTimeout) {
  workers_->FailNext("Session", absl::UnavailableError("connection reset"), kForever);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  absl::Status connected;
  std::thread connect([&] { connected = agent->Connect(); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(10)));  // Connect's own wait
  clock_.Advance(absl::Seconds(10));
  connect.join();
  EXPECT_EQ(connected.code(), absl::StatusCode::kUnavailable) << connected;
  EXPECT_THAT(connected.message(),
              HasSubstr("the Session stream to the coordinator at fake:7070 did not open "
                        "within 10s"));
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 0);
}

// --- Heartbeats ------------------------------------------------------------

TEST_F(AgentTest, HeartbeatsEveryIntervalOfTheClock) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  clock_.Advance(kInterval);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 2));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + 2 * kInterval));
  clock_.Advance(kInterval - absl::Seconds(1));
  // Still waiting for t0 + 10 s: no heartbeat before its time.
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 2);
  EXPECT_THAT(clock_.Waiters(), ElementsAre(t0_ + 2 * kInterval));
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 3));
  EXPECT_THAT(workers_->CallTimes("Heartbeat"),
              ElementsAre(t0_, t0_ + kInterval, t0_ + 2 * kInterval));
  for (const FakeWorkerClient::Call& c : workers_->calls()) {
    // A heartbeat's deadline: the longer of the interval and --timeout.
    if (c.rpc == "Heartbeat") {
      EXPECT_EQ(c.timeout, absl::Seconds(10));
    }
  }
}

TEST_F(AgentTest, HeartbeatDeadlineIsAtLeastTheInterval) {
  v1::JobSpec spec;
  spec.mutable_elastic()->mutable_heartbeat_interval()->set_seconds(30);
  workers_->SetSpec(spec);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  ASSERT_TRUE(agent->Connect().ok());
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 1));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(30)));
  EXPECT_EQ(workers_->calls().back().timeout, absl::Seconds(30));
}

// ... and at most half the heartbeat timeout: a heartbeat held longer could
// no longer keep the worker alive (a fresh one can).
TEST_F(AgentTest, HeartbeatDeadlineIsAtMostHalfTheHeartbeatTimeout) {
  v1::JobSpec spec;
  spec.mutable_elastic()->mutable_heartbeat_interval()->set_seconds(2);
  spec.mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(12);
  workers_->SetSpec(spec);
  std::unique_ptr<WorkerAgent> agent = Agent(Options());  // --timeout 10 s
  ASSERT_TRUE(agent->Connect().ok());
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 1));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(2)));
  EXPECT_EQ(workers_->calls().back().timeout, absl::Seconds(6));
}

TEST_F(AgentTest, ProgressIsHeartbeatedAtOnceWhenTheStateChanges) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  agent->SetProgress(7, v1::WORKER_STATE_TRAINING);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 2));
  // The interval starts over from the extra heartbeat (sent at t0).
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + kInterval));
  v1::StepMetrics metrics;
  metrics.set_step(8);
  metrics.set_loss(2.5);
  agent->SetMetrics(metrics);
  agent->SetProgress(8, v1::WORKER_STATE_TRAINING);  // same state: waits for the interval
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 2);
  clock_.Advance(kInterval);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 3));
  const std::vector<v1::HeartbeatRequest> beats = workers_->heartbeats();
  EXPECT_THAT(workers_->CallTimes("Heartbeat"), ElementsAre(t0_, t0_, t0_ + kInterval));
  EXPECT_EQ(beats[1].state(), v1::WORKER_STATE_TRAINING);
  EXPECT_EQ(beats[1].step(), 7u);
  EXPECT_FALSE(beats[1].has_metrics());
  EXPECT_EQ(beats[2].step(), 8u);
  EXPECT_EQ(beats[2].metrics().loss(), 2.5);
}

// A run of failed heartbeats is logged twice: its first failure with the
// status, and the first accepted heartbeat after it with the count and the
// time since the first failure; the failures in between are not.
TEST_F(AgentTest, LogsTheFirstFailedHeartbeatAndTheRecovery) {
  std::vector<std::string> lines;
  absl::Mutex mu;
  WorkerAgentOptions o = Options();
  o.log = [&](absl::string_view line) {
    absl::MutexLock lock(&mu);
    lines.emplace_back(line);
  };
  std::unique_ptr<WorkerAgent> agent = Agent(o);
  ASSERT_TRUE(agent->Connect().ok());
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 1));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + kInterval));
  workers_->FailNext("Heartbeat", absl::UnavailableError("connection refused"), 3);
  for (int n = 2; n <= 5; ++n) {
    clock_.Advance(kInterval);
    ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", n));
    ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + n * kInterval));
  }
  absl::MutexLock lock(&mu);
  EXPECT_THAT(lines,
              ElementsAre("heartbeat of generation 1 failed (trying again every 5s): "
                          "UNAVAILABLE: connection refused",
                          "heartbeats accepted again after 3 failed over 15s (the last: "
                          "UNAVAILABLE: connection refused)"));
}

TEST_F(AgentTest, NoHeartbeatsWhenDisabled) {
  WorkerAgentOptions o = Options();
  o.send_heartbeats = false;
  std::unique_ptr<WorkerAgent> agent = Agent(o);
  ASSERT_TRUE(agent->Connect().ok());
  EXPECT_TRUE(clock_.Waiters().empty());  // nothing waits for a heartbeat time
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 0);
}

// --- Generation changes ----------------------------------------------------

// The coordinator ended generation 1 (a peer was lost): the next heartbeat
// answers ABORTED; the agent marks the generation over, cancels its token,
// delivers RESTART_AT_GENERATION, then re-joins in place.
TEST_F(AgentTest, AbortedHeartbeatEndsTheGenerationAndRejoins) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::shared_ptr<client::CancelToken> token = agent->GenerationToken(1);
  std::atomic<bool> over_in_callback{false}, cancelled_in_callback{false};
  std::atomic<uint64_t> generation_in_callback{0};
  agent->SetDirectiveCallback([&](const v1::Directive& d) {
    over_in_callback = agent->generation_over();
    generation_in_callback = agent->generation();
    cancelled_in_callback = token->cancelled();
    log_.Callback()(d);
  });
  workers_->EndGeneration("rank 1 lost: heartbeat timeout", /*tell_session=*/false);
  clock_.Advance(kInterval);
  ASSERT_TRUE(log_.Await(1));
  // The heartbeat thread re-joined and waits for its next interval.
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + 2 * kInterval));
  const v1::Directive d = log_.seen().at(0);
  ASSERT_TRUE(d.has_restart_at_generation());
  EXPECT_EQ(d.restart_at_generation().generation(), 2u);
  EXPECT_THAT(d.restart_at_generation().reason(), HasSubstr("rank 1 lost: heartbeat timeout"));
  EXPECT_TRUE(over_in_callback);
  EXPECT_EQ(generation_in_callback, 1u);
  EXPECT_TRUE(cancelled_in_callback);
  EXPECT_EQ(agent->generation(), 2u);
  EXPECT_FALSE(agent->generation_over());
  EXPECT_EQ(workers_->joins().at(1).worker().incarnation(), 77u);  // same incarnation
  EXPECT_THAT(workers_->CallNames(),
              ElementsAre("JoinJob", "Session", "Heartbeat", "Heartbeat", "JoinJob"));
  // The new generation has a fresh, live token; the old one stays cancelled.
  EXPECT_FALSE(agent->GenerationToken(2)->cancelled());
  EXPECT_TRUE(agent->GenerationToken(1)->cancelled());
  clock_.Advance(kInterval);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 3));
  EXPECT_EQ(workers_->heartbeats().at(2).fence().generation(), 2u);
  // The queue holds the directive too.
  std::optional<v1::Directive> queued = agent->NextDirective(absl::ZeroDuration());
  ASSERT_TRUE(queued.has_value());
  EXPECT_EQ(queued->restart_at_generation().generation(), 2u);
}

TEST_F(AgentTest, RestartOnTheStreamRejoinsAndStaleRepeatsAreIgnored) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->EndGeneration("peer w1 left", /*tell_session=*/true);
  ASSERT_TRUE(log_.Await(1));
  ASSERT_TRUE(workers_->AwaitCalls("JoinJob", 2));
  // A repeat of the same restart, then a checkpoint request, on the stream:
  // the repeat is dropped (already in generation 2).
  ASSERT_TRUE(workers_->SendDirective(Restart(2, "peer w1 left")));
  ASSERT_TRUE(workers_->SendDirective(Checkpoint(10)));
  ASSERT_TRUE(log_.Await(2));
  const std::vector<v1::Directive> seen = log_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].restart_at_generation().generation(), 2u);
  EXPECT_EQ(seen[0].restart_at_generation().reason(), "peer w1 left");
  EXPECT_EQ(seen[1].checkpoint().step(), 10u);
  EXPECT_EQ(agent->generation(), 2u);
  EXPECT_EQ(workers_->CallCount("JoinJob"), 2);
}

TEST_F(AgentTest, CheckpointDirectivesAreDeliveredOncePerStep) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->QueueHeartbeatDirective(Checkpoint(10));
  workers_->QueueHeartbeatDirective(Checkpoint(10));
  clock_.Advance(kInterval);  // heartbeat 2: CHECKPOINT 10
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + 2 * kInterval));
  clock_.Advance(kInterval);  // heartbeat 3: CHECKPOINT 10 again
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + 3 * kInterval));
  ASSERT_TRUE(workers_->SendDirective(Checkpoint(10)));
  ASSERT_TRUE(workers_->SendDirective(Checkpoint(20)));
  ASSERT_TRUE(log_.Await(2));
  const std::vector<v1::Directive> seen = log_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].checkpoint().step(), 10u);
  EXPECT_EQ(seen[1].checkpoint().step(), 20u);
  EXPECT_EQ(agent->NextDirective(absl::ZeroDuration())->checkpoint().step(), 10u);
  EXPECT_EQ(agent->NextDirective(absl::ZeroDuration())->checkpoint().step(), 20u);
  EXPECT_FALSE(agent->NextDirective(absl::ZeroDuration()).has_value());
}

TEST_F(AgentTest, StopOnTheStreamIsDeliveredOnceAndEndsTheAgent) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::shared_ptr<client::CancelToken> token = agent->GenerationToken(1);
  v1::Directive stop;
  stop.mutable_stop()->set_reason("the job completed");
  stop.mutable_stop()->set_phase(v1::JOB_PHASE_COMPLETED);
  ASSERT_TRUE(workers_->SendDirective(stop));
  ASSERT_TRUE(workers_->SendDirective(stop));
  ASSERT_TRUE(workers_->EndSession(absl::OkStatus()));
  ASSERT_TRUE(log_.Await(1));
  EXPECT_TRUE(agent->stopped());
  EXPECT_TRUE(token->cancelled());
  EXPECT_THAT(token->reason(), HasSubstr("the job completed"));
  const absl::StatusOr<v1::Assignment> a = agent->WaitForAssignment(absl::Seconds(1));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.status().message(), HasSubstr("job 'job' stopped"));
  ASSERT_TRUE(agent->Leave("stopped").ok());
  ASSERT_EQ(log_.seen().size(), 1u);
  EXPECT_EQ(log_.seen()[0].stop().phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(workers_->CallCount("Session"), 1);  // a stream that ended OK after STOP stays closed
}

TEST_F(AgentTest, FinishedJobOnTheStreamStops) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(workers_->EndSession(absl::FailedPreconditionError("job 'job' is CANCELLED")));
  ASSERT_TRUE(log_.Await(1));
  EXPECT_EQ(log_.seen()[0].stop().reason(), "job 'job' is CANCELLED");
  EXPECT_TRUE(agent->stopped());
}

// The coordinator declared this worker lost (its stream ends ABORTED): the
// agent re-joins, then reopens the stream after a backoff delay.
TEST_F(AgentTest, LostSessionRejoinsThenReopensAfterABackoffDelay) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->EndGeneration("w0 lost: no heartbeat for 10s", /*tell_session=*/false);
  ASSERT_TRUE(workers_->EndSession(absl::AbortedError("w0 lost: no heartbeat for 10s")));
  ASSERT_TRUE(log_.Await(1));
  const absl::Duration d = Delays(1)[0];
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d));
  EXPECT_EQ(agent->generation(), 2u);
  clock_.Advance(d);
  ASSERT_TRUE(workers_->AwaitSessions(2));
  EXPECT_THAT(workers_->CallTimes("Session"), ElementsAre(t0_, t0_ + d));
  EXPECT_THAT(log_.seen()[0].restart_at_generation().reason(), HasSubstr("heartbeat"));
  EXPECT_EQ(log_.seen()[0].restart_at_generation().generation(), 2u);
}

// Without heartbeats the fake coordinator hears nothing however long it
// waits; when it declares the worker lost the agent re-joins in place.
TEST_F(AgentTest, HungWorkerIsLostAndRejoins) {
  WorkerAgentOptions o = Options();
  o.send_heartbeats = false;
  std::unique_ptr<WorkerAgent> agent = Agent(o);
  ASSERT_TRUE(agent->Connect().ok());
  clock_.Advance(absl::Minutes(10));
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 0);
  workers_->EndGeneration("hung lost: heartbeat timeout", /*tell_session=*/false);
  ASSERT_TRUE(workers_->EndSession(absl::AbortedError("hung lost: heartbeat timeout")));
  ASSERT_TRUE(log_.Await(1));
  ASSERT_TRUE(workers_->AwaitCalls("JoinJob", 2));
  EXPECT_THAT(log_.seen()[0].restart_at_generation().reason(), HasSubstr("heartbeat"));
  EXPECT_EQ(workers_->joins().at(1).worker().incarnation(), 77u);
}

TEST_F(AgentTest, RefusedTokenOnAHeartbeatStopsTheWorker) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::shared_ptr<client::CancelToken> token = agent->GenerationToken(1);
  workers_->FailNext("Heartbeat", absl::UnauthenticatedError("unknown token"));
  clock_.Advance(kInterval);
  ASSERT_TRUE(log_.Await(1));
  const v1::Directive d = log_.seen()[0];
  ASSERT_TRUE(d.has_stop());
  EXPECT_THAT(d.stop().reason(), StartsWith(kTokenRefusedPrefix));
  EXPECT_THAT(d.stop().reason(), HasSubstr("unknown token"));
  EXPECT_TRUE(agent->stopped());
  EXPECT_TRUE(token->cancelled());
}

TEST_F(AgentTest, UnavailableHeartbeatIsTriedAgainNextInterval) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->FailNext("Heartbeat", absl::UnavailableError("restarting"));
  clock_.Advance(kInterval);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 2));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + 2 * kInterval));
  clock_.Advance(kInterval);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 3));
  EXPECT_FALSE(agent->stopped());
  EXPECT_FALSE(agent->generation_over());
  EXPECT_TRUE(log_.seen().empty());
}

TEST_F(AgentTest, ForgottenJobOnRejoinStopsTheWorker) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->FailNext("JoinJob", absl::NotFoundError("no job 'job'"));
  workers_->EndGeneration("the coordinator restarted", /*tell_session=*/true);
  ASSERT_TRUE(log_.Await(2));
  const std::vector<v1::Directive> seen = log_.seen();
  EXPECT_TRUE(seen[0].has_restart_at_generation());
  ASSERT_TRUE(seen[1].has_stop());
  EXPECT_THAT(seen[1].stop().reason(), StartsWith(kJobUnknownPrefix));
  EXPECT_THAT(seen[1].stop().reason(), HasSubstr("no job 'job'"));
  EXPECT_TRUE(agent->stopped());
}

TEST_F(AgentTest, FinishedJobOnRejoinStopsTheWorker) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->FailNext("JoinJob", absl::FailedPreconditionError("job 'job' is COMPLETED"));
  workers_->EndGeneration("the job completed", /*tell_session=*/true);
  ASSERT_TRUE(log_.Await(2));
  EXPECT_EQ(log_.seen()[1].stop().reason(), "job 'job' is COMPLETED");
  EXPECT_TRUE(agent->stopped());
}

// --- Assignments -----------------------------------------------------------

TEST_F(AgentTest, WaitForAssignmentReturnsTheFormedGeneration) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->Form(Rank(1, 2));
  const absl::StatusOr<v1::Assignment> a = agent->WaitForAssignment(absl::Seconds(30));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->generation(), 1u);
  EXPECT_EQ(a->rank(), 1u);
  EXPECT_EQ(a->world_size(), 2u);
  EXPECT_EQ(clock_.Now(), t0_);
}

TEST_F(AgentTest, WaitForAssignmentTimesOutOnTheClock) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  absl::StatusOr<v1::Assignment> a;
  std::thread waiter([&] { a = agent->WaitForAssignment(absl::Seconds(4)); });
  ASSERT_TRUE(workers_->AwaitCalls("GetAssignment", 1));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(4)));
  clock_.Advance(absl::Seconds(4));
  waiter.join();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded) << a.status();
  EXPECT_EQ(a.status().message(), "no assignment for generation 1 within 4s");
  const v1::GetAssignmentRequest req = workers_->assignment_requests().at(0);
  EXPECT_TRUE(req.wait());
  EXPECT_EQ(req.timeout().seconds(), 4);
  EXPECT_EQ(req.fence().generation(), 1u);
}

TEST_F(AgentTest, LongAssignmentWaitsAreAskedForInSlices) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  absl::StatusOr<v1::Assignment> a;
  std::thread waiter([&] { a = agent->WaitForAssignment(absl::Seconds(45)); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(30)));  // the first 30 s slice
  clock_.Advance(absl::Seconds(30));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(45)));  // the remaining 15 s
  workers_->Form(Rank(0, 1));
  waiter.join();
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<v1::GetAssignmentRequest> reqs = workers_->assignment_requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].timeout().seconds(), 30);
  EXPECT_EQ(reqs[1].timeout().seconds(), 15);
}

TEST_F(AgentTest, UnavailableGetAssignmentIsRetriedWithBackoff) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->FailNext("GetAssignment", absl::UnavailableError("restarting"), 2);
  absl::StatusOr<v1::Assignment> a;
  std::thread waiter([&] { a = agent->WaitForAssignment(absl::Seconds(60)); });
  const std::vector<absl::Duration> d = Delays(2);
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d[0]));
  clock_.Advance(d[0]);
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d[0] + d[1]));
  clock_.Advance(d[1]);
  ASSERT_TRUE(workers_->AwaitCalls("GetAssignment", 3));
  workers_->Form(Rank(0, 1));
  waiter.join();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(workers_->CallTimes("GetAssignment"),
              ElementsAre(t0_, t0_ + d[0], t0_ + d[0] + d[1]));
}

TEST_F(AgentTest, AssignmentAfterAGenerationChangeIsTheNewGenerations) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->Form(Rank(2, 3));
  ASSERT_EQ(agent->WaitForAssignment(absl::Seconds(30))->rank(), 2u);
  workers_->EndGeneration("w2 lost", /*tell_session=*/true);
  ASSERT_TRUE(log_.Await(1));
  ASSERT_TRUE(workers_->AwaitCalls("JoinJob", 2));
  const int asked_before = workers_->CallCount("GetAssignment");
  absl::StatusOr<v1::Assignment> a;
  std::thread waiter([&] { a = agent->WaitForAssignment(absl::Seconds(30)); });
  // Waiting for generation 2 to form (its request names generation 2).
  ASSERT_TRUE(workers_->AwaitCalls("GetAssignment", asked_before + 1));
  workers_->Form(Rank(1, 2));
  waiter.join();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->generation(), 2u);
  EXPECT_EQ(a->rank(), 1u);
  EXPECT_EQ(a->world_size(), 2u);
  EXPECT_EQ(workers_->assignment_requests().back().fence().generation(), 2u);
}

TEST_F(AgentTest, SpareGetsARankInTheNextGeneration) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  v1::Assignment spare;
  spare.set_spare(true);
  spare.set_world_size(2);
  workers_->Form(spare);
  ASSERT_TRUE(agent->WaitForAssignment(absl::Seconds(30))->spare());
  workers_->EndGeneration("rank 0 lost", /*tell_session=*/true);
  ASSERT_TRUE(workers_->AwaitCalls("JoinJob", 2));
  workers_->Form(Rank(0, 2));
  const absl::StatusOr<v1::Assignment> a = agent->WaitForAssignment(absl::Seconds(30));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->spare());
  EXPECT_EQ(a->rank(), 0u);
  EXPECT_EQ(a->generation(), 2u);
}

TEST_F(AgentTest, WaitForAssignmentBeforeConnectFails) {
  std::unique_ptr<WorkerAgent> agent = Agent(Options());
  EXPECT_EQ(agent->WaitForAssignment(absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(workers_->calls().empty());
}

// --- ReportError -----------------------------------------------------------

TEST_F(AgentTest, ReportErrorEndsTheGenerationBeforeItReturns) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  const absl::StatusOr<v1::Directive> d = agent->ReportError(
      absl::StatusCode::kDeadlineExceeded, "all_reduce timed out", "all_reduce dp/0", 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->restart_at_generation().generation(), 2u);
  const v1::ReportErrorRequest req = workers_->error_reports().at(0);
  EXPECT_EQ(req.fence().generation(), 1u);
  EXPECT_EQ(req.code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(req.message(), "all_reduce timed out");
  EXPECT_EQ(req.operation(), "all_reduce dp/0");
  EXPECT_EQ(req.peer_rank(), 1u);
  EXPECT_EQ(agent->generation(), 2u);
  EXPECT_FALSE(agent->generation_over());
  ASSERT_EQ(log_.seen().size(), 1u);
  EXPECT_EQ(log_.seen()[0].restart_at_generation().generation(), 2u);

  // A late report of a failure in generation 1 is refused; it does not end
  // generation 2.
  const absl::StatusOr<v1::Directive> late = agent->ReportError(
      absl::StatusCode::kDataLoss, "restoring ckpt-x: missing", "train", std::nullopt,
      /*generation=*/1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_EQ(agent->generation(), 2u);
  EXPECT_FALSE(agent->generation_over());
  EXPECT_EQ(workers_->CallCount("JoinJob"), 2);
  EXPECT_EQ(log_.seen().size(), 1u);
}

TEST_F(AgentTest, ReportErrorNeedsAnError) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  EXPECT_EQ(agent->ReportError(absl::StatusCode::kOk, "", "", std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(workers_->CallCount("ReportError"), 0);
}

// --- Leave, destruction, tokens, directives --------------------------------

TEST_F(AgentTest, LeaveTellsTheCoordinatorOnceAndStopsTheThreads) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::shared_ptr<client::CancelToken> token = agent->GenerationToken(1);
  ASSERT_TRUE(agent->Leave("drained").ok());
  ASSERT_TRUE(agent->Leave("again").ok());
  const std::vector<v1::LeaveJobRequest> leaves = workers_->leaves();
  ASSERT_EQ(leaves.size(), 1u);
  EXPECT_EQ(leaves[0].reason(), "drained");
  EXPECT_EQ(leaves[0].fence().worker().incarnation(), 77u);
  EXPECT_TRUE(clock_.Waiters().empty());
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 1);
  EXPECT_TRUE(token->cancelled());
  EXPECT_FALSE(workers_->session_open());
}

TEST_F(AgentTest, LeaveThatCannotReachTheCoordinatorSaysSo) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->FailNext("LeaveJob", absl::UnavailableError("cannot reach the coordinator"));
  EXPECT_EQ(agent->Leave("bye").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(clock_.Waiters().empty());  // the threads stopped anyway
}

TEST_F(AgentTest, LeavingAFinishedJobIsOk) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->FailNext("LeaveJob", absl::FailedPreconditionError("job 'job' is COMPLETED"));
  EXPECT_TRUE(agent->Leave("done").ok());
}

TEST_F(AgentTest, DestroyingTheAgentBreaksTheStreamWithoutLeaving) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::shared_ptr<client::CancelToken> token = agent->GenerationToken(1);
  ASSERT_TRUE(workers_->session_open());
  agent.reset();
  EXPECT_FALSE(workers_->session_open());
  EXPECT_TRUE(token->cancelled());
  EXPECT_EQ(workers_->CallCount("LeaveJob"), 0);
}

TEST_F(AgentTest, GenerationTokensOfOtherGenerationsAreCancelled) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::shared_ptr<client::CancelToken> live = agent->GenerationToken(1);
  EXPECT_FALSE(live->cancelled());
  EXPECT_EQ(agent->GenerationToken(1), live);  // one token per generation
  std::shared_ptr<client::CancelToken> other = agent->GenerationToken(7);
  EXPECT_TRUE(other->cancelled());
  EXPECT_THAT(other->reason(), HasSubstr("generation 7 is not this worker's live generation"));
}

TEST_F(AgentTest, NextDirectiveWaitsOnTheClock) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  std::optional<v1::Directive> d = Checkpoint(1);
  std::thread waiter([&] { d = agent->NextDirective(absl::Seconds(3)); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(3)));
  clock_.Advance(absl::Seconds(3));
  waiter.join();
  EXPECT_FALSE(d.has_value());

  std::thread second([&] { d = agent->NextDirective(absl::Hours(1)); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Seconds(3) + absl::Hours(1)));
  ASSERT_TRUE(workers_->SendDirective(Checkpoint(5)));
  second.join();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->checkpoint().step(), 5u);
  EXPECT_EQ(clock_.Now(), t0_ + absl::Seconds(3));
}

}  // namespace
}  // namespace shardline::worker

// WorkerAgent's progress reports (HeartbeatRequest.progress) on a
// FakeWorkerClient and a FakeClock: the progress source's RankProgress rides
// on the heartbeats the agent sends anyway, only while it holds a rank of
// the current generation; a change of activity sends no heartbeat.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_worker_client.h"
#include "worker/agent.h"

namespace shardline::worker {
namespace {

using client::testing::FakeWorkerClient;
using ::testing::ElementsAre;

constexpr absl::Duration kInterval = absl::Seconds(5);

// A progress source whose answer the test sets, and which records the
// generation of every call.
class Source {
 public:
  WorkerAgent::ProgressSource Fn() {
    return [this](uint64_t generation) {
      absl::MutexLock lock(&mu_);
      generations_.push_back(generation);
      v1::RankProgress p = progress_;
      return p;
    };
  }
  void Set(v1::Activity activity, uint64_t step) {
    absl::MutexLock lock(&mu_);
    progress_.set_activity(activity);
    progress_.set_step(step);
    progress_.clear_collectives();
    v1::CollectiveProgress* c = progress_.add_collectives();
    c->set_group("dp/0");
    c->set_operation("all_reduce");
    c->set_sequence(step * 3);
    c->set_in_flight(activity == v1::ACTIVITY_COLLECTIVE);
  }
  std::vector<uint64_t> generations() const {
    absl::MutexLock lock(&mu_);
    return generations_;
  }

 private:
  mutable absl::Mutex mu_;
  v1::RankProgress progress_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> generations_ ABSL_GUARDED_BY(mu_);
};

v1::Assignment Rank(uint32_t rank, uint32_t world_size, bool spare = false) {
  v1::Assignment a;
  a.set_rank(rank);
  a.set_world_size(world_size);
  a.set_spare(spare);
  return a;
}

class AgentProgressTest : public ::testing::Test {
 protected:
  AgentProgressTest() : workers_(std::make_shared<FakeWorkerClient>(&clock_)), t0_(clock_.Now()) {
    v1::JobSpec spec;
    spec.mutable_elastic()->mutable_heartbeat_interval()->set_seconds(
        absl::ToInt64Seconds(kInterval));
    workers_->SetSpec(spec);
  }

  // An agent with the progress source, connected at t0 (first heartbeat
  // sent, the next one due at t0 + kInterval).
  std::unique_ptr<WorkerAgent> Connected() {
    WorkerAgentOptions o;
    o.connection.address = "fake:7070";
    o.connection.timeout = absl::Seconds(10);
    o.job_id = "job";
    o.worker_id = "w0";
    o.incarnation = 77;
    o.host = "host0";
    o.backoff.seed = 1;
    client::CoordinatorClients clients;
    clients.workers = workers_;
    auto agent = std::make_unique<WorkerAgent>(o, clients, &clock_);
    agent->SetProgressSource(source_.Fn());
    EXPECT_TRUE(agent->Connect().ok());
    EXPECT_TRUE(workers_->AwaitCalls("Heartbeat", 1));
    EXPECT_TRUE(clock_.AwaitWaiterAt(t0_ + kInterval));
    return agent;
  }

  // Advances to the next interval heartbeat (number `n` in all) and
  // returns it.
  v1::HeartbeatRequest NextBeat(int n, absl::Time due) {
    EXPECT_TRUE(clock_.AwaitWaiterAt(due));
    clock_.Advance(due - clock_.Now());
    EXPECT_TRUE(workers_->AwaitCalls("Heartbeat", n));
    return workers_->heartbeats().at(static_cast<size_t>(n - 1));
  }

  FakeClock clock_;
  std::shared_ptr<FakeWorkerClient> workers_;
  const absl::Time t0_;
  Source source_;
};

TEST_F(AgentProgressTest, ARankReportsTheSourcesProgressInItsHeartbeats) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  // Not assigned yet: no progress, and the source is not asked.
  EXPECT_FALSE(workers_->heartbeats().at(0).has_progress());
  workers_->Form(Rank(1, 2));
  ASSERT_TRUE(agent->WaitForAssignment(absl::Seconds(30)).ok());
  source_.Set(v1::ACTIVITY_COMPUTE, 14);
  const v1::HeartbeatRequest beat = NextBeat(2, t0_ + kInterval);
  ASSERT_TRUE(beat.has_progress());
  EXPECT_EQ(beat.progress().activity(), v1::ACTIVITY_COMPUTE);
  EXPECT_EQ(beat.progress().step(), 14u);
  ASSERT_EQ(beat.progress().collectives_size(), 1);
  EXPECT_EQ(beat.progress().collectives(0).group(), "dp/0");
  EXPECT_EQ(beat.progress().collectives(0).sequence(), 42u);
  // The next one carries what the source says then.
  source_.Set(v1::ACTIVITY_COLLECTIVE, 15);
  const v1::HeartbeatRequest later = NextBeat(3, t0_ + 2 * kInterval);
  EXPECT_EQ(later.progress().activity(), v1::ACTIVITY_COLLECTIVE);
  EXPECT_EQ(later.progress().step(), 15u);
  EXPECT_TRUE(later.progress().collectives(0).in_flight());
  EXPECT_THAT(source_.generations(), ElementsAre(1u, 1u));
}

TEST_F(AgentProgressTest, AnActivityChangeSendsNoHeartbeatButAStateChangeCarriesProgress) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->Form(Rank(0, 2));
  ASSERT_TRUE(agent->WaitForAssignment(absl::Seconds(30)).ok());
  // The source changing (as the training thread's activity does) is not
  // heartbeated: still one heartbeat, the clock's waiter unchanged.
  source_.Set(v1::ACTIVITY_COLLECTIVE, 3);
  source_.Set(v1::ACTIVITY_COMPUTE, 4);
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + kInterval));
  EXPECT_EQ(workers_->CallCount("Heartbeat"), 1);
  // A WorkerState change is heartbeated at once, with the progress.
  agent->SetProgress(4, v1::WORKER_STATE_TRAINING);
  ASSERT_TRUE(workers_->AwaitCalls("Heartbeat", 2));
  const v1::HeartbeatRequest beat = workers_->heartbeats().at(1);
  EXPECT_EQ(beat.state(), v1::WORKER_STATE_TRAINING);
  EXPECT_EQ(beat.progress().activity(), v1::ACTIVITY_COMPUTE);
  EXPECT_EQ(beat.progress().step(), 4u);
  EXPECT_THAT(workers_->CallTimes("Heartbeat"), ElementsAre(t0_, t0_));
}

TEST_F(AgentProgressTest, ASpareReportsNoProgress) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->Form(Rank(0, 2, /*spare=*/true));
  ASSERT_TRUE(agent->WaitForAssignment(absl::Seconds(30)).ok());
  source_.Set(v1::ACTIVITY_IDLE, 0);
  const v1::HeartbeatRequest beat = NextBeat(2, t0_ + kInterval);
  EXPECT_FALSE(beat.has_progress());
  EXPECT_TRUE(source_.generations().empty());
}

TEST_F(AgentProgressTest, AfterTheGenerationEndsNoProgressUntilTheNextAssignment) {
  std::unique_ptr<WorkerAgent> agent = Connected();
  ASSERT_NE(agent, nullptr);
  workers_->Form(Rank(1, 2));
  ASSERT_TRUE(agent->WaitForAssignment(absl::Seconds(30)).ok());
  source_.Set(v1::ACTIVITY_COMPUTE, 5);
  ASSERT_TRUE(NextBeat(2, t0_ + kInterval).has_progress());
  // Generation 1 ends; the agent re-joins generation 2, not formed yet.
  workers_->EndGeneration("rank 0 lost");
  ASSERT_TRUE(workers_->AwaitCalls("JoinJob", 2));
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (agent->generation() != 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(agent->generation(), 2u);
  const v1::HeartbeatRequest between = NextBeat(3, t0_ + 2 * kInterval);
  EXPECT_EQ(between.fence().generation(), 2u);
  EXPECT_FALSE(between.has_progress());
  // Assigned again: reports resume, for generation 2.
  workers_->Form(Rank(0, 1));
  ASSERT_TRUE(agent->WaitForAssignment(absl::Seconds(30)).ok());
  const v1::HeartbeatRequest again = NextBeat(4, t0_ + 3 * kInterval);
  ASSERT_TRUE(again.has_progress());
  EXPECT_EQ(again.progress().step(), 5u);
  EXPECT_THAT(source_.generations(), ElementsAre(1u, 2u));
}

}  // namespace
}  // namespace shardline::worker

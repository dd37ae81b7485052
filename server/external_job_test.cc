// External-workload jobs (job.proto ExternalWorkload) in the coordinator's
// state machine, on a fake clock: formation at min/max with the last call,
// recovery, growth on join, completion by leave and by CompleteJob,
// heartbeats without train_steps, no plan, and a restart on SQLite state.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/state_store.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;
using ::testing::HasSubstr;

// min..max nodes, heartbeat 1 s / timeout 5 s, last call 2 s, join
// timeout 60 s.
v1::JobSpec ExternalSpec(uint32_t min_workers, uint32_t max_workers) {
  v1::JobSpec spec;
  spec.set_name("torchrun-external");
  spec.mutable_external()->set_framework("torchrun");
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(min_workers);
  e->set_max_workers(max_workers);
  *e->mutable_heartbeat_interval() = TimeUtil::SecondsToDuration(1);
  *e->mutable_heartbeat_timeout() = TimeUtil::SecondsToDuration(5);
  *e->mutable_last_call() = TimeUtil::SecondsToDuration(2);
  *e->mutable_join_timeout() = TimeUtil::SecondsToDuration(60);
  return spec;
}

class ExternalJobTest : public ::testing::Test {
 protected:
  ExternalJobTest() : store_(NewMemoryStore()) { Restart(); }

  void Restart() {
    coordinator_ = std::make_unique<Coordinator>(&clock_, store_.get());
    ASSERT_TRUE(coordinator_->Recover().ok());
  }

  void Create(const v1::JobSpec& spec) {
    v1::CreateJobRequest r;
    r.set_job_id("job");
    *r.mutable_spec() = spec;
    auto created = coordinator_->CreateJob(r);
    ASSERT_TRUE(created.ok()) << created.status();
  }

  static v1::WorkerIdentity Id(const std::string& worker, uint64_t incarnation = 7) {
    v1::WorkerIdentity w;
    w.set_job_id("job");
    w.set_worker_id(worker);
    w.set_incarnation(incarnation);
    return w;
  }

  static v1::Fence Fence(const std::string& worker, uint64_t generation) {
    v1::Fence f;
    *f.mutable_worker() = Id(worker);
    f.set_generation(generation);
    return f;
  }

  absl::StatusOr<v1::JoinJobResponse> Join(const std::string& worker) {
    v1::JoinJobRequest r;
    *r.mutable_worker() = Id(worker);
    r.set_host("host-" + worker);
    r.set_device("cpu");
    return coordinator_->JoinJob(r);
  }

  absl::StatusOr<v1::HeartbeatResponse> Beat(const std::string& worker, uint64_t generation,
                                             uint64_t step) {
    v1::HeartbeatRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_step(step);
    r.set_state(v1::WORKER_STATE_TRAINING);
    return coordinator_->Heartbeat(r);
  }

  absl::Status Leave(const std::string& worker, uint64_t generation,
                     std::vector<GenerationEnded>* ended) {
    v1::LeaveJobRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_reason("workload exited 0");
    return coordinator_->LeaveJob(r, ended);
  }

  absl::StatusOr<v1::Job> Complete(const std::string& worker, uint64_t generation,
                                   const std::string& reason, std::vector<GenerationEnded>* ended) {
    v1::CompleteJobRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_reason(reason);
    return coordinator_->CompleteJob(r, ended);
  }

  v1::Job Job() { return *coordinator_->GetJob("job"); }

  std::map<std::string, v1::Member> Members() {
    std::map<std::string, v1::Member> out;
    const absl::StatusOr<v1::ListMembersResponse> list = coordinator_->ListMembers("job");
    EXPECT_TRUE(list.ok()) << list.status();
    for (const v1::Member& m : list->members()) out[m.worker_id()] = m;
    return out;
  }

  v1::Assignment AssignmentOf(const std::string& worker, uint64_t generation) {
    auto a = coordinator_->GetAssignment(Fence(worker, generation), false, absl::Now());
    EXPECT_TRUE(a.ok()) << worker << ": " << a.status();
    return a.ok() ? *a : v1::Assignment{};
  }

  FakeClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(ExternalJobTest, FormsAtMaxAtOnceAndAtMinAfterTheLastCall) {
  Create(ExternalSpec(2, 3));
  ASSERT_TRUE(Join("a").ok());
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);  // below min_workers
  ASSERT_TRUE(Join("b").ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);  // min reached: the last call runs
  clock_.Advance(absl::Milliseconds(1999));
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);
  clock_.Advance(absl::Milliseconds(1));
  coordinator_->Tick();
  v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.world_size(), 2u);
  EXPECT_EQ(job.dp(), 0u);
  EXPECT_EQ(job.phase_reason(), "generation 1 formed: world 2, 0 spares");
  const v1::Assignment a = AssignmentOf("a", 1);
  EXPECT_EQ(a.generation(), 1u);
  EXPECT_EQ(a.rank(), 0u);
  EXPECT_EQ(a.world_size(), 2u);
  EXPECT_FALSE(a.spare());
  EXPECT_FALSE(a.has_parallel());
  EXPECT_EQ(a.groups_size(), 0);
  EXPECT_EQ(AssignmentOf("b", 1).rank(), 1u);

  // A second job forms at once at max_workers, no last call.
  v1::CreateJobRequest r;
  r.set_job_id("other");
  *r.mutable_spec() = ExternalSpec(2, 2);
  ASSERT_TRUE(coordinator_->CreateJob(r).ok());
  for (const char* w : {"x", "y"}) {
    v1::JoinJobRequest j;
    *j.mutable_worker() = Id(w);
    j.mutable_worker()->set_job_id("other");
    ASSERT_TRUE(coordinator_->JoinJob(j).ok());
  }
  EXPECT_EQ(coordinator_->GetJob("other")->phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(coordinator_->GetJob("other")->world_size(), 2u);
}

TEST_F(ExternalJobTest, NoPlanNoShardOwnerNoCheckpointSchedule) {
  Create(ExternalSpec(1, 1));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  auto plan = coordinator_->GetPlan("job");
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("job job is an external job (spec.external): it has no plan"));
  v1::GetShardOwnerRequest owner;
  owner.set_job_id("job");
  owner.set_parameter("wte");
  auto o = coordinator_->GetShardOwner(owner);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("it has no plan"));
}

TEST_F(ExternalJobTest, RecoveryAfterAStreamBreakFormsAsSoonAsSurvivorsRejoin) {
  Create(ExternalSpec(2, 4));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  clock_.Advance(absl::Seconds(2));
  coordinator_->Tick();
  ASSERT_EQ(Job().world_size(), 3u);
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sb.ok());
  const std::vector<GenerationEnded> ended = coordinator_->CloseSession(Id("b"), *sb);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(Job().generation(), 2u);
  ASSERT_TRUE(Join("a").ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);  // c is still FENCED
  ASSERT_TRUE(Join("c").ok());                         // every survivor is back: no last call
  const v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.generation(), 2u);
  EXPECT_EQ(job.world_size(), 2u);
  EXPECT_EQ(AssignmentOf("a", 2).rank(), 0u);  // survivors keep their order
  EXPECT_EQ(AssignmentOf("c", 2).rank(), 1u);
}

TEST_F(ExternalJobTest, AJoinBelowMaxGrowsAtOnceAndAtMaxWaitsAsASpare) {
  Create(ExternalSpec(2, 3));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  clock_.Advance(absl::Seconds(2));
  coordinator_->Tick();
  ASSERT_EQ(Job().world_size(), 2u);
  auto c = Join("c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), v1::MEMBER_STATE_JOINING);
  EXPECT_EQ(c->generation(), 2u);
  v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(job.phase_reason(), "grow: 'c' joined; world 2 -> 3");
  // The ended generation goes to the rendezvous at the next tick.
  const std::vector<GenerationEnded> ended = coordinator_->Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  auto events = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast());
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_FENCED);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());  // every survivor back, and max reached
  job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.world_size(), 3u);
  EXPECT_EQ(AssignmentOf("c", 2).rank(), 2u);
  events = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast());
  ASSERT_TRUE(events.ok());
  ASSERT_TRUE(events->back().has_generation_formed());
  EXPECT_EQ(events->back().generation_formed().reason(), v1::FORMATION_REASON_GROW);
  EXPECT_EQ(events->back().generation_formed().dp(), 0u);

  // At max_workers a newcomer waits as a spare; the generation goes on.
  auto d = Join("d");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->state(), v1::MEMBER_STATE_SPARE);
  EXPECT_EQ(d->generation(), 2u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().num_spares(), 1u);
  const v1::Assignment spare = AssignmentOf("d", 2);
  EXPECT_TRUE(spare.spare());
  EXPECT_EQ(spare.world_size(), 3u);
  EXPECT_EQ(spare.generation(), 2u);
}

TEST_F(ExternalJobTest, LeaveOfOneRankGoesOnLeaveOfAllCompletes) {
  Create(ExternalSpec(1, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Job().world_size(), 3u);
  std::vector<GenerationEnded> ended;
  ASSERT_TRUE(Leave("b", 1, &ended).ok());
  EXPECT_TRUE(ended.empty());
  v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.generation(), 1u);
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_LEFT);
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_ACTIVE);
  ASSERT_TRUE(Beat("a", 1, 5).ok());  // the others' fences still hold
  ASSERT_TRUE(Leave("a", 1, &ended).ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  ASSERT_TRUE(Leave("c", 1, &ended).ok());
  job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(job.phase_reason(), "all 3 ranks of generation 1 left");
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
}

TEST_F(ExternalJobTest, SparesGetStopWhenEveryRankHasLeft) {
  Create(ExternalSpec(1, 1));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("s").ok());
  ASSERT_EQ(Members()["s"].state(), v1::MEMBER_STATE_SPARE);
  auto session = coordinator_->OpenSession(Id("s"));
  ASSERT_TRUE(session.ok());
  std::vector<GenerationEnded> ended;
  ASSERT_TRUE(Leave("a", 1, &ended).ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(Job().phase_reason(), "all 1 ranks of generation 1 left");
  bool stopped = false;
  for (int i = 0; i < 8 && !stopped; ++i) {
    auto msg = coordinator_->NextSessionMessage(Id("s"), *session, absl::InfinitePast());
    ASSERT_TRUE(msg.ok()) << msg.status();
    if (!msg->has_value()) break;
    stopped = (*msg)->directive().has_stop();
    if (stopped) {
      EXPECT_EQ((*msg)->directive().stop().phase(), v1::JOB_PHASE_COMPLETED);
    }
  }
  EXPECT_TRUE(stopped);
}

TEST_F(ExternalJobTest, ALostRankStillEndsTheGeneration) {
  Create(ExternalSpec(1, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  ASSERT_EQ(Job().world_size(), 2u);
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(Beat("a", 1, 1).ok());
  clock_.Advance(absl::Seconds(3));  // b silent for 6 s > 5 s
  const std::vector<GenerationEnded> ended = coordinator_->Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(Members()["b"].loss_reason(), v1::LOSS_REASON_HEARTBEAT_TIMEOUT);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  ASSERT_TRUE(Join("a").ok());  // the only survivor: forms at once
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 1u);
}

TEST_F(ExternalJobTest, HeartbeatStepsAreProgressOnlyAndResetTheErrorStreak) {
  Create(ExternalSpec(1, 1));
  ASSERT_TRUE(Join("a").ok());
  // No train_steps: any step is accepted and shown, and DONE completes nothing.
  ASSERT_TRUE(Beat("a", 1, 123456789).ok());
  EXPECT_EQ(Job().step(), 123456789u);
  EXPECT_EQ(Members()["a"].step(), 123456789u);
  v1::HeartbeatRequest done;
  *done.mutable_fence() = Fence("a", 1);
  done.set_state(v1::WORKER_STATE_DONE);
  auto r = coordinator_->Heartbeat(done);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->directive().has_continue_training());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);

  // Errors in kMaxConsecutiveErrorGenerations - 1 generations, then a
  // heartbeat (at step 0, the same as the generation's start) resets the
  // count: two more errors do not exclude.
  auto report = [&](uint64_t g) {
    v1::ReportErrorRequest e;
    *e.mutable_fence() = Fence("a", g);
    e.set_code(static_cast<int>(absl::StatusCode::kInternal));
    e.set_message("worker process exited 1");
    std::vector<GenerationEnded> ended;
    return coordinator_->ReportError(e, &ended);
  };
  uint64_t g = 1;
  for (int i = 0; i + 1 < Coordinator::kMaxConsecutiveErrorGenerations; ++i) {
    ASSERT_TRUE(report(g).ok());
    ASSERT_TRUE(Join("a").ok());
    ASSERT_EQ(Job().generation(), ++g);
  }
  ASSERT_TRUE(Beat("a", g, 0).ok());
  for (int i = 0; i + 1 < Coordinator::kMaxConsecutiveErrorGenerations; ++i) {
    ASSERT_TRUE(report(g).ok());
    ASSERT_TRUE(Join("a").ok()) << "excluded after a heartbeat reset the count";
    ASSERT_EQ(Job().generation(), ++g);
  }
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_ACTIVE);
}

TEST_F(ExternalJobTest, CompleteJobByAMember) {
  Create(ExternalSpec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  std::vector<GenerationEnded> ended;
  // Too long a reason is refused before anything changes.
  auto long_reason = Complete("a", 1, std::string(1025, 'x'), &ended);
  EXPECT_EQ(long_reason.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  // The fence's generation is not checked.
  auto done = Complete("a", 99, "torchrun closed the rendezvous", &ended);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(done->phase_reason(), "completed by 'a': torchrun closed the rendezvous");
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  auto events = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast());
  ASSERT_TRUE(events.ok());
  ASSERT_TRUE(events->back().has_phase_changed());
  EXPECT_EQ(events->back().phase_changed().new_phase(), v1::JOB_PHASE_COMPLETED);
  // Repeated: unchanged, nothing more ends.
  const v1::Job before = Job();
  ended.clear();
  auto again = Complete("b", 1, "another reason", &ended);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->phase_reason(), before.phase_reason());
  EXPECT_EQ(again->update_time().seconds(), before.update_time().seconds());
  EXPECT_TRUE(ended.empty());
  // Heartbeats now get STOP.
  auto beat = Beat("b", 1, 0);
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(beat->directive().has_stop());
}

TEST_F(ExternalJobTest, CompleteJobRefusals) {
  Create(ExternalSpec(1, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  std::vector<GenerationEnded> ended;
  // A LOST caller.
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sb.ok());
  coordinator_->CloseSession(Id("b"), *sb);
  ASSERT_EQ(Members()["b"].state(), v1::MEMBER_STATE_LOST);
  auto lost = Complete("b", 1, "", &ended);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("'b' is LOST"));
  // A stranger.
  auto stranger = Complete("zz", 1, "", &ended);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Job().phase(), v1::JOB_PHASE_COMPLETED);
  // A FENCED member may complete (torchrun closes between rounds too).
  ASSERT_EQ(Members()["a"].state(), v1::MEMBER_STATE_FENCED);
  auto fenced = Complete("a", 1, "", &ended);
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(fenced->phase_reason(), "completed by 'a'");

  // A GPT job: FAILED_PRECONDITION. A cancelled external job too.
  v1::CreateJobRequest r;
  r.set_job_id("cancelled");
  *r.mutable_spec() = ExternalSpec(1, 1);
  ASSERT_TRUE(coordinator_->CreateJob(r).ok());
  v1::JoinJobRequest j;
  *j.mutable_worker() = Id("a");
  j.mutable_worker()->set_job_id("cancelled");
  ASSERT_TRUE(coordinator_->JoinJob(j).ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id("cancelled");
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  v1::CompleteJobRequest c;
  *c.mutable_fence() = Fence("a", 1);
  c.mutable_fence()->mutable_worker()->set_job_id("cancelled");
  auto on_cancelled = coordinator_->CompleteJob(c, &ended);
  EXPECT_EQ(on_cancelled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(on_cancelled.status().message()), HasSubstr("CANCELLED"));
}

// An external job saves by itself: a drain takes the rank out at once
// (no checkpoint to wait for), even with a checkpoint directory.
TEST_F(ExternalJobTest, DrainTakesARankOutAtOnce) {
  v1::JobSpec spec = ExternalSpec(1, 2);
  spec.mutable_checkpoint()->set_directory("/shared/ckpt");
  Create(spec);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  std::vector<GenerationEnded> ended;
  auto drained = coordinator_->DrainWorker("job", "b", "host maintenance", false, &ended);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->state(), v1::MEMBER_STATE_LEFT);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  ASSERT_TRUE(Join("a").ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 1u);
}

TEST_F(ExternalJobTest, JoinTimeoutMessageCountsNodes) {
  Create(ExternalSpec(3, 4));
  ASSERT_TRUE(Join("a").ok());
  for (int s = 0; s <= 60; ++s) {  // a stays alive while the others never come
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat("a", 1, 0).ok());
    coordinator_->Tick();
  }
  const v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_FAILED);
  EXPECT_THAT(job.phase_reason(), HasSubstr("only 1 nodes joined within join_timeout 60s"));
  EXPECT_THAT(job.phase_reason(), HasSubstr("min_workers=3 (nodes of the external job)"));
  EXPECT_THAT(job.phase_reason(), ::testing::Not(HasSubstr("tp*pp")));
}

// A RUNNING external job and a COMPLETED one survive a restart on SQLite
// state: same generation, world and ranks, still no plan.
TEST(ExternalJobRestartTest, SurvivesACoordinatorRestartOnSqlite) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/external_restart.db");
  std::filesystem::remove(path);
  FakeClock clock;
  auto join = [](Coordinator& c, const std::string& job, const std::string& worker) {
    v1::JoinJobRequest j;
    j.mutable_worker()->set_job_id(job);
    j.mutable_worker()->set_worker_id(worker);
    j.mutable_worker()->set_incarnation(7);
    j.set_device("cpu");
    return c.JoinJob(j);
  };
  {
    absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    Coordinator c(&clock, store->get());
    ASSERT_TRUE(c.Recover().ok());
    for (const char* id : {"running", "done"}) {
      v1::CreateJobRequest r;
      r.set_job_id(id);
      *r.mutable_spec() = ExternalSpec(2, 2);
      ASSERT_TRUE(c.CreateJob(r).ok());
      ASSERT_TRUE(join(c, id, "a").ok());
      ASSERT_TRUE(join(c, id, "b").ok());
    }
    v1::CompleteJobRequest done;
    done.mutable_fence()->mutable_worker()->set_job_id("done");
    done.mutable_fence()->mutable_worker()->set_worker_id("b");
    done.mutable_fence()->mutable_worker()->set_incarnation(7);
    done.mutable_fence()->set_generation(1);
    std::vector<GenerationEnded> ended;
    ASSERT_TRUE(c.CompleteJob(done, &ended).ok());
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  Coordinator c(&clock, store->get());
  absl::Status recovered = c.Recover();
  ASSERT_TRUE(recovered.ok()) << recovered;
  const v1::Job running = *c.GetJob("running");
  EXPECT_EQ(running.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(running.generation(), 1u);
  EXPECT_EQ(running.world_size(), 2u);
  EXPECT_EQ(running.spec().external().framework(), "torchrun");
  v1::Fence fence;
  fence.mutable_worker()->set_job_id("running");
  fence.mutable_worker()->set_worker_id("b");
  fence.mutable_worker()->set_incarnation(7);
  fence.set_generation(1);
  auto a = c.GetAssignment(fence, false, absl::Now());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank(), 1u);
  EXPECT_EQ(a->world_size(), 2u);
  EXPECT_EQ(c.GetPlan("running").status().code(), absl::StatusCode::kFailedPrecondition);
  const v1::Job done = *c.GetJob("done");
  EXPECT_EQ(done.phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(done.phase_reason(), "completed by 'b'");
}

}  // namespace
}  // namespace shardline::server

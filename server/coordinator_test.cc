// The coordinator's state machine with a fake clock: formation (min, max,
// last call, spares, constant global batch), failure detection three ways,
// fencing, case C9, durability across a restart.
#include "server/coordinator.h"
#include "server/coordinator_test_fixture.h"
#include "testing/job_specs.h"

#include <cmath>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/checkpoint_registry.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;
using google::protobuf::util::TimeUtil;

class CoordinatorTest : public CoordinatorFixture {
 protected:
  // Members a, b, c of generation 1: a and b heartbeat every second for
  // 10 s, c not at all, and no Tick ends the generation early; then one more
  // second and a Tick, whose ended generations go to *ended.
  void BeatWhileCFreezes(std::vector<GenerationEnded>* ended) {
    for (int t = 1; t <= 10; ++t) {
      clock_.Advance(absl::Seconds(1));
      ASSERT_TRUE(Beat("a", 1, t).ok());
      ASSERT_TRUE(Beat("b", 1, t).ok());
      coordinator_->Tick();
      ASSERT_EQ(Job().generation(), 1u) << "declared lost too early, t=" << t;
    }
    clock_.Advance(absl::Seconds(1));
    *ended = coordinator_->Tick();
  }
};

TEST_F(CoordinatorTest, FormsAtOnceWhenMaxWorkersJoin) {
  Create(Spec(2, 3));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);
  auto c = Join("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state(), v1::MEMBER_STATE_ACTIVE);
  const v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.world_size(), 3u);
  EXPECT_EQ(job.dp(), 3u);
  // Ranks in join order; dp 3 divides the 12 micro-batches per step.
  EXPECT_EQ(AssignmentOf("a", 1).rank(), 0u);
  EXPECT_EQ(AssignmentOf("b", 1).rank(), 1u);
  const v1::Assignment a = AssignmentOf("c", 1);
  EXPECT_EQ(a.rank(), 2u);
  EXPECT_EQ(a.world_size(), 3u);
  EXPECT_EQ(a.gradient_accumulation_steps(), 4u);
  // Only the groups that hold rank 2 (its tp group, dp, its pp
  // group), each with its name and position in Plan.groups.
  std::vector<std::string> names;
  for (const v1::ProcessGroup& g : a.groups()) {
    EXPECT_NE(std::find(g.ranks().begin(), g.ranks().end(), 2u), g.ranks().end()) << g.name();
    names.push_back(g.name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tp/2", "dp/0", "pp/2"}));
  EXPECT_FALSE(a.has_restore());
}

TEST_F(CoordinatorTest, FormsAtMinWorkersAfterTheLastCall) {
  Create(Spec(2, 4));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(Beat("a", 1).status().code() == absl::StatusCode::kOk);
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);  // last call is 5 s
  clock_.Advance(absl::Seconds(2));
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 2u);
}

TEST_F(CoordinatorTest, SparesAndAConstantGlobalBatch) {
  // pp=2: worlds are multiples of 2. 7 workers, 12 micro-batches per step:
  // dp 3 (world 6) divides 12, so 1 spare.
  Create(Spec(2, 7, /*pp=*/2, /*global_batch=*/12));
  for (const char* w : {"a", "b", "c", "d", "e", "f", "g"}) ASSERT_TRUE(Join(w).ok());
  EXPECT_EQ(Job().world_size(), 6u);
  EXPECT_EQ(Job().num_spares(), 1u);
  EXPECT_EQ(Members()["g"].state(), v1::MEMBER_STATE_SPARE);
  EXPECT_TRUE(AssignmentOf("g", 1).spare());
  EXPECT_EQ(AssignmentOf("f", 1).gradient_accumulation_steps(), 4u);  // 12 / 3

  // 10 micro-batches per step: dp 3 does not divide 10, so dp 2 (world 4).
  Create(Spec(2, 7, /*pp=*/2, /*global_batch=*/10), "job2");
  for (const char* w : {"a", "b", "c", "d", "e", "f", "g"}) {
    v1::JoinJobRequest r;
    *r.mutable_worker() = Id(w, 7, "job2");
    r.set_device("cpu");
    ASSERT_TRUE(coordinator_->JoinJob(r).ok());
  }
  const v1::Job job2 = *coordinator_->GetJob("job2");
  EXPECT_EQ(job2.world_size(), 4u);
  EXPECT_EQ(job2.dp(), 2u);
  EXPECT_EQ(job2.num_spares(), 3u);
}

// Tick skips its scan of the members until a timeout can be due; a Tick
// before anyone joined (nothing due, ever) must not keep the members who
// join later from being scanned: the frozen one is still LOST in time.
TEST_F(CoordinatorTest, HeartbeatTimeoutOfMembersWhoJoinedAfterAnEmptyScan) {
  Create(Spec(2, 3));
  coordinator_->Tick();  // no members yet
  clock_.Advance(absl::Seconds(1));
  coordinator_->Tick();
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Job().generation(), 1u);
  std::vector<GenerationEnded> ended;
  ASSERT_NO_FATAL_FAILURE(BeatWhileCFreezes(&ended));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason, HasSubstr("rank 2 (c) lost"));
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_HEARTBEAT_TIMEOUT);
}

// Case C9: 3 workers, min 2; one is frozen (no clean leave).
TEST_F(CoordinatorTest, C9FrozenRankIsLostByHeartbeatTimeoutAndFencedOnWaking) {
  Create(Spec(2, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Job().generation(), 1u);
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  // Within heartbeat_timeout + one interval.
  std::vector<GenerationEnded> ended;
  ASSERT_NO_FATAL_FAILURE(BeatWhileCFreezes(&ended));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  EXPECT_THAT(ended[0].reason, HasSubstr("rank 2 (c) lost"));
  EXPECT_EQ(Job().generation(), 2u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_HEARTBEAT_TIMEOUT);

  // Survivors: stale fences are aborted; they re-join and re-form at once.
  const auto stale = Beat("a", 1);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(stale.status().message()), HasSubstr("generation 1 is over (current 2)"));
  ASSERT_EQ(Join("a")->generation(), 2u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);  // b has not re-joined yet
  ASSERT_TRUE(Join("b").ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 2u);
  EXPECT_EQ(AssignmentOf("a", 2).rank(), 0u);
  EXPECT_EQ(AssignmentOf("b", 2).rank(), 1u);

  // c wakes (SIGCONT): everything it sends carries generation 1 and is refused.
  const auto woken = Beat("c", 1);
  EXPECT_EQ(woken.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(woken.status().message()), HasSubstr("re-join"));
  EXPECT_EQ(Job().generation(), 2u);  // nothing changed
  // It must re-join; the job is running, so it becomes a spare.
  auto rejoin = Join("c");
  ASSERT_TRUE(rejoin.ok());
  EXPECT_EQ(rejoin->state(), v1::MEMBER_STATE_SPARE);
  EXPECT_EQ(Job().generation(), 2u);
}

// Case C9, second part: with min 2 and one survivor, the job stops.
TEST_F(CoordinatorTest, C9OneSurvivorBelowMinWorkersFailsWithAReason) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  for (int t = 1; t <= 11; ++t) {
    clock_.Advance(absl::Seconds(1));
    (void)Beat("a", Job().generation());
    coordinator_->Tick();
  }
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  ASSERT_TRUE(Join("a").ok());
  for (int t = 0; t < 61; ++t) {
    clock_.Advance(absl::Seconds(1));
    (void)Beat("a", 2);
    coordinator_->Tick();
  }
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_FAILED);
  EXPECT_THAT(Job().phase_reason(), HasSubstr("only 1 workers joined within join_timeout 60s"));
  EXPECT_THAT(Job().phase_reason(), HasSubstr("min_workers=2"));
  // The reason keeps what emptied the job.
  EXPECT_THAT(Job().phase_reason(),
              HasSubstr("; generation 1 had ended: rank 1 (b) lost: no heartbeat for"));
  const auto stop = Beat("a", 2);
  ASSERT_TRUE(stop.ok());
  EXPECT_TRUE(stop->directive().has_stop());
  EXPECT_EQ(stop->directive().stop().phase(), v1::JOB_PHASE_FAILED);
}

TEST_F(CoordinatorTest, SessionStreamBreakIsNoticedAtOnce) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  auto sa = coordinator_->OpenSession(Id("a"));
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sa.ok() && sb.ok());
  const absl::Time soon = absl::Now() + absl::Milliseconds(50);
  auto opened = coordinator_->NextSessionMessage(Id("a"), *sa, soon);
  ASSERT_TRUE(opened.ok() && opened->has_value());
  EXPECT_EQ((*opened)->opened().state(), v1::MEMBER_STATE_ACTIVE);
  auto assignment = coordinator_->NextSessionMessage(Id("a"), *sa, soon);
  ASSERT_TRUE(assignment.ok() && assignment->has_value());
  EXPECT_EQ((*assignment)->assignment().rank(), 0u);
  auto nothing = coordinator_->NextSessionMessage(Id("a"), *sa, absl::Now() + absl::Milliseconds(20));
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(nothing->has_value());

  // b's process dies: its stream breaks. No clock advance needed.
  const std::vector<GenerationEnded> ended = coordinator_->CloseSession(Id("b"), *sb);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(Members()["b"].loss_reason(), v1::LOSS_REASON_STREAM_BROKEN);
  EXPECT_EQ(Job().generation(), 2u);
  // a is told on its stream.
  auto restart = coordinator_->NextSessionMessage(Id("a"), *sa, soon);
  ASSERT_TRUE(restart.ok() && restart->has_value());
  EXPECT_EQ((*restart)->directive().restart_at_generation().generation(), 2u);
  EXPECT_THAT((*restart)->directive().restart_at_generation().reason(), HasSubstr("rank 1 (b) lost"));
  // A late close of the same session changes nothing more.
  EXPECT_TRUE(coordinator_->CloseSession(Id("b"), *sb).empty());
  EXPECT_EQ(Job().generation(), 2u);
}

TEST_F(CoordinatorTest, FencingRejectsBadStaleAndReplacedCallers) {
  Create(Spec(1, 1));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  v1::Fence no_incarnation = Fence("a", 1, 0);
  EXPECT_THAT(std::string(coordinator_->CheckFence(no_incarnation).status().message()),
              HasSubstr("fence.worker.incarnation must be non-zero"));
  EXPECT_EQ(coordinator_->CheckFence(Fence("a", 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->CheckFence(Fence("zz", 1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->CheckFence(Fence("a", 3)).status().code(), absl::StatusCode::kAborted);
  auto ok = coordinator_->CheckFence(Fence("a", 1));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->rank, 0);
  EXPECT_EQ(ok->world_size, 1);

  // The same slot restarts with a new incarnation: the old one is fenced off
  // and, since it held a rank, the generation ends.
  auto session = coordinator_->OpenSession(Id("a"));
  ASSERT_TRUE(session.ok());
  auto rejoin = Join("a", /*incarnation=*/8);
  ASSERT_TRUE(rejoin.ok());
  EXPECT_EQ(rejoin->generation(), 2u);
  const auto ended = coordinator_->Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  const auto old = coordinator_->CheckFence(Fence("a", 1, 7));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("was replaced by incarnation 8"));
  // An incarnation newer than the member's was not replaced by an older one;
  // it is still ABORTED, so that it re-joins.
  const auto unjoined = coordinator_->CheckFence(Fence("a", 2, 9));
  EXPECT_EQ(unjoined.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(unjoined.status().message(),
            "incarnation 9 of worker 'a' is not the member of job 'job' this coordinator knows "
            "(incarnation 8); re-join with JoinJob");
  // A generation the job has not reached is not "over".
  const auto future = coordinator_->CheckFence(Fence("a", 3, 8));
  EXPECT_EQ(future.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(future.status().message()),
              HasSubstr("generation 3 does not exist (job 'job' is at generation 2)"));
  // A late message about the old incarnation (its stream closing) changes nothing.
  EXPECT_TRUE(coordinator_->CloseSession(Id("a", 7), *session).empty());
  EXPECT_EQ(Members()["a"].incarnation(), 8u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);  // re-formed with the new process
  EXPECT_EQ(Job().generation(), 2u);
  // The replaced process cannot come back and replace its successor (two
  // processes started with one worker_id would take turns forever).
  const auto back = Join("a", /*incarnation=*/7);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(back.status().message()), HasSubstr("this process must exit"));
  EXPECT_EQ(Members()["a"].incarnation(), 8u);
  EXPECT_EQ(Job().generation(), 2u);
}

TEST_F(CoordinatorTest, DuplicateJoinsAreIdempotent) {
  Create(Spec(2, 3));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("a").ok());
  EXPECT_EQ(Members().size(), 1u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);
}

TEST_F(CoordinatorTest, ErrorReportLosesADeadPeerAndRestartsTheGeneration) {
  Create(Spec(3, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  auto sa = coordinator_->OpenSession(Id("a"));
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sa.ok() && sb.ok());
  // c never opened a session and has been quiet for 3 s (> 2 intervals).
  clock_.Advance(absl::Seconds(3));
  v1::ReportErrorRequest r;
  *r.mutable_fence() = Fence("a", 1);
  r.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  r.set_message("all_reduce timed out waiting for rank 2");
  r.set_operation("all_reduce dp/0");
  r.set_peer_rank(2);
  std::vector<GenerationEnded> ended;
  v1::ReportErrorRequest bad = r;
  bad.set_code(0);
  EXPECT_EQ(coordinator_->ReportError(bad, &ended).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = r;
  bad.set_peer_rank(3);
  EXPECT_THAT(std::string(coordinator_->ReportError(bad, &ended).status().message()),
              HasSubstr("peer_rank=3 is not a rank; world_size is 3"));
  EXPECT_TRUE(ended.empty());
  auto response = coordinator_->ReportError(r, &ended);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->directive().restart_at_generation().generation(), 2u);
  EXPECT_EQ(ended.size(), 1u);
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_ERROR_REPORTED);
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_FENCED);
  // A second report of the same failure from b is stale: ABORTED, nothing more.
  *r.mutable_fence() = Fence("b", 1);
  EXPECT_EQ(coordinator_->ReportError(r, &ended).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Job().generation(), 2u);
}

// `worker` (incarnation 7) reports that it cannot bind its interface.
absl::StatusOr<v1::ReportErrorResponse> ReportBindError(Coordinator& c, const v1::Fence& fence) {
  v1::ReportErrorRequest r;
  *r.mutable_fence() = fence;
  r.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  r.set_message("cannot bind 10.0.0.9");
  r.set_operation("build communicators");
  std::vector<GenerationEnded> ended;
  return c.ReportError(r, &ended);
}

// A worker whose own error reports end kMaxConsecutiveErrorGenerations
// generations in a row is excluded; the job re-forms without it, and only a
// new process of the slot may join again.
TEST_F(CoordinatorTest, RepeatedErrorReportsExcludeTheWorker) {
  Create(Spec(2, 3));  // dp 3 or 2 (global batch 12)
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Job().world_size(), 3u);
  const uint64_t n = Coordinator::kMaxConsecutiveErrorGenerations;
  for (uint64_t g = 1; g < n; ++g) {
    // a and b got as far as READY; c fails every time.
    ASSERT_TRUE(Beat("a", g, 0, v1::WORKER_STATE_READY).ok());
    auto r = ReportBindError(*coordinator_, Fence("c", g));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->directive().has_restart_at_generation());
    for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok()) << w;
    ASSERT_EQ(Job().generation(), g + 1);
    ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
    ASSERT_EQ(Job().world_size(), 3u);
  }
  auto r = ReportBindError(*coordinator_, Fence("c", n));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->directive().has_stop());
  EXPECT_THAT(r->directive().stop().reason(), HasSubstr("excluded"));
  const v1::Member c = Members()["c"];
  EXPECT_EQ(c.state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(c.loss_reason(), v1::LOSS_REASON_REPEATED_ERRORS);
  EXPECT_THAT(c.detail(), HasSubstr("3 consecutive generations"));
  EXPECT_THAT(c.detail(), HasSubstr("cannot bind 10.0.0.9"));
  // The same process may not come back.
  auto again = Join("c");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("excluded"));
  // The others re-form without it.
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().generation(), n + 1);
  EXPECT_EQ(Job().world_size(), 2u);
  // The exclusion is in the event log.
  auto events = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast());
  ASSERT_TRUE(events.ok());
  bool seen = false;
  for (const v1::JobEvent& e : *events) {
    seen |= e.has_worker_lost() && e.worker_lost().worker_id() == "c" &&
            e.worker_lost().reason() == v1::LOSS_REASON_REPEATED_ERRORS;
  }
  EXPECT_TRUE(seen);
  // A new process of the slot joins (as a spare of the formed generation).
  auto fresh = Join("c", /*incarnation=*/8);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->state(), v1::MEMBER_STATE_SPARE);
}

// A heartbeat reporting a step done in the generation resets the count
// (READY alone does not: what fails every time may come after it);
// generations ended by others neither count nor reset.
TEST_F(CoordinatorTest, AStepDoneResetsTheErrorStreak) {
  Create(Spec(2, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  const uint64_t n = Coordinator::kMaxConsecutiveErrorGenerations;
  uint64_t g = 1;
  auto next = [&] {
    for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok()) << w;
    ASSERT_EQ(Job().generation(), ++g);
  };
  for (uint64_t i = 0; i + 1 < n; ++i) {
    ASSERT_TRUE(ReportBindError(*coordinator_, Fence("c", g)).ok());
    next();
  }
  // Another worker's report: neutral.
  ASSERT_TRUE(ReportBindError(*coordinator_, Fence("a", g)).ok());
  next();
  // c gets its communicators ready (no reset) and trains a step (reset),
  // then fails again.
  ASSERT_TRUE(Beat("c", g, 0, v1::WORKER_STATE_READY).ok());
  ASSERT_TRUE(Beat("c", g, 1, v1::WORKER_STATE_TRAINING).ok());
  for (uint64_t i = 0; i + 1 < n; ++i) {
    ASSERT_TRUE(ReportBindError(*coordinator_, Fence("c", g)).ok());
    next();
  }
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_ACTIVE);
  // The next one is the n-th in a row.
  auto r = ReportBindError(*coordinator_, Fence("c", g));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->directive().has_stop());
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_REPEATED_ERRORS);
}

// Excluding the worker leaves fewer than min_workers: the job fails at once,
// naming the worker and its error.
TEST_F(CoordinatorTest, ExclusionBelowMinWorkersFailsTheJobNamingTheWorker) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  const uint64_t n = Coordinator::kMaxConsecutiveErrorGenerations;
  for (uint64_t g = 1; g < n; ++g) {
    ASSERT_TRUE(ReportBindError(*coordinator_, Fence("b", g)).ok());
    ASSERT_TRUE(Join("a").ok());
    ASSERT_TRUE(Join("b").ok());
  }
  auto r = ReportBindError(*coordinator_, Fence("b", n));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->directive().has_stop());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_FAILED);
  EXPECT_THAT(Job().phase_reason(), HasSubstr("worker 'b'"));
  EXPECT_THAT(Job().phase_reason(), HasSubstr("cannot bind 10.0.0.9"));
  EXPECT_THAT(Job().phase_reason(), HasSubstr("min_workers=2"));
  EXPECT_TRUE(Beat("a", n + 1)->directive().has_stop());
}

TEST_F(CoordinatorTest, LeavingActiveEndsTheGenerationLeavingSpareDoesNot) {
  Create(Spec(2, 3, /*pp=*/2));  // world 2, one spare
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Members()["c"].state(), v1::MEMBER_STATE_SPARE);
  std::vector<GenerationEnded> ended;
  v1::LeaveJobRequest leave;
  *leave.mutable_fence() = Fence("c", 1);
  leave.set_reason("draining node");
  ASSERT_TRUE(coordinator_->LeaveJob(leave, &ended).ok());
  EXPECT_TRUE(ended.empty());
  EXPECT_EQ(Job().generation(), 1u);
  *leave.mutable_fence() = Fence("b", 1);
  ASSERT_TRUE(coordinator_->LeaveJob(leave, &ended).ok());
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason, HasSubstr("rank 1 (b) left: draining node"));
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_LEFT);
  ASSERT_TRUE(coordinator_->LeaveJob(leave, &ended).ok());  // idempotent
}

TEST_F(CoordinatorTest, SpareReplacesALostRank) {
  Create(Spec(2, 3, /*pp=*/2));  // world 2 + spare c
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sb.ok());
  ASSERT_EQ(coordinator_->CloseSession(Id("b"), *sb).size(), 1u);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("c").ok());  // the spare re-joins too
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 2u);
  EXPECT_EQ(AssignmentOf("a", 2).rank(), 0u);  // survivor keeps its place
  EXPECT_EQ(AssignmentOf("c", 2).rank(), 1u);  // the spare takes the lost rank
}

TEST_F(CoordinatorTest, CompletesWhenEveryRankIsDone) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  ASSERT_TRUE(Beat("a", 1, 100, v1::WORKER_STATE_DONE)->directive().has_continue_training());
  EXPECT_EQ(Beat("b", 1, 101).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Beat("b", 1, 1, v1::WORKER_STATE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto last = Beat("b", 1, 100, v1::WORKER_STATE_DONE);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->directive().has_stop());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(Job().step(), 100u);
  EXPECT_TRUE(Beat("a", 1)->directive().has_stop());
  // The finished job's layout stays queryable, also after a restart.
  ASSERT_TRUE(coordinator_->GetPlan("job").ok());
  Restart();
  auto plan = coordinator_->GetPlan("job");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->world_size(), 2u);
}

TEST_F(CoordinatorTest, ALostSpareIsNoLongerCounted) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  ASSERT_TRUE(Join("c").ok());
  ASSERT_EQ(Job().num_spares(), 1u);
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(Beat("a", 1).ok());
  ASSERT_TRUE(Beat("b", 1).ok());
  clock_.Advance(absl::Seconds(6));  // c: no heartbeat for 11 s > 10 s
  ASSERT_TRUE(Beat("a", 1).ok());
  ASSERT_TRUE(Beat("b", 1).ok());
  coordinator_->Tick();
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(Job().num_spares(), 0u);
  EXPECT_EQ(Job().generation(), 1u);  // a spare's loss ends nothing
}

TEST_F(CoordinatorTest, RestartFromTheStoreLosesNothingAndDoesNotReform) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  v1::CheckpointRef ref;
  ref.set_checkpoint_id("g1-s10");
  ref.set_step(10);
  ASSERT_TRUE(coordinator_->NoteCheckpointCommitted("job", ref, 1234).ok());
  clock_.Advance(absl::Seconds(8));
  Restart();  // a new coordinator on the same store ("kill -9" of the old one)
  const v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.generation(), 1u);
  EXPECT_EQ(job.last_checkpoint().step(), 10u);
  EXPECT_EQ(Members()["b"].rank(), 1u);
  // Workers carry on with the same fence; a fresh heartbeat clock means no
  // one is lost for the time the coordinator was down.
  clock_.Advance(absl::Seconds(5));
  EXPECT_TRUE(coordinator_->Tick().empty());
  ASSERT_TRUE(Beat("a", 1, 11).ok());
  ASSERT_TRUE(Beat("b", 1, 11).ok());
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(AssignmentOf("b", 1).restore().step(), 10u);
  EXPECT_EQ(AssignmentOf("b", 1).data_cursor(), 10u * 12);
  // The restarted coordinator knows the token by its hash only.
  EXPECT_EQ(coordinator_->WorkerTokenHash("job").value(), Sha256Hex(last_token_));
}

TEST_F(CoordinatorTest, CreateJobValidatesTheSpecNamingFields) {
  v1::CreateJobRequest r;
  r.set_job_id("Bad_Id");
  *r.mutable_spec() = Spec(1, 1);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("job_id='Bad_Id' is invalid"));
  r.set_job_id("ok");
  r.mutable_spec()->mutable_parallel()->set_tp(3);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.parallel.tp=3 does not divide spec.model.num_heads=2"));
  *r.mutable_spec() = Spec(1, 1, /*pp=*/2);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.elastic.min_workers=1 < tp*pp=2"));
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->mutable_training()->set_global_batch(7);
  r.mutable_spec()->mutable_training()->set_micro_batch(2);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.training.global_batch=7 is not a positive multiple of "
                        "spec.training.micro_batch=2"));
  *r.mutable_spec() = Spec(5, 5, 1, /*global_batch=*/7);  // dp 5 does not divide 7
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("no data-parallel degree fits"));
  *r.mutable_spec() = Spec(1, 1);
  *r.mutable_spec()->mutable_elastic()->mutable_heartbeat_timeout() = TimeUtil::SecondsToDuration(1);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.elastic.heartbeat_timeout=1s must be longer"));
  *r.mutable_spec() = Spec(1, 1);
  *r.mutable_spec()->mutable_elastic()->mutable_heartbeat_timeout() =
      TimeUtil::SecondsToDuration(601);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.elastic.heartbeat_timeout=601s is too long; at most 10m"));
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->mutable_training()->set_adam_beta2(1.5);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.training.adam_beta2=1.5 is invalid; use a value in [0, 1)"));
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->mutable_training()->set_learning_rate(std::nan(""));
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.training.learning_rate=nan is invalid"));
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->mutable_data()->set_validation_fraction(1.5);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("spec.data.validation_fraction=1.5"));
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->mutable_training()->set_learning_rate(1e-3);
  r.mutable_spec()->mutable_training()->set_min_learning_rate(5);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("min_learning_rate=5 exceeds"));
  r.set_job_id("trailing-");
  *r.mutable_spec() = Spec(1, 1);
  EXPECT_THAT(std::string(coordinator_->CreateJob(r).status().message()),
              HasSubstr("not ending with '-'"));
  r.set_job_id("ok");
  // No id: the coordinator picks one.
  r.set_job_id("");
  *r.mutable_spec() = Spec(1, 1);
  auto picked = coordinator_->CreateJob(r);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_THAT(picked->job().job_id(), ::testing::MatchesRegex("job-[0-9a-f]{8}"));
  r.set_job_id("ok");
  // Same id and spec: the same job, but the token only from the call that
  // created it (only its hash is kept); another spec: AlreadyExists.
  *r.mutable_spec() = Spec(1, 1);
  auto first = coordinator_->CreateJob(r);
  auto again = coordinator_->CreateJob(r);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(first->worker_token().size(), 32u);
  EXPECT_EQ(again->worker_token(), "");
  EXPECT_EQ(again->job().create_time().seconds(), first->job().create_time().seconds());
  EXPECT_EQ(coordinator_->WorkerTokenHash("ok").value(), Sha256Hex(first->worker_token()));
  r.mutable_spec()->set_name("other");
  EXPECT_EQ(coordinator_->CreateJob(r).status().code(), absl::StatusCode::kAlreadyExists);
}

// Values a new user can type that the coordinator must refuse with the field
// named, in a message short enough to reach the client.
TEST_F(CoordinatorTest, CreateJobRefusesEmptyDataAndBadFreeText) {
  v1::CreateJobRequest r;
  r.set_job_id("ok");
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->mutable_data()->clear_dataset_path();
  absl::Status s = coordinator_->CreateJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.data.dataset_path is empty; give the path of the "
                                     "text corpus every worker can read"));
  *r.mutable_spec() = Spec(1, 1);
  r.mutable_spec()->set_name("x\x1b[2J\nPhase: COMPLETED");
  s = coordinator_->CreateJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.name='x\\x1b[2J\\nPhase: COMPLETED' contains "
                                     "control characters"));
  r.mutable_spec()->set_name(std::string(2000000, 'n'));
  s = coordinator_->CreateJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(2000000 bytes)' is too long; use 1..128 bytes"));
  EXPECT_LT(s.message().size(), 300u);
  // A 100,000-character job id is named, abbreviated.
  r.set_job_id(std::string(100000, 'j'));
  *r.mutable_spec() = Spec(1, 1);
  s = coordinator_->CreateJob(r).status();
  EXPECT_THAT(s.message(), HasSubstr("(100000 bytes)' is invalid; use 1..63 characters"));
  EXPECT_LT(s.message().size(), 300u);
  EXPECT_TRUE(coordinator_->ListJobs({})->jobs().empty());
}

TEST_F(CoordinatorTest, JoinWithAHugeWorkerIdNamesTheField) {
  Create(Spec(1, 1));
  const absl::Status s = Join(std::string(100000, 'w')).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("worker.worker_id='wwww"));
  EXPECT_THAT(s.message(), HasSubstr("... (100000 bytes)' is invalid; use 1..128 printable"));
  EXPECT_LT(s.message().size(), 300u);
}

TEST_F(CoordinatorTest, CancelReasonMustBeShortPrintableText) {
  Create(Spec(1, 1));
  v1::CancelJobRequest r;
  r.set_job_id("job");
  r.set_reason("a\x1b[2Jb\nPhase: fake");
  absl::Status s = coordinator_->CancelJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("reason='a\\x1b[2Jb\\nPhase: fake' contains control "
                                     "characters or malformed UTF-8; use at most 1024 bytes"));
  r.set_reason(std::string(100 * 1024, 'r'));
  s = coordinator_->CancelJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(102400 bytes)' is too long; use at most 1024 bytes"));
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_PENDING);  // nothing happened
  r.set_reason("maintenance \xc3\xa9t\xc3\xa9");
  ASSERT_TRUE(coordinator_->CancelJob(r).ok());
  EXPECT_EQ(Job().phase_reason(), "cancelled: maintenance \xc3\xa9t\xc3\xa9");
}

TEST_F(CoordinatorTest, FinishedJobsDoNotCountAgainstTheJobLimit) {
  coordinator_ = std::make_unique<Coordinator>(&clock_, store_.get(), CoordinatorOptions{2});
  Create(Spec(1, 1), "one");
  Create(Spec(1, 1), "two");
  v1::CreateJobRequest r;
  r.set_job_id("three");
  *r.mutable_spec() = Spec(1, 1);
  EXPECT_EQ(coordinator_->CreateJob(r).status().code(), absl::StatusCode::kResourceExhausted);
  v1::CancelJobRequest cancel;
  cancel.set_job_id("one");
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  EXPECT_TRUE(coordinator_->CreateJob(r).ok());
  EXPECT_TRUE(coordinator_->GetJob("one").ok());  // still queryable
}

TEST_F(CoordinatorTest, PlanAndOwnersExistOnceFormed) {
  Create(Spec(2, 2));
  EXPECT_EQ(coordinator_->GetPlan("job").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  auto plan = coordinator_->GetPlan("job");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->world_size(), 2u);
  EXPECT_EQ(plan->groups(0).name(), "tp/0");
  v1::GetShardOwnerRequest r;
  r.set_job_id("job");
  r.set_parameter("final_layernorm.bias");
  r.set_element_index(3);
  auto owners = coordinator_->GetShardOwner(r);
  ASSERT_TRUE(owners.ok()) << owners.status();
  EXPECT_EQ(owners->numel(), 8u);
  EXPECT_EQ(owners->holders_size(), 2 * 3);  // zero_stage 0: both dp ranks, 3 kinds
  r.set_parameter("nope");
  EXPECT_EQ(coordinator_->GetShardOwner(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, AssignmentWaitEndsWhenTheGenerationForms) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  absl::StatusOr<v1::Assignment> waited;
  std::thread waiter([&] {
    waited = coordinator_->GetAssignment(Fence("a", 1), true, absl::Now() + absl::Seconds(10));
  });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Join("b").ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->rank(), 0u);
  EXPECT_EQ(coordinator_->GetAssignment(Fence("a", 1), true, absl::Now()).value().rank(), 0u);
}

// The event log survives a restart: sequence numbers go on without a gap or
// a repeat, so a watcher resuming after its last sequence misses nothing.
TEST_F(CoordinatorTest, EventSequenceSurvivesARestart) {
  Create(Spec(1, 1));
  ASSERT_TRUE(Join("a").ok());
  auto before = coordinator_->WaitEvents("job", std::nullopt, absl::Now());
  ASSERT_TRUE(before.ok());
  const uint64_t last = before->back().sequence();
  Restart();
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job");
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  auto after = coordinator_->WaitEvents("job", last, absl::Now());
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ((*after)[0].sequence(), last + 1);
  EXPECT_EQ((*after)[0].phase_changed().new_phase(), v1::JOB_PHASE_CANCELLED);
  auto all = coordinator_->WaitEvents("job", 0, absl::Now());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), last + 1);  // the history before the restart is still there
}

TEST_F(CoordinatorTest, EventsReplayAndWait) {
  Create(Spec(1, 1));
  ASSERT_TRUE(Join("a").ok());
  auto events = coordinator_->WaitEvents("job", std::nullopt, absl::Now());
  ASSERT_TRUE(events.ok());
  // created → joined → RUNNING → generation formed
  ASSERT_GE(events->size(), 4u);
  EXPECT_TRUE((*events)[0].has_phase_changed());
  EXPECT_TRUE((*events)[1].has_worker_joined());
  EXPECT_TRUE(events->back().has_generation_formed());
  EXPECT_EQ(events->back().generation_formed().worker_ids(0), "a");
  const uint64_t last = events->back().sequence();
  auto none = coordinator_->WaitEvents("job", last, absl::Now() + absl::Milliseconds(20));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// Issue 6: a worker joining a RUNNING job waits as a spare; the job grows at
// the next committed checkpoint (Coordinator::NoteCheckpointCommitted).
class CoordinatorGrowTest : public CoordinatorTest {
 protected:
  // a and b form world 2 after the last call (max_workers is larger).
  void FormWorldOfTwo() {
    ASSERT_TRUE(Join("a").ok());
    ASSERT_TRUE(Join("b").ok());
    clock_.Advance(absl::Seconds(6));  // past last_call
    coordinator_->Tick();
    ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
    ASSERT_EQ(Job().world_size(), 2u);
  }

  // Joins `worker` into the RUNNING job (a spare) with an open session, as
  // a live worker process has; returns the session id.
  uint64_t JoinSpare(const std::string& worker, bool open_session = true) {
    auto joined = Join(worker);
    EXPECT_TRUE(joined.ok()) << joined.status();
    EXPECT_EQ(joined.ok() ? joined->state() : v1::MEMBER_STATE_UNSPECIFIED,
              v1::MEMBER_STATE_SPARE);
    if (!open_session) return 0;
    auto session = coordinator_->OpenSession(Id(worker));
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *session : 0;
  }

  static v1::CheckpointRef Ref(uint64_t step) {
    v1::CheckpointRef ref;
    ref.set_checkpoint_id(absl::StrCat("ckpt-step", step, "-gen1"));
    ref.set_step(step);
    return ref;
  }

  // Commits `step`'s checkpoint; returns the generations it ended.
  std::vector<GenerationEnded> Commit(uint64_t step) {
    std::vector<GenerationEnded> ended;
    EXPECT_TRUE(coordinator_->NoteCheckpointCommitted("job", Ref(step), 1000, &ended).ok());
    return ended;
  }

  // The newest event of the kind `has` selects.
  template <typename Has>
  std::optional<v1::JobEvent> LastEvent(Has has) {
    auto events = coordinator_->WaitEvents("job", std::nullopt, absl::Now());
    EXPECT_TRUE(events.ok()) << events.status();
    std::optional<v1::JobEvent> out;
    for (const v1::JobEvent& e : events.ok() ? *events : std::vector<v1::JobEvent>{}) {
      if (has(e)) out = e;
    }
    return out;
  }
};

TEST_F(CoordinatorGrowTest, GrowsAtTheNextCommittedCheckpointNotBefore) {
  Create(Spec(2, 4));  // 12 micro-batches per step: dp 2 (m 6) and dp 4 (m 3)
  FormWorldOfTwo();
  EXPECT_TRUE(Commit(5).empty());  // no spares: nothing to grow into
  JoinSpare("c");
  const uint64_t session_d = JoinSpare("d");
  EXPECT_EQ(Job().num_spares(), 2u);
  // Not before a checkpoint: time, heartbeats and ticks change nothing.
  for (int t = 1; t <= 8; ++t) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat("a", 1, 5 + t).ok());
    ASSERT_TRUE(Beat("b", 1, 5 + t).ok());
    ASSERT_TRUE(Beat("c", 1, 0, v1::WORKER_STATE_WAITING).ok());
    ASSERT_TRUE(Beat("d", 1, 0, v1::WORKER_STATE_WAITING).ok());
    EXPECT_TRUE(coordinator_->Tick().empty());
  }
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Job().world_size(), 2u);

  const std::vector<GenerationEnded> ended = Commit(10);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  EXPECT_EQ(ended[0].reason, "grow: 2 spares joined; world 2 -> 4 at checkpoint step 10");
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(Job().generation(), 2u);
  EXPECT_EQ(Job().last_checkpoint().step(), 10u);
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_FENCED);
  EXPECT_EQ(Members()["d"].state(), v1::MEMBER_STATE_FENCED);
  EXPECT_TRUE(coordinator_->Tick().empty());  // handed over once, through `ended`
  // The spare is told to re-join like the ranks.
  std::optional<v1::Directive> restart;
  while (!restart.has_value()) {
    auto msg = coordinator_->NextSessionMessage(Id("d"), session_d, absl::Now());
    ASSERT_TRUE(msg.ok()) << msg.status();
    ASSERT_TRUE(msg->has_value()) << "no restart directive for the spare";
    if ((*msg)->has_directive()) restart = (*msg)->directive();
  }
  EXPECT_EQ(restart->restart_at_generation().generation(), 2u);
  EXPECT_THAT(restart->restart_at_generation().reason(), HasSubstr("grow: "));

  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Join(w).ok());
  const v1::Job job = Job();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.world_size(), 4u);
  EXPECT_EQ(job.dp(), 4u);
  EXPECT_EQ(job.num_spares(), 0u);
  // Ranks keep their places; the newcomers take the new ranks in join order.
  // Everyone restores the committed checkpoint; the global batch is the same.
  for (const auto& [worker, rank] :
       std::vector<std::pair<std::string, uint32_t>>{{"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}}) {
    const v1::Assignment a = AssignmentOf(worker, 2);
    EXPECT_EQ(a.rank(), rank) << worker;
    EXPECT_EQ(a.restore().checkpoint_id(), "ckpt-step10-gen1") << worker;
    EXPECT_EQ(a.start_step(), 10u) << worker;
    EXPECT_EQ(a.data_cursor(), 10u * 12) << worker;
    EXPECT_EQ(a.gradient_accumulation_steps(), 3u) << worker;  // 12 / 4
  }
  const std::optional<v1::JobEvent> formed =
      LastEvent([](const v1::JobEvent& e) { return e.has_generation_formed(); });
  ASSERT_TRUE(formed.has_value());
  EXPECT_EQ(formed->generation_formed().generation(), 2u);
  EXPECT_EQ(formed->generation_formed().reason(), v1::FORMATION_REASON_GROW);
  EXPECT_EQ(formed->generation_formed().world_size(), 4u);
  EXPECT_EQ(formed->generation_formed().restore().step(), 10u);
  const std::optional<v1::JobEvent> recovering = LastEvent([](const v1::JobEvent& e) {
    return e.has_phase_changed() && e.phase_changed().new_phase() == v1::JOB_PHASE_RECOVERING;
  });
  ASSERT_TRUE(recovering.has_value());
  EXPECT_THAT(recovering->phase_changed().reason(), HasSubstr("world 2 -> 4"));
  EXPECT_EQ(recovering->generation(), 2u);
}

TEST_F(CoordinatorGrowTest, GrowsOnlyUpToMaxWorkers) {
  Create(Spec(2, 3));  // dp 3 divides 12
  FormWorldOfTwo();
  for (const char* w : {"c", "d", "e"}) JoinSpare(w);
  const std::vector<GenerationEnded> ended = Commit(10);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].reason, "grow: 3 spares joined; world 2 -> 3 at checkpoint step 10");
  for (const char* w : {"a", "b", "c", "d", "e"}) ASSERT_TRUE(Join(w).ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 3u);
  EXPECT_EQ(Job().num_spares(), 2u);
  EXPECT_EQ(Members()["e"].state(), v1::MEMBER_STATE_SPARE);
  // At max_workers: the spares stay spares.
  EXPECT_TRUE(Commit(15).empty());
  EXPECT_EQ(Job().generation(), 2u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
}

// A checkpoint of an ended generation that commits after the next one
// formed (its last shard report raced the generation's end) does not change
// what the new generation restores: every rank's assignment, asked before
// or after the commit, names the restore point it formed with (found by
// tests/elastic_training_test: two ranks restored steps 15 and 10).
TEST_F(CoordinatorGrowTest, AssignmentsKeepTheRestorePointTheirGenerationFormedWith) {
  Create(Spec(2, 3, /*pp=*/2));  // world 2 + spare c
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  EXPECT_TRUE(Commit(10).empty());
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sb.ok());
  ASSERT_EQ(coordinator_->CloseSession(Id("b"), *sb).size(), 1u);  // generation 1 ends
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("c").ok());
  ASSERT_EQ(Job().generation(), 2u);
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(AssignmentOf("a", 2).restore().step(), 10u);
  EXPECT_TRUE(Commit(15).empty());  // generation 1's, late
  EXPECT_EQ(Job().last_checkpoint().step(), 15u);  // the next generation's restore point
  for (const char* w : {"a", "c"}) {
    const v1::Assignment a = AssignmentOf(w, 2);
    EXPECT_EQ(a.restore().step(), 10u) << w;
    EXPECT_EQ(a.start_step(), 10u) << w;
  }
  const std::optional<v1::JobEvent> formed =
      LastEvent([](const v1::JobEvent& e) { return e.has_generation_formed(); });
  ASSERT_TRUE(formed.has_value());
  EXPECT_EQ(formed->generation_formed().restore().step(), 10u);
}

TEST_F(CoordinatorGrowTest, NoGrowWhenDpWouldNotChange) {
  Create(Spec(2, 4, /*pp=*/1, /*global_batch=*/8));  // dp in {1, 2, 4, 8}: not 3
  FormWorldOfTwo();
  JoinSpare("c");
  EXPECT_TRUE(Commit(10).empty());  // 3 workers: still dp 2
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Job().last_checkpoint().step(), 10u);
  JoinSpare("d");
  // Without `ended`, the next Tick() hands the ended generation over.
  ASSERT_TRUE(coordinator_->NoteCheckpointCommitted("job", Ref(15), 1000).ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  const std::vector<GenerationEnded> ended = coordinator_->Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].reason, "grow: 2 spares joined; world 2 -> 4 at checkpoint step 15");
  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Join(w).ok());
  EXPECT_EQ(Job().world_size(), 4u);
  EXPECT_EQ(AssignmentOf("c", 2).gradient_accumulation_steps(), 2u);  // 8 / 4
}

TEST_F(CoordinatorGrowTest, NoGrowAtTheLastStepFromAnOlderCheckpointOrForDeadSpares) {
  Create(Spec(2, 4));  // train_steps 100
  FormWorldOfTwo();
  EXPECT_TRUE(Commit(25).empty());
  // Spares whose session stream is not open are not counted as healthy.
  JoinSpare("c", /*open_session=*/false);
  JoinSpare("d", /*open_session=*/false);
  EXPECT_TRUE(Commit(30).empty());
  for (const char* w : {"c", "d"}) ASSERT_TRUE(coordinator_->OpenSession(Id(w)).ok());
  // A checkpoint older than the restore point (committed late) is not one.
  EXPECT_TRUE(Commit(20).empty());
  EXPECT_EQ(Job().last_checkpoint().step(), 30u);
  // The last step: the ranks are about to finish.
  EXPECT_TRUE(Commit(100).empty());
  EXPECT_EQ(Job().last_checkpoint().step(), 100u);
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_TRUE(coordinator_->Tick().empty());
}

// docs/ARCHITECTURE.md "Checkpoints": a checksum mismatch is DataLoss and
// restore falls back to the previous committed checkpoint. Each DataLoss that
// names the restore point marks it unusable (durably, in the
// CheckpointRegistry, the marks' owner) and moves one checkpoint further
// back, down to training from scratch; it never loops and does not count as
// the reporting worker's error streak.
TEST_F(CoordinatorTest, RestoreDataLossFallsBackToThePreviousCommittedCheckpoint) {
  Create(Spec(2, 2));
  for (const char* w : {"a", "b"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  auto ref = [](uint64_t step) {
    v1::CheckpointRef r;
    r.set_checkpoint_id(absl::StrCat("ckpt-step", step, "-gen1"));
    r.set_step(step);
    return r;
  };
  std::vector<v1::CheckpointRef> committed;
  for (uint64_t step : {5, 10, 15}) {
    ASSERT_TRUE(coordinator_->NoteCheckpointCommitted("job", ref(step), 100).ok());
    committed.push_back(ref(step));
  }
  auto report = [&](const std::string& worker, uint64_t generation, absl::StatusCode code,
                    const std::string& message) {
    v1::ReportErrorRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_code(static_cast<int>(code));
    r.set_message(message);
    r.set_operation("train");
    std::vector<GenerationEnded> ended;
    return coordinator_->ReportError(r, &ended, committed, registry_.get());
  };
  auto rejoin = [&](uint64_t generation) {
    for (const char* w : {"a", "b"}) ASSERT_TRUE(Join(w).ok()) << w;
    ASSERT_EQ(Job().generation(), generation);
    ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  };
  // Generation 1 ends for an ordinary reason; generation 2 restores step 15.
  ASSERT_TRUE(report("b", 1, absl::StatusCode::kDeadlineExceeded, "all_reduce timed out").ok());
  rejoin(2);
  EXPECT_EQ(AssignmentOf("a", 2).restore().checkpoint_id(), "ckpt-step15-gen1");

  // A DataLoss that does not name the restore point is an ordinary error.
  ASSERT_TRUE(report("a", 2, absl::StatusCode::kDataLoss, "restoring ckpt-step99-gen1: x").ok());
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), "ckpt-step15-gen1");
  EXPECT_TRUE(registry_->UnusableCheckpoints("job").empty());
  rejoin(3);

  // Step 15 is corrupt: generation 4 restores step 10.
  auto r = report("a", 3, absl::StatusCode::kDataLoss,
                  "restoring ckpt-step15-gen1: piece of tensor wte in rank-00000.bin: crc32c "
                  "0x1234 expected 0x5678");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->directive().restart_at_generation().generation(), 4u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_THAT(Job().phase_reason(),
              HasSubstr("restore point ckpt-step15-gen1 (step 15) is unusable"));
  EXPECT_THAT(Job().phase_reason(),
              HasSubstr("falling back to the previous committed checkpoint ckpt-step10-gen1"));
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), "ckpt-step10-gen1");
  EXPECT_THAT(registry_->UnusableCheckpoints("job")["ckpt-step15-gen1"],
              HasSubstr("crc32c 0x1234"));
  // b's report of the same failure is stale: nothing moves further back.
  EXPECT_EQ(report("b", 3, absl::StatusCode::kDataLoss, "restoring ckpt-step15-gen1: crc")
                .status()
                .code(),
            absl::StatusCode::kAborted);
  rejoin(4);
  v1::Assignment a = AssignmentOf("a", 4);
  EXPECT_EQ(a.restore().checkpoint_id(), "ckpt-step10-gen1");
  EXPECT_EQ(a.start_step(), 10u);
  EXPECT_EQ(a.data_cursor(), 10u * 12);

  // The event log says which checkpoint was given up and why.
  auto events = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast());
  ASSERT_TRUE(events.ok());
  bool seen = false;
  for (const v1::JobEvent& e : *events) {
    seen |= e.has_checkpoint_aborted() &&
            e.checkpoint_aborted().checkpoint_id() == "ckpt-step15-gen1" &&
            absl::StrContains(e.checkpoint_aborted().reason(), "not restorable");
  }
  EXPECT_TRUE(seen);

  // Step 10 is corrupt too: one further back, to step 5.
  ASSERT_TRUE(
      report("a", 4, absl::StatusCode::kDataLoss, "restoring ckpt-step10-gen1: short file").ok());
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), "ckpt-step5-gen1");
  rejoin(5);

  // The marks and the restore point survive a coordinator restart.
  Restart();
  EXPECT_EQ(registry_->UnusableCheckpoints("job").size(), 2u);
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), "ckpt-step5-gen1");

  // Step 5 is corrupt: nothing earlier is left, so training starts over.
  r = report("a", 5, absl::StatusCode::kDataLoss, "restoring ckpt-step5-gen1: crc32c mismatch");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Job().phase_reason(), HasSubstr("restarting from step 0"));
  EXPECT_FALSE(Job().has_last_checkpoint());
  rejoin(6);
  a = AssignmentOf("a", 6);
  EXPECT_FALSE(a.has_restore());
  EXPECT_EQ(a.start_step(), 0u);
  // An unusable checkpoint never becomes the restore point again, and the
  // four DataLoss reports from `a` did not exclude it.
  ASSERT_TRUE(
      coordinator_->NoteCheckpointCommitted("job", ref(15), 100, nullptr, registry_.get()).ok());
  EXPECT_FALSE(Job().has_last_checkpoint());
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_ACTIVE);
}

}  // namespace
}  // namespace shardline::server

namespace shardline::server {
namespace {

// Drains (shardctl drain): a rank leaves only after the next checkpoint
// commits, so nothing trained is lost; spares and jobs without checkpoints
// are drained at once; a drained process cannot come back in.
class CoordinatorDrainTest : public CoordinatorGrowTest {
 protected:
  // Every message queued on `session` of `worker` right now.
  std::vector<v1::SessionMessage> Drain(const std::string& worker, uint64_t session) {
    std::vector<v1::SessionMessage> out;
    for (;;) {
      auto msg = coordinator_->NextSessionMessage(Id(worker), session, absl::Now());
      if (!msg.ok() || !msg->has_value()) return out;
      out.push_back(**msg);
    }
  }
};

TEST_F(CoordinatorDrainTest, RankLeavesAfterTheNextCheckpointCommits) {
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_checkpoint()->set_directory("/ckpt");
  Create(spec);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  auto sa = coordinator_->OpenSession(Id("a"));
  auto sb = coordinator_->OpenSession(Id("b"));
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  JoinSpare("c");
  ASSERT_TRUE(Beat("a", 1, 7).ok());
  ASSERT_TRUE(Beat("b", 1, 7).ok());
  Drain("a", *sa);
  Drain("b", *sb);

  std::vector<GenerationEnded> ended;
  auto drained = coordinator_->DrainWorker("job", "b", "kernel upgrade", false, &ended);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(ended.empty());
  EXPECT_EQ(drained->state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_THAT(drained->detail(), HasSubstr("draining (kernel upgrade)"));
  EXPECT_EQ(Job().generation(), 1u);
  // Every rank is asked to save after the step following the job's step 7.
  for (auto [worker, session] : {std::pair<std::string, uint64_t>{"a", *sa}, {"b", *sb}}) {
    std::vector<v1::SessionMessage> msgs = Drain(worker, session);
    ASSERT_EQ(msgs.size(), 1u) << worker;
    EXPECT_EQ(msgs[0].directive().checkpoint().step(), 8u) << worker;
  }
  // An older checkpoint committing late does not count.
  EXPECT_TRUE(Commit(5).empty());
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_ACTIVE);
  // The requested one does: b is told to stop and leaves; the job re-forms
  // from it with the spare taking b's place.
  ended = Commit(8);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason, HasSubstr("(b) drained: kernel upgrade"));
  std::vector<v1::SessionMessage> to_b = Drain("b", *sb);
  ASSERT_FALSE(to_b.empty());
  EXPECT_THAT(to_b.back().directive().stop().reason(), HasSubstr("drained: kernel upgrade"));
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_LEFT);
  EXPECT_EQ(Job().generation(), 2u);
  EXPECT_EQ(Job().last_checkpoint().step(), 8u);
  // The drained process cannot re-join; a new one (new incarnation) can.
  absl::StatusOr<v1::JoinJobResponse> again = Join("b");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("drained"));
  EXPECT_TRUE(Join("b", /*incarnation=*/8).ok());
}

// The drain is durable: a coordinator restarted before the checkpoint
// commits still lets the member go at that commit.
TEST_F(CoordinatorDrainTest, PendingDrainSurvivesACoordinatorRestart) {
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_checkpoint()->set_directory("/ckpt");
  Create(spec);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  JoinSpare("c");
  ASSERT_TRUE(Beat("a", 1, 7).ok());
  ASSERT_TRUE(Beat("b", 1, 7).ok());
  std::vector<GenerationEnded> ended;
  ASSERT_TRUE(coordinator_->DrainWorker("job", "b", "disk swap", false, &ended).ok());

  Restart();  // kill -9 of the coordinator; a new one on the same store
  EXPECT_EQ(Members()["b"].drain_reason(), "disk swap");
  EXPECT_EQ(Members()["b"].drain_after_step(), 7u);
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_ACTIVE);
  ended = Commit(8);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason, HasSubstr("(b) drained: disk swap"));
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_LEFT);
  EXPECT_TRUE(Members()["b"].drain_reason().empty());
  // And that is durable too.
  Restart();
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_LEFT);
}

// A drain applies to the process it was asked of: when that process dies
// and a supervisor starts a new one in the slot, the new one stays.
TEST_F(CoordinatorDrainTest, ANewProcessOfADrainingSlotJoinsNormally) {
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_checkpoint()->set_directory("/ckpt");
  Create(spec);
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  JoinSpare("c");
  ASSERT_TRUE(Beat("a", 1, 7).ok());
  ASSERT_TRUE(Beat("b", 1, 7).ok());
  std::vector<GenerationEnded> ended;
  ASSERT_TRUE(coordinator_->DrainWorker("job", "b", "reboot", false, &ended).ok());
  ASSERT_TRUE(Join("b", /*incarnation=*/8).ok());  // b died; its replacement joins
  EXPECT_TRUE(Members()["b"].drain_reason().empty());
  Commit(8);  // the checkpoint that would have released the old process
  EXPECT_NE(Members()["b"].state(), v1::MEMBER_STATE_LEFT);
}

TEST_F(CoordinatorDrainTest, SpareOrJobWithoutCheckpointsIsDrainedAtOnce) {
  Create(Spec(2, 2));  // no checkpoint directory
  FormWorldOfTwo();
  const uint64_t sc = JoinSpare("c");
  std::vector<GenerationEnded> ended;
  auto spare = coordinator_->DrainWorker("job", "c", "", false, &ended);
  ASSERT_TRUE(spare.ok()) << spare.status();
  EXPECT_EQ(spare->state(), v1::MEMBER_STATE_LEFT);
  EXPECT_THAT(spare->detail(), HasSubstr("drained: operator request"));
  EXPECT_TRUE(ended.empty());
  EXPECT_EQ(Job().num_spares(), 0u);
  std::vector<v1::SessionMessage> to_c = Drain("c", sc);
  ASSERT_FALSE(to_c.empty());
  EXPECT_TRUE(to_c.back().directive().has_stop());
  // A rank of a job without checkpoints: the generation ends now. Only b
  // would stay, below min_workers=2: refused unless forced.
  auto refused = coordinator_->DrainWorker("job", "a", "bad disk", false, &ended);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("draining 'a' would leave 1 live worker, fewer than min_workers=2"));
  EXPECT_TRUE(ended.empty());
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_ACTIVE);
  auto rank = coordinator_->DrainWorker("job", "a", "bad disk", /*force=*/true, &ended);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(rank->state(), v1::MEMBER_STATE_LEFT);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(Job().generation(), 2u);
}

TEST_F(CoordinatorDrainTest, ErrorsNameTheWorkerAndState) {
  Create(Spec(2, 2));
  FormWorldOfTwo();
  std::vector<GenerationEnded> ended;
  auto unknown = coordinator_->DrainWorker("job", "zz", "", false, &ended);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no worker 'zz'"));
  EXPECT_EQ(coordinator_->DrainWorker("nope", "a", "", false, &ended).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(coordinator_->DrainWorker("job", "a", "", true, &ended).ok());
  auto twice = coordinator_->DrainWorker("job", "a", "", true, &ended);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("worker 'a' is LEFT; only live workers"));
  auto escape = coordinator_->DrainWorker("job", "b", "x\x1b]0;pwned\x07", true, &ended);
  EXPECT_EQ(escape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(escape.status().message(), HasSubstr("reason='x\\x1b]0;pwned\\x07' contains"));
  auto long_reason = coordinator_->DrainWorker("job", "b", std::string(1025, 'r'), true, &ended);
  EXPECT_EQ(long_reason.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Members()["b"].drain_reason().empty());
}

}  // namespace
}  // namespace shardline::server

namespace shardline::server {
namespace {

// Members whose heartbeats waited while the coordinator formed a (large)
// generation are not declared lost for the coordinator's own delay: the
// formation counts as a sign of life.
TEST_F(CoordinatorTest, FormingAGenerationCountsAsASignOfLife) {
  Create(Spec(2, 3));  // heartbeat_timeout 10 s, last_call 5 s
  ASSERT_TRUE(Join("a").ok());
  ASSERT_TRUE(Join("b").ok());
  clock_.Advance(absl::Seconds(9));  // no heartbeats meanwhile
  coordinator_->Tick();              // last call over: forms now
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  clock_.Advance(absl::Seconds(9));  // 18 s after joining, 9 s after forming
  EXPECT_TRUE(coordinator_->Tick().empty());
  EXPECT_EQ(Members()["a"].state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(Members()["b"].state(), v1::MEMBER_STATE_ACTIVE);
  clock_.Advance(absl::Seconds(2));  // now past the timeout since forming
  EXPECT_FALSE(coordinator_->Tick().empty());
}

}  // namespace
}  // namespace shardline::server

namespace shardline::server {
namespace {

// A worker that gets its communicators ready every time but fails before
// its first step (e.g. it cannot open the data) is still excluded after
// kMaxConsecutiveErrorGenerations: READY heartbeats racing its error
// reports do not reset the count.
TEST_F(CoordinatorTest, ReadyAloneDoesNotResetTheErrorStreak) {
  Create(Spec(2, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  const uint64_t n = Coordinator::kMaxConsecutiveErrorGenerations;
  for (uint64_t g = 1; g <= n; ++g) {
    ASSERT_TRUE(Beat("c", g, 0, v1::WORKER_STATE_READY).ok());
    auto r = ReportBindError(*coordinator_, Fence("c", g));
    ASSERT_TRUE(r.ok()) << r.status();
    if (g < n) {
      EXPECT_TRUE(r->directive().has_restart_at_generation()) << g;
      for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok()) << w;
    } else {
      EXPECT_TRUE(r->directive().has_stop());
    }
  }
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_REPEATED_ERRORS);
}

// Watchers are woken by the job's event log, not by time: with the fake
// clock standing still an event still reaches the waker, once per event,
// and only for its job.
TEST_F(CoordinatorTest, EventWakersRunOnEveryEventWithoutTimePassing) {
  Create(Spec(1, 1));
  Create(Spec(1, 1), "other");
  int woken = 0;
  int other_woken = 0;
  absl::StatusOr<uint64_t> id = coordinator_->AddEventWaker("job", [&] { ++woken; });
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(coordinator_->AddEventWaker("other", [&] { ++other_woken; }).ok());
  EXPECT_EQ(coordinator_->AddEventWaker("nope", [] {}).status().code(),
            absl::StatusCode::kNotFound);
  const size_t before = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast())->size();
  ASSERT_TRUE(Join("w0").ok());  // WorkerJoined
  const size_t after = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast())->size();
  EXPECT_GT(after, before);
  EXPECT_EQ(woken, static_cast<int>(after - before));
  EXPECT_EQ(other_woken, 0);
  coordinator_->RemoveEventWaker("job", *id);
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job");
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  EXPECT_EQ(woken, static_cast<int>(after - before));  // removed: not called again
}

// Issue 14: ListJobs disagreed with job.proto (page_size 0 gave 100, over
// 1000 was an error, ascending ids instead of newest first, a bogus
// page_token was accepted).
TEST(CoordinatorListJobsTest, MatchesTheProtoComments) {
  FakeClock clock;
  std::unique_ptr<StateStore> store = NewMemoryStore();
  Coordinator coordinator(&clock, store.get());
  // Created in an order unrelated to their ids; the last two at one time.
  std::vector<std::string> created;
  for (int i = 0; i < 60; ++i) {
    v1::CreateJobRequest r;
    r.set_job_id(absl::StrCat("j", (i * 37) % 60 + 10));
    *r.mutable_spec() = fixtures::SmallSpec(1, 1, 4);
    ASSERT_TRUE(coordinator.CreateJob(r).ok()) << r.job_id();
    created.push_back(r.job_id());
    if (i < 58) clock.Advance(absl::Seconds(1));
  }
  // Newest create_time first; the two created at the same time by job_id,
  // descending.
  std::vector<std::string> newest(created.rbegin(), created.rend());
  if (newest[0] < newest[1]) std::swap(newest[0], newest[1]);

  v1::ListJobsRequest req;
  absl::StatusOr<v1::ListJobsResponse> page = coordinator.ListJobs(req);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs_size(), 50);  // 0 means 50
  for (int i = 0; i < page->jobs_size(); ++i) EXPECT_EQ(page->jobs(i).job_id(), newest[i]) << i;
  ASSERT_FALSE(page->next_page_token().empty());
  req.set_page_token(page->next_page_token());
  page = coordinator.ListJobs(req);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs_size(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(page->jobs(i).job_id(), newest[50 + i]) << i;
  EXPECT_TRUE(page->next_page_token().empty());

  // Above 1000 is treated as 1000, not an error.
  req.Clear();
  req.set_page_size(5000);
  page = coordinator.ListJobs(req);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs_size(), 60);

  // Pages of 7 walk every job once, in order.
  req.Clear();
  req.set_page_size(7);
  std::vector<std::string> walked;
  for (int pages = 0; pages < 20; ++pages) {
    page = coordinator.ListJobs(req);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& j : page->jobs()) walked.push_back(j.job_id());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(walked, newest);

  // A malformed token, or one from a call with other phases, is refused.
  for (const std::string token : {"j10", "garbage", "12/x/j10", "1//", "1//Bad_Id"}) {
    req.Clear();
    req.set_page_token(token);
    absl::Status s = coordinator.ListJobs(req).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_THAT(s.message(), HasSubstr("page_token")) << token;
  }
  req.Clear();
  req.set_page_size(1);
  page = coordinator.ListJobs(req);
  ASSERT_TRUE(page.ok());
  req.set_page_token(page->next_page_token());
  req.add_phases(v1::JOB_PHASE_PENDING);
  absl::Status s = coordinator.ListJobs(req).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("other phases"));
}

}  // namespace
}  // namespace shardline::server

namespace shardline::server {
namespace {

TEST_F(CoordinatorTest, CompactGroupsOnlyForWorkersThatAskForThem) {
  Create(Spec(2, 3));
  v1::JoinJobRequest r;
  *r.mutable_worker() = Id("a");
  r.set_device("cpu");
  r.set_compact_groups(true);
  ASSERT_TRUE(coordinator_->JoinJob(r).ok());
  ASSERT_TRUE(Join("b").ok());
  ASSERT_TRUE(Join("c").ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  // dp 3: the dp group holds ranks 0, 1, 2; tp and pp groups one rank each.
  const v1::Assignment compact = AssignmentOf("a", 1);  // rank 0
  const v1::Assignment full = AssignmentOf("c", 1);     // rank 2
  std::vector<std::string> names;
  for (const v1::ProcessGroup& g : compact.groups()) {
    names.push_back(g.name());
    EXPECT_EQ(g.ranks_size(), 0) << g.name();
    if (g.name() == "dp/0") {
      EXPECT_EQ(g.first_rank(), 0u);
      EXPECT_EQ(g.rank_stride(), 1u);
      EXPECT_EQ(g.size(), 3u);
    } else {
      EXPECT_EQ(g.first_rank(), 0u) << g.name();
      EXPECT_EQ(g.size(), 1u) << g.name();
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tp/0", "dp/0", "pp/0"}));
  for (const v1::ProcessGroup& g : full.groups()) {
    EXPECT_EQ(g.size(), 0u) << g.name();
    if (g.name() == "dp/0") {
      EXPECT_THAT(g.ranks(), ::testing::ElementsAre(0u, 1u, 2u));
    } else {
      EXPECT_THAT(g.ranks(), ::testing::ElementsAre(2u)) << g.name();
    }
  }
}

TEST_F(CoordinatorTest, AssignmentWakerIsCalledByFormationNotByOtherJoins) {
  Create(Spec(3, 3));
  ASSERT_TRUE(Join("a").ok());
  int woken = 0;
  uint64_t id = 0;
  auto first = coordinator_->PollAssignment(Fence("a", 1), [&woken] { ++woken; }, &id);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_value());
  EXPECT_NE(id, 0u);
  ASSERT_TRUE(Join("b").ok());
  EXPECT_EQ(woken, 0);  // another worker's join settles nothing for "a"
  ASSERT_TRUE(Join("c").ok());  // forms generation 1
  EXPECT_GE(woken, 1);
  auto settled = coordinator_->PollAssignment(Fence("a", 1), [] {}, &id);
  ASSERT_TRUE(settled.ok()) << settled.status();
  ASSERT_TRUE(settled->has_value());
  EXPECT_EQ((*settled)->rank(), 0u);
  EXPECT_EQ(id, 0u);  // removed with the answer
}

}  // namespace
}  // namespace shardline::server

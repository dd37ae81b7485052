// The coordinator's hang and straggler detection on a fake clock: progress
// reports in heartbeats, a stall found at exactly progress_timeout, the
// culprit named and evicted (or only reported), the ReportError path naming
// the rank that held the others up, and stragglers flagged and cleared.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/coordinator_test_fixture.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;
using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::CollectiveProgress DpOp(uint64_t seq, bool in_flight, absl::Duration elapsed) {
  v1::CollectiveProgress c;
  c.set_group("dp/0");
  c.set_operation("all_reduce");
  c.set_sequence(seq);
  c.set_count(4096);
  c.set_dtype("float32");
  c.set_in_flight(in_flight);
  *c.mutable_elapsed() = TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(elapsed));
  return c;
}

google::protobuf::Duration D(absl::Duration d) {
  return TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(d));
}

// Waiting in all_reduce #seq of dp/0 for `elapsed`, at `step`.
v1::RankProgress Waiting(uint64_t step, uint64_t seq, absl::Duration elapsed) {
  v1::RankProgress p;
  p.set_activity(v1::ACTIVITY_COLLECTIVE);
  p.set_step(step);
  *p.add_collectives() = DpOp(seq, true, elapsed);
  return p;
}

// In compute at `step`, the last all_reduce #seq done.
v1::RankProgress Computing(uint64_t step, uint64_t seq, absl::Duration step_time = {},
                           absl::Duration compute_time = {}) {
  v1::RankProgress p;
  p.set_activity(v1::ACTIVITY_COMPUTE);
  p.set_step(step);
  *p.add_collectives() = DpOp(seq, false, absl::Milliseconds(3));
  *p.mutable_step_time() = D(step_time);
  *p.mutable_compute_time() = D(compute_time);
  return p;
}

class HangDetectionTest : public CoordinatorFixture {
 protected:
  // Four ranks a, b, c, d (dp 4, one dp group "dp/0"; 3 of them form a
  // generation too); heartbeats every 1 s, heartbeat timeout 10 s, 1000
  // steps.
  void Form(std::optional<absl::Duration> progress_timeout,
            v1::HangPolicy policy = v1::HANG_POLICY_UNSPECIFIED, int max_workers = 4,
            v1::StragglerPolicy straggler_policy = v1::STRAGGLER_POLICY_UNSPECIFIED,
            int min_workers = 3) {
    v1::JobSpec spec = Spec(min_workers, max_workers);
    spec.mutable_training()->set_train_steps(1000);
    if (progress_timeout.has_value()) {
      *spec.mutable_elastic()->mutable_progress_timeout() = D(*progress_timeout);
    }
    spec.mutable_elastic()->set_hang_policy(policy);
    spec.mutable_elastic()->set_straggler_policy(straggler_policy);
    spec.mutable_checkpoint()->set_directory("/tmp/hang-detection-test");
    Create(spec);
    for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Join(w).ok()) << w;
    if (Job().phase() == v1::JOB_PHASE_PENDING) {  // below max_workers: the last call
      clock_.Advance(absl::Seconds(6));
      coordinator_->Tick();
    }
    ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
    ASSERT_EQ(Job().world_size(), 4u);
  }

  absl::StatusOr<v1::HeartbeatResponse> BeatP(const std::string& worker, uint64_t generation,
                                              const v1::RankProgress& p) {
    v1::HeartbeatRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_step(p.step());
    r.set_state(v1::WORKER_STATE_TRAINING);
    *r.mutable_progress() = p;
    return coordinator_->Heartbeat(r);
  }

  // a, b and d wait in all_reduce #47 (since `since`), c computes at step
  // 14 after #46; every one beats now.
  void BeatStalled(absl::Time since) {
    const absl::Duration waited = clock_.Now() - since;
    for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(BeatP(w, 1, Waiting(14, 47, waited)).ok());
    ASSERT_TRUE(BeatP("c", 1, Computing(14, 46)).ok());
  }

  // `worker` (generation 1) reports its all_reduce timed out.
  absl::StatusOr<v1::ReportErrorResponse> ReportTimeout(const std::string& worker,
                                                        std::vector<GenerationEnded>* ended) {
    v1::ReportErrorRequest r;
    *r.mutable_fence() = Fence(worker, 1);
    r.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    r.set_operation("all_reduce");
    r.set_message("timed out after 5 s");
    return coordinator_->ReportError(r, ended);
  }

  // a, b and d wait in all_reduce #47 from now, c computes after #46;
  // every one beats and the coordinator ticks each second for 5 s.
  void StallFiveSeconds() {
    const absl::Time start = clock_.Now();
    BeatStalled(start);
    for (int s = 1; s <= 5; ++s) {
      clock_.Advance(absl::Seconds(1));
      BeatStalled(start);
      coordinator_->Tick();
    }
  }

  std::vector<v1::JobEvent> Events() {
    auto events = coordinator_->WaitEvents("job", std::nullopt, absl::InfinitePast());
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *events : std::vector<v1::JobEvent>{};
  }
  std::vector<v1::HangReport> Hangs() {
    std::vector<v1::HangReport> out;
    for (const v1::JobEvent& e : Events()) {
      if (e.has_hang_detected()) out.push_back(e.hang_detected());
    }
    return out;
  }
  std::vector<v1::StragglerChanged> StragglerEvents() {
    std::vector<v1::StragglerChanged> out;
    for (const v1::JobEvent& e : Events()) {
      if (e.has_straggler_changed()) out.push_back(e.straggler_changed());
    }
    return out;
  }
};

TEST_F(HangDetectionTest, StallFoundAtExactlyTheTimeoutAndTheCulpritEvicted) {
  Form(absl::Seconds(5));
  const absl::Time start = clock_.Now();
  BeatStalled(start);  // the first reports: progress
  for (int s = 1; s <= 4; ++s) {
    clock_.Advance(absl::Seconds(1));
    BeatStalled(start);
    coordinator_->Tick();
  }
  clock_.Advance(absl::Milliseconds(999));
  coordinator_->Tick();
  EXPECT_TRUE(Hangs().empty()) << "found before the timeout";
  clock_.Advance(absl::Milliseconds(1));
  std::vector<GenerationEnded> ended = coordinator_->Tick();

  const std::vector<v1::HangReport> hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  const v1::HangReport& h = hangs[0];
  EXPECT_EQ(h.generation(), 1u);
  EXPECT_EQ(h.group(), "dp/0");
  EXPECT_EQ(h.operation(), "all_reduce");
  EXPECT_EQ(h.sequence(), 47u);
  EXPECT_EQ(h.num_waiting(), 3u);
  EXPECT_EQ(h.num_culprits(), 1u);
  ASSERT_EQ(h.culprits_size(), 1);
  EXPECT_EQ(h.culprits(0).rank(), 2u);
  EXPECT_EQ(h.culprits(0).worker_id(), "c");
  EXPECT_EQ(h.culprits(0).host(), "host-c");
  EXPECT_EQ(h.culprits(0).activity(), v1::ACTIVITY_COMPUTE);
  EXPECT_EQ(h.culprits(0).step(), 14u);
  EXPECT_EQ(h.culprits(0).last_collective().sequence(), 46u);
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(h.stalled_for()), 5000);
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(h.progress_timeout()), 5000);
  EXPECT_EQ(h.action(), v1::HANG_POLICY_EVICT);
  EXPECT_EQ(h.summary(),
            "no progress for 5.0 s (progress_timeout 5.0 s): 3 ranks wait in all_reduce #47 of "
            "dp/0 for 5.0 s, held up by rank 2 (c on host-c): in compute at step 14, last "
            "heartbeat 1.0 s ago");
  EXPECT_EQ(Job().last_hang().summary(), h.summary());
  EXPECT_EQ(*coordinator_->HangsDetected(Job().job_id()), 1u);
  EXPECT_EQ(coordinator_->HangsDetected("no-such-job").status().code(),
            absl::StatusCode::kNotFound);

  // Evicted: LOST (HUNG) with the summary, the generation ended.
  const v1::Member c = Members()["c"];
  EXPECT_EQ(c.state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(c.loss_reason(), v1::LOSS_REASON_HUNG);
  EXPECT_EQ(c.detail(), h.summary());
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation, 1u);
  EXPECT_EQ(Job().generation(), 2u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_THAT(Job().phase_reason(), HasSubstr("rank 2 (c) lost: no progress for 5.0 s"));

  // Excluded: its heartbeats STOP, its re-join is refused; a new process may join.
  auto beat = Beat("c", 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_TRUE(beat->directive().has_stop());
  EXPECT_THAT(beat->directive().stop().reason(), HasSubstr("excluded"));
  EXPECT_THAT(beat->directive().stop().reason(), HasSubstr("held up by rank 2"));
  auto again = Join("c");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("excluded"));

  // The others re-form without it, for the hang.
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(Join(w).ok()) << w;
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 3u);
  bool formed_for_hang = false;
  for (const v1::JobEvent& e : Events()) {
    formed_for_hang |= e.has_generation_formed() && e.generation_formed().generation() == 2 &&
                       e.generation_formed().reason() == v1::FORMATION_REASON_HANG;
  }
  EXPECT_TRUE(formed_for_hang);
  auto fresh = Join("c", /*incarnation=*/8);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->state(), v1::MEMBER_STATE_SPARE);

  // Not durable: a restarted coordinator has no last_hang.
  Restart();
  EXPECT_FALSE(Job().has_last_hang());
  EXPECT_EQ(*coordinator_->HangsDetected(Job().job_id()), 0u);
}

// A restarted coordinator (or a replica that takes over) judges the
// generation it recovered: the stall clock starts at the recovery, not at
// the epoch, and the rank table is rebuilt so the culprit is found.
TEST_F(HangDetectionTest, RecoveredCoordinatorJudgesFromTheRecovery) {
  Form(absl::Seconds(5));
  clock_.Advance(absl::Hours(1));
  Restart();
  coordinator_->RestartHeartbeatClocks();
  const absl::Time start = clock_.Now();
  BeatStalled(start);
  coordinator_->Tick();
  EXPECT_TRUE(Hangs().empty()) << "judged a stall from before the recovery";
  for (int s = 1; s <= 5; ++s) {
    clock_.Advance(absl::Seconds(1));
    BeatStalled(start);
    coordinator_->Tick();
  }
  const std::vector<v1::HangReport> hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  ASSERT_EQ(hangs[0].culprits_size(), 1);
  EXPECT_EQ(hangs[0].culprits(0).worker_id(), "c");
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(hangs[0].stalled_for()), 5000);
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_HUNG);
}

// Evicting the culprit leaves fewer than min_workers: the job fails at
// once, naming the hang.
TEST_F(HangDetectionTest, EvictionBelowMinWorkersWaitsForAReplacement) {
  Form(absl::Seconds(5), v1::HANG_POLICY_EVICT, 4, v1::STRAGGLER_POLICY_UNSPECIFIED,
       /*min_workers=*/4);
  StallFiveSeconds();
  // Evicted; the other three are too few, so the job waits (join_timeout,
  // as after any loss) rather than failing at once.
  EXPECT_EQ(Members()["c"].loss_reason(), v1::LOSS_REASON_HUNG);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_THAT(Job().phase_reason(), HasSubstr("no progress for 5.0 s"));
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(Join(w).ok()) << w;
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  // The evicted incarnation may not come back; a new process may.
  EXPECT_EQ(Join("c").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Join("c", /*incarnation=*/8).ok());
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 4u);
  EXPECT_EQ(Job().generation(), 2u);
}

// Nobody replaces the evicted rank: the job fails after join_timeout.
TEST_F(HangDetectionTest, EvictionBelowMinWorkersFailsAfterJoinTimeout) {
  Form(absl::Seconds(5), v1::HANG_POLICY_EVICT, 4, v1::STRAGGLER_POLICY_UNSPECIFIED,
       /*min_workers=*/4);
  StallFiveSeconds();
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  const absl::Duration join_timeout =
      absl::Seconds(Job().spec().elastic().join_timeout().seconds());
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(Join(w).ok()) << w;
  clock_.Advance(join_timeout - absl::Seconds(1));
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  clock_.Advance(absl::Seconds(2));
  coordinator_->Tick();
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_FAILED);
  EXPECT_THAT(Job().phase_reason(), HasSubstr("join_timeout"));
}

TEST_F(HangDetectionTest, ReportPolicyReportsOncePerStall) {
  Form(absl::Seconds(5), v1::HANG_POLICY_REPORT);
  absl::Time start = clock_.Now();
  BeatStalled(start);
  for (int s = 1; s <= 12; ++s) {
    clock_.Advance(absl::Seconds(1));
    BeatStalled(start);
    coordinator_->Tick();
  }
  std::vector<v1::HangReport> hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0].action(), v1::HANG_POLICY_REPORT);
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(Job().generation(), 1u);
  // Progress resumes (c reaches #47, every one completes it), then a new stall.
  clock_.Advance(absl::Seconds(1));
  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(BeatP(w, 1, Computing(15, 47)).ok());
  coordinator_->Tick();
  start = clock_.Now();
  for (int s = 1; s <= 5; ++s) {
    clock_.Advance(absl::Seconds(1));
    for (const char* w : {"a", "b", "d"}) {
      ASSERT_TRUE(BeatP(w, 1, Waiting(15, 48, clock_.Now() - start)).ok());
    }
    ASSERT_TRUE(BeatP("c", 1, Computing(15, 47)).ok());
    coordinator_->Tick();
  }
  hangs = Hangs();
  ASSERT_EQ(hangs.size(), 2u);
  EXPECT_EQ(hangs[1].sequence(), 48u);
  EXPECT_EQ(Job().last_hang().sequence(), 48u);
}

TEST_F(HangDetectionTest, ZeroTimeoutTurnsItOff) {
  Form(absl::ZeroDuration());
  const absl::Time start = clock_.Now();
  for (int s = 0; s <= 120; ++s) {
    BeatStalled(start);
    coordinator_->Tick();
    clock_.Advance(absl::Seconds(1));
  }
  EXPECT_TRUE(Hangs().empty());
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_ACTIVE);
}

TEST_F(HangDetectionTest, NoReportWhenNobodyWaits) {
  Form(absl::Seconds(5));
  for (int s = 0; s <= 30; ++s) {
    for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(BeatP(w, 1, Computing(14, 46)).ok());
    coordinator_->Tick();
    clock_.Advance(absl::Seconds(1));
  }
  EXPECT_TRUE(Hangs().empty());
}

TEST_F(HangDetectionTest, AutomaticTimeoutFollowsTheStepTime) {
  Form(std::nullopt);  // unset: max(30 s, 10 x median step_time)
  // One step of 6 s done by every rank (median step time 6 s: timeout 60 s).
  for (const char* w : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(
        BeatP(w, 1, Computing(14, 46, absl::Seconds(6), absl::Seconds(5))).ok());
  }
  const absl::Time start = clock_.Now();
  auto beat = [&] {
    for (const char* w : {"a", "b", "d"}) {
      v1::RankProgress p = Waiting(14, 47, clock_.Now() - start);
      *p.mutable_step_time() = D(absl::Seconds(6));
      ASSERT_TRUE(BeatP(w, 1, p).ok());
    }
    ASSERT_TRUE(BeatP("c", 1, Computing(14, 46, absl::Seconds(6), absl::Seconds(5))).ok());
  };
  for (int s = 1; s <= 59; ++s) {
    clock_.Advance(absl::Seconds(1));
    beat();
    coordinator_->Tick();
  }
  EXPECT_TRUE(Hangs().empty()) << "found before 10 x the step time";
  clock_.Advance(absl::Seconds(1));
  beat();
  coordinator_->Tick();
  const std::vector<v1::HangReport> hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(TimeUtil::DurationToSeconds(hangs[0].progress_timeout()), 60);
  EXPECT_EQ(hangs[0].culprits(0).worker_id(), "c");
}

TEST_F(HangDetectionTest, AutomaticTimeoutIsAtLeastThirtySeconds) {
  Form(std::nullopt);
  const absl::Time start = clock_.Now();
  BeatStalled(start);
  for (int s = 1; s <= 29; ++s) {
    clock_.Advance(absl::Seconds(1));
    BeatStalled(start);
    coordinator_->Tick();
  }
  EXPECT_TRUE(Hangs().empty());
  clock_.Advance(absl::Seconds(1));
  BeatStalled(start);
  coordinator_->Tick();
  ASSERT_EQ(Hangs().size(), 1u);
  EXPECT_EQ(TimeUtil::DurationToSeconds(Hangs()[0].progress_timeout()), 30);
}

// One rank stopped (SIGSTOP: its heartbeats stop too) in compute; a
// survivor's collective times out and it reports the error before the
// heartbeat timeout: the reason, the event and the culprit's detail name it.
TEST_F(HangDetectionTest, TheErrorReportNamesTheRankThatHeldTheOthersUp) {
  Form(absl::ZeroDuration());  // no stall detection: only the report's path
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(BeatP(w, 1, Waiting(15, 47, {})).ok());
  ASSERT_TRUE(BeatP("c", 1, Computing(15, 46)).ok());
  const absl::Time start = clock_.Now();
  clock_.Advance(absl::Milliseconds(6100));  // c says nothing from here on
  for (const char* w : {"a", "b", "d"}) {
    ASSERT_TRUE(BeatP(w, 1, Waiting(15, 47, clock_.Now() - start)).ok());
  }
  std::vector<GenerationEnded> ended;
  auto response = ReportTimeout("a", &ended);
  ASSERT_TRUE(response.ok()) << response.status();
  const std::string held =
      "held up by rank 2 (c on host-c): in compute at step 15, last heartbeat 6.1 s ago";
  ASSERT_TRUE(response->directive().has_restart_at_generation());
  EXPECT_THAT(response->directive().restart_at_generation().reason(), HasSubstr(held));
  EXPECT_THAT(response->directive().restart_at_generation().reason(),
              StartsWith("rank 0 (a) reported DEADLINE_EXCEEDED in all_reduce: timed out"));
  EXPECT_THAT(Job().phase_reason(), HasSubstr(held));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason, HasSubstr(held));
  const std::vector<v1::HangReport> hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0].action(), v1::HANG_POLICY_EVICT);
  EXPECT_EQ(hangs[0].culprits(0).rank(), 2u);
  EXPECT_EQ(hangs[0].num_waiting(), 3u);
  // Frozen whole (no heartbeat for 6.1 s): lost, so that the others re-form
  // without waiting for it; it may re-join once it runs again.
  const v1::Member c = Members()["c"];
  EXPECT_EQ(c.state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(c.loss_reason(), v1::LOSS_REASON_ERROR_REPORTED);
  EXPECT_THAT(c.detail(), StartsWith("held up the job and sends no heartbeats: rank 0 (a) reported"));
  EXPECT_THAT(c.detail(), HasSubstr(held));
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(Join(w).ok()) << w;
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 3u);
  ASSERT_TRUE(Join("c").ok());
  EXPECT_EQ(Members()["c"].state(), v1::MEMBER_STATE_SPARE);
}

// The culprit of an error report still heartbeats (its training thread is
// stuck, its process is not: a collective_timeout shorter than
// progress_timeout ended the wait first). With hang_policy EVICT (the
// default) it is evicted as a stall would be — else it would re-join and
// hold up every later generation; with REPORT it is only named (FENCED).
class ErrorReportCulpritTest : public HangDetectionTest {
 protected:
  // a, b, d have waited 6 s in all_reduce #47; c beats now, in compute
  // after #46; a reports its timeout.
  void ReportWithALiveCulprit() {
    const absl::Time start = clock_.Now();
    clock_.Advance(absl::Seconds(6));
    for (const char* w : {"a", "b", "d"}) {
      ASSERT_TRUE(BeatP(w, 1, Waiting(15, 47, clock_.Now() - start)).ok());
    }
    ASSERT_TRUE(BeatP("c", 1, Computing(15, 46)).ok());
    std::vector<GenerationEnded> ended;
    auto response = ReportTimeout("a", &ended);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_THAT(Job().phase_reason(),
                HasSubstr("held up by rank 2 (c on host-c): in compute at step 15, last heartbeat "
                          "0.0 s ago"));
  }
};

TEST_F(ErrorReportCulpritTest, ALiveCulpritIsEvictedByDefault) {
  Form(absl::ZeroDuration());
  ASSERT_NO_FATAL_FAILURE(ReportWithALiveCulprit());
  const v1::Member c = Members()["c"];
  EXPECT_EQ(c.state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(c.loss_reason(), v1::LOSS_REASON_HUNG);
  EXPECT_THAT(c.detail(), StartsWith("held up the job (its heartbeats go on, its training does "
                                     "not): rank 0 (a) reported DEADLINE_EXCEEDED"));
  ASSERT_EQ(Hangs().size(), 1u);
  EXPECT_EQ(Hangs()[0].action(), v1::HANG_POLICY_EVICT);
  // Excluded like a stalled rank: its heartbeats get STOP; the others re-form.
  auto beat = Beat("c", 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->directive().has_stop());
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(Join(w).ok()) << w;
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), 3u);
}

TEST_F(ErrorReportCulpritTest, ALiveCulpritIsOnlyNamedWithReportPolicy) {
  Form(absl::ZeroDuration(), v1::HANG_POLICY_REPORT);
  ASSERT_NO_FATAL_FAILURE(ReportWithALiveCulprit());
  const v1::Member c = Members()["c"];
  EXPECT_EQ(c.state(), v1::MEMBER_STATE_FENCED);
  EXPECT_THAT(c.detail(), StartsWith("held up the job: 3 ranks wait in all_reduce #47 of dp/0"));
  ASSERT_EQ(Hangs().size(), 1u);
  EXPECT_EQ(Hangs()[0].action(), v1::HANG_POLICY_REPORT);
}

// A member lost by its heartbeat timeout says what it was doing.
TEST_F(HangDetectionTest, HeartbeatTimeoutDetailSaysWhatItWasDoing) {
  Form(absl::ZeroDuration());
  for (const char* w : {"a", "b", "d"}) ASSERT_TRUE(BeatP(w, 1, Waiting(15, 47, {})).ok());
  ASSERT_TRUE(BeatP("c", 1, Computing(15, 46)).ok());
  for (int s = 1; s <= 11; ++s) {
    clock_.Advance(absl::Seconds(1));
    for (const char* w : {"a", "b", "d"}) {
      ASSERT_TRUE(BeatP(w, 1, Waiting(15, 47, absl::Seconds(s))).ok());
    }
    coordinator_->Tick();
  }
  const v1::Member c = Members()["c"];
  EXPECT_EQ(c.loss_reason(), v1::LOSS_REASON_HEARTBEAT_TIMEOUT);
  EXPECT_THAT(c.detail(), HasSubstr("; its last report: in compute at step 15"));
}

TEST_F(HangDetectionTest, HeartbeatProgressIsValidated) {
  Form(absl::Seconds(5));
  v1::RankProgress p = Computing(3, 1);
  p.set_activity(v1::ACTIVITY_UNSPECIFIED);
  auto r = BeatP("a", 1, p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("progress.activity is UNSPECIFIED"));
  p = Waiting(3, 2, absl::Seconds(1));
  v1::CollectiveProgress* send = p.add_collectives();
  send->set_group("pp/0");
  send->set_operation("send");
  send->set_sequence(1);
  send->set_in_flight(true);
  send->set_peer_rank(4);
  r = BeatP("a", 1, p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("progress.collectives[1].peer_rank=4 is not a rank; world_size is 4"));
  // Refused reports change nothing: no progress kept.
  EXPECT_FALSE(Members()["a"].has_progress());
  send->set_peer_rank(3);
  ASSERT_TRUE(BeatP("a", 1, p).ok());
  const v1::Member a = Members()["a"];
  ASSERT_TRUE(a.has_progress());
  EXPECT_EQ(a.progress().collectives(1).peer_rank(), 3u);
}

// c computes 2x as long per step as the others: flagged once the window of
// 10 steps is full, cleared when it is back to normal.
TEST_F(HangDetectionTest, StragglerFlaggedWithinTheWindowAndCleared) {
  Form(absl::ZeroDuration());
  int flagged_at = 0;
  for (uint64_t step = 1; step <= 20 && flagged_at == 0; ++step) {
    for (const char* w : {"a", "b", "c", "d"}) {
      const absl::Duration compute = std::string(w) == "c" ? absl::Milliseconds(200)
                                                           : absl::Milliseconds(100);
      ASSERT_TRUE(BeatP(w, 1, Computing(step, step, absl::Milliseconds(250), compute)).ok());
    }
    coordinator_->Tick();
    if (Job().num_stragglers() > 0) flagged_at = static_cast<int>(step);
    clock_.Advance(absl::Milliseconds(250));
  }
  EXPECT_EQ(flagged_at, 10);
  const v1::Job job = Job();
  ASSERT_EQ(job.stragglers_size(), 1);
  EXPECT_EQ(job.stragglers(0).rank(), 2u);
  EXPECT_EQ(job.stragglers(0).worker_id(), "c");
  EXPECT_EQ(job.stragglers(0).host(), "host-c");
  EXPECT_DOUBLE_EQ(job.stragglers(0).ratio(), 2.0);
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(job.stragglers(0).compute_time()), 200);
  EXPECT_EQ(TimeUtil::DurationToMilliseconds(job.stragglers(0).median_compute_time()), 100);
  EXPECT_EQ(job.stragglers(0).window_steps(), 10u);
  EXPECT_EQ(job.stragglers(0).since_step(), 10u);
  EXPECT_FALSE(job.stragglers(0).replacing());
  EXPECT_EQ(Members()["c"].straggler().rank(), 2u);
  EXPECT_FALSE(Members()["a"].has_straggler());
  std::vector<v1::StragglerChanged> events = StragglerEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].cleared());
  EXPECT_EQ(events[0].straggler().worker_id(), "c");

  int cleared_at = 0;
  for (uint64_t step = 11; step <= 30 && cleared_at == 0; ++step) {
    for (const char* w : {"a", "b", "c", "d"}) {
      ASSERT_TRUE(BeatP(w, 1, Computing(step, step, absl::Milliseconds(250),
                                        absl::Milliseconds(100)))
                      .ok());
    }
    coordinator_->Tick();
    if (Job().num_stragglers() == 0) cleared_at = static_cast<int>(step);
  }
  EXPECT_EQ(cleared_at, 15);  // 5 of the 10 at 100 ms: the lower middle one
  EXPECT_FALSE(Members()["c"].has_straggler());
  EXPECT_EQ(Job().stragglers_size(), 0);
  events = StragglerEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[1].cleared());
}

TEST_F(HangDetectionTest, TwentyPercentJitterFlagsNobody) {
  Form(absl::ZeroDuration());
  for (uint64_t step = 1; step <= 200; ++step) {
    int i = 0;
    for (const char* w : {"a", "b", "c", "d"}) {
      const int64_t jitter = static_cast<int64_t>((step * 7919 + ++i * 104729) % 41) - 20;
      ASSERT_TRUE(BeatP(w, 1, Computing(step, step, absl::Milliseconds(150),
                                        absl::Milliseconds(100 + jitter)))
                      .ok());
    }
    coordinator_->Tick();
    ASSERT_EQ(Job().num_stragglers(), 0u) << "step " << step;
  }
  EXPECT_TRUE(StragglerEvents().empty());
}

// STRAGGLER_POLICY_REPLACE with a healthy spare: the straggler is drained
// (it leaves at the next committed checkpoint), which is not durable for
// the flag but is for the drain.
TEST_F(HangDetectionTest, ReplacePolicyDrainsTheStragglerWhenASpareExists) {
  Form(absl::ZeroDuration(), v1::HANG_POLICY_UNSPECIFIED, /*max_workers=*/5,
       v1::STRAGGLER_POLICY_REPLACE);
  ASSERT_TRUE(Join("e").ok());
  ASSERT_EQ(Members()["e"].state(), v1::MEMBER_STATE_SPARE);
  ASSERT_TRUE(coordinator_->OpenSession(Id("e")).ok());
  for (uint64_t step = 1; step <= 10; ++step) {
    for (const char* w : {"a", "b", "c", "d"}) {
      const absl::Duration compute = std::string(w) == "c" ? absl::Milliseconds(300)
                                                           : absl::Milliseconds(100);
      ASSERT_TRUE(BeatP(w, 1, Computing(step, step, absl::Milliseconds(350), compute)).ok());
    }
    coordinator_->Tick();
  }
  const v1::Member c = Members()["c"];
  EXPECT_THAT(c.drain_reason(),
              StartsWith("straggler: rank 2 (c on host-c): median compute 300ms over 10 steps, "
                         "3.00x the generation's 100ms"));
  EXPECT_TRUE(c.straggler().replacing());
  EXPECT_TRUE(Job().stragglers(0).replacing());
  ASSERT_EQ(StragglerEvents().size(), 1u);
  EXPECT_TRUE(StragglerEvents()[0].straggler().replacing());
  // The drain survives a restart; the flag and the progress report do not.
  Restart();
  const v1::Member after = Members()["c"];
  EXPECT_THAT(after.drain_reason(), StartsWith("straggler: "));
  EXPECT_FALSE(after.has_straggler());
  EXPECT_FALSE(after.has_progress());
  EXPECT_EQ(Job().num_stragglers(), 0u);
}

TEST_F(HangDetectionTest, ReplacePolicyWithoutASpareOnlyReports) {
  Form(absl::ZeroDuration(), v1::HANG_POLICY_UNSPECIFIED, 4, v1::STRAGGLER_POLICY_REPLACE);
  for (uint64_t step = 1; step <= 10; ++step) {
    for (const char* w : {"a", "b", "c", "d"}) {
      const absl::Duration compute = std::string(w) == "c" ? absl::Milliseconds(300)
                                                           : absl::Milliseconds(100);
      ASSERT_TRUE(BeatP(w, 1, Computing(step, step, absl::Milliseconds(350), compute)).ok());
    }
    coordinator_->Tick();
  }
  EXPECT_EQ(Job().num_stragglers(), 1u);
  EXPECT_TRUE(Members()["c"].drain_reason().empty());
  EXPECT_FALSE(Job().stragglers(0).replacing());
}

}  // namespace
}  // namespace shardline::server

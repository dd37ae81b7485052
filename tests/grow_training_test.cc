// Growing a running job end to end (issue 6): a real shardline-coordinator
// and real shardline-worker processes. Two workers form world 2 (min 2,
// max 4); two more start mid-training and wait as spares; at the next
// committed checkpoint the coordinator ends generation 1 ("grow: ...") and
// re-forms at world 4, restoring that checkpoint. The global batch is
// constant (16 samples: dp 2 runs 4 micro-batches, dp 4 runs 2), so the run
// must finish with the final loss of an uninterrupted single-rank run.
// 200 steps (checkpoints every 5) leave the late workers many commits to
// catch even on a loaded machine, where 60 let the job finish before the
// second one joined.
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/training_job_harness.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

constexpr int kSteps = 200;

// The tiny model of elastic_training_test. global batch 16 of micro-batch 2:
// 8 micro-batches per step, so dp 2 and dp 4 fit and dp 3 does not (three
// workers do not grow a world of two).
v1::JobSpec Spec(const std::string& checkpoint_dir) {
  TinyGptJob job;
  job.name = "grow";
  job.checkpoint_dir = checkpoint_dir;
  job.steps = kSteps;
  job.global_batch = 16;
  job.min_workers = 2;
  job.max_workers = 4;
  job.heartbeat_timeout = absl::Seconds(5);
  // The first formation waits this long for more than two workers; a long
  // one also keeps a slow re-join (2 shared cores) in the grown generation.
  job.last_call = absl::Seconds(2);
  return TinyGptSpec(job);
}

class GrowTrainingTest : public TrainingJobTest {
 protected:
  GrowTrainingTest() : TrainingJobTest("grow") {}
};

TEST_F(GrowTrainingTest, TwoWorkersJoiningMidTrainingGrowTheWorldAtACheckpoint) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt");
  const double reference = UninterruptedFinalLoss(spec);
  StartCoordinator();
  CreateJob(spec);
  StartWorker(0);
  StartWorker(1);
  ASSERT_TRUE(WaitForStep(8, absl::Seconds(120))) << Logs();
  {
    const v1::Job job = GetJob();
    ASSERT_EQ(job.generation(), 1u) << job.phase_reason() << Logs();
    ASSERT_EQ(job.world_size(), 2u) << Logs();
  }
  StartWorker(2);
  StartWorker(3);
  // They join generation 1 as spares; the world grows to 4 at a checkpoint
  // once both are in. When the second one's join completes the pair and a
  // checkpoint is already committed, generation 1 ends at once and that
  // worker goes straight to world 4 without logging its spare assignment.
  {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    bool joined = false;
    while (!joined && absl::Now() < deadline) {
      const std::string log = workers_[2]->Log();
      joined = absl::StrContains(log, ": spare (world 2)") ||
               absl::StrContains(log, "world 4: communicators ready");
      if (!joined) absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_TRUE(joined) << "worker 2 was neither a spare of world 2 nor a rank of world 4"
                        << Logs();
  }

  const v1::Job job = WaitForJobEnd();
  ASSERT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED) << job.phase_reason() << Logs();
  EXPECT_EQ(job.generation(), 2u) << Logs();
  EXPECT_EQ(job.world_size(), 4u) << Logs();
  EXPECT_EQ(job.dp(), 4u) << Logs();
  EXPECT_TRUE(absl::StrContains(coordinator_->Log(),
                                "grow: 2 spares joined; world 2 -> 4 at checkpoint step"))
      << Logs();

  // Every worker trained in world 4 from the checkpoint the grow named.
  for (const auto& w : workers_) {
    EXPECT_TRUE(absl::StrContains(w->Log(), "world 4: communicators ready")) << w->Log();
    EXPECT_TRUE(absl::StrContains(w->Log(), "restored ckpt-step")) << w->Log();
  }
  const double final_loss = FinalLoss();
  ASSERT_GT(final_loss, 0) << "no worker logged step " << kSteps << Logs();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
}

}  // namespace
}  // namespace shardline::worker

// Elastic training end to end (issue 6): a real shardline-coordinator on
// SQLite and real shardline-worker processes train a small GPT on the
// repository's corpus with checkpoints every few steps, and survive
//   * a worker SIGKILLed mid-training (the spare takes its rank; with no
//     spare dp shrinks and gradient accumulation keeps the global batch),
//   * a worker frozen with SIGSTOP (case C9: found by heartbeat timeout;
//     after SIGCONT it is fenced off and re-joins as a new member),
//   * the coordinator killed and restarted on its state file.
// Each run must finish all steps with the final loss of an uninterrupted
// run of the same job (data order and global batch are fixed, so every
// layout follows the same curve), computed here in-process.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/grpc_backup_poll.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/training_job_harness.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

// global batch 12 of micro-batch 2: dp 3 (m 2), dp 2 (m 3) or dp 1 (m 6).
v1::JobSpec Spec(const std::string& checkpoint_dir, int min_workers, int max_workers) {
  TinyGptJob job;
  job.name = "elastic";
  job.checkpoint_dir = checkpoint_dir;
  job.steps = 40;
  job.global_batch = 12;
  job.min_workers = min_workers;
  job.max_workers = max_workers;
  job.heartbeat_timeout = absl::Seconds(2);
  job.last_call = absl::Milliseconds(500);
  return TinyGptSpec(job);
}

class ElasticTrainingTest : public TrainingJobTest {
 protected:
  ElasticTrainingTest() : TrainingJobTest("elastic") {}

  void CoordinatorRestartKeepsTheGeneration(const std::string& checkpoints);
};

// Three workers (world 3 at most 3... here max 2: one spare); SIGKILL a
// ranked worker: the spare takes its place, training resumes from the last
// committed checkpoint and ends at the uninterrupted loss.
TEST_F(ElasticTrainingTest, SigkillWithSpareResumesFromCheckpoint) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt-kill", 2, 2);
  const double reference = UninterruptedFinalLoss(spec);
  ASSERT_NO_FATAL_FAILURE(StartTraining(spec, /*workers=*/3, /*until_step=*/12));
  // Kill a worker that holds a rank.
  const int victim = RankedWorker();
  ASSERT_GE(victim, 0);
  workers_[victim]->Kill();
  workers_[victim].reset();
  const double final_loss = WaitForCompletion();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
  bool logged_recovery = false;
  for (const auto& w : workers_) {
    if (w != nullptr && absl::StrContains(w->Log(), "recovery (")) logged_recovery = true;
    if (w != nullptr) {
      EXPECT_TRUE(absl::StrContains(w->Log(), "restored ckpt-step")) << w->Log();
    }
  }
  EXPECT_TRUE(logged_recovery) << Logs();
}

// No spare: dp shrinks from 3 to 2 with more micro-batches per rank; the
// global batch and so the loss curve stay the same.
TEST_F(ElasticTrainingTest, SigkillWithoutSpareShrinksDp) {
  v1::JobSpec spec = Spec(dir_ + "/ckpt-shrink", 2, 3);
  // Saves written in the background while training goes on: the step only
  // counts as saved once committed, and the restore still lands exactly.
  spec.mutable_checkpoint()->set_async_save(true);
  const double reference = UninterruptedFinalLoss(spec);
  ASSERT_NO_FATAL_FAILURE(StartTraining(spec, /*workers=*/3, /*until_step=*/12));
  workers_[1]->Kill();
  workers_[1].reset();
  const double final_loss = WaitForCompletion();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
  EXPECT_EQ(GetJob().dp(), 2u);
}

// Case C9: a frozen worker is declared lost by heartbeat timeout, the job
// re-forms without it; after SIGCONT it is fenced off and re-joins as a new
// member (a spare here, since the job is RUNNING).
TEST_F(ElasticTrainingTest, C9SigstopIsDetectedByHeartbeatTimeout) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt-stop", 2, 3);
  const double reference = UninterruptedFinalLoss(spec);
  ASSERT_NO_FATAL_FAILURE(StartTraining(spec, /*workers=*/3, /*until_step=*/12));
  const absl::Time stopped = absl::Now();
  workers_[2]->Signal(SIGSTOP);
  // Re-formed at generation 2 without it.
  ASSERT_TRUE(workers_[0]->WaitFor("world 2: communicators ready", absl::Seconds(30)))
      << Logs();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(2 + 1 + 5));  // timeout + interval + slack
  workers_[2]->Signal(SIGCONT);
  // Woken, it finds its generation over (fenced) and re-joins.
  // (Within the collective timeout, 20 s, plus a margin: a rank frozen in
  // the middle of a collective may only see it fail at that timeout.)
  ASSERT_TRUE(workers_[2]->WaitFor("generation 1 ended during training", absl::Seconds(60)) ||
              workers_[2]->WaitFor("generation 1 is over", absl::Seconds(1)))
      << Logs();
  const double final_loss = WaitForCompletion();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
}

// The coordinator is killed (SIGKILL) mid-training and restarted on its
// SQLite file: the workers reconnect and training goes on to the end, in
// the same generation. `checkpoints` names the job's checkpoint folder.
void ElasticTrainingTest::CoordinatorRestartKeepsTheGeneration(const std::string& checkpoints) {
  v1::JobSpec spec = Spec(dir_ + "/" + checkpoints, 2, 2);
  // Heartbeats resume within a second or two of the restart; a timeout
  // longer than that (the default is 30 s) keeps the generation.
  spec.mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(10);
  const double reference = UninterruptedFinalLoss(spec);
  ASSERT_NO_FATAL_FAILURE(StartTraining(spec, /*workers=*/2, /*until_step=*/8));
  coordinator_->Kill();
  // Down long enough that checkpoint calls meet a dead coordinator (they
  // retry), then back on the same address and state file.
  absl::SleepFor(absl::Milliseconds(1500));
  StartCoordinator(address_);
  const double final_loss = WaitForCompletion();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
  // Training went on in the same generation: nothing re-formed.
  EXPECT_EQ(GetJob().generation(), 1u) << Logs();
}

TEST_F(ElasticTrainingTest, CoordinatorRestartMidTraining) {
  CoordinatorRestartKeepsTheGeneration("ckpt-coord");
}

// The same with gRPC's backup poller off in the workers (an operator's
// GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS=0; common/grpc_backup_poll.h):
// then only the agent's own watch of the connection after an UNAVAILABLE
// heartbeat (WorkerClient::AwaitConnection) notices that the restarted
// coordinator serves; without it the workers never reconnected and the job
// stayed RECOVERING.
TEST_F(ElasticTrainingTest, CoordinatorRestartWithoutGrpcBackupPoller) {
  worker_env_ = {{kBackupPollIntervalVariable, "0"}};
  CoordinatorRestartKeepsTheGeneration("ckpt-coord-nopoll");
}

}  // namespace
}  // namespace shardline::worker

namespace shardline::worker {
namespace {

// shardctl drain: the drained rank leaves only after a checkpoint taken at
// the next step boundary commits, so no step is trained twice; the spare
// takes its place, the drained process stops (exit 0), and the run ends at
// the uninterrupted loss.
TEST_F(ElasticTrainingTest, DrainLeavesAfterACheckpointAtTheNextStep) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt-drain", 2, 2);
  const double reference = UninterruptedFinalLoss(spec);
  ASSERT_NO_FATAL_FAILURE(StartTraining(spec, /*workers=*/3, /*until_step=*/12));
  const int victim = RankedWorker();
  ASSERT_GE(victim, 0);
  v1::DrainWorkerRequest req;
  req.set_job_id("elastic");
  req.set_worker_id(absl::StrCat("w", victim));
  req.set_reason("test drain");
  v1::Member member;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = Jobs()->DrainWorker(&ctx, req, &member);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(workers_[victim]->WaitExit(absl::Seconds(60)), 0) << Logs();
  EXPECT_TRUE(absl::StrContains(workers_[victim]->Log(), "drained: test drain")) << Logs();
  const double final_loss = WaitForCompletion();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
  // The job resumed from the drain's checkpoint: no step after it was lost.
  const std::string survivors = workers_[(victim + 1) % 3]->Log();
  EXPECT_TRUE(absl::StrContains(survivors, "restored ckpt-step")) << Logs();
  // The generation ended for the drain, not for a lost worker. The survivor
  // names it as the restart directive said it ("... drained: test drain)")
  // or as a fenced call's answer did ("generation 1 is over (current 2): ...
  // drained: test drain; abort communicators ..."), whichever came first.
  bool drain_recovery = false;
  for (absl::string_view line : absl::StrSplit(survivors, '\n')) {
    drain_recovery = drain_recovery || (absl::StrContains(line, "recovery (") &&
                                        absl::StrContains(line, "drained: test drain") &&
                                        absl::StrContains(line, "communicators ready after"));
  }
  EXPECT_TRUE(drain_recovery) << Logs();
  EXPECT_FALSE(absl::StrContains(survivors, " lost")) << Logs();
}

}  // namespace
}  // namespace shardline::worker

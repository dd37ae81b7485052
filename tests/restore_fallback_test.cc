// Restore fallback end to end (issue 6; docs/ARCHITECTURE.md "Checkpoints": a checksum
// mismatch is DataLoss and restore falls back to the previous committed
// checkpoint). A real shardline-coordinator and three shardline-worker
// processes (world 2 and a spare) train with a checkpoint every 5 steps.
// The ranks are frozen, a byte of every shard file of the newest committed
// checkpoint is flipped, and one rank is killed: the job re-forms, the
// restore of the corrupt checkpoint fails with DataLoss, the coordinator
// marks it unusable and re-forms from the previous committed checkpoint, and
// the job completes with the loss of an uninterrupted run.
#include <signal.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/training_job_harness.h"

namespace shardline::worker {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::shardline::v1;

constexpr int kSteps = 30;

// As in elastic_training_test.cc; keep_last 3 so that the previous
// checkpoint is still there.
v1::JobSpec Spec(const std::string& checkpoint_dir) {
  TinyGptJob job;
  job.name = "fallback";
  job.checkpoint_dir = checkpoint_dir;
  job.steps = kSteps;
  job.global_batch = 12;
  job.keep_last = 3;
  job.min_workers = 2;
  job.max_workers = 2;
  job.heartbeat_timeout = absl::Seconds(3);
  job.last_call = absl::Milliseconds(500);
  return TinyGptSpec(job);
}

// "ckpt-step000000000010-gen1" -> 10.
uint64_t StepOf(const std::string& checkpoint_id) {
  uint64_t step = 0;
  const size_t at = checkpoint_id.find("step");
  if (at == std::string::npos) return 0;
  if (!absl::SimpleAtoi(checkpoint_id.substr(at + 4, 12), &step)) return 0;
  return step;
}

class RestoreFallbackTest : public TrainingJobTest {
 protected:
  RestoreFallbackTest() : TrainingJobTest("fallback") {}
};

TEST_F(RestoreFallbackTest, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt");
  const std::string root = dir_ + "/ckpt/fallback";  // <directory>/<job_id>
  const double reference = UninterruptedFinalLoss(spec);

  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(CreateJob(spec));
  for (int i = 0; i < 3; ++i) StartWorker(i);
  // Two checkpoints committed (steps 5 and 10) once step 12 is done.
  ASSERT_TRUE(WaitForStep(12, absl::Seconds(120))) << Logs();

  // Freeze the ranks so that no newer checkpoint commits meanwhile, then
  // corrupt every shard file of the newest committed one.
  std::vector<int> ranked;
  for (int i = 0; i < 3; ++i) {
    if (!absl::StrContains(workers_[i]->Log(), ": spare")) ranked.push_back(i);
  }
  ASSERT_EQ(ranked.size(), 2u) << Logs();
  for (int i : ranked) workers_[i]->Signal(SIGSTOP);
  absl::SleepFor(absl::Milliseconds(300));
  std::ifstream latest_file(root + "/LATEST");
  std::string corrupt;
  std::getline(latest_file, corrupt);
  ASSERT_FALSE(corrupt.empty());
  const uint64_t corrupt_step = StepOf(corrupt);
  ASSERT_GE(corrupt_step, 10u) << corrupt;
  std::string previous;  // the newest committed checkpoint before it
  for (const fs::directory_entry& d : fs::directory_iterator(root)) {
    const std::string id = d.path().filename().string();
    if (!fs::exists(d.path() / "manifest.json") || StepOf(id) >= corrupt_step) continue;
    if (previous.empty() || StepOf(id) > StepOf(previous)) previous = id;
  }
  ASSERT_FALSE(previous.empty()) << "no committed checkpoint before " << corrupt;
  int flipped = 0;
  for (const fs::directory_entry& f : fs::directory_iterator(fs::path(root) / corrupt)) {
    if (!absl::StartsWith(f.path().filename().string(), "rank-")) continue;
    std::fstream shard(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff at = static_cast<std::streamoff>(fs::file_size(f.path()) / 2);
    shard.seekg(at);
    const char c = static_cast<char>(shard.get());
    shard.seekp(at);
    shard.put(static_cast<char>(c ^ 0x10));
    ++flipped;
  }
  ASSERT_GT(flipped, 0);
  // One rank dies; the other goes on (the spare takes the dead one's rank).
  workers_[ranked[0]]->Kill();
  workers_[ranked[0]].reset();
  workers_[ranked[1]]->Signal(SIGCONT);

  // The job completes with the uninterrupted loss.
  const v1::Job job = WaitForJobEnd();
  ASSERT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED) << job.phase_reason() << Logs();
  const double final_loss = FinalLoss();
  bool restored_previous = false, restored_corrupt = false, skipped = false;
  for (const auto& w : workers_) {
    if (w == nullptr) continue;
    const std::string log = w->Log();
    restored_previous |= absl::StrContains(log, absl::StrCat("restored ", previous, " "));
    restored_corrupt |= absl::StrContains(log, absl::StrCat("restored ", corrupt, " "));
    skipped |= absl::StrContains(log, "checkpoint skipped");
  }
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
  EXPECT_TRUE(restored_previous) << "no worker restored " << previous << Logs();
  EXPECT_FALSE(restored_corrupt) << Logs();
  // Once marked unusable the corrupt one is no longer the newest committed:
  // LATEST moves back to the previous one at once, and the re-trained
  // steps are saved again (the save of the corrupt one's step is accepted
  // in the new generation, not skipped).
  EXPECT_FALSE(skipped) << Logs();
  const std::string log = coordinator_->Log();
  EXPECT_TRUE(absl::StrContains(log, absl::StrCat("restore point ", corrupt))) << log;
  EXPECT_TRUE(absl::StrContains(
      log, absl::StrCat("falling back to the previous committed checkpoint ", previous)))
      << log;
  EXPECT_TRUE(absl::StrContains(
      log, absl::StrCat("checkpoint LATEST moved job=fallback checkpoint=", previous)))
      << log;
  bool resaved = false;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    resaved |= absl::StrContains(line, "checkpoint committed job=fallback") &&
               absl::StrContains(line, absl::StrCat(" step=", corrupt_step, " ")) &&
               !absl::StrContains(line, corrupt);
  }
  EXPECT_TRUE(resaved) << "step " << corrupt_step << " was not saved again" << log;
  // The listing says why the corrupt one is kept but not used (or retention
  // already removed it: it expires first).
  auto checkpoints = v1::CheckpointService::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  v1::ListCheckpointsRequest req;
  req.set_job_id("fallback");
  v1::ListCheckpointsResponse listed;
  grpc::ClientContext ctx;
  ASSERT_TRUE(checkpoints->ListCheckpoints(&ctx, req, &listed).ok());
  for (const v1::CheckpointSummary& c : listed.checkpoints()) {
    EXPECT_EQ(c.unusable_reason().empty(), c.checkpoint_id() != corrupt) << c.DebugString();
  }
}

}  // namespace
}  // namespace shardline::worker

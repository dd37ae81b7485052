// Checkpointer on a FakeCheckpointClient (testing/fake_checkpoint_client.h)
// and a FakeClock, with the real trainer (the small test GPT, one rank) and
// real shard files: what it sends, how it retries, what it restores.
#include "worker/checkpointer.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_checkpoint_client.h"
#include "worker/train/staging_device.h"
#include "worker/train/test_util.h"
#include "worker/train/trainer.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;
using client::testing::FakeCheckpointClient;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using train::Trainer;

constexpr int kSteps = 2;

train::TrainingOptions Options() {
  return train::testing::SmallGptOptions(train::testing::Layout{}, /*total_steps=*/4);
}

// Runs `body` with a single-rank trainer that has trained `steps` steps.
void WithTrainer(int steps, const std::function<void(Trainer&)>& body) {
  train::testing::Train(Options(), steps, [&](int, Trainer& t) { body(t); });
}

// The values of every slice the trainer would save, in order.
std::vector<std::vector<float>> SavedValues(Trainer& t) {
  std::vector<std::vector<float>> out;
  absl::StatusOr<std::vector<Trainer::StateSlice>> slices = t.SaveSlices();
  EXPECT_TRUE(slices.ok()) << slices.status();
  if (!slices.ok()) return out;
  for (const Trainer::StateSlice& s : *slices) {
    out.emplace_back(s.data, s.data + (s.end - s.begin));
  }
  return out;
}

class CheckpointerTest : public ::testing::Test {
 protected:
  CheckpointerTest()
      : directory_(absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                                ::testing::UnitTest::GetInstance()->current_test_info()->name())),
        checkpoints_(std::make_shared<FakeCheckpointClient>(&clock_, directory_)),
        t0_(clock_.Now()) {
    backoff_ = Checkpointer::DefaultBackoff();
    backoff_.seed = 3;
  }

  v1::Fence Fence() const {
    v1::Fence f;
    f.mutable_worker()->set_job_id("job");
    f.mutable_worker()->set_worker_id("w0");
    f.mutable_worker()->set_incarnation(9);
    f.set_generation(1);
    return f;
  }

  std::vector<absl::Duration> Delays(int n) const {
    Backoff backoff(backoff_);
    std::vector<absl::Duration> out;
    for (int i = 0; i < n; ++i) out.push_back(backoff.Next());
    return out;
  }

  const std::string directory_;
  FakeClock clock_;
  std::shared_ptr<FakeCheckpointClient> checkpoints_;
  const absl::Time t0_;
  BackoffOptions backoff_;
};

TEST_F(CheckpointerTest, DefaultBackoffIsValid) {
  const BackoffOptions o = Checkpointer::DefaultBackoff();
  EXPECT_TRUE(ValidateBackoffOptions(o).ok());
  EXPECT_EQ(o.initial, absl::Milliseconds(100));
  EXPECT_EQ(o.max, absl::Milliseconds(500));
}

TEST_F(CheckpointerTest, SaveWritesTheShardAndReportsIt) {
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(kSteps, [&](Trainer& t) {
    ASSERT_TRUE(ckpt.Save(Fence(), /*rank=*/0, kSteps, /*data_cursor=*/16, t, false).ok());
  });
  EXPECT_THAT(checkpoints_->CallNames(), ElementsAre("BeginCheckpoint", "ReportShard"));
  const v1::BeginCheckpointRequest begin = checkpoints_->begins().at(0);
  EXPECT_EQ(begin.step(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(begin.fence().worker().worker_id(), "w0");
  const v1::ReportShardRequest report = checkpoints_->reports().at(0);
  const std::string id = "ckpt-step000000000002-gen1";
  EXPECT_EQ(report.checkpoint_id(), id);
  EXPECT_EQ(report.fence().generation(), 1u);
  EXPECT_EQ(report.data_cursor(), 16u);
  ASSERT_EQ(report.files_size(), 1);
  const std::string file = absl::StrCat(directory_, "/", id, "/", report.files(0).path());
  EXPECT_EQ(std::filesystem::file_size(file), report.files(0).size_bytes());
  EXPECT_GT(report.tensors_size(), 0);
  EXPECT_EQ(ckpt.last_summary().checkpoint_id(), id);
  EXPECT_EQ(ckpt.last_summary().step(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(ckpt.last_summary().state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_TRUE(ckpt.Finish().ok());
}

TEST_F(CheckpointerTest, AsyncSaveReportsInTheBackground) {
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(kSteps, [&](Trainer& t) {
    ASSERT_TRUE(ckpt.Save(Fence(), 0, kSteps, 16, t, /*async=*/true).ok());
    // Until the background part is collected the step counts as pending.
    EXPECT_EQ(ckpt.last_summary().state(), v1::CHECKPOINT_STATE_PENDING);
    // The state was copied: training on does not change what is written.
    ASSERT_TRUE(t.TrainStep().ok());
  });
  ASSERT_TRUE(ckpt.Finish().ok());
  EXPECT_EQ(ckpt.last_summary().state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_THAT(checkpoints_->CallNames(), ElementsAre("BeginCheckpoint", "ReportShard"));
}

// With the state on a device (StagingDevice, whose copies to host run as
// late as a GPU's copy stream may run them), an async save copies it beside
// the next step: the shard written holds the saved step's values, not the
// next step's, and restores onto a fresh trainer as such.
TEST_F(CheckpointerTest, AsyncSaveOfADeviceStateWritesTheSavedStep) {
  train::testing::StagingDevice device;
  train::TrainingOptions options = Options();
  options.device = &device;
  std::vector<std::vector<float>> saved, after_step;
  {
    Checkpointer ckpt(checkpoints_, &clock_, backoff_);
    train::testing::Train(options, kSteps, [&](int, Trainer& t) {
      saved = SavedValues(t);
      const int64_t before = device.async_copies();
      ASSERT_TRUE(ckpt.Save(Fence(), 0, kSteps, 16, t, /*async=*/true).ok());
      EXPECT_GT(device.async_copies(), before) << "the save did not copy beside the math";
      ASSERT_TRUE(t.TrainStep().ok());
      ASSERT_TRUE(ckpt.Finish().ok());
      EXPECT_EQ(ckpt.last_summary().state(), v1::CHECKPOINT_STATE_COMMITTED);
      after_step = SavedValues(t);
    });
  }
  ASSERT_FALSE(saved.empty());
  ASSERT_NE(after_step, saved) << "the step after the save changed nothing";
  v1::CheckpointRef ref;
  ref.set_checkpoint_id("ckpt-step000000000002-gen1");
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(0, [&](Trainer& fresh) {
    ASSERT_TRUE(ckpt.Restore("job", ref, fresh).ok());
    EXPECT_EQ(SavedValues(fresh), saved);
  });
}

TEST_F(CheckpointerTest, RestoreLoadsTheSavedStateOntoAFreshTrainer) {
  std::vector<std::vector<float>> saved;
  {
    Checkpointer ckpt(checkpoints_, &clock_, backoff_);
    WithTrainer(kSteps, [&](Trainer& t) {
      saved = SavedValues(t);
      ASSERT_TRUE(ckpt.Save(Fence(), 0, kSteps, 16, t, false).ok());
    });
  }
  v1::CheckpointRef ref;
  ref.set_checkpoint_id("ckpt-step000000000002-gen1");
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(0, [&](Trainer& fresh) {
    ASSERT_NE(SavedValues(fresh), saved);  // it starts from its initial weights
    ASSERT_TRUE(ckpt.Restore("job", ref, fresh).ok());
    EXPECT_EQ(fresh.step(), kSteps);
    EXPECT_EQ(SavedValues(fresh), saved);
  });
  const v1::GetManifestRequest asked = checkpoints_->manifest_requests().at(0);
  EXPECT_EQ(asked.job_id(), "job");
  EXPECT_EQ(asked.checkpoint_id(), ref.checkpoint_id());
  // Only the tensors this rank needs, each once, sorted.
  std::vector<std::string> tensors(asked.tensors().begin(), asked.tensors().end());
  EXPECT_FALSE(tensors.empty());
  EXPECT_TRUE(std::is_sorted(tensors.begin(), tensors.end()));
  EXPECT_EQ(std::adjacent_find(tensors.begin(), tensors.end()), tensors.end());
}

TEST_F(CheckpointerTest, UnavailableIsRetriedWithJitteredBackoff) {
  checkpoints_->FailNext("BeginCheckpoint", absl::UnavailableError("restarting"), 2);
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  const std::vector<absl::Duration> d = Delays(2);
  WithTrainer(kSteps, [&](Trainer& t) {
    absl::Status saved;
    std::thread saver([&] { saved = ckpt.Save(Fence(), 0, kSteps, 16, t, false); });
    ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d[0]));
    clock_.Advance(d[0]);
    ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d[0] + d[1]));
    clock_.Advance(d[1]);
    saver.join();
    EXPECT_TRUE(saved.ok()) << saved;
  });
  EXPECT_THAT(checkpoints_->CallTimes("BeginCheckpoint"),
              ElementsAre(t0_, t0_ + d[0], t0_ + d[0] + d[1]));
  EXPECT_THAT(checkpoints_->CallTimes("ReportShard"), ElementsAre(t0_ + d[0] + d[1]));
}

TEST_F(CheckpointerTest, RetriesEndAfterTheRetryWindow) {
  checkpoints_->FailNext("ReportShard", absl::UnavailableError("restarting"), INT_MAX);
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  std::vector<absl::Time> expected = {t0_};
  WithTrainer(kSteps, [&](Trainer& t) {
    absl::Status saved;
    std::thread saver([&] { saved = ckpt.Save(Fence(), 0, kSteps, 16, t, false); });
    absl::Duration elapsed;
    for (absl::Duration d : Delays(1000)) {
      if (elapsed + d > Checkpointer::kRetryWindow) break;
      elapsed += d;
      expected.push_back(t0_ + elapsed);
      ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + elapsed));
      clock_.Advance(d);
    }
    saver.join();
    EXPECT_EQ(saved.code(), absl::StatusCode::kUnavailable) << saved;
    EXPECT_THAT(std::string(saved.message()), StartsWith("ReportShard: restarting"));
  });
  EXPECT_EQ(checkpoints_->CallTimes("ReportShard"), expected);
  EXPECT_LE(expected.back(), t0_ + absl::Minutes(1));
}

TEST_F(CheckpointerTest, AbortedCommitFailsTheSave) {
  checkpoints_->AbortNextCommit("rank 1's file is missing");
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(kSteps, [&](Trainer& t) {
    const absl::Status s = ckpt.Save(Fence(), 0, kSteps, 16, t, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_EQ(s.message(),
              "checkpoint ckpt-step000000000002-gen1 was aborted: rank 1's file is missing");
  });
  EXPECT_EQ(ckpt.last_summary().state(), v1::CHECKPOINT_STATE_ABORTED);
}

TEST_F(CheckpointerTest, RefusedBeginIsReturnedWithoutWriting) {
  checkpoints_->FailNext("BeginCheckpoint",
                         absl::FailedPreconditionError("the job has no checkpoint directory"));
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(kSteps, [&](Trainer& t) {
    const absl::Status s = ckpt.Save(Fence(), 0, kSteps, 16, t, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(), "BeginCheckpoint: the job has no checkpoint directory");
  });
  EXPECT_THAT(checkpoints_->CallNames(), ElementsAre("BeginCheckpoint"));
  EXPECT_FALSE(std::filesystem::exists(directory_));
  EXPECT_TRUE(clock_.Waiters().empty());
}

TEST_F(CheckpointerTest, RestoreOfAnUnknownCheckpointNamesIt) {
  v1::CheckpointRef ref;
  ref.set_checkpoint_id("ckpt-step000000000009-gen1");
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(0, [&](Trainer& t) {
    const absl::Status s = ckpt.Restore("job", ref, t);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_EQ(s.message(),
              "restoring ckpt-step000000000009-gen1: GetManifest: no checkpoint "
              "ckpt-step000000000009-gen1");
  });
}

// A shard whose bytes changed after the commit: DataLoss naming the
// checkpoint (the coordinator falls back from it).
TEST_F(CheckpointerTest, RestoreChecksEveryPiecesChecksum) {
  {
    Checkpointer ckpt(checkpoints_, &clock_, backoff_);
    WithTrainer(kSteps,
                [&](Trainer& t) { ASSERT_TRUE(ckpt.Save(Fence(), 0, kSteps, 16, t, false).ok()); });
  }
  const v1::ReportShardRequest report = checkpoints_->reports().at(0);
  const std::string file = absl::StrCat(directory_, "/", report.checkpoint_id(), "/",
                                        report.files(0).path());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(static_cast<std::streamoff>(report.files(0).size_bytes() / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(report.files(0).size_bytes() / 2));
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  v1::CheckpointRef ref;
  ref.set_checkpoint_id(report.checkpoint_id());
  Checkpointer ckpt(checkpoints_, &clock_, backoff_);
  WithTrainer(0, [&](Trainer& t) {
    const absl::Status s = ckpt.Restore("job", ref, t);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()),
                StartsWith(absl::StrCat("restoring ", report.checkpoint_id(), ": ")));
  });
}

}  // namespace
}  // namespace shardline::worker

// The real trainer through real shard files: every rank of layout A writes
// its SaveSlices with WriteShard, the reports are merged into a manifest the
// way the coordinator commits one, and every rank of layout B fills its
// RestoreSlices with ReadRuns and continues. The loss curve must continue
// the uninterrupted single-rank run within 1e-4 relative (docs/ARCHITECTURE.md
// "Numbers that are contracts"; worker/train/trainer_restore_test.cc does
// the same round trip in memory).
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "plan/model.h"
#include "testing/manifest_test_util.h"
#include "checkpoint/shard_io.h"
#include "worker/checkpoint/trainer_state.h"
#include "worker/train/test_util.h"

namespace shardline::worker {
namespace {

using train::StepStats;
using train::Trainer;
using train::TrainingOptions;

constexpr int kSteps = 5;
constexpr int kSaveAt = 3;

using train::testing::Layout;

TrainingOptions Options(const Layout& l) { return train::testing::SmallGptOptions(l, kSteps); }

// The coordinator's commit (see MergeReports), committed.
v1::Manifest Merge(const std::map<int, v1::ReportShardRequest>& reports,
                   const std::string& directory) {
  v1::Manifest m = checkpoint::testing::MergeReports(reports);
  m.set_checkpoint_id("job-1/step-3");
  m.set_step(kSaveAt);
  m.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  m.set_directory(directory);
  return m;
}

std::vector<double> Losses(const std::vector<StepStats>& stats) {
  std::vector<double> out;
  for (const StepStats& s : stats) out.push_back(s.loss);
  return out;
}

struct Param {
  Layout before, after;
  bool async = false;  // save through checkpoint::AsyncShardWriter
};

class TrainerCheckpointTest : public ::testing::TestWithParam<Param> {};

TEST_P(TrainerCheckpointTest, ContinuesTheUninterruptedCurveFromShardFiles) {
  static const std::vector<double>* reference =
      new std::vector<double>(Losses(train::testing::Train(Options(Layout{}), kSteps)));
  const Param& param = GetParam();
  static int attempt = 0;
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt-", attempt++);

  absl::Mutex mu;
  std::map<int, v1::ReportShardRequest> reports;
  train::testing::Train(Options(param.before), kSaveAt, [&](int rank, Trainer& t) {
    absl::StatusOr<std::vector<Trainer::StateSlice>> slices = t.SaveSlices();
    ASSERT_TRUE(slices.ok()) << slices.status();
    const std::vector<checkpoint::LocalRun> runs = FromStateSlices(*slices);
    absl::StatusOr<v1::ReportShardRequest> r;
    if (param.async) {
      checkpoint::AsyncShardWriter writer;
      ASSERT_TRUE(writer.Start(dir, rank, runs).ok());
      r = writer.Wait();
    } else {
      r = checkpoint::WriteShard(dir, rank, runs);
    }
    ASSERT_TRUE(r.ok()) << r.status();
    absl::MutexLock lock(&mu);
    reports[rank] = *std::move(r);
  });
  ASSERT_EQ(reports.size(), static_cast<size_t>(Options(param.before).parallel.world_size()));
  const v1::Manifest manifest = Merge(reports, dir);

  // Every parameter and both moments, each element exactly once.
  const auto specs = *plan::GptParameters(Options(param.before).model);
  EXPECT_EQ(manifest.tensors_size(), static_cast<int>(3 * specs.size()));
  const checkpoint::VerifyReport verify = checkpoint::VerifyCheckpoint(manifest, dir);
  EXPECT_TRUE(verify.ok()) << verify.first_problem;
  EXPECT_EQ(verify.tensors, static_cast<int64_t>(3 * specs.size()));
  int64_t numel = 0;
  for (const auto& s : specs) numel += s.numel();
  EXPECT_EQ(verify.bytes_checked, static_cast<uint64_t>(2 * 3 * numel * 4));

  const std::vector<double> resumed =
      train::testing::ResumeAndTrain(Options(param.after), kSaveAt, kSteps, [&](Trainer& t) {
        const absl::Status read = checkpoint::ReadRuns(manifest, dir, FromStateSlices(t.RestoreSlices()));
        ASSERT_TRUE(read.ok()) << read;
        ASSERT_TRUE(t.FinishRestore(kSaveAt).ok());
      });
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSaveAt));
  for (int s = kSaveAt; s < kSteps; ++s) {
    EXPECT_NEAR(resumed[s - kSaveAt], (*reference)[s], 1e-4 * (*reference)[s]) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TrainerCheckpointTest,
    ::testing::Values(
        // tp=2 (dims 0 and 1 split), pp=2, dp=2 ZeRO-1 -> one rank, ZeRO-3 over dp=2.
        Param{Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .micro_batch_size = 1}, Layout{.dp = 2, .zero = 3}},
        // Uneven ZeRO-3 shards -> tp=2 pp=2, saved asynchronously.
        Param{Layout{.dp = 2, .zero = 3}, Layout{.tp = 2, .pp = 2, .zero = 0}, /*async=*/true},
        // ZeRO-2 -> interleaved pipeline with tp=2.
        Param{Layout{.dp = 2, .zero = 2},
              Layout{.tp = 2, .pp = 2, .vpp = 2, .zero = 0,
                     .schedule = plan::ScheduleKind::kInterleaved}},
        // tp=2 ZeRO-3 -> tp=2 ZeRO-1 at another dp.
        Param{Layout{.tp = 2, .dp = 2, .zero = 3, .micro_batch_size = 1}, Layout{.tp = 2, .zero = 1}}),
    [](const ::testing::TestParamInfo<Param>& info) {
      auto name = [](const Layout& l) {
        return absl::StrCat("tp", l.tp, "pp", l.pp, "vpp", l.vpp, "dp", l.dp, "z", l.zero);
      };
      return absl::StrCat(name(info.param.before), "_to_", name(info.param.after),
                          info.param.async ? "_async" : "");
    });

}  // namespace
}  // namespace shardline::worker

// Checkpoint state without files: ranks of layout A save their slices into
// whole global tensors (each element must be written exactly once), ranks of
// layout B restore from them and continue; the loss curve must continue the
// uninterrupted single-rank run (docs/ARCHITECTURE.md "Checkpoints": restore at any layout).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "worker/train/init.h"
#include "worker/train/test_util.h"

namespace shardline::worker::train {
namespace {

constexpr int kSteps = 10;
constexpr int kSaveAt = 5;

using testing::Layout;

TrainingOptions Options(const Layout& l) { return testing::SmallGptOptions(l, kSteps); }

using testing::GlobalState;
using testing::Restore;
using testing::Save;

std::vector<double> Losses(const std::vector<StepStats>& stats) {
  std::vector<double> out;
  for (const StepStats& s : stats) out.push_back(s.loss);
  return out;
}

class RestoreTest : public ::testing::TestWithParam<std::pair<Layout, Layout>> {};

TEST_P(RestoreTest, ContinuesTheUninterruptedCurveAtAnotherLayout) {
  static const std::vector<double>* reference =
      new std::vector<double>(Losses(testing::Train(Options(Layout{}), kSteps)));
  const auto& [before, after] = GetParam();
  GlobalState state;
  testing::Train(Options(before), kSaveAt, [&](int, Trainer& t) { Save(t, state); });
  // Every element of every tensor exactly once: 3 tensors per parameter.
  const auto specs = *plan::GptParameters(Options(before).model);
  {
    absl::MutexLock lock(&state.mu);
    ASSERT_EQ(state.values.size(), 3 * specs.size());
    for (const auto& [name, writes] : state.writes) {
      for (size_t i = 0; i < writes.size(); ++i)
        ASSERT_EQ(writes[i], 1) << name << " element " << i;
    }
  }
  const std::vector<double> resumed = testing::ResumeAndTrain(
      Options(after), kSaveAt, kSteps, [&](Trainer& t) { Restore(t, state, kSaveAt); });
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSaveAt));
  for (int s = kSaveAt; s < kSteps; ++s) {
    EXPECT_NEAR(resumed[s - kSaveAt], (*reference)[s], 1e-4 * (*reference)[s]) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RestoreTest,
    ::testing::Values(
        // Same layout.
        std::make_pair(Layout{}, Layout{}),
        // Other dp and zero stage (C1/C4-style uneven shards on both sides).
        std::make_pair(Layout{.dp = 2, .zero = 3}, Layout{.zero = 0}),
        std::make_pair(Layout{.zero = 0}, Layout{.dp = 2, .zero = 2}),
        // Other tp and pp.
        std::make_pair(Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .micro_batch_size = 1},
                       Layout{.dp = 2, .zero = 3}),
        std::make_pair(Layout{.dp = 2, .zero = 2},
                       Layout{.tp = 2, .pp = 2, .vpp = 2, .zero = 0, .schedule = plan::ScheduleKind::kInterleaved})));

}  // namespace
}  // namespace shardline::worker::train

// The contract (docs/ARCHITECTURE.md "Numbers that are contracts"): in fp32 every
// parallel layout reproduces the single-rank loss curve within 1e-4
// relative over 20 steps. Each layout runs every rank as a thread with real
// Gloo backends over loopback.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/train/test_util.h"

namespace shardline::worker::train {
namespace {

constexpr int kSteps = 20;

using testing::Layout;

TrainingOptions Options(const Layout& l) { return testing::SmallGptOptions(l, kSteps); }

const std::vector<StepStats>& Reference() {
  static const std::vector<StepStats>* ref =
      new std::vector<StepStats>(testing::Train(Options(Layout{}), kSteps));
  return *ref;
}

class EquivalenceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(EquivalenceTest, MatchesSingleRankLossCurve) {
  const std::vector<StepStats>& ref = Reference();
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  // The curve must actually move, or equality would prove little.
  EXPECT_LT(ref.back().loss, ref.front().loss - 1.0) << "reference did not learn";
  testing::ExpectOnCurve(testing::Train(Options(GetParam()), kSteps), ref, 1e-4, 1e-3);
}

using plan::ScheduleKind;
constexpr ScheduleKind k1F1B = ScheduleKind::kOneFOneB;
constexpr ScheduleKind kGpipe = ScheduleKind::kGpipe;
constexpr ScheduleKind kInterleaved = ScheduleKind::kInterleaved;

INSTANTIATE_TEST_SUITE_P(
    Layouts, EquivalenceTest,
    ::testing::Values(
        // Tensor parallelism alone.
        Layout{.tp = 2},
        // Pipelines: more and fewer micro-batches than stages, every schedule.
        Layout{.pp = 2, .schedule = k1F1B},
        Layout{.pp = 2, .schedule = k1F1B, .micro_batch_size = 8},  // m = 1 < pp
        Layout{.pp = 2, .schedule = kGpipe},
        Layout{.pp = 2, .vpp = 2, .schedule = kInterleaved},
        Layout{.pp = 2, .vpp = 2, .schedule = kInterleaved, .micro_batch_size = 4},  // m = pp
        // Case C6: pp = 4 with m = 1 and m = 2.
        Layout{.pp = 4, .schedule = k1F1B, .micro_batch_size = 8},
        Layout{.pp = 4, .schedule = k1F1B, .micro_batch_size = 4},
        // Data parallelism and every ZeRO stage.
        Layout{.dp = 2, .zero = 0},
        Layout{.dp = 2, .zero = 1},
        Layout{.dp = 2, .zero = 2},
        Layout{.dp = 2, .zero = 3},
        Layout{.dp = 2, .zero = 3, .micro_batch_size = 4},  // m = 1
        // Case C2: an alignment larger than most units leaves dp rank 1 with
        // empty shards (all padding) that still take part in every collective.
        Layout{.dp = 2, .zero = 2, .alignment = 8192},
        Layout{.dp = 2, .zero = 3, .alignment = 8192},
        // Everything together.
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .schedule = k1F1B, .micro_batch_size = 1},
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 3, .schedule = kGpipe},
        Layout{.tp = 2, .pp = 2, .vpp = 2, .dp = 2, .zero = 2, .schedule = kInterleaved,
               .micro_batch_size = 2},
        Layout{.tp = 2, .dp = 2, .zero = 3},
        Layout{.pp = 2, .vpp = 2, .dp = 2, .zero = 3, .schedule = kInterleaved,
               .micro_batch_size = 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.Name(); });

}  // namespace
}  // namespace shardline::worker::train

#include "plan/memory.h"

#include "gtest/gtest.h"
#include "plan/plan.h"

namespace shardline::plan {
namespace {

// Rajbhandari et al., SC'20, Figure 1: Psi = 7.5B, N_d = 64, K = 12 (mixed
// precision): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB for stages 0-3.
TEST(MemoryTest, ZeroPaperFigure1) {
  const int64_t psi = 7'500'000'000;
  const int64_t expected[] = {120'000'000'000, 31'406'250'000, 16'640'625'000, 1'875'000'000};
  for (int stage = 0; stage <= 3; ++stage) {
    ParallelConfig p;
    p.dp = 64;
    p.zero_stage = stage;
    p.precision = Precision::kMixed;
    const auto m = EstimateFromParameterCount(psi, p);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->total(), expected[stage]) << "stage " << stage;
  }
}

TEST(MemoryTest, Fp32BytesAndModelParallelSplit) {
  ParallelConfig p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 4;
  p.zero_stage = 2;
  const auto m = EstimateFromParameterCount(1000, p);  // 250 per model-parallel rank
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->params, 250 * 4);
  EXPECT_EQ(m->grads, 63 * 4);      // ceil(250 / 4) elements
  EXPECT_EQ(m->optimizer, 63 * 8);
  EXPECT_EQ(EstimateFromParameterCount(0, p).status().code(), absl::StatusCode::kInvalidArgument);
  p.tp = 0;
  EXPECT_EQ(EstimateFromParameterCount(10, p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryTest, ExactPerRankMatchesParameterCountOnOneRank) {
  const GptConfig model{4, 128, 4, 0, 256, 64};
  const auto plan = MakePlan(model, ParallelConfig{});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->memory.size(), 1u);
  EXPECT_EQ(plan->memory[0].params, 4 * GptParameterCount(model));
  EXPECT_EQ(plan->memory[0].total(), 16 * GptParameterCount(model));
}

TEST(MemoryTest, ExactPerRankCountsTiedCopyAndPaddedShards) {
  const GptConfig model{2, 8, 2, 0, 16, 4};
  ParallelConfig p;
  p.pp = 2;
  p.dp = 3;
  p.zero_stage = 3;
  p.zero_alignment = 4;
  const auto plan = MakePlan(model, p);
  ASSERT_TRUE(plan.ok());
  // Sum of padded shards of the rank's units, 4 bytes per element for each kind.
  for (int rank = 0; rank < 6; ++rank) {
    const RankCoordinates c = plan->topology.CoordinatesOf(rank);
    int64_t elems = 0;
    for (const Unit& u : plan->zero.units) {
      if (u.pp_rank == c.pp_rank) elems += u.padded / 3;
    }
    EXPECT_EQ(plan->memory[rank].params, 4 * elems);
    EXPECT_EQ(plan->memory[rank].optimizer, 8 * elems);
  }
  // The last stage holds the tied head copy (V*h = 128 elements).
  int64_t stage_sum = 0;
  for (const Unit& u : plan->zero.units) stage_sum += u.numel;
  EXPECT_EQ(stage_sum, GptParameterCount(model) + 16 * 8);
}

}  // namespace
}  // namespace shardline::plan

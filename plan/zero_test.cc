#include "plan/zero.h"

#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan.h"

namespace shardline::plan {
namespace {

using ::testing::HasSubstr;

std::vector<ShardRange> Shards(int64_t n, int dp, int64_t a) {
  std::vector<ShardRange> out;
  for (int r = 0; r < dp; ++r) out.push_back(ShardOf(n, dp, a, r));
  return out;
}

// Case C1: N=57, D=2, A=1 and A=2.
TEST(ShardTest, C1ShardSizesThatDoNotDivide) {
  EXPECT_EQ(PaddedNumel(57, 2, 1), 58);
  EXPECT_EQ(Shards(57, 2, 1), (std::vector<ShardRange>{{0, 29}, {29, 57}}));
  EXPECT_EQ(PaddedNumel(57, 2, 2), 60);
  EXPECT_EQ(Shards(57, 2, 2), (std::vector<ShardRange>{{0, 30}, {30, 57}}));
  EXPECT_EQ(Shards(57, 2, 2)[1].size(), 27);  // 27 real + 3 padding
}

// Case C1 sweep: N in {1, D-1, D+1, 2D-1} x D in {2, 3, 4} (and alignments):
// the real parts re-join to the original values bit for bit.
TEST(ShardTest, C1SweepRejoinsBitForBit) {
  for (int dp : {2, 3, 4}) {
    for (int64_t n : {int64_t{1}, int64_t{dp - 1}, int64_t{dp + 1}, int64_t{2 * dp - 1}}) {
      for (int64_t a : {1, 2, 3, 16}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " D=" << dp << " A=" << a);
        const int64_t padded = PaddedNumel(n, dp, a);
        EXPECT_EQ(padded % (dp * a), 0);
        EXPECT_GE(padded, n);
        EXPECT_LT(padded - n, dp * a);
        std::vector<float> values(n);
        for (int64_t i = 0; i < n; ++i) values[i] = 0.1f * static_cast<float>(i) - 3.7f;
        std::vector<float> rejoined;
        int64_t next = 0, real = 0;
        for (const ShardRange& s : Shards(n, dp, a)) {
          EXPECT_EQ(s.begin, next);  // contiguous, no overlap
          EXPECT_LE(s.size(), padded / dp);
          rejoined.insert(rejoined.end(), values.begin() + s.begin, values.begin() + s.end);
          next = s.end;
          real += s.size();
        }
        EXPECT_EQ(real, n);
        EXPECT_EQ(0, std::memcmp(rejoined.data(), values.data(), n * sizeof(float)));
      }
    }
  }
}

// Case C2: fewer elements than ranks.
TEST(ShardTest, C2FewerElementsThanRanks) {
  EXPECT_EQ(Shards(3, 4, 1), (std::vector<ShardRange>{{0, 1}, {1, 2}, {2, 3}, {3, 3}}));
  const auto big = Shards(32, 2048, 1);
  for (int r = 0; r < 2048; ++r) EXPECT_EQ(big[r].size(), r < 32 ? 1 : 0) << r;
  EXPECT_EQ(big[31], (ShardRange{31, 32}));
  EXPECT_EQ(PaddedNumel(32, 2048, 1), 2048);
  // Planning with empty shards: rank 3 of N=3, D=4 holds no piece; the
  // others one element each; the padded shard (1 element) is the same on all.
  const Unit small = MakeUnit("u", {{"p", 3}}, 4, 1);
  EXPECT_EQ(small.padded, 4);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(OwnedPieces(small, r).size(), 1u);
    EXPECT_EQ(OwnedPieces(small, r)[0].local_range, (ShardRange{r, r + 1}));
  }
  EXPECT_TRUE(OwnedPieces(small, 3).empty());
  const Unit wide = MakeUnit("u", {{"p", 32}}, 2048, 1);
  EXPECT_EQ(OwnedPieces(wide, 31)[0].local_range, (ShardRange{31, 32}));
  EXPECT_TRUE(OwnedPieces(wide, 32).empty());
  EXPECT_TRUE(OwnedPieces(wide, 2047).empty());
  // An empty unit: every rank empty, nothing padded.
  EXPECT_EQ(PaddedNumel(0, 4, 8), 0);
  EXPECT_EQ(Shards(0, 4, 8), (std::vector<ShardRange>(4, ShardRange{0, 0})));
}

std::vector<std::tuple<std::string, int64_t, int64_t>> Owned(const Unit& u, int r) {
  std::vector<std::tuple<std::string, int64_t, int64_t>> out;
  for (const OwnedPiece& p : OwnedPieces(u, r)) {
    out.emplace_back(p.parameter, p.local_range.begin, p.local_range.end);
  }
  return out;
}

// Case C3: zero-size parameters.
TEST(ShardTest, C3ZeroSizeParameters) {
  const Unit a = MakeUnit("u", {{"p0", 8}, {"p1", 0}, {"p2", 24}}, 2, 1);
  EXPECT_EQ(a.numel, 32);
  EXPECT_EQ(a.shards[0], (ShardRange{0, 16}));
  using T = std::vector<std::tuple<std::string, int64_t, int64_t>>;
  EXPECT_EQ(Owned(a, 0), (T{{"p0", 0, 8}, {"p2", 0, 8}}));
  EXPECT_EQ(Owned(a, 1), (T{{"p2", 8, 24}}));

  const Unit b = MakeUnit("u", {{"p0", 16}, {"p1", 4}, {"p2", 0}}, 2, 1);
  EXPECT_EQ(b.padded / 2, 10);
  EXPECT_EQ(Owned(b, 0), (T{{"p0", 0, 10}}));
  EXPECT_EQ(Owned(b, 1), (T{{"p0", 10, 16}, {"p1", 0, 4}}));
  EXPECT_EQ(b.pieces[2].offset, 20);  // = N: belongs to no rank
}

// Case C4: padding never reaches the checkpoint.
TEST(ShardTest, C4PaddingNeverReachesTheCheckpoint) {
  const Unit u = MakeUnit("u", {{"w", 100}}, 8, 16);
  EXPECT_EQ(u.padded, 128);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(u.shards[r], (ShardRange{16 * r, 16 * r + 16}));
  EXPECT_EQ(u.shards[6], (ShardRange{96, 100}));
  EXPECT_EQ(u.shards[7].size(), 0);
  EXPECT_TRUE(OwnedPieces(u, 7).empty());  // rank 7 writes nothing
  std::vector<int> covered(u.numel, 0);
  for (int r = 0; r < 8; ++r) {
    for (const OwnedPiece& p : OwnedPieces(u, r)) {
      for (int64_t i = p.local_range.begin; i < p.local_range.end; ++i) ++covered[i];
    }
  }
  EXPECT_EQ(covered, std::vector<int>(100, 1));  // exactly [0,100): no overlap, no overhang
}

TEST(ShardTest, StagesShardTheRightKinds) {
  EXPECT_FALSE(IsSharded(StateKind::kOptimizerState, 0));
  EXPECT_TRUE(IsSharded(StateKind::kOptimizerState, 1));
  EXPECT_FALSE(IsSharded(StateKind::kGrad, 1));
  EXPECT_TRUE(IsSharded(StateKind::kGrad, 2));
  EXPECT_FALSE(IsSharded(StateKind::kParam, 2));
  EXPECT_TRUE(IsSharded(StateKind::kParam, 3));
}

// A small model where every number below was worked out by hand:
// L=2, h=8, a=2, f=32, V=16, s=4; tp=2, pp=2, dp=2, zero_stage=1.
class OwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel_.tp = 2;
    parallel_.pp = 2;
    parallel_.dp = 2;
    parallel_.zero_stage = 1;
    auto plan = MakePlan(model_, parallel_);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = std::make_unique<Plan>(*std::move(plan));
  }
  std::vector<Holder> Owners(absl::string_view name, std::optional<int64_t> element) {
    auto owners = FindOwners(plan_->zero, plan_->topology, plan_->parameters, name, element);
    EXPECT_TRUE(owners.ok()) << owners.status();
    return owners.ok() ? *owners : std::vector<Holder>{};
  }
  GptConfig model_{2, 8, 2, 0, 16, 4};
  ParallelConfig parallel_;
  std::unique_ptr<Plan> plan_;
};

TEST_F(OwnerTest, UnitLayoutByHand) {
  const Unit* layer1 = nullptr;
  for (const Unit& u : plan_->zero.units) {
    if (u.name == "layers.1" && u.tp_rank == 1) layer1 = &u;
  }
  ASSERT_NE(layer1, nullptr);
  EXPECT_EQ(layer1->pp_rank, 1);
  // 8+8 (ln) + 96 (qkv.w/2) + 12 (qkv.b/2) + 32 (dense.w/2) + 8 (dense.b)
  // + 8+8 (ln) + 128 (fc1.w/2) + 16 (fc1.b/2) + 128 (fc2.w/2) + 8 (fc2.b)
  EXPECT_EQ(layer1->numel, 460);
  EXPECT_EQ(layer1->pieces[8].parameter, "layers.1.mlp.fc1.weight");
  EXPECT_EQ(layer1->pieces[8].offset, 180);
  EXPECT_EQ(layer1->shards[1], (ShardRange{230, 460}));
}

TEST_F(OwnerTest, ElementOfAColumnParallelWeight) {
  // fc1.weight is [32, 8] split on dim 0: element 200 = row 25, col 0 → tp
  // rank 1, local offset 9*8 = 72, unit offset 180 + 72 = 252 → dp rank 1
  // (shard [230, 460)). zero_stage 1: params and grads on both dp ranks
  // (global ranks 5 and 7), optimizer state only on dp rank 1 (rank 7).
  const auto owners = Owners("layers.1.mlp.fc1.weight", 200);
  std::vector<std::pair<std::string, int>> got;
  for (const Holder& h : owners) {
    got.emplace_back(std::string(StateKindName(h.kind)), h.rank);
    EXPECT_EQ(h.unit, "layers.1");
    EXPECT_EQ(h.unit_range, (ShardRange{252, 253}));
    EXPECT_EQ(h.local_range, (ShardRange{72, 73}));
    EXPECT_EQ(h.coordinates.tp_rank, 1);
    EXPECT_EQ(h.coordinates.pp_rank, 1);
  }
  EXPECT_EQ(got, (std::vector<std::pair<std::string, int>>{
                     {"param", 5}, {"param", 7}, {"grad", 5}, {"grad", 7}, {"optimizer", 7}}));
}

TEST_F(OwnerTest, ElementOfARowParallelWeight) {
  // dense.weight is [8, 8] split on dim 1: element 13 = row 1, col 5 → tp
  // rank 1, local (1 * 4 + 1) = 5.
  const auto owners = Owners("layers.0.attention.dense.weight", 13);
  ASSERT_FALSE(owners.empty());
  for (const Holder& h : owners) {
    EXPECT_EQ(h.coordinates.tp_rank, 1);
    EXPECT_EQ(h.local_range, (ShardRange{5, 6}));
  }
}

TEST_F(OwnerTest, TiedWordEmbeddingHasACopyOnTheLastStage) {
  const auto owners = Owners("embedding.word_embeddings.weight", 0);
  int first_stage = 0, tied = 0;
  for (const Holder& h : owners) {
    EXPECT_EQ(h.coordinates.tp_rank, 0);  // row 0 of a vocab-parallel table
    if (h.tied_copy) {
      EXPECT_EQ(h.unit, "head");
      EXPECT_EQ(h.coordinates.pp_rank, 1);
      ++tied;
    } else {
      EXPECT_EQ(h.unit, "embedding");
      EXPECT_EQ(h.coordinates.pp_rank, 0);
      ++first_stage;
    }
  }
  EXPECT_EQ(first_stage, 5);  // 2 param + 2 grad + 1 optimizer
  EXPECT_EQ(tied, 5);
}

TEST_F(OwnerTest, WholeParameterPiecesCoverItExactlyOncePerKindAndCopy) {
  // A replicated parameter: every tp rank holds the whole [8] vector.
  for (const std::string name : {"layers.0.input_layernorm.weight", "layers.1.mlp.fc2.weight"}) {
    const auto owners = Owners(name, std::nullopt);
    std::map<std::pair<int, int>, int64_t> optimizer_elems;  // (tp_rank, pp_rank) → elements
    for (const Holder& h : owners) {
      if (h.kind == StateKind::kOptimizerState) {
        optimizer_elems[{h.coordinates.tp_rank, h.coordinates.pp_rank}] += h.local_range.size();
      }
    }
    for (const auto& [slice, n] : optimizer_elems) {
      EXPECT_EQ(n, name == "layers.1.mlp.fc2.weight" ? 128 : 8) << name;
    }
  }
}

TEST_F(OwnerTest, ErrorsNameTheProblem) {
  auto unknown = FindOwners(plan_->zero, plan_->topology, plan_->parameters, "layers.9.foo", {});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("layers.9.foo"));
  auto out_of_range = FindOwners(plan_->zero, plan_->topology, plan_->parameters,
                                 "final_layernorm.bias", 8);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out_of_range.status().message()), HasSubstr("choose element in [0, 8)"));
}

TEST(OwnerStageTest, StageThreeShardsEverythingStageZeroNothing) {
  const GptConfig model{1, 8, 2, 0, 16, 4};
  for (int stage : {0, 3}) {
    ParallelConfig p;
    p.dp = 4;
    p.zero_stage = stage;
    const auto plan = MakePlan(model, p);
    ASSERT_TRUE(plan.ok());
    const auto owners =
        FindOwners(plan->zero, plan->topology, plan->parameters, "final_layernorm.weight", 3);
    ASSERT_TRUE(owners.ok());
    EXPECT_EQ(owners->size(), stage == 0 ? 12u : 3u);  // 3 kinds x (4 ranks | 1 rank)
  }
}

}  // namespace
}  // namespace shardline::plan

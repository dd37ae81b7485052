#include "plan/model.h"

#include <cmath>
#include <numeric>
#include <set>

#include "gtest/gtest.h"

namespace shardline::plan {
namespace {

int64_t SumOfShapes(const std::vector<ParameterSpec>& params) {
  int64_t n = 0;
  for (const ParameterSpec& p : params) n += p.numel();
  return n;
}

TEST(ModelTest, ParameterCountEqualsSumOfShapes) {
  const GptConfig configs[] = {
      {4, 128, 4, 0, 256, 64},       // nanoGPT's CPU recipe
      {1, 8, 2, 0, 16, 4},           // tiny
      {3, 48, 6, 100, 97, 33},       // odd sizes, explicit ffn
      {12, 768, 12, 0, 50257, 1024}  // GPT-2 small
  };
  for (const GptConfig& m : configs) {
    const auto params = GptParameters(m);
    ASSERT_TRUE(params.ok()) << params.status();
    EXPECT_EQ(SumOfShapes(*params), GptParameterCount(m));
    EXPECT_EQ(params->size(), 4 + 12 * static_cast<size_t>(m.num_layers));
  }
}

TEST(ModelTest, KnownModelSizes) {
  // GPT-2 small (tied head): 124,439,808 parameters.
  EXPECT_EQ(GptParameterCount({12, 768, 12, 0, 50257, 1024}), 124439808);
  // The nanoGPT CPU recipe on bytes: 4 layers, width 128, context 64.
  EXPECT_EQ(GptParameterCount({4, 128, 4, 0, 256, 64}), 834304);
}

TEST(ModelTest, NamesAreUniqueAndShapesAndSplitsFollowMegatron) {
  const auto params = GptParameters({2, 8, 2, 0, 16, 4});
  ASSERT_TRUE(params.ok());
  std::set<std::string> names;
  for (const ParameterSpec& p : *params) EXPECT_TRUE(names.insert(p.name).second) << p.name;
  auto find = [&](const std::string& name) {
    for (const ParameterSpec& p : *params) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << name;
    return ParameterSpec{};
  };
  EXPECT_EQ(find("embedding.word_embeddings.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(find("embedding.word_embeddings.weight").tp_split_dim, 0);
  EXPECT_EQ(find("embedding.position_embeddings.weight").tp_split_dim, -1);
  EXPECT_EQ(find("layers.1.attention.qkv.weight").shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(find("layers.1.attention.qkv.weight").tp_split_dim, 0);
  EXPECT_EQ(find("layers.1.attention.qkv.weight").layer, 1);
  EXPECT_EQ(find("layers.0.attention.dense.weight").tp_split_dim, 1);
  EXPECT_EQ(find("layers.0.attention.dense.bias").tp_split_dim, -1);
  EXPECT_EQ(find("layers.0.mlp.fc1.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(find("layers.0.mlp.fc1.bias").tp_split_dim, 0);
  EXPECT_EQ(find("layers.0.mlp.fc2.weight").shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(find("layers.0.mlp.fc2.weight").tp_split_dim, 1);
  EXPECT_EQ(find("final_layernorm.bias").role, ParameterRole::kHead);
  const ParameterSpec fc2 = find("layers.0.mlp.fc2.weight");
  EXPECT_EQ(fc2.local_shape(4), (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(fc2.local_numel(4), 64);
  EXPECT_EQ(find("final_layernorm.weight").local_numel(4), 8);
}

TEST(ModelTest, InvalidModelIsRejected) {
  EXPECT_EQ(GptParameters({0, 8, 2, 0, 16, 4}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Narayanan et al., SC'21, Eq. (3): with f = 4h the general count must equal
// the paper's closed forms.
TEST(ModelTest, FlopsMatchNarayananEquation3) {
  const GptConfig configs[] = {{96, 12288, 96, 0, 51200, 2048},  // GPT-3 175B (paper Table 1)
                               {4, 128, 4, 0, 256, 64}};
  for (const GptConfig& m : configs) {
    const double b = 1536, s = m.seq_length, l = m.num_layers, h = m.hidden_size,
                 v = m.vocab_size;
    const double with_recompute = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
    const double without = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
    EXPECT_NEAR(TrainingFlopsPerIteration(m, 1536, true) / with_recompute, 1.0, 1e-12);
    EXPECT_NEAR(TrainingFlopsPerIteration(m, 1536, false) / without, 1.0, 1e-12);
  }
}

TEST(ModelTest, FlopsScaleLinearlyInBatchAndUseFfnWidth) {
  const GptConfig m{2, 64, 4, 100, 256, 32};
  EXPECT_DOUBLE_EQ(TrainingFlopsPerIteration(m, 6, false),
                   3 * TrainingFlopsPerIteration(m, 2, false));
  // By hand: per layer and sample 8sh^2 + 4shf + 4s^2h; head 2shV; x3.
  const double s = 32, h = 64, f = 100, v = 256;
  const double expected = 3 * (2 * (8 * s * h * h + 4 * s * h * f + 4 * s * s * h) + 2 * s * h * v);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerIteration(m, 1, false), expected);
}

}  // namespace
}  // namespace shardline::plan

// The trainer's API: argument errors, parameters and samples that agree
// across layouts, validation loss, and ZeRO-3 gathering on request.
#include "worker/train/trainer.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/model.h"
#include "worker/train/test_util.h"

namespace shardline::worker::train {
namespace {

using ::testing::HasSubstr;

TrainingOptions Small(int tp, int pp, int dp, int zero, int micro_batches) {
  TrainingOptions o;
  o.model.num_layers = 2;
  o.model.hidden_size = 16;
  o.model.num_heads = 4;
  o.model.vocab_size = 256;
  o.model.seq_length = 16;
  o.parallel.tp = tp;
  o.parallel.pp = pp;
  o.parallel.dp = dp;
  o.parallel.zero_stage = zero;
  o.parallel.micro_batches = micro_batches;
  o.parallel.micro_batch_size = 2;
  o.learning_rate = {.learning_rate = 1e-2, .min_learning_rate = 1e-3, .warmup_steps = 1,
                     .total_steps = 10};
  o.adamw.weight_decay = 0.1;
  return o;
}

TEST(TrainerTest, CreateRejectsBadArgumentsNamingTheField) {
  const Corpus& corpus = testing::ShakespeareCorpus();
  TrainingOptions o = Small(1, 1, 1, 0, 1);
  RankGroups none;

  TrainingOptions bad_heads = o;
  bad_heads.model.num_heads = 3;
  EXPECT_THAT(Trainer::Create(bad_heads, none, &corpus).status().message(),
              HasSubstr("num_heads=3"));

  EXPECT_THAT(Trainer::Create(o, none, nullptr).status().message(), HasSubstr("corpus"));

  TrainingOptions dp2 = o;
  dp2.parallel.dp = 2;
  absl::Status missing = Trainer::Create(dp2, none, &corpus).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("groups.dp is null"));

  RankGroups out_of_range;
  out_of_range.coordinates.pp_rank = 1;
  EXPECT_THAT(Trainer::Create(o, out_of_range, &corpus).status().message(),
              HasSubstr("pp_rank=1"));

  TrainingOptions long_seq = o;
  long_seq.model.seq_length = 4096;
  absl::StatusOr<Corpus> tiny = Corpus::FromBytes(std::string(1000, 'a'), 0.1);
  ASSERT_TRUE(tiny.ok());
  EXPECT_THAT(Trainer::Create(long_seq, none, &*tiny).status().message(),
              HasSubstr("seq_length"));
}

// After a few steps, tp=2 x dp=2 under ZeRO-3 holds the same weights as one
// rank: the tp slices put together equal the single-rank tensor.
TEST(TrainerTest, ParametersAgreeWithSingleRankAfterTraining) {
  constexpr int kSteps = 3;
  const std::string name = "layers.1.attention.qkv.weight";  // split along dim 0
  const std::string dense = "layers.0.attention.dense.weight";  // split along dim 1
  std::vector<float> single_qkv, single_dense;
  testing::Train(Small(1, 1, 1, 0, 4), kSteps, [&](int, Trainer& t) {
    single_qkv = *t.Parameter(name);
    single_dense = *t.Parameter(dense);
  });
  absl::Mutex mu;
  std::vector<std::vector<float>> qkv(4), dns(4);
  testing::Train(Small(2, 1, 2, 3, 2), kSteps, [&](int rank, Trainer& t) {
    absl::StatusOr<std::vector<float>> a = t.Parameter(name);
    absl::StatusOr<std::vector<float>> b = t.Parameter(dense);
    ASSERT_TRUE(a.ok() && b.ok());
    absl::MutexLock lock(&mu);
    qkv[rank] = *a;
    dns[rank] = *b;
  });
  // Ranks 2 and 3 (dp rank 1) gather the same values under ZeRO-3.
  EXPECT_EQ(qkv[2], qkv[0]);
  EXPECT_EQ(qkv[3], qkv[1]);
  EXPECT_EQ(dns[3], dns[1]);
  ASSERT_EQ(single_qkv.size(), qkv[0].size() + qkv[1].size());
  // dim 0 split: rows of tp rank 0, then rows of tp rank 1.
  std::vector<float> joined = qkv[0];
  joined.insert(joined.end(), qkv[1].begin(), qkv[1].end());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < joined.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(single_qkv[i]));
    max_diff = std::max(max_diff, std::abs(single_qkv[i] - joined[i]));
  }
  EXPECT_GT(max_abs, 0.01f);
  EXPECT_LT(max_diff, 1e-4f * max_abs);
  // dim 1 split of a [16, 16] weight: each row is 8 columns of tp 0, then 8 of tp 1.
  ASSERT_EQ(single_dense.size(), 256u);
  max_diff = 0;
  for (int row = 0; row < 16; ++row) {
    for (int col = 0; col < 16; ++col) {
      const float got = dns[col / 8][row * 8 + col % 8];
      max_diff = std::max(max_diff, std::abs(single_dense[row * 16 + col] - got));
    }
  }
  EXPECT_LT(max_diff, 1e-5f);
}

TEST(TrainerTest, ParameterNotOnThisStageIsNotFound) {
  testing::Train(Small(1, 2, 1, 0, 2), 1, [&](int rank, Trainer& t) {
    absl::Status s = t.Parameter(rank == 0 ? "layers.1.mlp.fc1.weight" : "layers.0.mlp.fc1.weight")
                         .status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), HasSubstr("pp rank"));
    // The last stage keeps the tied copy of the word embedding.
    EXPECT_TRUE(t.Parameter("embedding.word_embeddings.weight").ok());
  });
}

// Validation loss and samples are the same on every rank and layout.
TEST(TrainerTest, ValidationAndSamplesAgreeAcrossLayouts) {
  absl::Mutex mu;
  std::vector<double> losses;
  std::vector<std::string> texts;
  auto probe = [&](int, Trainer& t) {
    absl::StatusOr<double> v = t.EvaluateValidation(16);
    ASSERT_TRUE(v.ok()) << v.status();
    absl::StatusOr<std::string> text = t.Sample("To be", 12, 0.8, 7);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(text->size(), 12u);
    absl::MutexLock lock(&mu);
    losses.push_back(*v);
    texts.push_back(*text);
  };
  testing::Train(Small(1, 1, 1, 0, 4), 2, probe);
  testing::Train(Small(2, 2, 2, 2, 2), 2, probe);
  ASSERT_EQ(losses.size(), 9u);
  for (size_t i = 1; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], losses[0], 1e-4 * losses[0]) << i;
    EXPECT_EQ(texts[i], texts[0]) << i;
  }
  // An untrained byte model is near log(256) = 5.55 nats.
  EXPECT_GT(losses[0], 4.0);
  EXPECT_LT(losses[0], 6.0);
}

TEST(TrainerTest, SampleRejectsEmptyPrompt) {
  testing::Train(Small(1, 1, 1, 0, 1), 0, [&](int, Trainer& t) {
    EXPECT_EQ(t.Sample("", 4, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t.Sample("x", -1, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace shardline::worker::train

namespace shardline::worker::train {
namespace {

// One rank's wish to checkpoint after a step becomes every rank's decision
// at that same step (the drain protocol relies on it).
TEST(TrainerTest, CheckpointRequestIsAgreedByEveryRank) {
  TrainingOptions o = Small(2, 2, 2, 1, 1);
  absl::Mutex mu;
  std::map<int, std::vector<bool>> seen;
  absl::Status s = RunLocalCluster(o.parallel, [&](int rank, const RankGroups& g) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Trainer>> t =
        Trainer::Create(o, g, &testing::ShakespeareCorpus());
    if (!t.ok()) return t.status();
    for (int step = 0; step < 3; ++step) {
      // Only rank 5 asks, and only at step 1.
      absl::StatusOr<StepStats> st = (*t)->TrainStep(rank == 5 && step == 1);
      if (!st.ok()) return st.status();
      absl::MutexLock lock(&mu);
      seen[rank].push_back(st->checkpoint_requested);
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(seen.size(), 8u);
  for (const auto& [rank, flags] : seen) {
    EXPECT_EQ(flags, (std::vector<bool>{false, true, false})) << "rank " << rank;
  }
}

}  // namespace
}  // namespace shardline::worker::train

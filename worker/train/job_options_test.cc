#include "worker/train/job_options.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace shardline::worker::train {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec() {
  v1::JobSpec s;
  s.set_name("t");
  s.mutable_model()->set_num_layers(4);
  s.mutable_model()->set_hidden_size(128);
  s.mutable_model()->set_num_heads(4);
  s.mutable_model()->set_vocab_size(256);
  s.mutable_model()->set_seq_length(64);
  s.mutable_parallel()->set_tp(1);
  s.mutable_parallel()->set_pp(2);
  s.mutable_parallel()->set_zero_stage(2);
  s.mutable_training()->set_global_batch(24);
  s.mutable_training()->set_micro_batch(3);
  s.mutable_training()->set_train_steps(2000);
  s.mutable_training()->set_learning_rate(1e-3);
  s.mutable_training()->set_min_learning_rate(1e-4);
  s.mutable_training()->set_warmup_steps(100);
  s.mutable_training()->set_adam_beta2(0.99);
  s.mutable_training()->set_weight_decay(0.1);
  s.mutable_training()->set_grad_clip(1.0);
  s.mutable_training()->set_seed(42);
  s.mutable_data()->set_dataset_path("data/tinyshakespeare.txt");
  return s;
}

TEST(JobOptionsTest, TakesModelLayoutAndOptimizerFromTheSpec) {
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(Spec());
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainingOptions> o = TrainingOptionsFromSpec(*spec, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model.hidden_size, 128);
  EXPECT_EQ(o->model.ffn(), 512);
  EXPECT_EQ(o->parallel.pp, 2);
  EXPECT_EQ(o->parallel.dp, 2);
  EXPECT_EQ(o->parallel.zero_stage, 2);
  EXPECT_EQ(o->parallel.micro_batch_size, 3);
  EXPECT_EQ(o->parallel.micro_batches, 4);  // 24 / (3 * 2)
  EXPECT_EQ(o->parallel.global_batch(), 24);
  EXPECT_EQ(o->seed, 42u);
  EXPECT_EQ(o->learning_rate.total_steps, 2000);
  EXPECT_EQ(o->learning_rate.warmup_steps, 100);
  EXPECT_DOUBLE_EQ(o->adamw.beta1, 0.9);  // 0 in the spec means the default
  EXPECT_DOUBLE_EQ(o->adamw.beta2, 0.99);
  EXPECT_DOUBLE_EQ(o->adamw.epsilon, 1e-8);
  EXPECT_DOUBLE_EQ(o->grad_clip, 1.0);
}

TEST(JobOptionsTest, DpThatDoesNotDivideTheBatchIsRejected) {
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(Spec());
  ASSERT_TRUE(spec.ok());
  absl::Status s = TrainingOptionsFromSpec(*spec, 3).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dp=3"));
  EXPECT_THAT(s.message(), HasSubstr("global_batch=24"));
}

TEST(JobOptionsTest, Bf16IsAcceptedAndReachesTheTrainer) {
  v1::JobSpec raw = Spec();
  raw.mutable_training()->set_precision(v1::PRECISION_BF16);
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(raw);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainingOptions> o = TrainingOptionsFromSpec(*spec, 1);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->parallel.precision, plan::Precision::kMixed);
  raw.mutable_training()->set_precision(v1::PRECISION_FP32);
  spec = spec::ResolveJobSpec(raw);
  ASSERT_TRUE(spec.ok()) << spec.status();
  o = TrainingOptionsFromSpec(*spec, 1);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->parallel.precision, plan::Precision::kFp32);
}

}  // namespace
}  // namespace shardline::worker::train

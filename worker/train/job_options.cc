#include "worker/train/job_options.h"

#include "absl/strings/str_cat.h"
#include "spec/job_spec.h"

namespace shardline::worker::train {

absl::StatusOr<TrainingOptions> TrainingOptionsFromSpec(const v1::JobSpec& spec, int dp) {
  const v1::TrainingConfig& t = spec.training();
  if (dp < 1 || t.micro_batch() == 0 || t.global_batch() % (uint64_t{t.micro_batch()} * dp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dp=", dp, " does not divide spec.training.global_batch=", t.global_batch(),
        " into micro-batches of spec.training.micro_batch=", t.micro_batch()));
  }
  if (t.precision() != v1::PRECISION_UNSPECIFIED && t.precision() != v1::PRECISION_FP32 &&
      t.precision() != v1::PRECISION_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.training.precision=", t.precision(),
                     " is not one the trainer runs; set precision: fp32 or bf16"));
  }
  TrainingOptions o;
  o.model = spec::ModelOf(spec);
  o.parallel = spec::ParallelOf(spec, dp);
  o.seed = t.seed();
  o.learning_rate.learning_rate = t.learning_rate();
  o.learning_rate.min_learning_rate = t.min_learning_rate();
  o.learning_rate.warmup_steps = static_cast<int64_t>(t.warmup_steps());
  o.learning_rate.total_steps = static_cast<int64_t>(t.train_steps());
  o.adamw.beta1 = t.adam_beta1() > 0 ? t.adam_beta1() : 0.9;
  o.adamw.beta2 = t.adam_beta2() > 0 ? t.adam_beta2() : 0.999;
  o.adamw.epsilon = t.adam_epsilon() > 0 ? t.adam_epsilon() : 1e-8;
  o.adamw.weight_decay = t.weight_decay();
  o.grad_clip = t.grad_clip();
  return o;
}

}  // namespace shardline::worker::train

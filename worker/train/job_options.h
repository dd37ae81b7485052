// The trainer's options from a job spec (proto/shardline/v1/job.proto).
//
//   absl::StatusOr<v1::JobSpec> spec = server::ResolveJobSpec(raw);
//   absl::StatusOr<TrainingOptions> o = TrainingOptionsFromSpec(*spec, /*dp=*/2);
//
// Pure function; thread-safe.
#ifndef SHARDLINE_WORKER_TRAIN_JOB_OPTIONS_H_
#define SHARDLINE_WORKER_TRAIN_JOB_OPTIONS_H_

#include "absl/status/statusor.h"
#include "shardline/v1/job.pb.h"
#include "worker/train/trainer.h"

namespace shardline::worker::train {

// Model and layout as the coordinator plans them at `dp` (micro_batches =
// global_batch / (micro_batch * dp)), optimizer settings with the proto's
// defaults for zeros (beta1 0.9, beta2 0.999, epsilon 1e-8), the cosine
// ending at train_steps. `spec` must be resolved (server::ResolveJobSpec).
// Errors: InvalidArgument when dp does not divide the global batch in
// micro-batches (names both) or the precision is not fp32.
absl::StatusOr<TrainingOptions> TrainingOptionsFromSpec(const v1::JobSpec& spec, int dp);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_JOB_OPTIONS_H_

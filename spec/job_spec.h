// Job specs: validation with errors that name the spec field, defaults, and
// the planner's view of one generation.
//
//   absl::StatusOr<v1::JobSpec> spec = ResolveJobSpec(request.spec());
//   std::optional<int> dp = ChooseDp(*spec, /*available_workers=*/7);
//   absl::StatusOr<plan::Plan> plan = PlanGeneration(*spec, *dp);
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_SPEC_JOB_SPEC_H_
#define SHARDLINE_SPEC_JOB_SPEC_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/text.h"
#include "plan/plan.h"
#include "shardline/v1/job.pb.h"

namespace shardline::spec {

// Defaults applied to unset (zero) fields, as job.proto documents.
inline constexpr absl::Duration kDefaultHeartbeatInterval = absl::Seconds(5);
inline constexpr absl::Duration kDefaultHeartbeatTimeout = absl::Seconds(30);
inline constexpr absl::Duration kDefaultJoinTimeout = absl::Minutes(10);
inline constexpr absl::Duration kDefaultLastCall = absl::Seconds(10);
inline constexpr absl::Duration kDefaultCollectiveTimeout = absl::Minutes(5);
// The longest heartbeat_timeout a job may set. The coordinator's keepalive
// timeout is longer (ServerOptions), so a stalled worker is judged by its
// job's heartbeat_timeout.
inline constexpr absl::Duration kMaxHeartbeatTimeout = absl::Minutes(10);
// At most this many optimizer steps per job.
inline constexpr uint64_t kMaxTrainSteps = uint64_t{1} << 40;

// Limits on free text the coordinator stores and shardctl prints (bytes of
// UTF-8). Longer values are refused: one job must not make `job list` pad
// every row to megabytes, and an echoed value must fit a gRPC status.
inline constexpr size_t kMaxJobNameBytes = 128;   // spec.name, as job.proto says
inline constexpr size_t kMaxReasonBytes = 1024;   // CancelJob / DrainWorker reason
inline constexpr size_t kMaxPathBytes = 4096;     // PATH_MAX: dataset_path, checkpoint.directory

// Validates `spec` and returns it with defaults filled in:
//   model.ffn_hidden_size 0 → 4 * hidden_size; parallel.vpp 0 → 1;
//   parallel.schedule UNSPECIFIED → 1F1B (INTERLEAVED when vpp > 1);
//   parallel.zero_alignment 0 → 1; training.precision → FP32;
//   elastic.min_workers 0 → tp * pp; elastic.max_workers 0 → no cap
//   (plan::kMaxWorldSize);
//   elastic durations unset (or "0s", which proto3 cannot tell apart) → the
//   defaults above. spec.name: 1..128 bytes of printable text (CheckText);
//   data.dataset_path: non-empty, at most 4096 bytes, no control characters
//   (relative paths are the workers' business); checkpoint.directory: empty
//   or absolute without '..', at most 4096 bytes. Optimizer settings must be finite and in range
//   (learning rates, weight decay, grad clip >= 0; betas and
//   data.validation_fraction in [0, 1); min_learning_rate <= learning_rate).
// InvalidArgument names the field with its full path and what would be valid,
// e.g. "spec.parallel.tp=3 does not divide spec.model.num_heads=8; choose tp
// in {1, 2, 4, 8}", "spec.elastic.min_workers=2 < tp*pp=4",
// "spec.training.global_batch=10 is not a multiple of
// spec.training.micro_batch=4", or no dp in [min, max] workers that divides
// global_batch / micro_batch.
absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// The largest dp the job can run with `available` healthy workers:
// world = dp * tp * pp <= min(available, max_workers), world >= min_workers,
// dp divides global_batch / micro_batch (the global batch stays constant)
// and the pipeline schedule can run the resulting micro-batch count.
// nullopt when no dp fits. `spec` must be resolved.
std::optional<int> ChooseDp(const v1::JobSpec& spec, int available);

// The plan of a generation with `dp`: micro_batches = global_batch /
// (micro_batch * dp) per dp rank. `spec` must be resolved.
absl::StatusOr<plan::Plan> PlanGeneration(const v1::JobSpec& spec, int dp);

// The planner's configuration for a resolved spec at `dp`.
plan::GptConfig ModelOf(const v1::JobSpec& spec);
plan::ParallelConfig ParallelOf(const v1::JobSpec& spec, int dp);

}  // namespace shardline::spec

#endif  // SHARDLINE_SPEC_JOB_SPEC_H_

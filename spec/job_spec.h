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
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
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
// At most this many optimizer steps per job (also the bound of
// training.warmup_steps and checkpoint.interval_steps).
inline constexpr uint64_t kMaxTrainSteps = uint64_t{1} << 40;

// Bounds of the spec's durations (google.protobuf.Duration), after the
// defaults are applied. Each must first be a valid Duration (seconds within
// +-315576000000, nanos within +-999999999 with the seconds' sign), then:
//   heartbeat_interval  in [10 ms, 1 day]
//   heartbeat_timeout   in [max(2 x heartbeat_interval, 100 ms), 10 min]
//   join_timeout, last_call, collective_timeout  in [10 ms, 1 day]
// A shorter heartbeat timeout than two intervals (or the coordinator's
// ~100 ms tick) declares healthy workers lost and re-forms the job over and
// over.
inline constexpr absl::Duration kMinSpecDuration = absl::Milliseconds(10);
inline constexpr absl::Duration kMaxSpecDuration = absl::Hours(24);
inline constexpr absl::Duration kMinHeartbeatTimeout = absl::Milliseconds(100);
inline constexpr int kMinTimeoutIntervals = 2;

// Hang and straggler detection (job.proto ElasticPolicy, progress.proto):
//   progress_timeout   unset: automatic (server/progress_monitor.h: the
//                      larger of 30 s and 10 x the median step time), kept
//                      unset by ResolveJobSpec; 0 s: off; else 100 ms .. 24 h
//   hang_policy        UNSPECIFIED -> EVICT
//   straggler_factor   0 -> 1.5; else finite, > 1 and <= 100
//   straggler_window_steps  0 -> 10; else 3 .. 1000
//   straggler_min_excess    unset -> 5 ms; else 0 s (off) .. 10 min
//   straggler_policy   UNSPECIFIED -> REPORT
// An external job accepts them too (same checks) but is never judged: its
// agents send no progress reports (session.proto HeartbeatRequest.progress).
// The automatic progress timeout (progress_timeout unset), which the
// coordinator applies (server/progress_monitor.h) and shardctl job get
// describes: max(kMinAutoProgressTimeout, kAutoProgressStepFactor x the
// median of the ranks' latest step_time).
inline constexpr absl::Duration kMinAutoProgressTimeout = absl::Seconds(30);
inline constexpr int kAutoProgressStepFactor = 10;
inline constexpr absl::Duration kMinProgressTimeout = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxProgressTimeout = absl::Hours(24);
inline constexpr double kDefaultStragglerFactor = 1.5;
inline constexpr double kMaxStragglerFactor = 100;
inline constexpr uint32_t kDefaultStragglerWindowSteps = 10;
inline constexpr uint32_t kMinStragglerWindowSteps = 3;
inline constexpr uint32_t kMaxStragglerWindowSteps = 1000;
// A few of Linux's scheduler slices on a small host (a slice is ~3 ms on a
// 2-CPU machine): compute-time differences under it are noise.
inline constexpr absl::Duration kDefaultStragglerMinExcess = absl::Milliseconds(5);
inline constexpr absl::Duration kMaxStragglerMinExcess = absl::Minutes(10);

// Bounds of the spec's counts, checked before anything uses them (each in
// spec terms, printed unsigned): model sizes as the planner's limits
// (plan/config.h: num_layers <= 2^14, hidden_size, num_heads and
// ffn_hidden_size <= 2^22, vocab_size <= 2^31, seq_length <= 2^24);
// parallel.tp, pp and tp*pp <= plan::kMaxWorldSize (2^18), vpp <= 2^14,
// zero_stage <= 3, zero_alignment <= 2^20; training.micro_batch <= 2^24,
// global_batch <= 2^31 - 1, warmup_steps <= kMaxTrainSteps;
// checkpoint.interval_steps <= kMaxTrainSteps, keep_last <= kMaxKeepLast;
// elastic.min_workers and max_workers <= plan::kMaxWorldSize.
inline constexpr uint64_t kMaxGlobalBatch = (uint64_t{1} << 31) - 1;
inline constexpr uint64_t kMaxKeepLast = uint64_t{1} << 20;

// The largest spec accepted, serialized (unknown fields included).
inline constexpr size_t kMaxSerializedSpecBytes = size_t{1} << 20;

// Limits on free text the coordinator stores and shardctl prints (bytes of
// UTF-8). Longer values are refused: one job must not make `job list` pad
// every row to megabytes, and an echoed value must fit a gRPC status.
inline constexpr size_t kMaxJobNameBytes = 128;   // spec.name, as job.proto says
inline constexpr size_t kMaxReasonBytes = 1024;   // CancelJob / DrainWorker reason
inline constexpr size_t kMaxPathBytes = 4096;     // PATH_MAX: dataset_path, checkpoint.directory
inline constexpr size_t kMaxFrameworkBytes = 64;  // spec.external.framework, as job.proto says

// An external job (job.proto ExternalWorkload): spec.external is set. It
// has no model, plan or dp; its world is its nodes.
inline bool IsExternalJob(const v1::JobSpec& spec) { return spec.has_external(); }

// Validates `spec` and returns it with defaults filled in. First its shape:
// at most kMaxSerializedSpecBytes serialized; no unknown fields anywhere
// (fields this build does not know, e.g. from a newer client: refused,
// never stored);
// every enum a known value of its type (CheckEnumValue); every duration a
// valid google.protobuf.Duration; every count and duration within the
// bounds above. Then the defaults:
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
//
// The two kinds (job.proto JobSpec): a spec with spec.external set is an
// external job, resolved by its own rules: spec.model, parallel, training
// and data must be unset ("spec.model must be unset for an external job
// (spec.external is set)..."); spec.external.framework is 0..64 bytes of
// [a-z0-9._-]; spec.elastic.min_workers >= 1 (no default: the nodes to
// wait for), max_workers 0 → no cap (plan::kMaxWorldSize), else >=
// min_workers; the durations as above; spec.checkpoint.interval_steps must
// be 0 and async_save false (directory and keep_last as above). A spec with
// neither external nor model is refused ("spec.model is unset: ...").
absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// OK when `value` is a value of `type`; else InvalidArgument
// "<field>=<value> is not a <Type>; use one of NAME (n), ..., or leave it
// unset (NAME_UNSPECIFIED, 0) for the default".
absl::Status CheckEnumValue(absl::string_view field, const google::protobuf::EnumDescriptor* type,
                            int value);

// The largest dp the job can run with `available` healthy workers:
// world = dp * tp * pp <= min(available, max_workers), world >= min_workers,
// dp divides global_batch / micro_batch (the global batch stays constant)
// and the pipeline schedule can run the resulting micro-batch count.
// nullopt when no dp fits, and always for an external job (it has no dp).
// `spec` must be resolved.
std::optional<int> ChooseDp(const v1::JobSpec& spec, int available);

// The world size a generation gets with `available` healthy workers: for a
// GPT job ChooseDp(spec, available) * tp * pp; for an external job
// min(available, max_workers) when that is >= min_workers (and >= 1).
// nullopt when none fits. `spec` must be resolved.
std::optional<int> ChooseWorldSize(const v1::JobSpec& spec, int available);

// The plan of a generation with `dp`: micro_batches = global_batch /
// (micro_batch * dp) per dp rank. `spec` must be resolved.
absl::StatusOr<plan::Plan> PlanGeneration(const v1::JobSpec& spec, int dp);

// The planner's configuration for a resolved spec at `dp`.
plan::GptConfig ModelOf(const v1::JobSpec& spec);
plan::ParallelConfig ParallelOf(const v1::JobSpec& spec, int dp);

}  // namespace shardline::spec

#endif  // SHARDLINE_SPEC_JOB_SPEC_H_

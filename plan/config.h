// Model and parallel configuration shared by every part of the planner, and
// their validation.
//
//   GptConfig model{.num_layers = 4, .hidden_size = 128, .num_heads = 4,
//                   .vocab_size = 256, .seq_length = 64};
//   ParallelConfig parallel{.tp = 2, .pp = 2, .dp = 1};
//   absl::Status s = ValidateConfig(model, parallel);  // InvalidArgument if bad
//
// Pure values: no I/O, no globals. Thread-compatible.
#ifndef SHARDLINE_PLAN_CONFIG_H_
#define SHARDLINE_PLAN_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::plan {

// Limits that keep every plan small enough to build in memory and every
// product of sizes inside int64. Violations are InvalidArgument.
inline constexpr int64_t kMaxLayers = int64_t{1} << 14;
inline constexpr int64_t kMaxWidth = int64_t{1} << 22;      // hidden, heads, ffn (elements)
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;      // tokens
inline constexpr int64_t kMaxSeqLength = int64_t{1} << 24;  // tokens
inline constexpr int64_t kMaxParameters = int64_t{1} << 50;
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 18;          // tp * pp * dp
inline constexpr int64_t kMaxActionsPerRank = int64_t{1} << 16;     // micro_batches * vpp
inline constexpr int64_t kMaxScheduleActions = int64_t{1} << 22;    // pp * vpp * micro_batches
inline constexpr int64_t kMaxShardRanges = int64_t{1} << 20;        // tp * dp * (num_layers + 2)
inline constexpr int64_t kMaxMicroBatchSize = int64_t{1} << 24;     // samples
inline constexpr int64_t kMaxAlignment = int64_t{1} << 20;          // elements

// A GPT decoder (Radford et al. 2019): learned positions, pre-LayerNorm,
// causal multi-head attention, GELU MLP, word embedding tied to the output
// head. All sizes are element counts (not bytes).
struct GptConfig {
  int64_t num_layers = 0;       // transformer layers, >= 1
  int64_t hidden_size = 0;      // model width h, >= 1
  int64_t num_heads = 0;        // attention heads a; must divide hidden_size
  int64_t ffn_hidden_size = 0;  // MLP inner width f; 0 means 4 * hidden_size
  int64_t vocab_size = 0;       // V, tokens (256 for byte-level)
  int64_t seq_length = 0;       // s, tokens per sample (context length)

  // ffn_hidden_size with the 0 → 4h default applied.
  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
};

enum class ScheduleKind { kGpipe, kOneFOneB, kInterleaved };
enum class Precision {
  kFp32,   // fp32 params and grads, fp32 AdamW moments: 4 + 4 + 8 bytes/param
  kMixed,  // bf16 mixed precision ("mixed", also "bf16"). Planned as ZeRO's
           // 2 + 2 + 12 bytes/param (bf16 params and grads, fp32 master +
           // moments); the CPU trainer keeps fp32 grads (worker/train/bf16_device.h)
};

// "gpipe", "1f1b", "interleaved".
absl::string_view ScheduleName(ScheduleKind kind);
// Parses a schedule name. InvalidArgument names the valid choices.
absl::StatusOr<ScheduleKind> ParseSchedule(absl::string_view name);
// "fp32", "mixed". ParsePrecision also takes "bf16" for kMixed.
absl::string_view PrecisionName(Precision precision);
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

// How one job is spread over ranks. world_size = tp * pp * dp; ranks are laid
// out tp fastest, then dp, then pp (docs/ARCHITECTURE.md, "Rank layout").
struct ParallelConfig {
  int tp = 1;          // tensor-parallel degree
  int pp = 1;          // pipeline-parallel degree (stages)
  int dp = 1;          // data-parallel degree
  int vpp = 1;         // virtual pipeline chunks per pp rank (interleaved only)
  int zero_stage = 0;  // 0 plain DP, 1 optimizer states, 2 + grads, 3 + params
  int64_t zero_alignment = 1;  // ZeRO shard alignment, in elements, >= 1
  int micro_batches = 1;       // m: micro-batches per iteration per dp rank
  int64_t micro_batch_size = 1;  // samples per micro-batch
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  Precision precision = Precision::kFp32;

  int world_size() const { return tp * pp * dp; }
  // Samples per iteration over the whole job: micro_batch_size * m * dp.
  int64_t global_batch() const { return micro_batch_size * micro_batches * dp; }
};

// Checks the model alone. InvalidArgument naming the field and what would be
// valid, e.g. "num_heads=6 does not divide hidden_size=128; choose num_heads
// in {1, 2, 4, 8, 16, 32, 64, 128}".
absl::Status ValidateGptConfig(const GptConfig& model);

// Checks the parallel layout alone (degrees >= 1, zero_stage in 0..3, vpp > 1
// only with the interleaved schedule, ...). InvalidArgument as above.
absl::Status ValidateParallelConfig(const ParallelConfig& parallel);

// Both of the above, then how they fit together: tp divides num_heads,
// hidden_size, ffn_hidden_size and vocab_size; num_layers >= pp * vpp.
absl::Status ValidateConfig(const GptConfig& model, const ParallelConfig& parallel);

// Checks a world size given alongside the degrees: world_size must equal
// tp * pp * dp. InvalidArgument says which dp would fit, if any.
absl::Status ValidateWorldSize(int64_t world_size, const ParallelConfig& parallel);

// Rewrites field names in a validation message for another audience: each
// "from" that starts a word (at the start, or after ' ' or '(') becomes "to",
// e.g. {"hidden_size=", "--hidden="} for a CLI or {"hidden_size=",
// "spec.model.hidden_size="} for an API. Longer names must come before names
// they end with ("ffn_hidden_size=" before "hidden_size="). OK stays OK.
absl::Status RenameFields(const absl::Status& status,
                          const std::vector<std::pair<std::string, std::string>>& names);

// Divisors of n in increasing order, rendered "{1, 2, 4}"; used in messages
// that say which values would be valid.
std::string DivisorsOf(int64_t n);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_CONFIG_H_

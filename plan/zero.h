// ZeRO partitioning (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", SC'20): units, per-dp-rank shard
// ranges, per-parameter pieces, and the owner query.
//
//   ShardRange r = ShardOf(/*numel=*/57, /*dp=*/2, /*alignment=*/2, /*dp_rank=*/1);
//   // r = [30, 57): 27 real elements (+3 padding that is never saved)
//
// A unit is one flat buffer ZeRO shards as one piece: per (tp_rank, pp_rank)
// model-parallel slice, one "embedding" unit (chunk 0), one "layers.<i>" unit
// per transformer layer, and one "head" unit (last chunk). All offsets and
// sizes are element counts within the unit, never bytes.
// Pure functions; thread-safe.
#ifndef SHARDLINE_PLAN_ZERO_H_
#define SHARDLINE_PLAN_ZERO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "plan/config.h"
#include "plan/model.h"
#include "plan/pipeline.h"
#include "plan/topology.h"

namespace shardline::plan {

// Half-open element range [begin, end); empty when begin == end.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ShardRange& o) const { return begin == o.begin && end == o.end; }
};

// padded = ceil(numel / (dp * alignment)) * dp * alignment (docs/ARCHITECTURE.md "ZeRO
// shard rule"). Preconditions: numel >= 0, dp >= 1, alignment >= 1.
int64_t PaddedNumel(int64_t numel, int dp, int64_t alignment);

// The real elements dp rank `dp_rank` owns: [r*shard, min((r+1)*shard, numel))
// with shard = padded / dp, clamped to numel (possibly empty). The rest of
// the rank's shard is padding: it takes part in collectives but never
// appears in a checkpoint.
ShardRange ShardOf(int64_t numel, int dp, int64_t alignment, int dp_rank);

// A parameter's place inside a unit.
struct UnitPiece {
  std::string parameter;  // ParameterSpec::name
  int64_t offset = 0;     // first element of this parameter in the unit
  int64_t numel = 0;      // elements of the tp-local slice (may be 0)
  // True for the last stage's copy of the word embedding, the output head
  // tied to embedding.word_embeddings.weight when pp > 1 (Megatron-LM keeps a
  // copy there and all-reduces its gradient over the embedding group).
  bool tied_copy = false;
};

struct Unit {
  std::string name;  // "embedding", "layers.<i>", "head"
  int tp_rank = 0;
  int pp_rank = 0;
  int chunk = 0;           // pipeline chunk that uses it
  int64_t numel = 0;       // real elements: sum of the pieces' numel
  int64_t padded = 0;      // PaddedNumel(numel, dp, alignment)
  std::vector<UnitPiece> pieces;   // in offset order, contiguous from 0
  std::vector<ShardRange> shards;  // [dp_rank]: ShardOf(numel, dp, alignment, r)
};

// Builds one unit from its parameters' tp-local sizes, in order (a size may be
// 0: such a parameter occupies no range and belongs to no rank), and shards
// it over dp. Preconditions: sizes >= 0, dp >= 1, alignment >= 1.
Unit MakeUnit(std::string name, const std::vector<std::pair<std::string, int64_t>>& sizes, int dp,
              int64_t alignment);

// The part of one parameter a dp rank's shard holds.
struct OwnedPiece {
  std::string parameter;
  ShardRange unit_range;   // offsets in the unit
  ShardRange local_range;  // offsets in the parameter's tp-local slice
  bool tied_copy = false;
};

// The non-empty pieces of `unit` inside dp rank `dp_rank`'s shard, in
// offset order; empty for a rank whose shard is all padding.
std::vector<OwnedPiece> OwnedPieces(const Unit& unit, int dp_rank);

struct ZeroPlan {
  int dp = 1;
  int zero_stage = 0;
  int64_t alignment = 1;
  // Grouped by pp_rank, then tp_rank, then in forward order.
  std::vector<Unit> units;
};

// Lays out every (tp_rank, pp_rank) slice's units and shards them over dp.
// Errors: InvalidArgument from ValidateConfig.
absl::StatusOr<ZeroPlan> MakeZeroPlan(const GptConfig& model, const ParallelConfig& parallel,
                                      const PipelinePlan& pipeline);

// Whether zero_stage shards each kind of state over dp (stage 1: optimizer
// states; 2: + gradients; 3: + parameters).
enum class StateKind { kParam, kGrad, kOptimizerState };
absl::string_view StateKindName(StateKind kind);  // "param", "grad", "optimizer"
bool IsSharded(StateKind kind, int zero_stage);

// One place that holds (part of) a parameter's state.
struct Holder {
  StateKind kind = StateKind::kParam;
  int rank = 0;  // global rank
  RankCoordinates coordinates;
  std::string unit;
  ShardRange unit_range;   // elements of the unit held, within the parameter's piece
  ShardRange local_range;  // the same elements as offsets in the tp-local slice
  bool tied_copy = false;
};

// Which ranks hold parameter `name`'s params, grads and optimizer states.
// With `element` (an index into the global, unsplit tensor in row-major
// order) only the holders of that element are returned, each with a one-
// element range; without it, every piece on every rank. A kind that is not
// sharded under the plan's zero_stage is held whole by every dp rank.
// Errors: NotFound for an unknown name (names look like
// "layers.0.mlp.fc1.weight"); InvalidArgument when element is outside
// [0, numel). A zero-size parameter has no holders (empty result).
absl::StatusOr<std::vector<Holder>> FindOwners(const ZeroPlan& zero, const Topology& topology,
                                               const std::vector<ParameterSpec>& parameters,
                                               absl::string_view name,
                                               std::optional<int64_t> element);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_ZERO_H_

#include "plan/zero.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardline::plan {
namespace {

ShardRange Intersect(ShardRange a, ShardRange b) {
  const int64_t begin = std::max(a.begin, b.begin), end = std::min(a.end, b.end);
  return begin < end ? ShardRange{begin, end} : ShardRange{begin, begin};
}

// Maps an element of the global tensor (row-major) to the tp rank holding it
// and its offset in that rank's slice. For a tensor tp does not split, every
// tp rank holds it at the same offset; tp_rank is then -1.
struct ElementPlace {
  int tp_rank = -1;
  int64_t local = 0;
};

ElementPlace Locate(const ParameterSpec& p, int tp, int64_t element) {
  if (p.tp_split_dim < 0 || tp == 1) return {p.tp_split_dim < 0 ? -1 : 0, element};
  // Split the row-major index into (outer, split coordinate, inner).
  int64_t inner = 1;
  for (size_t d = p.tp_split_dim + 1; d < p.shape.size(); ++d) inner *= p.shape[d];
  const int64_t dim = p.shape[p.tp_split_dim], local_dim = dim / tp;
  const int64_t outer = element / (dim * inner);
  const int64_t coord = (element / inner) % dim;
  const int64_t in = element % inner;
  return {static_cast<int>(coord / local_dim), (outer * local_dim + coord % local_dim) * inner + in};
}

}  // namespace

int64_t PaddedNumel(int64_t numel, int dp, int64_t alignment) {
  const int64_t quantum = int64_t{dp} * alignment;
  return (numel + quantum - 1) / quantum * quantum;
}

ShardRange ShardOf(int64_t numel, int dp, int64_t alignment, int dp_rank) {
  const int64_t shard = PaddedNumel(numel, dp, alignment) / dp;
  const int64_t begin = std::min(int64_t{dp_rank} * shard, numel);
  const int64_t end = std::min(int64_t{dp_rank + 1} * shard, numel);
  return {begin, end};
}

absl::string_view StateKindName(StateKind kind) {
  switch (kind) {
    case StateKind::kParam:
      return "param";
    case StateKind::kGrad:
      return "grad";
    case StateKind::kOptimizerState:
      return "optimizer";
  }
  return "unknown";
}

bool IsSharded(StateKind kind, int zero_stage) {
  switch (kind) {
    case StateKind::kOptimizerState:
      return zero_stage >= 1;
    case StateKind::kGrad:
      return zero_stage >= 2;
    case StateKind::kParam:
      return zero_stage >= 3;
  }
  return false;
}

Unit MakeUnit(std::string name, const std::vector<std::pair<std::string, int64_t>>& sizes, int dp,
              int64_t alignment) {
  Unit unit;
  unit.name = std::move(name);
  for (const auto& [parameter, numel] : sizes) {
    unit.pieces.push_back(UnitPiece{parameter, unit.numel, numel, false});
    unit.numel += numel;
  }
  unit.padded = PaddedNumel(unit.numel, dp, alignment);
  for (int r = 0; r < dp; ++r) unit.shards.push_back(ShardOf(unit.numel, dp, alignment, r));
  return unit;
}

std::vector<OwnedPiece> OwnedPieces(const Unit& unit, int dp_rank) {
  std::vector<OwnedPiece> out;
  const ShardRange shard = unit.shards[dp_rank];
  for (const UnitPiece& piece : unit.pieces) {
    const ShardRange overlap = Intersect(shard, {piece.offset, piece.offset + piece.numel});
    if (overlap.size() == 0) continue;
    out.push_back(OwnedPiece{piece.parameter, overlap,
                             {overlap.begin - piece.offset, overlap.end - piece.offset},
                             piece.tied_copy});
  }
  return out;
}

absl::StatusOr<ZeroPlan> MakeZeroPlan(const GptConfig& model, const ParallelConfig& parallel,
                                      const PipelinePlan& pipeline) {
  if (absl::Status s = ValidateConfig(model, parallel); !s.ok()) return s;
  absl::StatusOr<std::vector<ParameterSpec>> params = GptParameters(model);
  if (!params.ok()) return params.status();
  const int tp = parallel.tp, dp = parallel.dp;

  // Each parameter's (name, tp-local size), grouped once by role and layer:
  // a chunk then touches only its own layers (the planner's largest layouts
  // have thousands of (pp, tp, chunk) triples and thousands of parameters).
  using Sizes = std::vector<std::pair<std::string, int64_t>>;
  Sizes embedding, head;
  std::vector<Sizes> layer_sizes(model.num_layers);
  for (const ParameterSpec& p : *params) {
    std::pair<std::string, int64_t> entry{p.name, p.local_numel(tp)};
    switch (p.role) {
      case ParameterRole::kEmbedding:
        embedding.push_back(std::move(entry));
        break;
      case ParameterRole::kHead:
        head.push_back(std::move(entry));
        break;
      case ParameterRole::kLayer:
        layer_sizes[p.layer].push_back(std::move(entry));
        break;
    }
  }
  // The output head is tied to the word embedding. When the last chunk
  // lives on another pp rank than chunk 0, that rank keeps a copy.
  Sizes head_with_copy = head;
  head_with_copy.push_back({(*params)[0].name, (*params)[0].local_numel(tp)});

  ZeroPlan zero;
  zero.dp = dp;
  zero.zero_stage = parallel.zero_stage;
  zero.alignment = parallel.zero_alignment;
  for (int pp_rank = 0; pp_rank < parallel.pp; ++pp_rank) {
    for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
      for (int c : pipeline.ChunksOfRank(pp_rank)) {
        const Chunk& chunk = pipeline.chunks[c];
        auto add_unit = [&](std::string name, const Sizes& sizes, bool last_is_tied_copy) {
          Unit unit = MakeUnit(std::move(name), sizes, dp, parallel.zero_alignment);
          if (last_is_tied_copy) unit.pieces.back().tied_copy = true;
          unit.tp_rank = tp_rank;
          unit.pp_rank = pp_rank;
          unit.chunk = c;
          zero.units.push_back(std::move(unit));
        };
        const bool tied_copy = chunk.has_head && pipeline.chunks[0].pp_rank != pp_rank;
        if (chunk.has_embedding) add_unit("embedding", embedding, false);
        for (int layer = chunk.first_layer; layer <= chunk.last_layer; ++layer) {
          add_unit(absl::StrCat("layers.", layer), layer_sizes[layer], false);
        }
        if (chunk.has_head) add_unit("head", tied_copy ? head_with_copy : head, tied_copy);
      }
    }
  }
  return zero;
}

absl::StatusOr<std::vector<Holder>> FindOwners(const ZeroPlan& zero, const Topology& topology,
                                               const std::vector<ParameterSpec>& parameters,
                                               absl::string_view name,
                                               std::optional<int64_t> element) {
  auto spec = std::find_if(parameters.begin(), parameters.end(),
                           [&](const ParameterSpec& p) { return p.name == name; });
  if (spec == parameters.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no parameter named '", name, "'; names look like '", parameters.front().name, "' or '",
        parameters.size() > 2 ? parameters[2].name : parameters.back().name,
        "' (shardctl plan --json lists them all under parameters)"));
  }
  if (element.has_value() && (*element < 0 || *element >= spec->numel())) {
    return absl::InvalidArgumentError(absl::StrCat("element=", *element, " is outside ", name,
                                                   ", which has ", spec->numel(),
                                                   " elements; choose element in [0, ",
                                                   spec->numel(), ")"));
  }
  const ElementPlace place = element.has_value() ? Locate(*spec, topology.tp(), *element)
                                                 : ElementPlace{};
  std::vector<Holder> out;
  for (const Unit& unit : zero.units) {
    for (const UnitPiece& piece : unit.pieces) {
      if (piece.parameter != name || piece.numel == 0) continue;
      if (element.has_value() && place.tp_rank >= 0 && place.tp_rank != unit.tp_rank) continue;
      // The part of the unit in question: the whole piece or one element.
      const ShardRange wanted =
          element.has_value()
              ? ShardRange{piece.offset + place.local, piece.offset + place.local + 1}
              : ShardRange{piece.offset, piece.offset + piece.numel};
      for (StateKind kind :
           {StateKind::kParam, StateKind::kGrad, StateKind::kOptimizerState}) {
        for (int r = 0; r < zero.dp; ++r) {
          const ShardRange held =
              IsSharded(kind, zero.zero_stage) ? Intersect(unit.shards[r], wanted) : wanted;
          if (held.size() == 0) continue;
          Holder h;
          h.kind = kind;
          h.coordinates = {unit.tp_rank, r, unit.pp_rank};
          h.rank = topology.RankOf(h.coordinates);
          h.unit = unit.name;
          h.unit_range = held;
          h.local_range = {held.begin - piece.offset, held.end - piece.offset};
          h.tied_copy = piece.tied_copy;
          out.push_back(std::move(h));
        }
      }
    }
  }
  return out;
}

}  // namespace shardline::plan

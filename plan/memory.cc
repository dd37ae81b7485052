#include "plan/memory.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::plan {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

MemoryEstimate Bytes(int64_t param_elems, int64_t grad_elems, int64_t optimizer_elems,
                     Precision precision) {
  const BytesPerElement b = BytesFor(precision);
  return {param_elems * b.params, grad_elems * b.grads, optimizer_elems * b.optimizer};
}

}  // namespace

BytesPerElement BytesFor(Precision precision) {
  return precision == Precision::kFp32 ? BytesPerElement{4, 4, 8} : BytesPerElement{2, 2, 12};
}

absl::StatusOr<MemoryEstimate> EstimateFromParameterCount(int64_t parameters,
                                                          const ParallelConfig& parallel) {
  if (parameters < 1 || parameters > (int64_t{1} << 50)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params=", parameters, " is invalid; give the model's parameter count in [1, 2^50]"));
  }
  if (absl::Status s = ValidateParallelConfig(parallel); !s.ok()) return s;
  const int64_t slice = CeilDiv(parameters, int64_t{parallel.tp} * parallel.pp);
  // A sharded kind holds one padded shard, as in EstimatePerRank.
  const int64_t shard = PaddedNumel(slice, parallel.dp, parallel.zero_alignment) / parallel.dp;
  auto elems = [&](StateKind kind) {
    return IsSharded(kind, parallel.zero_stage) ? shard : slice;
  };
  return Bytes(elems(StateKind::kParam), elems(StateKind::kGrad),
               elems(StateKind::kOptimizerState), parallel.precision);
}

std::vector<MemoryEstimate> EstimatePerRank(const ZeroPlan& zero, const Topology& topology,
                                            Precision precision) {
  // Elements per (tp_rank, pp_rank) slice and kind; every dp rank of a slice
  // holds the same amount (shards are padded to equal size).
  const int tp = topology.tp();
  std::vector<std::array<int64_t, 3>> slice(int64_t{tp} * topology.pp(), {0, 0, 0});
  for (const Unit& unit : zero.units) {
    auto& s = slice[unit.pp_rank * tp + unit.tp_rank];
    int k = 0;
    for (StateKind kind : {StateKind::kParam, StateKind::kGrad, StateKind::kOptimizerState}) {
      s[k++] += IsSharded(kind, zero.zero_stage) ? unit.padded / zero.dp : unit.numel;
    }
  }
  std::vector<MemoryEstimate> out(topology.world_size());
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    const RankCoordinates c = topology.CoordinatesOf(rank);
    const auto& s = slice[c.pp_rank * tp + c.tp_rank];
    out[rank] = Bytes(s[0], s[1], s[2], precision);
  }
  return out;
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.2f %s", v, units[u]);
}

}  // namespace shardline::plan

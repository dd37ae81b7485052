// Model-state memory per rank, in bytes, for ZeRO stages 0-3.
//
//   MemoryEstimate m = EstimateFromParameterCount(7'500'000'000, {.dp = 64,
//       .zero_stage = 1, .precision = Precision::kMixed});
//   // m.total() = 31.4e9: the paper's 31.4 GB for Psi = 7.5B, N_d = 64
//
// Per parameter (Rajbhandari et al., ZeRO, SC'20, Section 3.1 and Figure 1):
//   fp32 training:  4 (params) + 4 (grads) + 8  (AdamW m, v)              = 16
//   mixed precision: 2 (fp16)  + 2 (fp16)  + 12 (fp32 master, m, v; K=12) = 16
// Stage 1 divides the optimizer bytes by dp, stage 2 also the gradients,
// stage 3 also the parameters. Activations, communication buffers and
// allocator overhead are not included.
// Pure functions; thread-safe.
#ifndef SHARDLINE_PLAN_MEMORY_H_
#define SHARDLINE_PLAN_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/config.h"
#include "plan/topology.h"
#include "plan/zero.h"

namespace shardline::plan {

struct BytesPerElement {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
};
BytesPerElement BytesFor(Precision precision);

struct MemoryEstimate {
  int64_t params = 0;     // bytes
  int64_t grads = 0;      // bytes
  int64_t optimizer = 0;  // bytes
  int64_t total() const { return params + grads + optimizer; }
};

// For a model known only by its parameter count: the parameters are spread
// evenly over tp * pp model-parallel ranks (rounded up) as one unit, and a
// kind the stage shards holds PaddedNumel(slice, dp, zero_alignment) / dp
// elements. Uses tp, pp, dp, zero_stage, zero_alignment and precision of
// `parallel`. Errors: InvalidArgument when parameters < 1 or the parallel
// config is invalid.
absl::StatusOr<MemoryEstimate> EstimateFromParameterCount(int64_t parameters,
                                                          const ParallelConfig& parallel);

// Exact per rank from a ZeRO plan: every unit of the rank's (tp_rank,
// pp_rank) slice counts numel elements for a kind held whole and padded / dp
// for a kind the stage shards (the shard buffer includes its padding).
// Result is indexed by global rank.
std::vector<MemoryEstimate> EstimatePerRank(const ZeroPlan& zero, const Topology& topology,
                                            Precision precision);

// A byte count for people: "1.50 MiB", "3.00 TiB"; below 1 KiB "812 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_MEMORY_H_

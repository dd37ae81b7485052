// Pipeline parallelism: layers → pp*vpp chunks → pp ranks, the per-rank
// schedules (GPipe, 1F1B, interleaved 1F1B), and a simulator that proves a
// schedule completes and measures its bubble.
//
//   absl::StatusOr<PipelinePlan> p = PartitionLayers(/*num_layers=*/30, /*pp=*/4, /*vpp=*/1);
//   // chunks: [0-7] [8-15] [16-22] [23-29]
//   absl::StatusOr<PipelineSchedule> s =
//       BuildSchedule(ScheduleKind::kOneFOneB, /*pp=*/4, /*vpp=*/1, /*micro_batches=*/8);
//   s->simulation.bubble_ratio;   // (pp-1)/m = 0.375
//
// Sources: GPipe (Huang et al., NeurIPS'19); 1F1B (PipeDream-Flush, Narayanan
// et al., ICML'21); interleaved 1F1B (Narayanan et al., SC'21, Section 2.2.2).
// Pure functions; thread-safe.
#ifndef SHARDLINE_PLAN_PIPELINE_H_
#define SHARDLINE_PLAN_PIPELINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/config.h"

namespace shardline::plan {

// A contiguous run of layers executed by one pp rank. Chunk c runs on pp rank
// c % pp; on an interleaved pipeline each rank holds vpp chunks
// (r, r + pp, r + 2pp, ...).
struct Chunk {
  int index = 0;
  int pp_rank = 0;
  int64_t first_layer = 0;  // inclusive
  int64_t last_layer = 0;   // inclusive
  bool has_embedding = false;  // chunk 0: word + position embeddings
  bool has_head = false;       // last chunk: final LayerNorm + (tied) head
};

struct PipelinePlan {
  int pp = 1;
  int vpp = 1;
  std::vector<Chunk> chunks;  // by index, pp * vpp of them
  // Chunk indices held by pp rank `pp_rank`, ascending (= execution order of
  // the model's layers on that rank).
  std::vector<int> ChunksOfRank(int pp_rank) const;
};

// Splits num_layers into pp*vpp contiguous chunks whose sizes differ by at
// most one, earlier chunks taking the extra layers (30 on 4 → 8, 8, 7, 7).
// Errors: InvalidArgument when pp or vpp < 1, or num_layers < pp*vpp (the
// message names both numbers).
absl::StatusOr<PipelinePlan> PartitionLayers(int64_t num_layers, int pp, int vpp);

// One step of a rank's schedule: run the forward (F) or backward (B) pass of
// micro-batch `micro_batch` through chunk `chunk` (a global chunk index).
struct Action {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int micro_batch = 0;
  int chunk = 0;
  // "F<micro_batch>.<chunk>" / "B<micro_batch>.<chunk>", e.g. "F3.1".
  std::string ToString() const;
  bool operator==(const Action& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

struct TimedAction {
  Action action;
  int64_t start = 0;  // simulated time units (t_F = 1, t_B = 2 by default)
  int64_t end = 0;
};

struct Simulation {
  int64_t t_forward = 1;   // time of one F action
  int64_t t_backward = 2;  // time of one B action
  int64_t makespan = 0;    // time the last action of any rank ends
  int64_t ideal = 0;       // busy time of one rank: m * vpp * (t_F + t_B)
  double bubble_ratio = 0; // (makespan - ideal) / ideal
  std::vector<std::vector<TimedAction>> timeline;  // [pp_rank][k], in order
};

struct RankSchedule {
  // Warmup forwards (Megatron-LM's num_warmup_microbatches): the forwards
  // run before the steady one-forward-one-backward phase. Unless every
  // forward is warmup (warmup == m * vpp), the first B comes after
  // warmup + 1 forwards.
  int warmup = 0;
  std::vector<Action> actions;  // 2 * m * vpp of them, in execution order
};

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int pp = 1;
  int vpp = 1;
  int micro_batches = 1;
  std::vector<RankSchedule> ranks;  // [pp_rank]
  Simulation simulation;            // with t_F = 1, t_B = 2
};

// Builds the schedule and simulates it; a schedule is returned only if the
// simulation completes (deadlock-free) and every (micro-batch, chunk) has
// exactly one F and one B on the rank owning the chunk.
//   GPipe: all F in micro-batch order, then all B; warmup = m.
//   1F1B: warmup min(pp - r - 1, m) F, then alternate F/B, then the rest B.
//   Interleaved: Megatron-LM's order — micro-batches in groups of pp, each
//     group through chunk 0, 1, ... (B in reverse chunk order); warmup
//     min((pp - r - 1) * 2 + (vpp - 1) * pp, m * vpp), all F first when
//     m == pp.
// Errors: InvalidArgument for degrees < 1, sizes over kMaxActionsPerRank or
// kMaxScheduleActions (config.h), vpp > 1
// with GPipe or 1F1B, or an
// interleaved schedule that cannot complete for this (pp, vpp, m) (the
// message says which m would work).
absl::StatusOr<PipelineSchedule> BuildSchedule(ScheduleKind kind, int pp, int vpp,
                                               int micro_batches);

// Runs per-rank action lists with F of (mb, c) waiting for F of (mb, c-1), B
// of (mb, c) waiting for F of (mb, c) and B of (mb, c+1), communication free
// and buffered (a send never blocks), each rank strictly in its own order.
// Errors: FailedPrecondition naming the stuck actions if no rank can make
// progress (deadlock) or an action's dependency never runs.
absl::StatusOr<Simulation> Simulate(const std::vector<RankSchedule>& ranks, int pp, int vpp,
                                    int micro_batches, int64_t t_forward = 1,
                                    int64_t t_backward = 2);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_PIPELINE_H_

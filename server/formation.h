// World formation: how many data-parallel replicas a new generation gets,
// which candidate holds which rank, and which candidates wait as spares.
// A pure function of the resolved job spec and the candidates; no
// coordinator state, lock or store (the Coordinator passes the JOINING
// members of the generation and applies the answer; docs/ARCHITECTURE.md
// "Coordinator state machine").
//
//   std::vector<FormationCandidate> candidates = {{"w0", -1, t0}, {"w1", 0, t1}};
//   absl::StatusOr<std::optional<Formation>> f = FormWorld(spec, candidates);
//   // f->has_value(): (*f)->ranks[r] is the index in `candidates` of rank r.
//
// The rules:
//   - dp = spec::ChooseDp(spec, candidates.size()): the largest dp with
//     world = dp * tp * pp <= min(candidates, max_workers), world >=
//     min_workers, dp dividing global_batch / micro_batch, and a schedule
//     that runs the resulting micro-batch count. No such dp: no formation.
//   - An external job (spec.external, job.proto ExternalWorkload): no dp and
//     no plan; world = spec::ChooseWorldSize: min(candidates, max_workers)
//     once that is >= min_workers.
//   - Order: candidates that held a rank before (previous_rank >= 0) come
//     first, by previous rank (survivors keep their relative order); then
//     the others by join_time, then worker_id. Candidates equal on these
//     keys keep the order they were given in (the Coordinator gives them
//     by worker_id).
//   - The first world candidates of that order get ranks 0..world-1 in
//     order; the rest are spares, in order.
//
// Thread-safety: a pure function; thread-safe.
#ifndef SHARDLINE_SERVER_FORMATION_H_
#define SHARDLINE_SERVER_FORMATION_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plan/plan.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

struct FormationCandidate {
  std::string worker_id;
  // Its rank in the last generation it was ACTIVE in; -1 when it has held
  // none (a newcomer, or a new process of its slot).
  int previous_rank = -1;
  absl::Time join_time;  // when its incarnation first joined the job
};

struct Formation {
  int dp = 0;          // 0 for an external job
  int world_size = 0;  // dp * tp * pp (an external job: its ranks)
  // spec::PlanGeneration(spec, dp); nullopt for an external job.
  std::optional<plan::Plan> plan;
  // ranks[r]: the index in the candidates of the one that gets rank r;
  // world_size entries.
  std::vector<size_t> ranks;
  // Indices of the candidates that wait as spares, in formation order.
  std::vector<size_t> spares;
};

// Forms a world of `candidates` under `spec` (resolved: spec::ResolveJobSpec)
// by the rules above. nullopt: no dp fits the candidates (e.g. fewer than
// min_workers). Internal ("cannot plan dp=<dp>: <why>"): the planner refused
// the dp that spec::ChooseDp chose, a broken invariant.
absl::StatusOr<std::optional<Formation>> FormWorld(
    const v1::JobSpec& spec, const std::vector<FormationCandidate>& candidates);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_FORMATION_H_

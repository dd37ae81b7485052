#include "server/formation.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "spec/job_spec.h"

namespace shardline::server {

absl::StatusOr<std::optional<Formation>> FormWorld(
    const v1::JobSpec& spec, const std::vector<FormationCandidate>& candidates) {
  std::optional<int> dp;
  std::optional<plan::Plan> p;
  size_t world = 0;
  if (spec::IsExternalJob(spec)) {  // no plan: world = the candidates, capped
    const std::optional<int> w = spec::ChooseWorldSize(spec, static_cast<int>(candidates.size()));
    if (!w.has_value()) return std::optional<Formation>();
    world = static_cast<size_t>(*w);
  } else {
    dp = spec::ChooseDp(spec, static_cast<int>(candidates.size()));
    if (!dp.has_value()) return std::optional<Formation>();
    absl::StatusOr<plan::Plan> planned = spec::PlanGeneration(spec, *dp);
    if (!planned.ok()) {
      return absl::InternalError(
          absl::StrCat("cannot plan dp=", *dp, ": ", planned.status().message()));
    }
    world = static_cast<size_t>(planned->parallel.world_size());
    p = *std::move(planned);
  }
  // Survivors keep their relative order (their previous ranks), then the
  // others in the order they joined.
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&candidates](size_t ia, size_t ib) {
    const FormationCandidate& a = candidates[ia];
    const FormationCandidate& b = candidates[ib];
    const bool ar = a.previous_rank >= 0, br = b.previous_rank >= 0;
    if (ar != br) return ar;
    if (ar) return a.previous_rank < b.previous_rank;
    if (a.join_time != b.join_time) return a.join_time < b.join_time;
    return a.worker_id < b.worker_id;
  });
  if (world > candidates.size()) {  // spec::ChooseDp never picks such a dp
    return absl::InternalError(
        absl::StrCat("cannot form world ", world, " of ", candidates.size(), " candidates"));
  }
  const auto first_spare = order.begin() + static_cast<std::ptrdiff_t>(world);
  Formation f{dp.value_or(0), static_cast<int>(world), std::move(p),
              std::vector<size_t>(order.begin(), first_spare),
              std::vector<size_t>(first_spare, order.end())};
  return std::optional<Formation>(std::move(f));
}

}  // namespace shardline::server

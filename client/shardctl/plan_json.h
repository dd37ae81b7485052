// JSON renderings of the planner's results for `shardctl plan --json`.
// The field names are a contract that scripts use; see README.md
// ("shardctl plan --json"). Integers are JSON numbers (never strings).
// Each returns the whole text, ending in a newline, laid out as
// nlohmann::json's dump(2) (two-space indent), written as it goes: the
// plan of a 3072-rank layout is ~4 MB.
//
//   std::cout << PlanToJson(plan);
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_CLIENT_SHARDCTL_PLAN_JSON_H_
#define SHARDLINE_CLIENT_SHARDCTL_PLAN_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/memory.h"
#include "plan/plan.h"
#include "plan/zero.h"

namespace shardline::shardctl {

// The full plan: model, parallel, parameters, topology, pipeline, schedule,
// zero, memory.
std::string PlanToJson(const plan::Plan& plan);

// A memory-only estimate from a parameter count (`--params N`).
std::string MemoryEstimateToJson(int64_t parameters, const plan::ParallelConfig& parallel,
                                 const plan::MemoryEstimate& memory);

// The answer to `shardctl plan owner`: one entry per holder.
std::string OwnersToJson(const std::string& parameter, std::optional<int64_t> element,
                         int zero_stage, const std::vector<plan::Holder>& holders);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_PLAN_JSON_H_

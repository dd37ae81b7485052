// JSON renderings of the planner's results for `shardctl plan --json`.
// The field names are a contract that scripts use; see README.md
// ("shardctl plan --json"). Integers are JSON numbers (never strings).
//
//   nlohmann::ordered_json j = PlanToJson(plan);
//   j["schedule"]["bubble_ratio"];
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_CLIENT_SHARDCTL_PLAN_JSON_H_
#define SHARDLINE_CLIENT_SHARDCTL_PLAN_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "plan/memory.h"
#include "plan/plan.h"
#include "plan/zero.h"

namespace shardline::shardctl {

// The full plan: model, parallel, parameters, topology, pipeline, schedule,
// zero, memory.
nlohmann::ordered_json PlanToJson(const plan::Plan& plan);

// A memory-only estimate from a parameter count (`--params N`).
nlohmann::ordered_json MemoryEstimateToJson(int64_t parameters, const plan::ParallelConfig& parallel,
                                    const plan::MemoryEstimate& memory);

// The answer to `shardctl plan owner`: one entry per holder.
nlohmann::ordered_json OwnersToJson(const std::string& parameter, std::optional<int64_t> element,
                            int zero_stage, const std::vector<plan::Holder>& holders);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_PLAN_JSON_H_

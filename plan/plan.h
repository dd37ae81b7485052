// The whole plan of one job: everything the coordinator hands out and
// shardctl prints, computed from (model, parallel config) alone.
//
//   absl::StatusOr<Plan> plan = MakePlan(model, parallel);
//   if (!plan.ok()) return plan.status();   // InvalidArgument naming the field
//   plan->schedule.simulation.bubble_ratio;
//
// Pure; no I/O. Thread-safe.
#ifndef SHARDLINE_PLAN_PLAN_H_
#define SHARDLINE_PLAN_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/config.h"
#include "plan/memory.h"
#include "plan/model.h"
#include "plan/pipeline.h"
#include "plan/topology.h"
#include "plan/zero.h"

namespace shardline::plan {

struct Plan {
  GptConfig model;
  ParallelConfig parallel;
  std::vector<ParameterSpec> parameters;  // global, unsplit, forward order
  int64_t parameter_count = 0;            // sum of numel, tied head once
  // Model FLOPs per iteration over parallel.global_batch() samples, without
  // and with activation recomputation (TrainingFlopsPerIteration).
  double flops_per_iteration = 0;
  double flops_per_iteration_recompute = 0;
  Topology topology;
  PipelinePlan pipeline;
  PipelineSchedule schedule;
  ZeroPlan zero;
  std::vector<MemoryEstimate> memory;  // [rank], bytes
  int max_memory_rank = 0;             // the rank with the largest total
};

// Errors: InvalidArgument naming the field and the valid choices, from
// ValidateConfig or from a pipeline schedule that cannot complete.
absl::StatusOr<Plan> MakePlan(const GptConfig& model, const ParallelConfig& parallel);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_PLAN_H_

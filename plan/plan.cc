#include "plan/plan.h"

#include <utility>

namespace shardline::plan {

absl::StatusOr<Plan> MakePlan(const GptConfig& model, const ParallelConfig& parallel) {
  if (absl::Status s = ValidateConfig(model, parallel); !s.ok()) return s;
  absl::StatusOr<std::vector<ParameterSpec>> parameters = GptParameters(model);
  if (!parameters.ok()) return parameters.status();
  absl::StatusOr<Topology> topology = Topology::Create(parallel.tp, parallel.pp, parallel.dp);
  if (!topology.ok()) return topology.status();
  absl::StatusOr<PipelinePlan> pipeline =
      PartitionLayers(model.num_layers, parallel.pp, parallel.vpp);
  if (!pipeline.ok()) return pipeline.status();
  absl::StatusOr<PipelineSchedule> schedule =
      BuildSchedule(parallel.schedule, parallel.pp, parallel.vpp, parallel.micro_batches);
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<ZeroPlan> zero = MakeZeroPlan(model, parallel, *pipeline);
  if (!zero.ok()) return zero.status();

  std::vector<MemoryEstimate> memory = EstimatePerRank(*zero, *topology, parallel.precision);
  int max_rank = 0;
  for (int r = 1; r < static_cast<int>(memory.size()); ++r) {
    if (memory[r].total() > memory[max_rank].total()) max_rank = r;
  }
  return Plan{model,
              parallel,
              *std::move(parameters),
              GptParameterCount(model),
              TrainingFlopsPerIteration(model, parallel.global_batch(), false),
              TrainingFlopsPerIteration(model, parallel.global_batch(), true),
              *std::move(topology),
              *std::move(pipeline),
              *std::move(schedule),
              *std::move(zero),
              std::move(memory),
              max_rank};
}

}  // namespace shardline::plan

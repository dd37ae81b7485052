// A rank's share of a checkpoint that holds what a plan's checkpoint must
// (checkpoint::CheckpointTensors), for tests that drive BeginCheckpoint /
// ReportShard without a trainer. Since a commit needs exactly the plan's
// tensors (issue 14), a test's ranks report these instead of a made-up
// tensor.
//
//   absl::StatusOr<v1::ReportShardRequest> r =
//       fixtures::WritePlanShard(*plan, begun.directory(), rank, world_size);
//   r->set_checkpoint_id(begun.checkpoint_id());  // and fence, data_cursor
//
// Every planned tensor's global row-major elements are split evenly over
// `world` ranks (rank r: [r * n / world, (r + 1) * n / world)), with value
// `value`, and written with checkpoint::WriteShard (a real file
// rank-0000r.bin, real checksums; nothing for a rank whose share is empty).
#ifndef SHARDLINE_TESTING_PLAN_CHECKPOINT_H_
#define SHARDLINE_TESTING_PLAN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/geometry.h"
#include "checkpoint/shard_io.h"
#include "shardline/v1/checkpoint.pb.h"
#include "shardline/v1/plan.pb.h"

namespace shardline::fixtures {

inline absl::StatusOr<shardline::v1::ReportShardRequest> WritePlanShard(
    const shardline::v1::Plan& plan, const std::string& directory, int rank, int world,
    float value = 0.0f) {
  std::vector<checkpoint::LocalRun> runs;
  std::vector<std::vector<float>> storage;
  const std::vector<checkpoint::PlannedTensor> tensors = checkpoint::CheckpointTensors(plan);
  storage.reserve(tensors.size());
  for (const checkpoint::PlannedTensor& t : tensors) {
    int64_t n = 1;
    checkpoint::LocalRun run;
    run.tensor = t.name;
    for (uint64_t d : t.global_shape) {
      run.global_shape.push_back(static_cast<int64_t>(d));
      n *= static_cast<int64_t>(d);
    }
    run.begin = n * rank / world;
    run.end = n * (rank + 1) / world;
    storage.emplace_back(static_cast<size_t>(run.end - run.begin), value);
    run.data = storage.back().data();
    runs.push_back(std::move(run));
  }
  return checkpoint::WriteShard(directory, rank, runs);
}

}  // namespace shardline::fixtures

#endif  // SHARDLINE_TESTING_PLAN_CHECKPOINT_H_

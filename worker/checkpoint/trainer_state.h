// Bridges the trainer's checkpoint state to shard I/O without making
// shard_io depend on the trainer.
//
//   std::vector<LocalRun> runs;
//   for (const auto& s : trainer.SaveSlices()) runs.push_back(FromStateSlice(s));
//   absl::StatusOr<v1::ReportShardRequest> report = WriteShard(dir, rank, runs);
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_WORKER_CHECKPOINT_TRAINER_STATE_H_
#define SHARDLINE_WORKER_CHECKPOINT_TRAINER_STATE_H_

#include <vector>

#include "checkpoint/shard_io.h"
#include "worker/train/trainer.h"

namespace shardline::worker {

// The LocalRun of a Trainer::StateSlice: same tensor name, the parameter's
// global shape and tp split dimension, tp/tp_rank, [begin, end) and data
// (not copied: valid as long as the slice's pointer is).
// Precondition: slice.spec != nullptr.
checkpoint::LocalRun FromStateSlice(const train::Trainer::StateSlice& slice);

// FromStateSlice of each slice, in order.
std::vector<checkpoint::LocalRun> FromStateSlices(const std::vector<train::Trainer::StateSlice>& slices);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_CHECKPOINT_TRAINER_STATE_H_

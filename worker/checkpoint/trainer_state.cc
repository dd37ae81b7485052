#include "worker/checkpoint/trainer_state.h"

namespace shardline::worker {

checkpoint::LocalRun FromStateSlice(const train::Trainer::StateSlice& slice) {
  checkpoint::LocalRun run;
  run.tensor = slice.tensor;
  run.global_shape = slice.spec->shape;
  run.split_dim = slice.spec->tp_split_dim;
  run.tp = slice.tp;
  run.tp_rank = slice.tp_rank;
  run.begin = slice.begin;
  run.end = slice.end;
  run.data = slice.data;
  return run;
}

std::vector<checkpoint::LocalRun> FromStateSlices(const std::vector<train::Trainer::StateSlice>& slices) {
  std::vector<checkpoint::LocalRun> runs;
  runs.reserve(slices.size());
  for (const train::Trainer::StateSlice& s : slices) runs.push_back(FromStateSlice(s));
  return runs;
}

}  // namespace shardline::worker

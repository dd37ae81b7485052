// Test helpers: run every rank of a (tp, pp, dp) layout as a thread of this
// process, each with real Gloo backends over loopback for its tp, dp, pp and
// embedding groups, bootstrapped through one in-memory store, and train.
#ifndef SHARDLINE_WORKER_TRAIN_TEST_UTIL_H_
#define SHARDLINE_WORKER_TRAIN_TEST_UTIL_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "plan/topology.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/train/local_cluster.h"
#include "worker/train/ops.h"
#include "worker/train/trainer.h"

namespace shardline::worker::train::testing {

// The corpus shipped with the repository (a data dependency of the test).
inline const Corpus& ShakespeareCorpus() {
  static const Corpus* corpus = [] {
    absl::StatusOr<Corpus> c = Corpus::Load("data/tinyshakespeare.txt", 0.1);
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      return new Corpus(*Corpus::FromBytes(std::string(4096, 'x'), 0.1));
    }
    return new Corpus(*std::move(c));
  }();
  return *corpus;
}

// Trains `steps` steps with every rank of options.parallel as a thread and
// returns rank 0's stats; every rank's losses must agree (checked). `after`
// (optional) runs on every rank's thread after training.
inline std::vector<StepStats> Train(
    const TrainingOptions& options, int steps,
    const std::function<void(int rank, Trainer&)>& after = nullptr) {
  SetBlasThreads(1);
  const int world = options.parallel.world_size();
  std::vector<std::vector<StepStats>> stats(world);
  GlooOptions gloo;
  gloo.timeout = absl::Seconds(60);
  gloo.connect_timeout = absl::Seconds(60);
  absl::Status status = RunLocalCluster(
      options.parallel,
      [&](int rank, const RankGroups& groups) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Trainer>> trainer =
            Trainer::Create(options, groups, &ShakespeareCorpus());
        if (!trainer.ok()) return trainer.status();
        for (int s = 0; s < steps; ++s) {
          absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
          if (!st.ok()) return st.status();
          stats[rank].push_back(*st);
        }
        if (after) after(rank, **trainer);
        return absl::OkStatus();
      },
      gloo);
  EXPECT_TRUE(status.ok()) << status;
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_EQ(stats[rank].size(), stats[0].size());
    for (size_t s = 0; s < std::min(stats[rank].size(), stats[0].size()); ++s) {
      EXPECT_EQ(stats[rank][s].loss, stats[0][s].loss) << "rank " << rank << " step " << s;
      EXPECT_EQ(stats[rank][s].grad_norm, stats[0][s].grad_norm) << "rank " << rank << " step " << s;
    }
  }
  return stats[0];
}

}  // namespace shardline::worker::train::testing

#endif  // SHARDLINE_WORKER_TRAIN_TEST_UTIL_H_

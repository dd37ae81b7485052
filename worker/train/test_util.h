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

// One rank's communicators, created in the global order of
// plan::Topology::GroupsInCreationOrder (each rank joins only its own).
struct RankBackends {
  plan::RankCoordinates coordinates;
  std::unique_ptr<Backend> tp, dp, pp, embedding;
  RankGroups groups() const {
    return RankGroups{coordinates, tp.get(), dp.get(), pp.get(), embedding.get()};
  }
};

inline absl::StatusOr<RankBackends> ConnectRank(const plan::Topology& topology, int rank,
                                                std::shared_ptr<Store> store) {
  RankBackends b;
  b.coordinates = topology.CoordinatesOf(rank);
  GlooOptions options;
  options.timeout = absl::Seconds(60);
  options.connect_timeout = absl::Seconds(60);
  int index = 0;
  for (const plan::Group& g : topology.GroupsInCreationOrder()) {
    ++index;
    auto it = std::find(g.ranks.begin(), g.ranks.end(), rank);
    if (it == g.ranks.end()) continue;
    const int group_rank = static_cast<int>(it - g.ranks.begin());
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(
        PrefixStore(store, absl::StrCat("g", index, "/")), group_rank,
        static_cast<int>(g.ranks.size()), options);
    if (!backend.ok()) return backend.status();
    switch (g.kind) {
      case plan::GroupKind::kTp: b.tp = *std::move(backend); break;
      case plan::GroupKind::kDp: b.dp = *std::move(backend); break;
      case plan::GroupKind::kPp: b.pp = *std::move(backend); break;
      case plan::GroupKind::kEmbedding: b.embedding = *std::move(backend); break;
    }
  }
  return b;
}

// Trains `steps` steps with every rank of options.parallel as a thread and
// returns rank 0's stats; every rank's losses must agree (checked). `after`
// (optional) runs on every rank's thread after training.
inline std::vector<StepStats> Train(
    const TrainingOptions& options, int steps,
    const std::function<void(int rank, Trainer&)>& after = nullptr) {
  SetBlasThreads(1);
  const plan::ParallelConfig& p = options.parallel;
  absl::StatusOr<plan::Topology> topology = plan::Topology::Create(p.tp, p.pp, p.dp);
  EXPECT_TRUE(topology.ok()) << topology.status();
  if (!topology.ok()) return {};
  const int world = topology->world_size();
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::vector<std::vector<StepStats>> stats(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<RankBackends> backends = ConnectRank(*topology, rank, store);
      ASSERT_TRUE(backends.ok()) << "rank " << rank << ": " << backends.status();
      absl::StatusOr<std::unique_ptr<Trainer>> trainer =
          Trainer::Create(options, backends->groups(), &ShakespeareCorpus());
      ASSERT_TRUE(trainer.ok()) << "rank " << rank << ": " << trainer.status();
      for (int s = 0; s < steps; ++s) {
        absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
        ASSERT_TRUE(st.ok()) << "rank " << rank << " step " << s << ": " << st.status();
        stats[rank].push_back(*st);
      }
      if (after) after(rank, **trainer);
    });
  }
  for (auto& t : threads) t.join();
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

// Every rank of a (tp, pp, dp) layout as a thread of this process, each with
// real backends (Gloo over loopback TCP by default, or a BackendFactory's)
// for its tp, dp, pp and embedding groups, bootstrapped through one
// in-memory store. Used by tests and by
// shardline-train-local (single-machine experiments and benchmarks).
//
//   absl::Status s = RunLocalCluster(options.parallel, [&](int rank, const RankGroups& g) {
//     auto trainer = Trainer::Create(options, g, &corpus);  ...
//   });
#ifndef SHARDLINE_WORKER_TRAIN_LOCAL_CLUSTER_H_
#define SHARDLINE_WORKER_TRAIN_LOCAL_CLUSTER_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plan/config.h"
#include "plan/topology.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/train/trainer.h"

namespace shardline::worker::train {

// One rank's communicators.
struct RankBackends {
  plan::RankCoordinates coordinates;
  std::unique_ptr<Backend> tp, dp, pp, embedding;
  RankGroups groups() const {
    return RankGroups{coordinates, tp.get(), dp.get(), pp.get(), embedding.get()};
  }
};

// Makes one group's backend: rank `group_rank` of `group_size` in the
// `kind` group whose bootstrap keys live under `store`, for world rank
// `rank`. Called from `rank`'s own thread; blocks until the group's other
// members arrive.
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(
    std::shared_ptr<Store> store, plan::GroupKind kind, int rank, int group_rank,
    int group_size)>;

// Gloo over loopback with `options` (CreateGlooBackend).
BackendFactory GlooFactory(GlooOptions options);

// Creates `rank`'s groups in plan::Topology::GroupsInCreationOrder (joining
// only its own), each under its own prefix of `store`. Blocks until the
// other members arrive. Errors: the factory's (CreateGlooBackend's).
absl::StatusOr<RankBackends> ConnectRank(const plan::Topology& topology, int rank,
                                         std::shared_ptr<Store> store,
                                         const BackendFactory& factory);

// Runs fn(rank, groups) on world_size threads, one per rank, and returns the
// first error: a failed connection, or fn's status. Blocks until every
// thread ends. A rank whose fn fails has its groups aborted, so its peers
// fail fast instead of at their timeout.
absl::Status RunLocalCluster(const plan::ParallelConfig& parallel,
                             const std::function<absl::Status(int rank, const RankGroups&)>& fn,
                             GlooOptions options = GlooOptions());
absl::Status RunLocalCluster(const plan::ParallelConfig& parallel,
                             const std::function<absl::Status(int rank, const RankGroups&)>& fn,
                             const BackendFactory& factory);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_LOCAL_CLUSTER_H_

#include "worker/train/local_cluster.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardline::worker::train {

BackendFactory GlooFactory(GlooOptions options) {
  return [options](std::shared_ptr<Store> store, plan::GroupKind, int, int group_rank,
                   int group_size) {
    return CreateGlooBackend(std::move(store), group_rank, group_size, options);
  };
}

absl::StatusOr<RankBackends> ConnectRank(const plan::Topology& topology, int rank,
                                         std::shared_ptr<Store> store,
                                         const BackendFactory& factory) {
  RankBackends b;
  b.coordinates = topology.CoordinatesOf(rank);
  int index = 0;
  for (const plan::Group& g : topology.GroupsInCreationOrder()) {
    ++index;
    auto it = std::find(g.ranks.begin(), g.ranks.end(), rank);
    if (it == g.ranks.end()) continue;
    const int group_rank = static_cast<int>(it - g.ranks.begin());
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        factory(PrefixStore(store, absl::StrCat(plan::GroupKindName(g.kind), index, "/")), g.kind,
                rank, group_rank, static_cast<int>(g.ranks.size()));
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

absl::Status RunLocalCluster(const plan::ParallelConfig& parallel,
                             const std::function<absl::Status(int rank, const RankGroups&)>& fn,
                             GlooOptions options) {
  return RunLocalCluster(parallel, fn, GlooFactory(options));
}

absl::Status RunLocalCluster(const plan::ParallelConfig& parallel,
                             const std::function<absl::Status(int rank, const RankGroups&)>& fn,
                             const BackendFactory& factory) {
  absl::StatusOr<plan::Topology> topology =
      plan::Topology::Create(parallel.tp, parallel.pp, parallel.dp);
  if (!topology.ok()) return topology.status();
  std::shared_ptr<Store> store = NewInMemoryStore();
  absl::Mutex mu;
  absl::Status first;  // guarded by mu until the threads are joined
  std::vector<std::thread> threads;
  for (int rank = 0; rank < topology->world_size(); ++rank) {
    threads.emplace_back([&, rank] {
      absl::Status s;
      absl::StatusOr<RankBackends> backends = ConnectRank(*topology, rank, store, factory);
      if (!backends.ok()) {
        s = backends.status();
      } else {
        s = fn(rank, backends->groups());
        // A failed rank leaves its peers blocked in collectives: abort its
        // groups so they fail fast instead of at their timeout.
        if (!s.ok()) {
          for (Backend* b : {backends->tp.get(), backends->dp.get(), backends->pp.get(),
                             backends->embedding.get()}) {
            if (b != nullptr) b->Abort();
          }
        }
      }
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = absl::Status(s.code(), absl::StrCat("rank ", rank, ": ", s.message()));
      }
    });
  }
  for (auto& t : threads) t.join();
  return first;
}

}  // namespace shardline::worker::train

// Backends for the trainer's tests over the NCCL backend on a stand-in
// plugin (the fake's loopback communicators, or the CUDA emulator that
// carries them): world rank r on device r.
#ifndef SHARDLINE_WORKER_GPU_NCCL_TEST_UTIL_H_
#define SHARDLINE_WORKER_GPU_NCCL_TEST_UTIL_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "plan/topology.h"
#include "worker/comm/nccl_backend.h"
#include "worker/train/local_cluster.h"

namespace shardline::worker::testing {

// NCCL backends over `plugin` (runfiles-relative), each operation bounded by
// `timeout`; pipeline groups with their p2p channels
// (NcclOptions::p2p_channels) unless `p2p_channels` is false.
inline train::BackendFactory NcclLoopbackFactory(std::string plugin, absl::Duration timeout,
                                                 bool p2p_channels = true) {
  return [plugin = std::move(plugin), timeout, p2p_channels](
             std::shared_ptr<Store> store, plan::GroupKind kind, int rank, int group_rank,
             int group_size) {
    NcclOptions o;
    o.plugin_path = plugin;
    o.device = rank;
    o.p2p_channels = p2p_channels && kind == plan::GroupKind::kPp;
    o.timeout = timeout;
    o.connect_timeout = absl::Seconds(60);
    return CreateNcclBackend(std::move(store), group_rank, group_size, o);
  };
}

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_WORKER_GPU_NCCL_TEST_UTIL_H_

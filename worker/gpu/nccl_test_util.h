// Backends for the trainer's tests over the NCCL backend on a stand-in
// plugin (the fake's loopback communicators, or the CUDA emulator that
// carries them): world rank r on device r.
#ifndef SHARDLINE_WORKER_GPU_NCCL_TEST_UTIL_H_
#define SHARDLINE_WORKER_GPU_NCCL_TEST_UTIL_H_

#include <dlfcn.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "gtest/gtest.h"
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

// One control of the fake plugin at `plugin` (runfiles-relative; one of
// fake_plugin.cc's shardline_fake_set_* functions, taking a T) set to
// `value` while this lives, then to `restore`. The plugin is the library the
// backends load, so both see one state. A control that is not found fails
// the test.
template <typename T>
class ScopedFakeSetting {
 public:
  ScopedFakeSetting(const char* plugin, const char* setter, T value, T restore)
      : restore_(restore) {
    void* fake = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(fake, nullptr) << dlerror();
    if (fake != nullptr) set_ = reinterpret_cast<void (*)(T)>(dlsym(fake, setter));
    EXPECT_NE(set_, nullptr) << setter;
    if (set_ != nullptr) set_(value);
  }
  ~ScopedFakeSetting() {
    if (set_ != nullptr) set_(restore_);
  }
  ScopedFakeSetting(const ScopedFakeSetting&) = delete;
  ScopedFakeSetting& operator=(const ScopedFakeSetting&) = delete;

 private:
  void (*set_)(T) = nullptr;
  const T restore_;
};

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_WORKER_GPU_NCCL_TEST_UTIL_H_

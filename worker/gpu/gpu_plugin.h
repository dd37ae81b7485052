// Loads the GPU plugin (libshardline_gpu.so) at run time and asks it what
// the machine has. The worker uses this to choose NCCL or fall back to Gloo.
//
//   absl::StatusOr<GpuPlugin> plugin = GpuPlugin::Load(GpuPlugin::DefaultPath());
//   if (!plugin.ok()) { /* Unavailable: use Gloo */ }
//   absl::StatusOr<GpuInfo> info = plugin->Probe();
//
// A loaded plugin stays mapped for the life of the process (CUDA does not
// support unloading cleanly). Thread-safe after Load.
#ifndef SHARDLINE_WORKER_GPU_GPU_PLUGIN_H_
#define SHARDLINE_WORKER_GPU_GPU_PLUGIN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/gpu/plugin_abi.h"

namespace shardline::worker {

struct GpuDevice {
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

struct GpuInfo {
  int cuda_runtime_version = 0;  // 13000 = CUDA 13.0
  int cuda_driver_version = 0;   // 0 = no driver
  int nccl_version = 0;          // 22805 = NCCL 2.28.5
  std::vector<GpuDevice> devices;
};

class GpuPlugin {
 public:
  // libshardline_gpu.so next to the running executable, where Bazel and the
  // install layout put it.
  static std::string DefaultPath();

  // dlopen()s `path`. Errors:
  //   Unavailable: the file is missing, or CUDA/NCCL libraries it needs are
  //     not installed (dlerror's text is in the message); fall back to Gloo.
  //   FailedPrecondition: the plugin speaks another ABI version (rebuild).
  static absl::StatusOr<GpuPlugin> Load(const std::string& path);

  // Versions and devices. Errors:
  //   Unavailable: no usable device or driver (the CUDA error is named).
  //   Internal: CUDA failed while reading a present device's properties.
  absl::StatusOr<GpuInfo> Probe() const;

  // Versions only; works on machines with the CUDA libraries but no GPU.
  GpuInfo Versions() const;

  // The plugin's NCCL/CUDA function table (plugin_abi.h); never null after a
  // successful Load. Used by worker/comm/nccl_backend.cc.
  const ShardlineGpuApi& api() const { return *api_; }

  // The plugin's training-math table (plugin_abi.h), or null when the plugin
  // has none (the fake plugin). Used through worker/gpu/gpu_ops.h.
  const ShardlineGpuTrainApi* train_api() const { return train_api_; }

 private:
  using ProbeFn = int (*)(void*, char*, size_t);
  GpuPlugin(ProbeFn probe, const ShardlineGpuApi* api, const ShardlineGpuTrainApi* train_api)
      : probe_(probe), api_(api), train_api_(train_api) {}
  ProbeFn probe_;
  const ShardlineGpuApi* api_;               // static storage in the plugin
  const ShardlineGpuTrainApi* train_api_;  // static storage in the plugin; may be null
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GPU_GPU_PLUGIN_H_

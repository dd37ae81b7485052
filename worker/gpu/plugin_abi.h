// The C ABI between shardline-worker and its GPU plugin
// (libshardline_gpu.so). Everything that links CUDA or NCCL lives in the
// plugin; the worker dlopen()s it at run time, so one worker binary runs on
// machines with and without CUDA and falls back to Gloo when the plugin or a
// GPU is missing (DESIGN.md, docs/BUILDING.md).
//
// Plain C types only, so the two sides may come from different compilers.
// Bump kShardlineGpuAbiVersion on any change to these structs or symbols.
#ifndef SHARDLINE_WORKER_GPU_PLUGIN_ABI_H_
#define SHARDLINE_WORKER_GPU_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHARDLINE_GPU_ABI_VERSION 1
#define SHARDLINE_GPU_MAX_DEVICES 64

typedef struct {
  int32_t index;                 // CUDA device ordinal
  char name[256];                // NUL-terminated, e.g. "NVIDIA H200"
  uint64_t total_memory_bytes;   // device memory, bytes
  int32_t compute_capability_major;
  int32_t compute_capability_minor;
} ShardlineGpuDevice;

typedef struct {
  int32_t abi_version;           // SHARDLINE_GPU_ABI_VERSION of the plugin
  int32_t cuda_runtime_version;  // e.g. 13000 for CUDA 13.0 (cudaRuntimeGetVersion)
  int32_t cuda_driver_version;   // 0 when no driver is installed
  int32_t nccl_version;          // ncclGetVersion, e.g. 22805 for 2.28.5
  int32_t device_count;          // devices filled in `devices` (<= max)
  ShardlineGpuDevice devices[SHARDLINE_GPU_MAX_DEVICES];
} ShardlineGpuInfo;

// Status codes returned by plugin functions (a subset of absl::StatusCode).
#define SHARDLINE_GPU_OK 0
#define SHARDLINE_GPU_INTERNAL 13
#define SHARDLINE_GPU_UNAVAILABLE 14

// Fills `info`. Versions are filled even when no GPU is usable; then it
// returns SHARDLINE_GPU_UNAVAILABLE with the CUDA error text in `error`
// (NUL-terminated, at most error_len bytes). Thread-safe.
typedef int (*ShardlineGpuProbeFn)(ShardlineGpuInfo* info, char* error, size_t error_len);
#define SHARDLINE_GPU_PROBE_SYMBOL "shardline_gpu_probe"

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // SHARDLINE_WORKER_GPU_PLUGIN_ABI_H_

// Part of libshardline_gpu.so, the only object that links CUDA and NCCL.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

#include "worker/gpu/plugin_abi.h"

extern "C" __attribute__((visibility("default"))) int shardline_gpu_probe(ShardlineGpuInfo* info,
                                                                         char* error,
                                                                         size_t error_len) {
  std::memset(info, 0, sizeof(*info));
  info->abi_version = SHARDLINE_GPU_ABI_VERSION;
  cudaRuntimeGetVersion(&info->cuda_runtime_version);
  cudaDriverGetVersion(&info->cuda_driver_version);
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) info->nccl_version = nccl;

  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::snprintf(error, error_len, "no usable CUDA device: %s (%s)",
                  err == cudaSuccess ? "device count is 0" : cudaGetErrorString(err),
                  err == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(err));
    return SHARDLINE_GPU_UNAVAILABLE;
  }
  if (count > SHARDLINE_GPU_MAX_DEVICES) count = SHARDLINE_GPU_MAX_DEVICES;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    const cudaError_t e = cudaGetDeviceProperties(&prop, i);
    if (e != cudaSuccess) {
      std::snprintf(error, error_len, "cudaGetDeviceProperties(%d): %s", i, cudaGetErrorString(e));
      return SHARDLINE_GPU_INTERNAL;
    }
    ShardlineGpuDevice& d = info->devices[i];
    d.index = i;
    std::snprintf(d.name, sizeof(d.name), "%s", prop.name);
    d.total_memory_bytes = prop.totalGlobalMem;
    d.compute_capability_major = prop.major;
    d.compute_capability_minor = prop.minor;
  }
  info->device_count = count;
  return SHARDLINE_GPU_OK;
}

// CPU stand-in for the CUDA runtime API used by the GPU plugin's training
// math (train_plugin.cc): "device" memory is host memory (cudaMalloc fills it
// with NaN so unwritten outputs show), streams are synchronous. For
// train_kernels_emu_test only; see cuda_runtime.h.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
struct CUstream_st {};
typedef CUstream_st* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidConfiguration = 9, cudaErrorInvalidDevicePointer = 17 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
#define cudaStreamNonBlocking 1
inline const char* cudaGetErrorString(cudaError_t) { return "mock"; }
inline const char* cudaGetErrorName(cudaError_t) { return "mock"; }
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
// As many devices as the fake's loopback NCCL has (SHARDLINE_FAKE_LOOPBACK_DEVICES), else 1.
inline cudaError_t cudaGetDeviceCount(int* c) { const char* e = std::getenv("SHARDLINE_FAKE_LOOPBACK_DEVICES"); *c = e != nullptr && std::atoi(e) > 0 ? std::atoi(e) : 1; return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = new CUstream_st; return cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) { delete s; return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t n) { *p = std::malloc(n); for (size_t i = 0; i < n / 4; ++i) ((float*)*p)[i] = __builtin_nanf(""); return cudaSuccess; }
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
#define cudaHostAllocDefault 0x00
inline cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) { *p = std::malloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
inline cudaError_t cudaFreeHost(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { std::memcpy(d, s, n); return cudaSuccess; }
// Events: streams are synchronous here, so every event is done when recorded.
struct CUevent_st {};
typedef CUevent_st* cudaEvent_t;
#define cudaEventDisableTiming 0x02
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { *e = new CUevent_st; return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { std::memset(d, v, n); return cudaSuccess; }

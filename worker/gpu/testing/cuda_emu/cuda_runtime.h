// A tiny CUDA emulator that runs train_kernels.cu's kernels on the CPU, to
// check their index math and block reductions on machines without a GPU:
// one std::thread per CUDA thread, blocks one after another (so __shared__
// is a function-level static), __syncthreads a block barrier, and
// __shfl_xor_sync an exchange through memory between two warp barriers.
// emu_source.py rewrites `k<<<grid, block, smem, stream>>>(args)` into
// `EmuLaunch(k, grid, block, smem, stream)(args)`. Needs C++20 (<barrier>).
// Not modelled: memory-ordering races beyond barriers, CUDA's own math
// library (glibc's expf/tanhf stand in), timing. Slow: ~100 s for the test.
#pragma once
#include <barrier>
#include <cmath>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include "cuda_runtime_api.h"
struct dim3 { unsigned x, y, z; dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {} };
struct uint3e { unsigned x = 0, y = 0, z = 0; };
inline thread_local uint3e threadIdx;
inline uint3e blockIdx;  // one block at a time: plain global, read-only in threads
inline dim3 blockDim, gridDim;
inline std::barrier<>* g_block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
inline std::vector<double> g_warp_buf;
inline std::mutex g_atomic_mu;
#define __global__
#define __device__
#define __shared__ static
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
  const unsigned tid = threadIdx.x + threadIdx.y * blockDim.x;
  const unsigned w = tid / 32, lane = tid % 32;
  g_warp_buf[tid] = static_cast<double>(v);
  g_warp_barriers[w]->arrive_and_wait();
  const T r = static_cast<T>(g_warp_buf[w * 32 + (lane ^ o)]);
  g_warp_barriers[w]->arrive_and_wait();
  return r;
}
inline float atomicAdd(float* p, float v) { std::lock_guard<std::mutex> l(g_atomic_mu); float o = *p; *p += v; return o; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
template <typename K>
struct EmuLauncher {
  K kernel; dim3 grid, block;
  template <typename... A> void operator()(A... args) {
    gridDim = grid; blockDim = block;
    const unsigned n = block.x * block.y;
    for (unsigned b = 0; b < grid.x; ++b) {
      blockIdx.x = b;
      std::barrier<> bar(n); g_block_barrier = &bar;
      g_warp_barriers.clear();
      for (unsigned w = 0; w < (n + 31) / 32; ++w) g_warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - w * 32)));
      g_warp_buf.assign(n, 0.0);
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < n; ++t) ts.emplace_back([=, this] { threadIdx.x = t % block.x; threadIdx.y = t / block.x; kernel(args...); });
      for (auto& t : ts) t.join();
    }
  }
};
template <typename K, typename G, typename B>
EmuLauncher<K> EmuLaunch(K k, G g, B b, size_t = 0, cudaStream_t = nullptr) { return {k, dim3(g), dim3(b)}; }

// A tiny CUDA emulator that runs train_kernels.cu's kernels on the CPU, to
// check their index math and block reductions on machines without a GPU:
// one host thread per CUDA thread (a persistent pool), blocks one after
// another, one launch at a time per process (so __shared__
// is a function-level static), __syncthreads a block barrier, and
// __shfl_xor_sync an exchange through memory between two warp barriers.
// emu_source.py rewrites `k<<<grid, block, smem, stream>>>(args)` into
// `EmuLaunch(k, grid, block, smem, stream)(args)`. Needs C++20 (<barrier>).
// Not modelled: memory-ordering races beyond barriers, CUDA's own math
// library (glibc's expf/tanhf stand in), timing. Slow: ~30 s for
// train_kernels_emu_test on two cores.
#pragma once
#include <cstring>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
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
// One launch at a time in the process: blocks share the globals above and
// __shared__ statics, and ranks running as threads launch concurrently.
inline std::mutex g_launch_mu;
#define __global__
#define __device__
#define __shared__ static
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
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
// Persistent host threads, one per CUDA thread of a block, reused by every
// block and launch (creating and joining a thread per CUDA thread dominated
// the emulator's time). Never destroyed: its threads are detached and sleep
// between blocks.
class EmuThreadPool {
 public:
  static EmuThreadPool& Get() { static EmuThreadPool* pool = new EmuThreadPool; return *pool; }
  // Runs f(t) for t in [0, n) on n distinct threads; returns when all are done.
  void Run(unsigned n, const std::function<void(unsigned)>& f) {
    std::unique_lock<std::mutex> l(mu_);
    for (; threads_ < n; ++threads_) std::thread([this, i = threads_] { Work(i); }).detach();
    job_ = &f; n_ = n; remaining_ = n; ++generation_;
    start_.notify_all();
    done_.wait(l, [this] { return remaining_ == 0; });
    job_ = nullptr;
  }
 private:
  void Work(unsigned i) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      start_.wait(l, [&] { return generation_ != seen; });
      seen = generation_;
      if (i >= n_) continue;
      const std::function<void(unsigned)>* f = job_;
      l.unlock();
      (*f)(i);
      l.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned threads_ = 0, n_ = 0, remaining_ = 0;
  uint64_t generation_ = 0;
};
template <typename K>
struct EmuLauncher {
  K kernel; dim3 grid, block;
  template <typename... A> void operator()(A... args) {
    std::lock_guard<std::mutex> launch(g_launch_mu);
    gridDim = grid; blockDim = block;
    const unsigned n = block.x * block.y;
    for (unsigned b = 0; b < grid.x; ++b) {
      blockIdx.x = b;
      std::barrier<> bar(n); g_block_barrier = &bar;
      g_warp_barriers.clear();
      for (unsigned w = 0; w < (n + 31) / 32; ++w) g_warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - w * 32)));
      g_warp_buf.assign(n, 0.0);
      const std::function<void(unsigned)> thread = [=, this](unsigned t) { threadIdx.x = t % block.x; threadIdx.y = t / block.x; kernel(args...); };
      EmuThreadPool::Get().Run(n, thread);
    }
  }
};
template <typename K, typename G, typename B>
EmuLauncher<K> EmuLaunch(K k, G g, B b, size_t = 0, cudaStream_t = nullptr) { return {k, dim3(g), dim3(b)}; }

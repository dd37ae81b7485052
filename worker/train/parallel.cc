#include "worker/train/parallel.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>

namespace shardline::worker::train {
namespace {

std::atomic<int> intra_op_threads{1};

}  // namespace

void SetIntraOpThreads(int threads) {
  intra_op_threads.store(std::clamp(threads, 1, kMaxIntraOpThreads), std::memory_order_relaxed);
  openblas_set_num_threads(1);
}

int IntraOpThreads() { return intra_op_threads.load(std::memory_order_relaxed); }

void ParallelFor(int64_t n, int64_t min_part, int64_t align,
                 absl::FunctionRef<void(int64_t begin, int64_t end)> f) {
  if (n <= 0) return;
  align = std::max<int64_t>(1, align);
  min_part = std::max<int64_t>(1, min_part);
  int64_t parts = std::min<int64_t>(IntraOpThreads(), n / min_part);
  if (parts <= 1 || omp_in_parallel()) {
    f(0, n);
    return;
  }
  // Part p is [bound(p), bound(p + 1)): n split evenly in units of align.
  const int64_t units = (n + align - 1) / align;
  parts = std::min(parts, units);
  auto bound = [&](int64_t p) { return std::min(n, units * p / parts * align); };
#pragma omp parallel num_threads(static_cast<int>(parts))
  {
    // OpenMP may give fewer threads than asked: each runs every nth part.
    const int64_t threads = omp_get_num_threads();
    for (int64_t p = omp_get_thread_num(); p < parts; p += threads) {
      const int64_t begin = bound(p), end = bound(p + 1);
      if (begin < end) f(begin, end);
    }
  }
}

}  // namespace shardline::worker::train

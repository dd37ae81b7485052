// Intra-op parallelism of the trainer's CPU kernels (ops.h, adamw.h): a
// kernel splits its rows, columns or elements into parts and runs them on
// up to IntraOpThreads() threads (OpenMP, GCC's libgomp: the threads stay
// alive between kernels, as torch's intra-op pool does).
//
//   SetIntraOpThreads(2);                         // once, at start
//   ParallelFor(rows, /*min_part=*/64, /*align=*/1,
//               [&](int64_t begin, int64_t end) { ... rows [begin, end) ... });
//
// Every kernel splits so that each output element is computed by one part,
// with the same arithmetic in the same order as with one thread: results
// are bit-identical for any thread count (ops_test checks it).
//
// Thread-safety: SetIntraOpThreads is process-wide (an atomic); ParallelFor
// may be called from many threads at once (each caller gets its own team of
// threads; a caller already inside a ParallelFor part runs nested calls on
// its own thread).
#ifndef SHARDLINE_WORKER_TRAIN_PARALLEL_H_
#define SHARDLINE_WORKER_TRAIN_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace shardline::worker::train {

// The most threads a kernel may use (the --threads flags' bound).
inline constexpr int kMaxIntraOpThreads = 256;

// Threads each kernel may use, clamped to 1..kMaxIntraOpThreads; default 1.
// Also sets OpenBLAS to one thread per product: the kernels split products
// themselves (on a small machine OpenBLAS's own threads for products of a
// few hundred rows cost more than they bring).
void SetIntraOpThreads(int threads);
int IntraOpThreads();

// Calls f(begin, end) once for each part of a partition of [0, n) into
// consecutive, disjoint ranges that cover it, possibly on several threads
// at once, and returns when every call has returned. The parts: at most
// IntraOpThreads(), each at least min_part elements long (so a small n is
// one part, run on the caller), and every boundary a multiple of align
// (>= 1). The partition depends only on n, min_part, align and the thread
// count. n <= 0 calls nothing.
void ParallelFor(int64_t n, int64_t min_part, int64_t align,
                 absl::FunctionRef<void(int64_t begin, int64_t end)> f);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_PARALLEL_H_

// The element types and reduction operations of the collectives
// (worker/comm/backend.h), apart so that the kernels (reduce_kernels.h) need
// nothing else.
#ifndef SHARDLINE_WORKER_COMM_TYPES_H_
#define SHARDLINE_WORKER_COMM_TYPES_H_

#include <cstddef>

namespace shardline::worker {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// Bytes per element of `dtype`.
constexpr size_t ElementSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

enum class ReduceOp {
  kSum,
  kAvg,  // kSum, then divide by size() (in fp32 for 16-bit types).
  kMax,
  kMin,
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COMM_TYPES_H_

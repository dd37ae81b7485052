// Element-wise kernels of the shared memory collectives (shm_group.cc):
// n-way reductions accumulated in fp32, and the fp16 / bf16 <-> fp32
// conversions, vectorised for AVX-512, AVX2 and baseline x86-64 (the best
// the CPU has is picked at load, as worker/train/vector_clones.h does for
// the training math).
//
//   const void* sources[3] = {a, b, c};
//   kernels::Reduce(sources, 3, count, DType::kBFloat16, ReduceOp::kSum, out, nullptr);
//
// Every count is in ELEMENTS. Results are bit-identical across the clones
// and equal to the scalar definitions: sums in source order (((s0 + s1) +
// s2) ...) in fp32, max/min as std::max/std::min of the running value and
// the next source, kAvg the sum divided by the number of sources, 16-bit
// values rounded to nearest even once at the end (worker/comm/float16.h's
// conversions, bit for bit, NaNs included).
//
// Thread-safety: pure functions.
#ifndef SHARDLINE_WORKER_COMM_REDUCE_KERNELS_H_
#define SHARDLINE_WORKER_COMM_REDUCE_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "worker/comm/types.h"

namespace shardline::worker::kernels {

// out0[i] (and out1[i] when out1 is non-null) = op over sources[0..n)[i] for
// i in [0, count); all in `dtype`. kAvg divides the sum by `divisor` (the
// group's size, which may exceed n when the sources are partial sums).
// An output may be one of the sources (same address): every block is read
// before it is written. n >= 1.
void Reduce(const void* const* sources, int n, size_t count, DType dtype, ReduceOp op,
            void* out0, void* out1, int divisor);

// acc[i] = op(acc[i], src[i]) in fp32 (src in `dtype`); kAvg sums.
void Accumulate(float* acc, const void* src, size_t count, DType dtype, ReduceOp op);

// acc[i] = src[i] converted to fp32.
void ToFloat32(const void* src, size_t count, DType dtype, float* acc);

// out[i] = acc[i] / divisor (divisor 1: unchanged) rounded to `dtype`.
// `out` may be `acc` (fp32) or overlap its start (16-bit: out is written
// behind the read position).
void FromFloat32(const float* acc, size_t count, DType dtype, int divisor, void* out);

// dst0[0..bytes) = dst1[0..bytes) = src[0..bytes), reading `src` from memory
// once (each block is copied to dst0, then from the cache to dst1, with
// streaming stores when `stream_dst1`: see CopyStreaming). No overlaps.
void CopyTwice(void* dst0, void* dst1, const void* src, size_t bytes, bool stream_dst1);

// dst[0..bytes) = src[0..bytes) with non-temporal (streaming) stores where
// the CPU has them (x86-64): the destination's lines are written without
// being read first and do not displace the cache. For outputs far larger
// than the caches, where it copies about twice as fast as memcpy (measured
// here: 512 KiB chunks from a cache-hot source into 64 MiB, 27 vs 11-17
// GB/s). No overlap.
void CopyStreaming(void* dst, const void* src, size_t bytes);

// The branch-free fp16 conversions the kernels use, exposed for the
// exhaustive test against float16.h.
uint32_t HalfBitsToFloatBits(uint16_t h);
uint16_t FloatBitsToHalfBits(uint32_t f);

}  // namespace shardline::worker::kernels

#endif  // SHARDLINE_WORKER_COMM_REDUCE_KERNELS_H_

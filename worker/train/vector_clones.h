// SL_VECTOR_CLONES: compiles the function it prefixes three times, for
// AVX-512 (avx512f), AVX2 and baseline x86-64, and lets the dynamic loader
// pick the best the CPU has (GCC/Clang target_clones, resolved once at load
// time by CPU feature, not by CPU model). Loops inside are vectorised for
// each target (the hot-path libraries build with -O3, worker/train/BUILD);
// GCC/Clang vector types (VecF below) become one, two or four registers.
// Elsewhere than x86-64 it expands to nothing.
//
// Results are identical across the clones wherever the code has no
// reassociation (none of ours does: no -ffast-math, and -std=c++17 keeps
// floating-point contraction off), so which clone runs does not change a
// value.
#ifndef SHARDLINE_WORKER_TRAIN_VECTOR_CLONES_H_
#define SHARDLINE_WORKER_TRAIN_VECTOR_CLONES_H_

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SL_VECTOR_CLONES
#endif

namespace shardline::worker::train::simd {

// 16 floats / 8 doubles / 16 int32s (64 bytes): element-wise arithmetic,
// comparisons and ?: work lane by lane. Pass them by pointer or reference
// between functions (by value changes the ABI between the clones).
constexpr int kFloatLanes = 16;
typedef float VecF __attribute__((vector_size(64)));
typedef int32_t VecI __attribute__((vector_size(64)));
constexpr int kDoubleLanes = 8;
typedef double VecD __attribute__((vector_size(64)));
typedef float VecF8 __attribute__((vector_size(32)));  // 8 floats, widened to VecD

}  // namespace shardline::worker::train::simd

#endif  // SHARDLINE_WORKER_TRAIN_VECTOR_CLONES_H_

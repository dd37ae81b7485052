#include "worker/comm/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// Compiled for AVX-512, AVX2 and baseline x86-64; the loader picks one by
// CPU feature (see worker/train/vector_clones.h, whose macro this mirrors:
// worker/comm is below worker/train and cannot include it).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SL_COMM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SL_COMM_VECTOR_CLONES
#endif
#define SL_INLINE inline __attribute__((always_inline))

namespace shardline::worker::kernels {

namespace {

// Elements per block: the fp32 accumulator of one block stays in L1.
constexpr size_t kBlock = 2048;

SL_INLINE float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
SL_INLINE uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// fp16 -> fp32, exact for every input (F. Giesen's half_to_float_fast5
// scheme): subnormals renormalised by one fp32 subtraction.
SL_INLINE uint32_t HalfToFloatBits(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = static_cast<uint32_t>(h & 0x7fff) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127 - 15) << 23;
  const uint32_t inf_nan = o + ((128 - 16) << 23);
  const uint32_t denorm = FloatToBits(BitsToFloat(o + (1u << 23)) - BitsToFloat(113u << 23));
  o = exp == shifted_exp ? inf_nan : (exp == 0 ? denorm : o);
  return o | (static_cast<uint32_t>(h & 0x8000) << 16);
}

// fp32 -> fp16, round to nearest even (float_to_half_fast3_rtne): NaN ->
// quiet NaN 0x7e00, >= 65520 -> inf, subnormals through one fp32 addition
// (round to nearest even in the default rounding mode).
SL_INLINE uint16_t FloatToHalfBits(uint32_t x) {
  const uint32_t sign = x & 0x80000000u;
  const uint32_t a = x ^ sign;
  const uint32_t f32_inf = 255u << 23;
  const uint32_t f16_max = (127u + 16) << 23;
  const uint32_t denorm_magic = ((127u - 15) + (23 - 10) + 1) << 23;
  const uint32_t special = a > f32_inf ? 0x7e00u : 0x7c00u;
  const uint32_t sub = FloatToBits(BitsToFloat(a) + BitsToFloat(denorm_magic)) - denorm_magic;
  const uint32_t mant_odd = (a >> 13) & 1;
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xfff + mant_odd) >> 13;
  const uint32_t o = a >= f16_max ? special : (a < (113u << 23) ? sub : normal);
  return static_cast<uint16_t>(o | (sign >> 16));
}

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet).
SL_INLINE uint16_t FloatToBf16Bits(uint32_t x) {
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

SL_INLINE void LoadBlock(const void* src, size_t len, DType dtype, float* acc) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(acc, src, len * 4);
      break;
    case DType::kBFloat16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < len; ++i) acc[i] = BitsToFloat(static_cast<uint32_t>(h[i]) << 16);
      break;
    }
    case DType::kFloat16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < len; ++i) acc[i] = BitsToFloat(HalfToFloatBits(h[i]));
      break;
    }
  }
}

template <typename Combine>
SL_INLINE void CombineTyped(float* acc, const void* src, size_t len, DType dtype, Combine f) {
  switch (dtype) {
    case DType::kFloat32: {
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < len; ++i) acc[i] = f(acc[i], s[i]);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < len; ++i)
        acc[i] = f(acc[i], BitsToFloat(static_cast<uint32_t>(h[i]) << 16));
      break;
    }
    case DType::kFloat16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < len; ++i) acc[i] = f(acc[i], BitsToFloat(HalfToFloatBits(h[i])));
      break;
    }
  }
}

SL_INLINE void CombineBlock(float* acc, const void* src, size_t len, DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:  // std::max(acc, s)
      CombineTyped(acc, src, len, dtype, [](float a, float s) { return a < s ? s : a; });
      break;
    case ReduceOp::kMin:  // std::min(acc, s)
      CombineTyped(acc, src, len, dtype, [](float a, float s) { return s < a ? s : a; });
      break;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      CombineTyped(acc, src, len, dtype, [](float a, float s) { return a + s; });
      break;
  }
}

SL_INLINE void StoreBlock(const float* acc, size_t len, DType dtype, void* out) {
  switch (dtype) {
    case DType::kFloat32:
      std::memmove(out, acc, len * 4);
      break;
    case DType::kBFloat16: {
      uint16_t* h = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < len; ++i) h[i] = FloatToBf16Bits(FloatToBits(acc[i]));
      break;
    }
    case DType::kFloat16: {
      uint16_t* h = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < len; ++i) h[i] = FloatToHalfBits(FloatToBits(acc[i]));
      break;
    }
  }
}

SL_INLINE void Divide(float* acc, size_t len, int divisor) {
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < len; ++i) acc[i] /= d;
}

const char* Offset(const void* p, size_t elements, size_t es) {
  return static_cast<const char*>(p) + elements * es;
}

}  // namespace

uint32_t HalfBitsToFloatBits(uint16_t h) { return HalfToFloatBits(h); }
uint16_t FloatBitsToHalfBits(uint32_t f) { return FloatToHalfBits(f); }

SL_COMM_VECTOR_CLONES
void Reduce(const void* const* sources, int n, size_t count, DType dtype, ReduceOp op,
            void* out0, void* out1, int divisor) {
  const size_t es = ElementSize(dtype);
  // fp32 sums of two sources, the common case, in one pass without the
  // accumulator.
  if (dtype == DType::kFloat32 && n == 2 && op == ReduceOp::kSum) {
    const float* a = static_cast<const float*>(sources[0]);
    const float* b = static_cast<const float*>(sources[1]);
    float* o = static_cast<float*>(out0);
    for (size_t i = 0; i < count; ++i) o[i] = a[i] + b[i];
    if (out1 != nullptr) std::memcpy(out1, out0, count * 4);
    return;
  }
  alignas(64) float acc[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t len = std::min(kBlock, count - begin);
    LoadBlock(Offset(sources[0], begin, es), len, dtype, acc);
    for (int j = 1; j < n; ++j) CombineBlock(acc, Offset(sources[j], begin, es), len, dtype, op);
    if (op == ReduceOp::kAvg && divisor != 1) Divide(acc, len, divisor);
    StoreBlock(acc, len, dtype, const_cast<char*>(Offset(out0, begin, es)));
    if (out1 != nullptr) StoreBlock(acc, len, dtype, const_cast<char*>(Offset(out1, begin, es)));
  }
}

void CopyStreaming(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Up to the first 16-byte boundary of the destination, then 64 bytes (a
  // line) per round with 16-byte streaming stores (SSE2: every x86-64 CPU;
  // as fast as wider ones here), then the tail.
  const size_t head = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();  // the streaming stores are ordered before what follows
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void CopyTwice(void* dst0, void* dst1, const void* src, size_t bytes, bool stream_dst1) {
  constexpr size_t kCopyBlock = size_t{16} << 10;  // stays in L1 between the two copies
  for (size_t off = 0; off < bytes; off += kCopyBlock) {
    const size_t len = std::min(kCopyBlock, bytes - off);
    char* first = static_cast<char*>(dst0) + off;
    std::memcpy(first, static_cast<const char*>(src) + off, len);
    if (stream_dst1) {
      CopyStreaming(static_cast<char*>(dst1) + off, first, len);
    } else {
      std::memcpy(static_cast<char*>(dst1) + off, first, len);
    }
  }
}

SL_COMM_VECTOR_CLONES
void Accumulate(float* acc, const void* src, size_t count, DType dtype, ReduceOp op) {
  const size_t es = ElementSize(dtype);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t len = std::min(kBlock, count - begin);
    CombineBlock(acc + begin, Offset(src, begin, es), len, dtype, op);
  }
}

SL_COMM_VECTOR_CLONES
void ToFloat32(const void* src, size_t count, DType dtype, float* acc) {
  const size_t es = ElementSize(dtype);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t len = std::min(kBlock, count - begin);
    LoadBlock(Offset(src, begin, es), len, dtype, acc + begin);
  }
}

SL_COMM_VECTOR_CLONES
void FromFloat32(const float* acc, size_t count, DType dtype, int divisor, void* out) {
  const size_t es = ElementSize(dtype);
  alignas(64) float tmp[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t len = std::min(kBlock, count - begin);
    const float* block = acc + begin;
    if (divisor != 1) {
      std::memcpy(tmp, block, len * 4);
      Divide(tmp, len, divisor);
      block = tmp;
    }
    StoreBlock(block, len, dtype, const_cast<char*>(Offset(out, begin, es)));
  }
}

}  // namespace shardline::worker::kernels

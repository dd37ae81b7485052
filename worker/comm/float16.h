// IEEE fp16 and bfloat16 <-> fp32 conversion, round-to-nearest-even.
#ifndef SHARDLINE_WORKER_COMM_FLOAT16_H_
#define SHARDLINE_WORKER_COMM_FLOAT16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardline::worker {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(man), -24);
    return (h & 0x8000) ? -f : f;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | (absx > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (absx >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (absx < 0x38800000u) {                       // below 2^-14: subnormal
    // |f| * 2^24 is exact; nearbyint rounds half to even.
    return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(f) * 16777216.0f));
  }
  const uint32_t v = absx - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t r = v >> 13;
  const uint32_t rem = v & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

inline float BFloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COMM_FLOAT16_H_

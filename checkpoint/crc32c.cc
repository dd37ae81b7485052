#include "checkpoint/crc32c.h"

#include <isa-l/crc.h>

#include <array>

namespace shardline::checkpoint {
namespace {

// Polynomials in the CRC's reflected bit order: bit 31 is the coefficient
// of x^0, bit 0 that of x^31. The CRC-32C polynomial P (0x1EDC6F41) without
// its x^32 term, reflected.
constexpr uint32_t kPolyReflected = 0x82F63B78u;
constexpr uint32_t kOne = 0x80000000u;  // x^0

// a * b mod P (carry-less; zlib's multmodp): for each term x^i of a, add
// b * x^i, computed by shifting b one degree at a time and reducing by P.
constexpr uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = kOne; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolyReflected : b >> 1;  // b *= x
  }
  return product;
}

// kX8Pow[k] = x^(8 * 2^k) mod P, k = 0..63 (a 64-bit byte count's bits):
// x^8 by three squarings of x, then one squaring per entry.
constexpr std::array<uint32_t, 64> MakeX8PowTable() {
  std::array<uint32_t, 64> table{};
  uint32_t p = kOne >> 1;  // x^1
  for (int i = 0; i < 3; ++i) p = MulModP(p, p);
  for (int k = 0; k < 64; ++k) {
    table[k] = p;
    p = MulModP(p, p);
  }
  return table;
}
constexpr std::array<uint32_t, 64> kX8Pow = MakeX8PowTable();

}  // namespace

uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc) {
  // crc32_iscsi keeps the register un-inverted: standard CRC-32C chaining is
  // ~crc32_iscsi(buf, len, ~previous). Its length is an int: chunk.
  constexpr size_t kChunk = size_t{1} << 30;
  uint32_t state = ~crc;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (bytes > 0) {
    const size_t n = bytes < kChunk ? bytes : kChunk;
    state = crc32_iscsi(p, static_cast<int>(n), state);
    p += n;
    bytes -= n;
  }
  return ~state;
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t b_bytes) {
  // crc_a * x^(8 b_bytes) mod P, one table factor per set bit of b_bytes.
  uint32_t shifted = crc_a;
  for (int k = 0; b_bytes != 0; ++k, b_bytes >>= 1) {
    if (b_bytes & 1) shifted = MulModP(kX8Pow[k], shifted);
  }
  return shifted ^ crc_b;
}

}  // namespace shardline::checkpoint

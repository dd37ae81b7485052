#include "checkpoint/crc32c.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::checkpoint {
namespace {

TEST(Crc32cTest, CheckValue) {
  // The catalogue check value of CRC-32C (RFC 3720 / "CRC-32/ISCSI").
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
}

TEST(Crc32cTest, EmptyInputIsZeroAndKeepsTheChain) {
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  EXPECT_EQ(Crc32c(nullptr, 0, 0xE3069283u), 0xE3069283u);
}

TEST(Crc32cTest, Rfc3720Vectors) {
  // RFC 3720 B.4: 32 bytes of zeros, of 0xFF, and ascending 0..31.
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32);
  for (int i = 0; i < 32; ++i) up[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(up.data(), 32), 0x46DD794Eu);
}

TEST(Crc32cTest, ChainingEqualsOneShot) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>((i * 131 + 7) & 0xFF));
  const uint32_t whole = Crc32c(text.data(), text.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{9}, size_t{500}, size_t{999}, size_t{1000}}) {
    const uint32_t head = Crc32c(text.data(), split);
    EXPECT_EQ(Crc32c(text.data() + split, text.size() - split, head), whole) << "split " << split;
  }
  uint32_t bytewise = 0;
  for (char c : text) bytewise = Crc32c(&c, 1, bytewise);
  EXPECT_EQ(bytewise, whole);
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

TEST(Crc32cCombineTest, EqualsTheChecksumOfTheConcatenationForEveryShortSplit) {
  // Every (|A|, |B|) with both up to 70 bytes: 0, odd, and across the
  // 8/16/32/64-byte widths the hardware path folds by.
  const std::string text = RandomBytes(140, 1);
  for (size_t a = 0; a <= 70; ++a) {
    for (size_t b = 0; b <= 70; ++b) {
      const uint32_t crc_a = Crc32c(text.data(), a);
      const uint32_t crc_b = Crc32c(text.data() + a, b);
      ASSERT_EQ(Crc32cCombine(crc_a, crc_b, b), Crc32c(text.data(), a + b))
          << "|A| " << a << " |B| " << b;
    }
  }
}

TEST(Crc32cCombineTest, LongAndOddLengths) {
  const std::string text = RandomBytes((size_t{3} << 20) + 1001, 2);
  const uint32_t whole = Crc32c(text.data(), text.size());
  for (size_t split : {size_t{1}, size_t{4095}, size_t{4096}, size_t{65537}, size_t{1} << 20,
                       (size_t{1} << 20) + 3, text.size() - 1, text.size()}) {
    const uint32_t head = Crc32c(text.data(), split);
    const uint32_t tail = Crc32c(text.data() + split, text.size() - split);
    EXPECT_EQ(Crc32cCombine(head, tail, text.size() - split), whole) << "split " << split;
  }
  // Many unequal pieces folded left to right, as a reader does per chunk.
  std::mt19937 rng(3);
  uint32_t folded = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min<size_t>(text.size() - at, rng() % 300000);
    folded = Crc32cCombine(folded, Crc32c(text.data() + at, n), n);
    at += n;
  }
  EXPECT_EQ(folded, whole);
}

TEST(Crc32cCombineTest, EmptySidesAreIdentities) {
  EXPECT_EQ(Crc32cCombine(0, 0xE3069283u, 9), 0xE3069283u);
  EXPECT_EQ(Crc32cCombine(0xE3069283u, 0, 0), 0xE3069283u);
  EXPECT_EQ(Crc32cCombine(0, 0, 0), 0u);
  EXPECT_EQ(Crc32cCombine(Crc32c("1234", 4), Crc32c("56789", 5), 5), 0xE3069283u);
}

TEST(Crc32cCombineTest, LengthsBeyond32Bits) {
  // B = 2^32 + 5 zero bytes exercises the table entries for bits >= 32 of
  // the length (x^(8 * 2^32) mod P and up); checked against streaming.
  constexpr uint64_t kZeros = (uint64_t{1} << 32) + 5;
  const std::vector<char> block(size_t{64} << 20, 0);
  const uint32_t head = Crc32c("123456789", 9);
  uint32_t stream = head, zeros = 0;
  for (uint64_t left = kZeros; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, block.size()));
    stream = Crc32c(block.data(), n, stream);
    zeros = Crc32c(block.data(), n, zeros);
    left -= n;
  }
  EXPECT_EQ(Crc32cCombine(head, zeros, kZeros), stream);
  // Associativity over huge lengths (pure algebra: no data needed).
  const uint64_t n1 = (uint64_t{7} << 40) + 11, n2 = (uint64_t{5} << 33) + 1;
  const uint32_t a = 0x12345678u, b = 0x9ABCDEF0u, c = 0x0F1E2D3Cu;
  EXPECT_EQ(Crc32cCombine(Crc32cCombine(a, b, n1), c, n2),
            Crc32cCombine(a, Crc32cCombine(b, c, n2), n1 + n2));
}

}  // namespace
}  // namespace shardline::checkpoint

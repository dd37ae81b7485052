#include "checkpoint/crc32c.h"

#include <cstring>
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

}  // namespace
}  // namespace shardline::checkpoint

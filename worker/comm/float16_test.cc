#include "worker/comm/float16.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

TEST(Float16Test, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = HalfToFloat(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), x) << std::hex << h;
  }
}

TEST(Float16Test, RoundsToNearestEven) {
  // 1 + 2^-11 is exactly between 1 and 1+2^-10: ties to even (1.0).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is between 1+2^-10 (odd) and 1+2^-9: ties to even (up).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);      // tie -> even 0
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie -> even 2
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(BFloat16Test, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBFloat16(f), h) << std::hex << h;
  }
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, even down
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, even up
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

}  // namespace
}  // namespace shardline::worker

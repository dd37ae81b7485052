// The shared memory collectives' kernels against scalar references: the
// branch-free fp16 conversions bit for bit against float16.h (every half,
// and the floats around every rounding boundary), and the n-way reductions
// bit for bit against a scalar loop in the same order, for every dtype and
// op, counts around the kernels' block size, outputs aliasing a source.
#include "worker/comm/reduce_kernels.h"

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/float16.h"
#include "worker/comm/types.h"

namespace shardline::worker::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(ReduceKernelsTest, HalfToFloatMatchesEveryHalf) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    ASSERT_EQ(HalfBitsToFloatBits(static_cast<uint16_t>(h)),
              Bits(HalfToFloat(static_cast<uint16_t>(h))))
        << "half 0x" << std::hex << h;
  }
}

TEST(ReduceKernelsTest, FloatToHalfMatchesAroundEveryBoundary) {
  // For every non-negative half h, the floats at h, at the midpoint to the
  // next half (a tie), and one ulp either side of both; then the same for
  // negatives. Plus a stride through every float bit pattern.
  auto check = [](uint32_t f) {
    ASSERT_EQ(FloatBitsToHalfBits(f), FloatToHalf(FromBits(f)))
        << "float bits 0x" << std::hex << f << " (" << FromBits(f) << ")";
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = HalfToFloat(static_cast<uint16_t>(h));
    const float hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: halves have 11 significant bits
    for (float f : {lo, mid}) {
      for (int64_t d = -1; d <= 1; ++d) {
        const uint32_t u = static_cast<uint32_t>(static_cast<int64_t>(Bits(f)) + d);
        check(u);
        check(u | 0x80000000u);
      }
    }
  }
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) check(static_cast<uint32_t>(u));
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e9f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 5.96e-8f, 2.98e-8f, 2.99e-8f}) {
    check(Bits(f));
    check(Bits(-f));
  }
}

// The scalar definition: fp32 accumulation in source order, one rounding.
float Combine(float acc, float s, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return std::max(acc, s);
    case ReduceOp::kMin:
      return std::min(acc, s);
    default:
      return acc + s;
  }
}

float Load(const std::vector<uint8_t>& v, size_t i, DType dtype) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, v.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, v.data() + 2 * i, 2);
  return dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
}

uint32_t Encoded(float f, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return Bits(f);
    case DType::kFloat16:
      return FloatToHalf(f);
    case DType::kBFloat16:
      return FloatToBFloat16(f);
  }
  return 0;
}

uint32_t Stored(const std::vector<uint8_t>& v, size_t i, DType dtype) {
  if (dtype == DType::kFloat32) {
    uint32_t u;
    std::memcpy(&u, v.data() + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, v.data() + 2 * i, 2);
  return h;
}

std::vector<uint8_t> RandomBuffer(size_t count, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<uint8_t> v(count * ElementSize(dtype) + 1);
  for (size_t i = 0; i < count; ++i) {
    float f = dist(rng);
    if (i % 101 == 7) f = std::numeric_limits<float>::infinity();
    if (i % 211 == 9) f = -0.0f;
    const uint32_t e = Encoded(f, dtype);
    if (dtype == DType::kFloat32) {
      std::memcpy(v.data() + 4 * i, &e, 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(e);
      std::memcpy(v.data() + 2 * i, &h, 2);
    }
  }
  return v;
}

TEST(ReduceKernelsTest, ReduceMatchesTheScalarDefinition) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      for (int n : {1, 2, 3, 5}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{2047}, size_t{2048},
                             size_t{2049}, size_t{5000}}) {
          const std::string ctx = absl::StrCat("dtype ", static_cast<int>(dtype), " op ",
                                               static_cast<int>(op), " n ", n, " count ", count);
          std::vector<std::vector<uint8_t>> in;
          std::vector<const void*> sources;
          for (int j = 0; j < n; ++j) in.push_back(RandomBuffer(count, dtype, rng));
          for (int j = 0; j < n; ++j) sources.push_back(in[j].data());
          const int divisor = n + 1;  // partial sums of a larger group
          std::vector<uint8_t> out0(in[0].size()), out1(in[0].size());
          Reduce(sources.data(), n, count, dtype, op, out0.data(), out1.data(), divisor);
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) {
            float acc = Load(in[0], i, dtype);
            for (int j = 1; j < n; ++j) acc = Combine(acc, Load(in[j], i, dtype), op);
            if (op == ReduceOp::kAvg) acc /= static_cast<float>(divisor);
            const uint32_t want = Encoded(acc, dtype);
            wrong += Stored(out0, i, dtype) != want || Stored(out1, i, dtype) != want;
          }
          EXPECT_EQ(wrong, 0u) << ctx;
          // In place: the output is the last source.
          std::vector<uint8_t> alias = in[n - 1];
          sources[n - 1] = alias.data();
          Reduce(sources.data(), n, count, dtype, op, alias.data(), nullptr, divisor);
          EXPECT_EQ(std::memcmp(alias.data(), out0.data(), count * ElementSize(dtype)), 0) << ctx;
        }
      }
    }
  }
}

TEST(ReduceKernelsTest, AccumulateAndConversionsMatchTheScalarDefinition) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      const size_t count = 4099;
      std::vector<uint8_t> a = RandomBuffer(count, dtype, rng), b = RandomBuffer(count, dtype, rng);
      std::vector<float> acc(count);
      ToFloat32(a.data(), count, dtype, acc.data());
      Accumulate(acc.data(), b.data(), count, dtype, op);
      std::vector<uint8_t> out(a.size());
      FromFloat32(acc.data(), count, dtype, 3, out.data());
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        const float want_acc = Combine(Load(a, i, dtype), Load(b, i, dtype), op);
        wrong += Bits(acc[i]) != Bits(want_acc);
        wrong += Stored(out, i, dtype) != Encoded(want_acc / 3.0f, dtype);
      }
      EXPECT_EQ(wrong, 0u) << "dtype " << static_cast<int>(dtype) << " op "
                           << static_cast<int>(op);
    }
  }
}

TEST(ReduceKernelsTest, CopiesAreExactAtEveryAlignmentAndLength) {
  std::vector<uint8_t> src(5000), dst(5100), dst2(5100), shm(5100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t dst_off : {0, 1, 8, 15, 16, 33}) {
    for (size_t src_off : {0, 3}) {
      for (size_t len : {0, 1, 15, 16, 63, 64, 65, 1000, 4000}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        std::fill(dst2.begin(), dst2.end(), 0xee);
        CopyStreaming(dst.data() + dst_off, src.data() + src_off, len);
        CopyTwice(shm.data(), dst2.data() + dst_off, src.data() + src_off, len, len % 2 == 0);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_off && i < dst_off + len;
          const uint8_t want = inside ? src[src_off + i - dst_off] : 0xee;
          ASSERT_EQ(dst[i], want) << "streaming dst_off " << dst_off << " src_off " << src_off
                                  << " len " << len << " at " << i;
          ASSERT_EQ(dst2[i], want) << "twice dst_off " << dst_off << " len " << len << " at " << i;
        }
        ASSERT_EQ(std::memcmp(shm.data(), src.data() + src_off, len), 0);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::worker::kernels

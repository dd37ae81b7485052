#include "worker/train/adamw.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::worker::train {
namespace {

// Straightforward double-precision AdamW, written from the header's formulas.
struct Reference {
  std::vector<double> p, m, v;
  void Step(const AdamWConfig& c, double lr, int64_t t, const std::vector<float>& g,
            const std::vector<uint8_t>& mask) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (mask[i]) p[i] -= lr * c.weight_decay * p[i];
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * double{g[i]} * g[i];
      const double m_hat = m[i] / (1 - std::pow(c.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(c.beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + c.epsilon);
    }
  }
};

TEST(AdamWTest, FirstStepMovesByLrTimesSign) {
  // At t = 1, m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps).
  AdamWConfig c;
  c.epsilon = 1e-12;
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f};
  const std::vector<float> g = {0.3f, -4.0f, 1e-3f, 0.0f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  AdamWStep(c, 0.01f, 1, p.data(), g.data(), m.data(), v.data(), nullptr, 4);
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
  EXPECT_NEAR(p[1], -1.99f, 1e-6);
  EXPECT_NEAR(p[2], 0.49f, 1e-6);
  EXPECT_EQ(p[3], 3.0f);  // zero gradient: no move
  EXPECT_NEAR(m[0], 0.1 * 0.3, 1e-7);
  EXPECT_NEAR(m[1], 0.1 * -4.0, 1e-7);
  EXPECT_NEAR(v[1], 0.001 * 16.0, 1e-8);
  EXPECT_NEAR(v[0], 0.001 * 0.09, 1e-10);

  // With a large epsilon the step shrinks: g = 1, eps = 1 gives lr / 2.
  c.epsilon = 1.0;
  std::vector<float> q = {0.0f};
  const std::vector<float> one = {1.0f};
  std::vector<float> m1 = {0.0f}, v1 = {0.0f};
  AdamWStep(c, 0.1f, 1, q.data(), one.data(), m1.data(), v1.data(), nullptr, 1);
  EXPECT_NEAR(q[0], -0.05f, 1e-7);
}

TEST(AdamWTest, WeightDecayOnlyWhereMasked) {
  AdamWConfig c;
  c.weight_decay = 0.5;
  c.epsilon = 1e-12;
  std::vector<float> p = {2.0f, 2.0f, 2.0f};
  const std::vector<float> g = {0.0f, 0.0f, 1.0f};
  std::vector<float> m(3, 0.0f), v(3, 0.0f);
  const std::vector<uint8_t> mask = {1, 0, 1};
  AdamWStep(c, 0.1f, 1, p.data(), g.data(), m.data(), v.data(), mask.data(), 3);
  EXPECT_NEAR(p[0], 2.0 * (1 - 0.1 * 0.5), 1e-6);  // 1.9: decay only
  EXPECT_EQ(p[1], 2.0f);                            // neither
  EXPECT_NEAR(p[2], 1.9 - 0.1, 1e-6);               // decay, then the Adam step

  // A null mask decays everything.
  std::vector<float> q = {2.0f, 2.0f};
  const std::vector<float> g0 = {0.0f, 0.0f};
  std::vector<float> m0(2, 0.0f), v0(2, 0.0f);
  AdamWStep(c, 0.1f, 1, q.data(), g0.data(), m0.data(), v0.data(), nullptr, 2);
  EXPECT_THAT(q, testing::Each(testing::FloatNear(1.9f, 1e-6f)));
}

TEST(AdamWTest, MatchesDoubleReferenceOverManySteps) {
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.epsilon = 1e-8;
  c.weight_decay = 0.1;
  constexpr int kN = 64;
  std::vector<float> p(kN), m(kN, 0.0f), v(kN, 0.0f), g(kN);
  std::vector<uint8_t> mask(kN);
  Reference ref;
  ref.m.assign(kN, 0.0);
  ref.v.assign(kN, 0.0);
  for (int i = 0; i < kN; ++i) {
    p[static_cast<size_t>(i)] = 0.05f * static_cast<float>(i - kN / 2);
    mask[static_cast<size_t>(i)] = i % 3 != 0;
    ref.p.push_back(p[static_cast<size_t>(i)]);
  }
  const std::vector<float> p0 = p;
  for (int64_t t = 1; t <= 50; ++t) {
    const float lr = 1e-2f * static_cast<float>(t % 7 + 1) / 7.0f;
    for (int i = 0; i < kN; ++i) {
      // Gradients that change sign and size from step to step.
      g[static_cast<size_t>(i)] =
          static_cast<float>(std::sin(0.37 * i + 0.11 * t) * (1.0 + 0.5 * std::cos(0.05 * t * i)));
    }
    AdamWStep(c, lr, t, p.data(), g.data(), m.data(), v.data(), mask.data(), kN);
    ref.Step(c, lr, t, g, mask);
    for (int i = 0; i < kN; ++i) {
      const size_t k = static_cast<size_t>(i);
      ASSERT_NEAR(p[k], ref.p[k], 2e-5) << "t=" << t << " i=" << i;
      ASSERT_NEAR(m[k], ref.m[k], 1e-6) << "t=" << t << " i=" << i;
      ASSERT_NEAR(v[k], ref.v[k], 1e-6) << "t=" << t << " i=" << i;
    }
  }
  // The parameters really moved (about 50 steps of up to lr).
  double moved = 0;
  for (int i = 0; i < kN; ++i) moved += std::fabs(p[static_cast<size_t>(i)] - p0[static_cast<size_t>(i)]);
  EXPECT_GT(moved / kN, 0.01);
}

TEST(AdamWTest, BiasCorrectionWithConstantGradient) {
  // With a constant gradient g, m_hat = g and v_hat = g^2 at every t (bias
  // correction exactly undoes the zero start), so each step is lr * sign(g).
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.epsilon = 1e-12;
  std::vector<float> p = {0.0f}, m = {0.0f}, v = {0.0f};
  const std::vector<float> g = {0.25f};
  for (int64_t t = 1; t <= 20; ++t) {
    AdamWStep(c, 1e-3f, t, p.data(), g.data(), m.data(), v.data(), nullptr, 1);
    EXPECT_NEAR(p[0], -1e-3 * t, 1e-6 * t) << t;
  }
  // Without the correction, step 1 would have been lr * 0.1 / sqrt(0.001) = 3.16 lr.
}

TEST(LearningRateTest, WarmupThenCosine) {
  LearningRateSchedule s;
  s.learning_rate = 6e-4;
  s.min_learning_rate = 6e-5;
  s.warmup_steps = 100;
  s.total_steps = 1100;
  EXPECT_DOUBLE_EQ(LearningRate(0, s), 6e-4 / 100);
  EXPECT_DOUBLE_EQ(LearningRate(49, s), 6e-4 * 50 / 100);
  EXPECT_DOUBLE_EQ(LearningRate(99, s), 6e-4);   // last warmup step reaches the peak
  EXPECT_DOUBLE_EQ(LearningRate(100, s), 6e-4);  // r = 0
  EXPECT_DOUBLE_EQ(LearningRate(600, s), (6e-4 + 6e-5) / 2);  // r = 1/2
  // r = 1/4: min + (lr - min) (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(LearningRate(350, s), 6e-5 + 5.4e-4 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(1100, s), 6e-5);
  EXPECT_DOUBLE_EQ(LearningRate(5000, s), 6e-5);
  // Monotone non-increasing after warmup.
  for (int64_t t = 100; t < 1200; ++t) EXPECT_LE(LearningRate(t + 1, s), LearningRate(t, s)) << t;
}

TEST(LearningRateTest, NoWarmupAndDegenerateSchedules) {
  LearningRateSchedule s;
  s.learning_rate = 1.0;
  s.min_learning_rate = 0.0;
  s.warmup_steps = 0;
  s.total_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRate(0, s), 1.0);
  EXPECT_NEAR(LearningRate(1, s), (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_NEAR(LearningRate(2, s), 0.5, 1e-15);
  EXPECT_NEAR(LearningRate(4, s), 0.0, 1e-15);
  // Warmup as long as the whole schedule: warmup, then the floor.
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRate(3, s), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(4, s), 0.0);
}

TEST(SumOfSquaresTest, Values) {
  const std::vector<float> x = {3.0f, -4.0f, 0.5f};
  EXPECT_DOUBLE_EQ(SumOfSquares(x.data(), 3), 25.25);
  EXPECT_DOUBLE_EQ(SumOfSquares(x.data(), 0), 0.0);
  // Accumulates in double: 2^20 copies of 1e-3 (fp32) without fp32 drift.
  const std::vector<float> small(1 << 20, 1e-3f);
  const double e = static_cast<double>(1e-3f);
  EXPECT_NEAR(SumOfSquares(small.data(), 1 << 20), e * e * (1 << 20), 1e-9);  // fp32: ~1e-2
}

}  // namespace
}  // namespace shardline::worker::train

#include "worker/train/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::worker::train {
namespace {

using ::testing::DoubleNear;
using ::testing::FloatEq;
using ::testing::FloatNear;

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override { SetIntraOpThreads(1); }
};

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central-difference gradient of the scalar `objective` w.r.t. every element of
// `v` (perturbed in place and restored). The step actually taken is measured
// after fp32 rounding.
std::vector<double> NumericGrad(std::vector<float>& v, const std::function<double()>& objective,
                                float eps = 1e-3f) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float orig = v[i];
    const float plus = orig + eps;
    const float minus = orig - eps;
    v[i] = plus;
    const double fp = objective();
    v[i] = minus;
    const double fm = objective();
    v[i] = orig;
    g[i] = (fp - fm) / (static_cast<double>(plus) - minus);
  }
  return g;
}

// Compares an analytic gradient with a numeric one: relative L2 error below
// 1e-2, and each element within 1e-2 of the largest gradient magnitude.
void ExpectGradNear(const std::vector<float>& analytic, const std::vector<double>& numeric,
                    const std::string& what) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  double diff2 = 0.0, ref2 = 0.0, max_abs = 0.0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    const double d = analytic[i] - numeric[i];
    diff2 += d * d;
    ref2 += numeric[i] * numeric[i];
    max_abs = std::max(max_abs, std::abs(numeric[i]));
  }
  ASSERT_GT(max_abs, 1e-3) << what << ": gradient is ~0, the check would be vacuous";
  EXPECT_LT(std::sqrt(diff2 / ref2), 1e-2) << what;
  for (size_t i = 0; i < analytic.size(); ++i) {
    EXPECT_NEAR(analytic[i], numeric[i], 1e-2 * max_abs + 1e-4) << what << " element " << i;
  }
}

// --- Gemm -------------------------------------------------------------------

TEST_F(OpsTest, GemmAllTransposeCombosMatchNaiveLoop) {
  const int64_t m = 5, n = 7, k = 4;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::vector<float> a = Random(m * k, 1);
      const std::vector<float> b = Random(k * n, 2);
      std::vector<float> c = Random(m * n, 3);
      std::vector<double> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            const float av = ta ? a[p * m + i] : a[i * k + p];
            const float bv = tb ? b[j * k + p] : b[p * n + j];
            s += static_cast<double>(av) * bv;
          }
          want[i * n + j] = 1.5 * s + 0.5 * c[i * n + j];
        }
      }
      Gemm(ta, tb, m, n, k, 1.5f, a.data(), b.data(), 0.5f, c.data());
      for (int64_t i = 0; i < m * n; ++i) {
        EXPECT_THAT(c[i], FloatNear(static_cast<float>(want[i]), 1e-5f))
            << "trans_a=" << ta << " trans_b=" << tb << " i=" << i;
      }
    }
  }
}

TEST_F(OpsTest, GemmBetaZeroIgnoresGarbageInC) {
  const std::vector<float> a = {1, 2, 3, 4};  // [2, 2]
  const std::vector<float> b = {5, 6, 7, 8};  // [2, 2]
  std::vector<float> c(4, std::numeric_limits<float>::quiet_NaN());
  Gemm(false, false, 2, 2, 2, 1.0f, a.data(), b.data(), 0.0f, c.data());
  EXPECT_THAT(c, ::testing::ElementsAre(19.0f, 22.0f, 43.0f, 50.0f));
}

// --- Linear -----------------------------------------------------------------

TEST_F(OpsTest, LinearForwardMatchesNaive) {
  const int64_t rows = 3, in = 4, out = 5;
  const auto x = Random(rows * in, 10), w = Random(out * in, 11), b = Random(out, 12);
  std::vector<float> y(rows * out), y_nobias(rows * out);
  LinearForward(x.data(), w.data(), b.data(), y.data(), rows, in, out);
  LinearForward(x.data(), w.data(), nullptr, y_nobias.data(), rows, in, out);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[t * in + i]) * w[o * in + i];
      EXPECT_THAT(y_nobias[t * out + o], FloatNear(static_cast<float>(s), 1e-5f));
      EXPECT_THAT(y[t * out + o], FloatNear(static_cast<float>(s + b[o]), 1e-5f));
    }
  }
}

TEST_F(OpsTest, LinearBackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, in = 5, out = 3;
  auto x = Random(rows * in, 20), w = Random(out * in, 21), b = Random(out, 22);
  const auto dy = Random(rows * out, 23);
  auto objective = [&] {
    std::vector<float> y(rows * out);
    LinearForward(x.data(), w.data(), b.data(), y.data(), rows, in, out);
    return Dot(dy, y);
  };
  std::vector<float> dx(rows * in), dw(out * in, 0.0f), db(out, 0.0f);
  LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), rows, in, out);
  ExpectGradNear(dx, NumericGrad(x, objective), "dx");
  ExpectGradNear(dw, NumericGrad(w, objective), "dw");
  ExpectGradNear(db, NumericGrad(b, objective), "db");
}

TEST_F(OpsTest, LinearBackwardAccumulatesParamsOverwritesActivations) {
  const int64_t rows = 3, in = 4, out = 2;
  const auto x = Random(rows * in, 30), w = Random(out * in, 31), dy = Random(rows * out, 32);
  std::vector<float> dx1(rows * in, 7.0f), dw1(out * in, 0.0f), db1(out, 0.0f);
  LinearBackward(x.data(), w.data(), dy.data(), dx1.data(), dw1.data(), db1.data(), rows, in,
                 out);
  std::vector<float> dx2(rows * in, -3.0f), dw2(out * in, 0.0f), db2(out, 0.0f);
  LinearBackward(x.data(), w.data(), dy.data(), dx2.data(), dw2.data(), db2.data(), rows, in,
                 out);
  LinearBackward(x.data(), w.data(), dy.data(), dx2.data(), dw2.data(), db2.data(), rows, in,
                 out);
  for (size_t i = 0; i < dx1.size(); ++i) EXPECT_THAT(dx2[i], FloatEq(dx1[i]));
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_THAT(dw2[i], FloatNear(2 * dw1[i], 1e-6f));
  for (size_t i = 0; i < db1.size(); ++i) EXPECT_THAT(db2[i], FloatNear(2 * db1[i], 1e-6f));

  // Null dx and db are skipped; dw still accumulates.
  std::vector<float> dw3(out * in, 0.0f);
  LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw3.data(), nullptr, rows, in, out);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_THAT(dw3[i], FloatEq(dw1[i]));
}

// --- LayerNorm --------------------------------------------------------------

TEST_F(OpsTest, LayerNormNormalisesEachRow) {
  const int64_t rows = 4, width = 64;
  auto x = Random(rows * width, 40, -3.0f, 5.0f);
  for (int64_t i = 0; i < width; ++i) x[i] += 1000.0f;  // large mean: no cancellation
  const std::vector<float> gamma(width, 1.0f), beta(width, 0.0f);
  std::vector<float> y(rows * width), mean(rows), rstd(rows);
  LayerNormForward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                   width);
  for (int64_t t = 0; t < rows; ++t) {
    double s = 0.0, s2 = 0.0, xs = 0.0;
    for (int64_t i = 0; i < width; ++i) {
      s += y[t * width + i];
      xs += x[t * width + i];
    }
    const double mu = s / width;
    for (int64_t i = 0; i < width; ++i) s2 += (y[t * width + i] - mu) * (y[t * width + i] - mu);
    EXPECT_THAT(mu, DoubleNear(0.0, 1e-5)) << "row " << t;
    // Biased variance with eps 1e-5 inside the sqrt: var(y) = var / (var + eps).
    EXPECT_THAT(s2 / width, DoubleNear(1.0, 1e-3)) << "row " << t;
    EXPECT_THAT(mean[t], FloatNear(static_cast<float>(xs / width), 1e-3f));
  }
}

TEST_F(OpsTest, LayerNormAppliesGammaBeta) {
  const std::vector<float> x = {1, 2, 3, 4};  // mean 2.5, biased var 1.25
  const std::vector<float> gamma = {2, 2, 2, 2}, beta = {1, 1, 1, 1};
  std::vector<float> y(4), mean(1), rstd(1);
  LayerNormForward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), 1, 4);
  const double rs = 1.0 / std::sqrt(1.25 + 1e-5);
  EXPECT_THAT(mean[0], FloatEq(2.5f));
  EXPECT_THAT(rstd[0], FloatNear(static_cast<float>(rs), 1e-6f));
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(y[i], FloatNear(static_cast<float>((x[i] - 2.5) * rs * 2 + 1), 1e-5f));
  }
}

TEST_F(OpsTest, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, width = 8;
  auto x = Random(rows * width, 50), gamma = Random(width, 51, 0.5f, 1.5f),
       beta = Random(width, 52);
  const auto dy = Random(rows * width, 53);
  auto objective = [&] {
    std::vector<float> y(rows * width), mean(rows), rstd(rows);
    LayerNormForward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(),
                     rows, width);
    return Dot(dy, y);
  };
  std::vector<float> y(rows * width), mean(rows), rstd(rows);
  LayerNormForward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                   width);
  std::vector<float> dx(rows * width), dgamma(width, 0.0f), dbeta(width, 0.0f);
  LayerNormBackward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                    dgamma.data(), dbeta.data(), rows, width);
  ExpectGradNear(dx, NumericGrad(x, objective), "dx");
  ExpectGradNear(dgamma, NumericGrad(gamma, objective), "dgamma");
  ExpectGradNear(dbeta, NumericGrad(beta, objective), "dbeta");

  // A second call doubles dgamma/dbeta and rewrites dx unchanged.
  std::vector<float> dx2(rows * width, 5.0f);
  const auto dgamma1 = dgamma, dbeta1 = dbeta;
  LayerNormBackward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx2.data(),
                    dgamma.data(), dbeta.data(), rows, width);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_THAT(dx2[i], FloatEq(dx[i]));
  for (int64_t i = 0; i < width; ++i) {
    EXPECT_THAT(dgamma[i], FloatNear(2 * dgamma1[i], 1e-6f));
    EXPECT_THAT(dbeta[i], FloatNear(2 * dbeta1[i], 1e-6f));
  }
}

// --- GELU -------------------------------------------------------------------

TEST_F(OpsTest, GeluKnownValues) {
  const std::vector<float> x = {0.0f, 1.0f, -1.0f, 3.0f, -6.0f};
  std::vector<float> y(x.size());
  GeluForward(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_THAT(y[1], FloatNear(0.841192f, 1e-6f));
  EXPECT_THAT(y[2], FloatNear(-0.158808f, 1e-6f));
  EXPECT_THAT(y[3], FloatNear(2.996363f, 1e-5f));
  EXPECT_THAT(y[4], FloatNear(0.0f, 1e-6f));

  // gelu'(0) = 0.5; in place (y aliases x) gives the same values.
  std::vector<float> g(1), one = {1.0f}, zero = {0.0f};
  GeluBackward(zero.data(), one.data(), g.data(), 1);
  EXPECT_THAT(g[0], FloatEq(0.5f));
  std::vector<float> inplace = x;
  GeluForward(inplace.data(), inplace.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(inplace, y);
}

TEST_F(OpsTest, GeluBackwardMatchesFiniteDifferences) {
  const int64_t n = 40;
  auto x = Random(n, 60, -4.0f, 4.0f);
  const auto dy = Random(n, 61);
  auto objective = [&] {
    std::vector<float> y(n);
    GeluForward(x.data(), y.data(), n);
    return Dot(dy, y);
  };
  std::vector<float> dx(n);
  GeluBackward(x.data(), dy.data(), dx.data(), n);
  ExpectGradNear(dx, NumericGrad(x, objective), "dx");

  // dx may alias dy.
  std::vector<float> aliased = dy;
  GeluBackward(x.data(), aliased.data(), aliased.data(), n);
  EXPECT_EQ(aliased, dx);
}

// The GELU of ops.h and its derivative in double precision, the references
// of the float kernels: written with s = 1 / (1 + exp(-2u)) = 0.5 (1 +
// tanh(u)), since 1 + tanh(u) cancels to nothing even in double below x = -6.
double GeluReference(double x) {
  const double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}
double GeluGradReference(double x) {
  const double c = 0.79788456080286535588, a = 0.044715;
  const double s = 1.0 / (1.0 + std::exp(-2.0 * c * (x + a * x * x * x)));
  return s + 2.0 * x * s * (1.0 - s) * c * (1.0 + 3.0 * a * x * x);
}

// Every float of [-12, 12] in steps of 2^-10 (24577 values: the whole range
// where GELU is neither x nor 0 in float), against the double formulas.
// Bound (ops.h): relative error <= 2e-7 (1 + |2u|), u the tanh argument
// (float's rounding of u, magnified |2u| times by exp), for both the value
// and the derivative; plus, for the value, 1e-36 absolute below x = -10,
// where exp's clamp at 88 stops the result shrinking at about 6e-39 |x|
// instead of 0, and for the derivative 1.2e-7 absolute (2 ulp of its two
// terms, about 0.5 each where it crosses zero near x = -0.75).
TEST_F(OpsTest, VectorisedGeluMatchesTheDoubleFormula) {
  std::vector<float> x;
  for (int i = -12 * 1024; i <= 12 * 1024; ++i) x.push_back(static_cast<float>(i) / 1024.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), ones(n, 1.0f), g(n);
  GeluForward(x.data(), y.data(), n);
  GeluBackward(x.data(), ones.data(), g.data(), n);
  double worst_y = 0, worst_g = 0;  // in units of the bound
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double two_u = 2 * 0.79788456080286535588 * (v + 0.044715 * v * v * v);
    const double rel_bound = 2e-7 * (1 + std::fabs(two_u));
    const double want = GeluReference(v);
    const double bound = std::max(rel_bound * std::fabs(want), 1e-36);
    const double err = std::fabs(y[i] - want);
    worst_y = std::max(worst_y, err / bound);
    EXPECT_LE(err, bound) << "gelu(" << v << ") = " << y[i] << ", want " << want;
    const double gwant = GeluGradReference(v);
    const double gbound = std::max(rel_bound * std::fabs(gwant), 1.2e-7);
    const double gerr = std::fabs(g[i] - gwant);
    worst_g = std::max(worst_g, gerr / gbound);
    EXPECT_LE(gerr, gbound) << "gelu'(" << v << ") = " << g[i] << ", want " << gwant;
  }
  std::printf("worst error as a fraction of the bound: forward %.3g, backward %.3g\n", worst_y,
              worst_g);
}

// The fused bias + GELU is the bias added, then (bf16) rounded, then GELU
// (then rounded), bit for bit, both ways; also in place.
TEST_F(OpsTest, BiasGeluIsTheBiasThenGeluBitForBit) {
  const int64_t rows = 37, width = 50, n = rows * width;
  const std::vector<float> x = Random(n, 41, -5.0f, 5.0f), b = Random(width, 42),
                           dy = Random(n, 43);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    std::vector<float> pre(n);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < width; ++j) pre[t * width + j] = x[t * width + j] + b[j];
    }
    if (bf16) RoundToBFloat16(pre.data(), n);
    std::vector<float> want_y(n), want_dx(n);
    GeluForward(pre.data(), want_y.data(), n);
    GeluBackward(pre.data(), dy.data(), want_dx.data(), n);
    if (bf16) {
      RoundToBFloat16(want_y.data(), n);
      RoundToBFloat16(want_dx.data(), n);
    }
    std::vector<float> y(n), dx(n);
    BiasGeluForward(x.data(), b.data(), y.data(), rows, width, bf16);
    BiasGeluBackward(x.data(), b.data(), dy.data(), dx.data(), rows, width, bf16);
    EXPECT_EQ(y, want_y);
    EXPECT_EQ(dx, want_dx);
    EXPECT_NE(y, std::vector<float>(n, 0.0f));
    std::vector<float> in_place = x, grad = dy;
    BiasGeluBackward(in_place.data(), b.data(), grad.data(), grad.data(), rows, width, bf16);
    BiasGeluForward(in_place.data(), b.data(), in_place.data(), rows, width, bf16);
    EXPECT_EQ(in_place, want_y);
    EXPECT_EQ(grad, want_dx);
  }
}

// Far outside [-12, 12] GELU is x (above) or 0 (below); exp's clamping keeps
// every result finite; NaN stays NaN; every length gives the same values
// (the vector blocks and the padded tail agree).
TEST_F(OpsTest, VectorisedGeluEdgesAndLengths) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {40.0f, 1e30f, -40.0f, -1e30f, inf, std::nanf("")};
  std::vector<float> y(x.size()), g(x.size()), ones(x.size(), 1.0f);
  GeluForward(x.data(), y.data(), static_cast<int64_t>(x.size()));
  GeluBackward(x.data(), ones.data(), g.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 40.0f);
  EXPECT_EQ(y[1], 1e30f);
  EXPECT_LE(std::fabs(y[2]), 1e-30f);
  EXPECT_LE(std::fabs(y[3]), 1e-7f);  // -1e30 * 6e-39
  EXPECT_EQ(y[4], inf);
  EXPECT_TRUE(std::isnan(y[5]));
  EXPECT_EQ(g[0], 1.0f);
  EXPECT_LE(std::fabs(g[2]), 1e-30f);
  EXPECT_TRUE(std::isnan(g[5]));

  const auto big = Random(100, 62, -6.0f, 6.0f);
  const auto dy = Random(100, 63);
  std::vector<float> all(100), all_dx(100);
  GeluForward(big.data(), all.data(), 100);
  GeluBackward(big.data(), dy.data(), all_dx.data(), 100);
  for (int64_t len = 1; len <= 40; ++len) {
    for (int64_t start : {int64_t{0}, int64_t{3}, int64_t{17}}) {
      std::vector<float> part(len), part_dx(len);
      GeluForward(big.data() + start, part.data(), len);
      GeluBackward(big.data() + start, dy.data() + start, part_dx.data(), len);
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(part[i], all[start + i]) << "len " << len << " start " << start << " i " << i;
        ASSERT_EQ(part_dx[i], all_dx[start + i]) << "len " << len << " start " << start;
      }
    }
  }
}

// --- Attention --------------------------------------------------------------

// Index of qkv[b, s, h, which, d].
int64_t QkvIndex(int64_t b, int64_t s, int64_t h, int64_t which, int64_t d, int64_t seq,
                 int64_t heads, int64_t hd) {
  return (((b * seq + s) * heads + h) * 3 + which) * hd + d;
}

TEST_F(OpsTest, AttentionMatchesNaiveSoftmax) {
  const int64_t batch = 2, seq = 5, heads = 3, hd = 4;
  const auto qkv = Random(batch * seq * heads * 3 * hd, 70);
  std::vector<float> probs(batch * heads * seq * seq), y(batch * seq * heads * hd);
  AttentionForward(qkv.data(), probs.data(), y.data(), batch, seq, heads, hd);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e30, sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += static_cast<double>(qkv[QkvIndex(b, i, h, 0, d, seq, heads, hd)]) *
                   qkv[QkvIndex(b, j, h, 1, d, seq, heads, hd)];
          }
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        const float* prow = probs.data() + ((b * heads + h) * seq + i) * seq;
        for (int64_t j = 0; j < seq; ++j) {
          if (j <= i) {
            EXPECT_THAT(prow[j], FloatNear(static_cast<float>(s[j] / sum), 1e-6f));
          } else {
            EXPECT_EQ(prow[j], 0.0f);
          }
        }
        for (int64_t d = 0; d < hd; ++d) {
          double out = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            out += s[j] / sum * qkv[QkvIndex(b, j, h, 2, d, seq, heads, hd)];
          }
          EXPECT_THAT(y[((b * seq + i) * heads + h) * hd + d],
                      FloatNear(static_cast<float>(out), 1e-5f));
        }
      }
    }
  }
}

TEST_F(OpsTest, AttentionWithOneTokenReturnsV) {
  const int64_t batch = 2, seq = 1, heads = 3, hd = 4;
  const auto qkv = Random(batch * seq * heads * 3 * hd, 71, -5.0f, 5.0f);
  std::vector<float> probs(batch * heads), y(batch * heads * hd);
  AttentionForward(qkv.data(), probs.data(), y.data(), batch, seq, heads, hd);
  for (float p : probs) EXPECT_EQ(p, 1.0f);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        EXPECT_EQ(y[(b * heads + h) * hd + d], qkv[QkvIndex(b, 0, h, 2, d, seq, heads, hd)]);
      }
    }
  }
}

TEST_F(OpsTest, AttentionIsCausal) {
  const int64_t batch = 2, seq = 6, heads = 2, hd = 4, later = 4;
  const auto qkv = Random(batch * seq * heads * 3 * hd, 72);
  std::vector<float> probs(batch * heads * seq * seq), y(batch * seq * heads * hd);
  AttentionForward(qkv.data(), probs.data(), y.data(), batch, seq, heads, hd);
  // Change q, k and v of token `later` (and after) in every batch and head.
  auto changed = qkv;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = later; s < seq; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t w = 0; w < 3; ++w) {
          for (int64_t d = 0; d < hd; ++d) changed[QkvIndex(b, s, h, w, d, seq, heads, hd)] += 3;
        }
      }
    }
  }
  std::vector<float> probs2(probs.size()), y2(y.size());
  AttentionForward(changed.data(), probs2.data(), y2.data(), batch, seq, heads, hd);
  int64_t changed_later = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t i = 0; i < heads * hd; ++i) {
        const int64_t idx = (b * seq + s) * heads * hd + i;
        if (s < later) {
          EXPECT_EQ(y2[idx], y[idx]) << "b=" << b << " s=" << s;
        } else if (y2[idx] != y[idx]) {
          ++changed_later;
        }
      }
    }
  }
  EXPECT_GT(changed_later, 0);  // the perturbation was real
}

TEST_F(OpsTest, AttentionBackwardMatchesFiniteDifferences) {
  const int64_t batch = 2, seq = 4, heads = 2, hd = 3;
  auto qkv = Random(batch * seq * heads * 3 * hd, 80);
  const auto dy = Random(batch * seq * heads * hd, 81);
  auto objective = [&] {
    std::vector<float> probs(batch * heads * seq * seq), y(batch * seq * heads * hd);
    AttentionForward(qkv.data(), probs.data(), y.data(), batch, seq, heads, hd);
    return Dot(dy, y);
  };
  std::vector<float> probs(batch * heads * seq * seq), y(batch * seq * heads * hd);
  AttentionForward(qkv.data(), probs.data(), y.data(), batch, seq, heads, hd);
  std::vector<float> dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  AttentionBackward(qkv.data(), probs.data(), dy.data(), dqkv.data(), batch, seq, heads, hd);
  ExpectGradNear(dqkv, NumericGrad(qkv, objective), "dqkv");
}

// bf16 attention: the probabilities are the fp32 path's rounded to bf16 (bit
// for bit), y is the product of those with v, and backward's dV reads them
// while dQ and dK read the score gradient rounded to bf16: checked against a
// reference in double that follows those rules, and against the same
// reference without the rounding of dS, which must be measurably worse.
TEST_F(OpsTest, Bf16AttentionRoundsProbabilitiesAndScoreGradients) {
  const int64_t batch = 2, seq = 24, heads = 2, hd = 8;
  auto qkv = Random(batch * seq * heads * 3 * hd, 82, -2.0f, 2.0f);
  auto dy = Random(batch * seq * heads * hd, 83);
  RoundToBFloat16(qkv.data(), static_cast<int64_t>(qkv.size()));
  RoundToBFloat16(dy.data(), static_cast<int64_t>(dy.size()));
  const int64_t p_n = batch * heads * seq * seq, y_n = batch * seq * heads * hd;
  std::vector<float> p32(p_n), y32(y_n), p16(p_n), y16(y_n);
  AttentionForward(qkv.data(), p32.data(), y32.data(), batch, seq, heads, hd);
  AttentionForward(qkv.data(), p16.data(), y16.data(), batch, seq, heads, hd, /*bf16=*/true);
  std::vector<float> rounded = p32;
  RoundToBFloat16(rounded.data(), p_n);
  ASSERT_EQ(p16, rounded);
  ASSERT_NE(p16, p32);  // the rounding changed something
  std::vector<float> dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  AttentionBackward(qkv.data(), p16.data(), dy.data(), dqkv.data(), batch, seq, heads, hd,
                    /*bf16=*/true);

  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  double y_err = 0, y_norm = 0;
  // [0]: dS rounded to bf16 (the rule); [1]: not rounded.
  double dqk_err[2] = {0, 0}, dqk_norm = 0, dv_err = 0, dv_norm = 0;
  auto q = [&](int64_t b, int64_t s, int64_t h, int64_t which, int64_t d) {
    return static_cast<double>(qkv[QkvIndex(b, s, h, which, d, seq, heads, hd)]);
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* p = p16.data() + (b * heads + h) * seq * seq;
      auto dyv = [&](int64_t s, int64_t d) {
        return static_cast<double>(dy[((b * seq + s) * heads + h) * hd + d]);
      };
      // Forward: y = P16 V.
      for (int64_t i = 0; i < seq; ++i) {
        for (int64_t d = 0; d < hd; ++d) {
          double out = 0;
          for (int64_t j = 0; j <= i; ++j) out += p[i * seq + j] * q(b, j, h, 2, d);
          const double got = y16[((b * seq + i) * heads + h) * hd + d];
          y_err += (got - out) * (got - out);
          y_norm += out * out;
        }
      }
      // Backward: dP = dY V^T, dS = P16 (dP - sum_j P16 dP), rounded or not.
      std::vector<double> ds[2];
      ds[0].assign(seq * seq, 0.0);
      ds[1].assign(seq * seq, 0.0);
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> dp(i + 1);
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < hd; ++d) dp[j] += dyv(i, d) * q(b, j, h, 2, d);
          dot += p[i * seq + j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double v = p[i * seq + j] * (dp[j] - dot);
          float f = static_cast<float>(v);
          RoundToBFloat16(&f, 1);
          ds[0][i * seq + j] = f;
          ds[1][i * seq + j] = v;
        }
      }
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t d = 0; d < hd; ++d) {
          double dv = 0;
          for (int64_t i = t; i < seq; ++i) dv += p[i * seq + t] * dyv(i, d);
          const double got_dv = dqkv[QkvIndex(b, t, h, 2, d, seq, heads, hd)];
          dv_err += (got_dv - dv) * (got_dv - dv);
          dv_norm += dv * dv;
          for (int r = 0; r < 2; ++r) {
            double dq = 0, dk = 0;
            for (int64_t j = 0; j <= t; ++j) dq += ds[r][t * seq + j] * q(b, j, h, 1, d);
            for (int64_t i = t; i < seq; ++i) dk += ds[r][i * seq + t] * q(b, i, h, 0, d);
            dq *= scale;
            dk *= scale;
            const double got_dq = dqkv[QkvIndex(b, t, h, 0, d, seq, heads, hd)];
            const double got_dk = dqkv[QkvIndex(b, t, h, 1, d, seq, heads, hd)];
            dqk_err[r] += (got_dq - dq) * (got_dq - dq) + (got_dk - dk) * (got_dk - dk);
            if (r == 0) dqk_norm += dq * dq + dk * dk;
          }
        }
      }
    }
  }
  EXPECT_LT(std::sqrt(y_err / y_norm), 1e-6);
  EXPECT_LT(std::sqrt(dv_err / dv_norm), 1e-6);
  const double rounded_err = std::sqrt(dqk_err[0] / dqk_norm);
  const double unrounded_err = std::sqrt(dqk_err[1] / dqk_norm);
  EXPECT_LT(rounded_err, 1e-4);
  EXPECT_GT(unrounded_err, 10 * rounded_err) << "dS was not rounded to bf16";
}

TEST_F(OpsTest, AttentionTrainerShapeProbsSumToOne) {
  // The trainer's shape: batch 12, seq 64, 4 heads of 32 (a few ms on one
  // core; no timing assertion, the machine is shared).
  const int64_t batch = 12, seq = 64, heads = 4, hd = 32;
  const auto qkv = Random(batch * seq * heads * 3 * hd, 90);
  const auto dy = Random(batch * seq * heads * hd, 91);
  std::vector<float> probs(batch * heads * seq * seq), y(batch * seq * heads * hd),
      dqkv(qkv.size());
  for (int rep = 0; rep < 5; ++rep) {
    AttentionForward(qkv.data(), probs.data(), y.data(), batch, seq, heads, hd);
    AttentionBackward(qkv.data(), probs.data(), dy.data(), dqkv.data(), batch, seq, heads, hd);
  }
  // Each probability row sums to 1.
  for (int64_t r = 0; r < batch * heads * seq; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < seq; ++j) s += probs[r * seq + j];
    EXPECT_THAT(s, DoubleNear(1.0, 1e-5)) << "row " << r;
  }
  for (float g : dqkv) ASSERT_TRUE(std::isfinite(g));
}

// --- Embeddings -------------------------------------------------------------

TEST_F(OpsTest, EmbeddingLooksUpLocalRowsAndZeroesOthers) {
  const int64_t width = 3, vocab_begin = 4, vocab_local = 4;  // rows 4..7 of 10
  const auto table = Random(vocab_local * width, 100);
  const std::vector<int32_t> tokens = {0, 4, 7, 8, 5, 3};
  std::vector<float> y(tokens.size() * width, 9.0f);
  EmbeddingForward(tokens.data(), table.data(), y.data(), static_cast<int64_t>(tokens.size()),
                   width, vocab_begin, vocab_local);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int64_t local = tokens[t] - vocab_begin;
    for (int64_t i = 0; i < width; ++i) {
      const float want = (local >= 0 && local < vocab_local) ? table[local * width + i] : 0.0f;
      EXPECT_EQ(y[t * width + i], want) << "token " << tokens[t];
    }
  }
}

TEST_F(OpsTest, EmbeddingBackwardAccumulatesInRangeOnly) {
  const int64_t width = 2, vocab_begin = 2, vocab_local = 3;
  const std::vector<int32_t> tokens = {2, 4, 2, 0, 5};
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> dtable(vocab_local * width, 1.0f);
  EmbeddingBackward(tokens.data(), dy.data(), dtable.data(), 5, width, vocab_begin, vocab_local);
  // Row 0 (token 2): 1 + (1,2) + (5,6); row 1 (token 3): untouched; row 2
  // (token 4): 1 + (3,4). Tokens 0 and 5 are another rank's.
  EXPECT_THAT(dtable, ::testing::ElementsAre(7.0f, 9.0f, 1.0f, 1.0f, 4.0f, 5.0f));
}

TEST_F(OpsTest, AddPositionForwardAndBackward) {
  const int64_t batch = 2, seq = 3, width = 2, rows = batch * seq;
  const std::vector<float> pos = {1, 2, 3, 4, 5, 6};
  std::vector<float> y(rows * width, 10.0f);
  AddPositionForward(pos.data(), y.data(), rows, seq, width);
  EXPECT_THAT(y, ::testing::ElementsAre(11, 12, 13, 14, 15, 16, 11, 12, 13, 14, 15, 16));

  std::vector<float> dy(rows * width);
  for (int64_t i = 0; i < rows * width; ++i) dy[i] = static_cast<float>(i);
  std::vector<float> dpos(seq * width, 0.5f);
  AddPositionBackward(dy.data(), dpos.data(), rows, seq, width);
  // dpos[s] = 0.5 + dy[s] + dy[seq + s].
  EXPECT_THAT(dpos, ::testing::ElementsAre(6.5f, 8.5f, 10.5f, 12.5f, 14.5f, 16.5f));
}

// --- Cross entropy ----------------------------------------------------------

struct CeResult {
  std::vector<float> loss;
  std::vector<float> dlogits;  // [rows, vocab]
};

// Runs the vocab-parallel cross entropy over `splits` equal vocab shards,
// combining the per-shard pieces the way the tensor-parallel all-reduces do.
CeResult VocabParallelCe(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                         int64_t rows, int64_t vocab, int splits, float scale) {
  const int64_t local = vocab / splits;
  std::vector<std::vector<float>> shards(splits, std::vector<float>(rows * local));
  for (int r = 0; r < splits; ++r) {
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < local; ++j) {
        shards[r][t * local + j] = logits[t * vocab + r * local + j];
      }
    }
  }
  std::vector<float> row_max(rows, -std::numeric_limits<float>::infinity());
  for (int r = 0; r < splits; ++r) {
    std::vector<float> m(rows);
    LocalRowMax(shards[r].data(), m.data(), rows, local);
    for (int64_t t = 0; t < rows; ++t) row_max[t] = std::max(row_max[t], m[t]);  // MAX
  }
  std::vector<float> sum_exp(rows, 0.0f), target_logit(rows, 0.0f);
  for (int r = 0; r < splits; ++r) {
    std::vector<float> s(rows), tl(rows);
    LocalSumExpAndTarget(shards[r].data(), row_max.data(), targets.data(), s.data(), tl.data(),
                         rows, r * local, local);
    for (int64_t t = 0; t < rows; ++t) {  // SUM
      sum_exp[t] += s[t];
      target_logit[t] += tl[t];
    }
  }
  CeResult out;
  out.loss.resize(rows);
  TokenLoss(row_max.data(), sum_exp.data(), target_logit.data(), out.loss.data(), rows);
  out.dlogits.resize(rows * vocab);
  for (int r = 0; r < splits; ++r) {
    std::vector<float> d(rows * local);
    CrossEntropyBackward(shards[r].data(), row_max.data(), sum_exp.data(), targets.data(), scale,
                         d.data(), rows, r * local, local);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < local; ++j) out.dlogits[t * vocab + r * local + j] = d[t * local + j];
    }
  }
  return out;
}

TEST_F(OpsTest, CrossEntropyOfUniformLogitsIsLogVocab) {
  const int64_t rows = 3, vocab = 64;
  const std::vector<float> logits(rows * vocab, 2.5f);
  const std::vector<int32_t> targets = {0, 17, 63};
  const CeResult r = VocabParallelCe(logits, targets, rows, vocab, 1, 1.0f);
  for (float l : r.loss) EXPECT_THAT(l, FloatNear(static_cast<float>(std::log(64.0)), 1e-6f));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < vocab; ++j) {
      const float want = 1.0f / vocab - (j == targets[t] ? 1.0f : 0.0f);
      EXPECT_THAT(r.dlogits[t * vocab + j], FloatNear(want, 1e-7f));
    }
  }
}

TEST_F(OpsTest, CrossEntropyMatchesNaiveAndStableForLargeLogits) {
  const int64_t rows = 2, vocab = 5;
  const std::vector<float> logits = {1000, 1001, 1002, 999, 1000,  // would overflow exp()
                                     -1, 0, 1, 2, 3};
  const std::vector<int32_t> targets = {2, 0};
  const CeResult r = VocabParallelCe(logits, targets, rows, vocab, 1, 1.0f);
  for (int64_t t = 0; t < rows; ++t) {
    double mx = -1e30, s = 0.0;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(logits[t * vocab + j]));
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(logits[t * vocab + j] - mx);
    const double want = std::log(s) + mx - logits[t * vocab + targets[t]];
    EXPECT_THAT(r.loss[t], FloatNear(static_cast<float>(want), 1e-5f));
    double gsum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) gsum += r.dlogits[t * vocab + j];
    EXPECT_THAT(gsum, DoubleNear(0.0, 1e-6));  // softmax - one_hot sums to 0
  }
}

// The exps run in 16-float vectors (ops.cc ExpShifted): whole blocks and a
// tail, at the trainer's byte vocabulary and at a ragged one, against the
// formula in double.
TEST_F(OpsTest, CrossEntropyMatchesDoubleAtTrainerAndRaggedVocab) {
  for (const int64_t vocab : {int64_t{256}, int64_t{37}}) {
    const int64_t rows = 4;
    const auto logits = Random(rows * vocab, 130, -6.0f, 6.0f);
    const std::vector<int32_t> targets = {0, 5, static_cast<int32_t>(vocab - 1), 16};
    const float scale = 0.25f;
    const CeResult r = VocabParallelCe(logits, targets, rows, vocab, 1, scale);
    for (int64_t t = 0; t < rows; ++t) {
      double mx = -1e30, sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) {
        mx = std::max(mx, static_cast<double>(logits[t * vocab + j]));
      }
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(logits[t * vocab + j] - mx);
      const double loss = std::log(sum) + mx - logits[t * vocab + targets[t]];
      EXPECT_THAT(r.loss[t], FloatNear(static_cast<float>(loss), 2e-6f * std::abs(loss) + 1e-6f))
          << "vocab " << vocab << " row " << t;
      for (int64_t j = 0; j < vocab; ++j) {
        const double want =
            scale * (std::exp(logits[t * vocab + j] - mx) / sum - (j == targets[t] ? 1.0 : 0.0));
        EXPECT_THAT(r.dlogits[t * vocab + j], FloatNear(static_cast<float>(want), 1e-7f))
            << "vocab " << vocab << " row " << t << " column " << j;
      }
    }
  }
}

TEST_F(OpsTest, CrossEntropyVocabSplitMatchesUnsplit) {
  const int64_t rows = 6, vocab = 32;
  const auto logits = Random(rows * vocab, 110, -4.0f, 4.0f);
  // Targets in both halves, including the boundary columns 15 and 16.
  const std::vector<int32_t> targets = {0, 15, 16, 31, 7, 23};
  const float scale = 1.0f / rows;
  const CeResult whole = VocabParallelCe(logits, targets, rows, vocab, 1, scale);
  for (int splits : {2, 4}) {
    const CeResult split = VocabParallelCe(logits, targets, rows, vocab, splits, scale);
    for (int64_t t = 0; t < rows; ++t) {
      EXPECT_THAT(split.loss[t], FloatNear(whole.loss[t], 1e-4f * std::abs(whole.loss[t])))
          << "splits=" << splits << " row " << t;
    }
    for (int64_t i = 0; i < rows * vocab; ++i) {
      EXPECT_THAT(split.dlogits[i], FloatNear(whole.dlogits[i], 1e-7f))
          << "splits=" << splits << " i=" << i;
    }
  }
}

TEST_F(OpsTest, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, vocab = 8;
  auto logits = Random(rows * vocab, 120, -2.0f, 2.0f);
  const std::vector<int32_t> targets = {1, 4, 7};
  const float scale = 0.5f;
  auto objective = [&] {
    const CeResult r = VocabParallelCe(logits, targets, rows, vocab, 2, scale);
    double s = 0.0;
    for (float l : r.loss) s += l;
    return scale * s;
  };
  const CeResult r = VocabParallelCe(logits, targets, rows, vocab, 2, scale);
  ExpectGradNear(r.dlogits, NumericGrad(logits, objective), "dlogits");
}

// --- AddInPlace -------------------------------------------------------------

TEST_F(OpsTest, AddInPlaceAdds) {
  const std::vector<float> x = {1, 2, 3};
  std::vector<float> y = {10, 20, 30};
  AddInPlace(x.data(), y.data(), 3);
  EXPECT_THAT(y, ::testing::ElementsAre(11, 22, 33));
}

}  // namespace
}  // namespace shardline::worker::train

namespace shardline::worker::train {
namespace {

// Every kernel with intra-op threads (parallel.h) gives the very bits it
// gives with one thread, at the trainer's shapes (nanoGPT CPU recipe: 768
// tokens, width 128, 4 heads, vocab 256) and at ragged ones; the split
// points move with the thread count (2, 3, 4) and none may change a value.
TEST(IntraOpThreadsTest, GiveBitIdenticalResults) {
  struct Shape {
    int64_t batch, seq, heads, head_dim, vocab;
  };
  for (const Shape& sh : {Shape{12, 64, 4, 32, 256}, Shape{5, 37, 3, 12, 101}}) {
    const int64_t rows = sh.batch * sh.seq, width = sh.heads * sh.head_dim, ffn = 4 * width;
    const auto x = Random(rows * width, 1), w = Random(ffn * width, 2), b = Random(ffn, 3);
    const auto dyf = Random(rows * ffn, 4), gamma = Random(width, 5), beta = Random(width, 6);
    const auto qkv = Random(rows * 3 * width, 7), dya = Random(rows * width, 8);
    const auto logits = Random(rows * sh.vocab, 9, -5.0f, 5.0f);
    std::vector<int32_t> targets(rows);
    for (int64_t t = 0; t < rows; ++t) targets[t] = static_cast<int32_t>((t * 7919) % sh.vocab);
    // Every output of every kernel, one after another.
    auto run = [&](int threads) {
      SetIntraOpThreads(threads);
      std::vector<std::vector<float>> out;
      auto add = [&](std::vector<float> v) { out.push_back(std::move(v)); };
      std::vector<float> y(rows * ffn), dx(rows * width), dw(ffn * width, 0.5f), db(ffn, 0.25f);
      LinearForward(x.data(), w.data(), b.data(), y.data(), rows, width, ffn);
      add(y);
      LinearBackward(x.data(), w.data(), dyf.data(), dx.data(), dw.data(), db.data(), rows, width,
                     ffn);
      add(dx), add(dw), add(db);
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {  // C[rows, ffn] = op(A) op(B), k = width
          std::vector<float> c(rows * ffn);
          Gemm(ta, tb, rows, ffn, width, 0.5f, x.data(), w.data(), 0.0f, c.data());
          add(c);
        }
      }
      std::vector<float> ln(rows * width), mean(rows), rstd(rows), dln(rows * width);
      std::vector<float> dgamma(width, 1.0f), dbeta(width, -1.0f);
      LayerNormForward(x.data(), gamma.data(), beta.data(), ln.data(), mean.data(), rstd.data(),
                       rows, width);
      LayerNormBackward(x.data(), gamma.data(), mean.data(), rstd.data(), dya.data(), dln.data(),
                        dgamma.data(), dbeta.data(), rows, width);
      add(ln), add(mean), add(rstd), add(dln), add(dgamma), add(dbeta);
      std::vector<float> g(rows * ffn), dg(rows * ffn);
      GeluForward(dyf.data(), g.data(), rows * ffn);
      GeluBackward(dyf.data(), y.data(), dg.data(), rows * ffn);
      add(g), add(dg);
      std::vector<float> probs(sh.batch * sh.heads * sh.seq * sh.seq), att(rows * width);
      std::vector<float> dqkv(rows * 3 * width);
      AttentionForward(qkv.data(), probs.data(), att.data(), sh.batch, sh.seq, sh.heads,
                       sh.head_dim);
      AttentionBackward(qkv.data(), probs.data(), dya.data(), dqkv.data(), sh.batch, sh.seq,
                        sh.heads, sh.head_dim);
      add(probs), add(att), add(dqkv);
      std::vector<float> mx(rows), se(rows), tl(rows), dl(rows * sh.vocab);
      LocalRowMax(logits.data(), mx.data(), rows, sh.vocab);
      LocalSumExpAndTarget(logits.data(), mx.data(), targets.data(), se.data(), tl.data(), rows,
                           0, sh.vocab);
      CrossEntropyBackward(logits.data(), mx.data(), se.data(), targets.data(), 0.1f, dl.data(),
                           rows, 0, sh.vocab);
      add(mx), add(se), add(tl), add(dl);
      return out;
    };
    const std::vector<std::vector<float>> one = run(1);
    for (int threads : {2, 3, 4}) {
      const std::vector<std::vector<float>> many = run(threads);
      ASSERT_EQ(many.size(), one.size());
      for (size_t i = 0; i < one.size(); ++i) {
        ASSERT_EQ(many[i].size(), one[i].size());
        EXPECT_EQ(std::memcmp(many[i].data(), one[i].data(), one[i].size() * sizeof(float)), 0)
            << "output " << i << " differs with " << threads << " threads at rows " << rows;
      }
    }
    SetIntraOpThreads(1);
  }
}

// The partition: consecutive parts that cover [0, n), boundaries on the
// alignment, parts no shorter than min_part (so small n stays one part),
// and at most as many parts as threads.
TEST(IntraOpThreadsTest, ParallelForPartition) {
  SetIntraOpThreads(3);
  auto parts = [](int64_t n, int64_t min_part, int64_t align) {
    std::vector<std::pair<int64_t, int64_t>> got(8, {-1, -1});
    std::atomic<int> calls{0};
    ParallelFor(n, min_part, align, [&](int64_t begin, int64_t end) {
      got[calls++] = {begin, end};
    });
    got.resize(calls.load());
    std::sort(got.begin(), got.end());
    return got;
  };
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(parts(100, 1, 1), (P{{0, 33}, {33, 66}, {66, 100}}));
  EXPECT_EQ(parts(100, 1, 16), (P{{0, 32}, {32, 64}, {64, 100}}));
  EXPECT_EQ(parts(100, 40, 1), (P{{0, 50}, {50, 100}}));  // 2 parts of >= 40
  EXPECT_EQ(parts(100, 100, 1), (P{{0, 100}}));
  EXPECT_EQ(parts(20, 1, 16), (P{{0, 16}, {16, 20}}));  // 2 units of 16
  EXPECT_TRUE(parts(0, 1, 1).empty());
  EXPECT_EQ(IntraOpThreads(), 3);
  SetIntraOpThreads(0);
  EXPECT_EQ(IntraOpThreads(), 1);
  SetIntraOpThreads(100000);
  EXPECT_EQ(IntraOpThreads(), kMaxIntraOpThreads);
  SetIntraOpThreads(1);
}

}  // namespace
}  // namespace shardline::worker::train

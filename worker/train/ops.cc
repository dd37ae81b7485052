#include "worker/train/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "worker/comm/float16.h"
#include "worker/train/parallel.h"
#include "worker/train/vector_clones.h"

namespace shardline::worker::train {
namespace {

#define SL_INLINE static inline __attribute__((always_inline))

// GELU tanh-approximation constants (GPT-2).
constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
constexpr double kGeluCubic = 0.044715;

// One cblas_sgemm call (OpenBLAS single-threaded: parallel.h).
// With beta == 0 the BLAS does not read C (the reference BLAS's definition,
// which OpenBLAS follows: it writes zeros before accumulating), so NaN
// garbage in an uninitialised C cannot leak (ops_test
// GemmBetaZeroIgnoresGarbageInC, AttentionBackward's NaN-filled dqkv).
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// Intra-op parts (parallel.h) of a product: at least kMinGemmPartFlops each
// (a few microseconds of a core), and at least kMinGemmPart rows or columns.
constexpr double kMinGemmPartFlops = 2e6;
constexpr int64_t kMinGemmPart = 32;

// C[m, n] (row stride ldc) = alpha * op(A) op(B) + beta * C with explicit row
// strides (in elements), so attention can address one head inside the
// interleaved qkv layout without copying. With beta == 0, C is written
// without being read. Split over the rows of C (m >= n) or its columns
// into intra-op parts: each element of C is still one BLAS dot product over
// all of k, so the result does not depend on the split.
void StridedGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // The product is empty: C = beta * C (never reading C when beta == 0).
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return;
  }
  const bool by_rows = m >= n;
  const int64_t other = by_rows ? n : m;
  const int64_t min_part = std::max<int64_t>(
      kMinGemmPart, static_cast<int64_t>(kMinGemmPartFlops / (2.0 * other * k)) + 1);
  ParallelFor(by_rows ? m : n, min_part, /*align=*/8, [&](int64_t begin, int64_t end) {
    if (by_rows) {  // rows [begin, end) of C: of op(A), the same rows
      Sgemm(trans_a, trans_b, end - begin, n, k, alpha, trans_a ? a + begin : a + begin * lda,
            lda, b, ldb, beta, c + begin * ldc, ldc);
    } else {  // columns [begin, end) of C: of op(B), the same columns
      Sgemm(trans_a, trans_b, m, end - begin, k, alpha, a, lda,
            trans_b ? b + begin * ldb : b + begin, ldb, beta, c + begin, ldc);
    }
  });
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c) {
  const int64_t lda = std::max<int64_t>(1, trans_a ? m : k);
  const int64_t ldb = std::max<int64_t>(1, trans_b ? k : n);
  StridedGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
}

void LinearForward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                   int64_t in, int64_t out) {
  if (b != nullptr) {
    for (int64_t t = 0; t < rows; ++t) std::memcpy(y + t * out, b, sizeof(float) * out);
    Gemm(false, true, rows, out, in, 1.0f, x, w, 1.0f, y);
  } else {
    Gemm(false, true, rows, out, in, 1.0f, x, w, 0.0f, y);
  }
}

void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, int64_t rows, int64_t in, int64_t out) {
  // dx[T, in] = dy[T, out] w[out, in].
  if (dx != nullptr) Gemm(false, false, rows, in, out, 1.0f, dy, w, 0.0f, dx);
  // dw[out, in] += dy^T x.
  Gemm(true, false, out, in, rows, 1.0f, dy, x, 1.0f, dw);
  if (db != nullptr) {
    // Column parts: each column summed over the rows in order, in double.
    ParallelFor(out, std::max<int64_t>(16, 32768 / std::max<int64_t>(1, rows)), 16,
                [&](int64_t begin, int64_t end) {
                  std::vector<double> acc(end - begin, 0.0);
                  for (int64_t t = 0; t < rows; ++t) {
                    const float* row = dy + t * out + begin;
                    for (int64_t o = 0; o < end - begin; ++o) acc[o] += row[o];
                  }
                  for (int64_t o = begin; o < end; ++o) db[o] += static_cast<float>(acc[o - begin]);
                });
  }
}

namespace {

using simd::VecD;
using simd::VecF8;
constexpr int kDLanes = simd::kDoubleLanes;

SL_INLINE void LoadWide(const float* p, VecD* v) {
  VecF8 f;
  std::memcpy(&f, p, sizeof f);
  *v = __builtin_convertvector(f, VecD);
}
SL_INLINE void StoreNarrow(const VecD& v, float* p) {
  const VecF8 f = __builtin_convertvector(v, VecF8);
  std::memcpy(p, &f, sizeof f);
}
SL_INLINE void LoadD(const double* p, VecD* v) { std::memcpy(v, p, sizeof(VecD)); }
SL_INLINE void StoreD(const VecD& v, double* p) { std::memcpy(p, &v, sizeof(VecD)); }
// The lanes' sum, lane 0 first (a fixed order: the same on every clone).
SL_INLINE double LaneSum(const VecD& v) {
  double s = 0;
  for (int l = 0; l < kDLanes; ++l) s += v[l];
  return s;
}

}  // namespace

// Kernels of one intra-op part (parallel.h), compiled per vector target.
// External linkage: GCC's target_clones needs it.
namespace ops_parts {

// LayerNorm in double (as before vectorisation): the row sums run in 8
// partial sums, one per lane, added in lane order at the end, and the tail
// elements after them.
SL_VECTOR_CLONES void LayerNormForwardRows(const float* x, const float* gamma, const float* beta,
                                           float* y, float* mean, float* rstd, int64_t rows,
                                           int64_t width) {
  const int64_t body = width - width % kDLanes;
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * width;
    float* yr = y + t * width;
    VecD acc = {}, v;
    for (int64_t i = 0; i < body; i += kDLanes) {
      LoadWide(xr + i, &v);
      acc += v;
    }
    double sum = LaneSum(acc);
    for (int64_t i = body; i < width; ++i) sum += xr[i];
    const double mu = width > 0 ? sum / width : 0.0;
    // Two-pass variance: no cancellation for rows with a large mean.
    VecD sq_acc = {};
    for (int64_t i = 0; i < body; i += kDLanes) {
      LoadWide(xr + i, &v);
      const VecD d = v - mu;
      sq_acc += d * d;
    }
    double sq = LaneSum(sq_acc);
    for (int64_t i = body; i < width; ++i) {
      const double d = xr[i] - mu;
      sq += d * d;
    }
    const double var = width > 0 ? sq / width : 0.0;
    const double rs = 1.0 / std::sqrt(var + kLayerNormEpsilon);
    VecD g, b;
    for (int64_t i = 0; i < body; i += kDLanes) {
      LoadWide(xr + i, &v);
      LoadWide(gamma + i, &g);
      LoadWide(beta + i, &b);
      StoreNarrow((v - mu) * rs * g + b, yr + i);
    }
    for (int64_t i = body; i < width; ++i) {
      yr[i] = static_cast<float>((xr[i] - mu) * rs * gamma[i] + beta[i]);
    }
    mean[t] = static_cast<float>(mu);
    rstd[t] = static_cast<float>(rs);
  }
}

// dx of rows [0, rows): with xhat = (x - mean) * rstd and g = dy * gamma,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
SL_VECTOR_CLONES void LayerNormBackwardDxRows(const float* x, const float* gamma,
                                              const float* mean, const float* rstd,
                                              const float* dy, float* dx, int64_t rows,
                                              int64_t width) {
  const int64_t body = width - width % kDLanes;
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * width;
    const float* dyr = dy + t * width;
    float* dxr = dx + t * width;
    const double mu = mean[t];
    const double rs = rstd[t];
    VecD sum_g_v = {}, sum_gx_v = {}, xv, dyv, gam;
    for (int64_t i = 0; i < body; i += kDLanes) {
      LoadWide(xr + i, &xv);
      LoadWide(dyr + i, &dyv);
      LoadWide(gamma + i, &gam);
      const VecD xhat = (xv - mu) * rs;
      const VecD g = dyv * gam;
      sum_g_v += g;
      sum_gx_v += g * xhat;
    }
    double sum_g = LaneSum(sum_g_v);
    double sum_g_xhat = LaneSum(sum_gx_v);
    for (int64_t i = body; i < width; ++i) {
      const double xhat = (xr[i] - mu) * rs;
      const double g = static_cast<double>(dyr[i]) * gamma[i];
      sum_g += g;
      sum_g_xhat += g * xhat;
    }
    const double mean_g = width > 0 ? sum_g / width : 0.0;
    const double mean_g_xhat = width > 0 ? sum_g_xhat / width : 0.0;
    for (int64_t i = 0; i < body; i += kDLanes) {
      LoadWide(xr + i, &xv);
      LoadWide(dyr + i, &dyv);
      LoadWide(gamma + i, &gam);
      const VecD xhat = (xv - mu) * rs;
      StoreNarrow(rs * (dyv * gam - mean_g - xhat * mean_g_xhat), dxr + i);
    }
    for (int64_t i = body; i < width; ++i) {
      const double xhat = (xr[i] - mu) * rs;
      const double g = static_cast<double>(dyr[i]) * gamma[i];
      dxr[i] = static_cast<float>(rs * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

// dgamma[c] += sum over rows of dy * xhat and dbeta[c] += sum of dy, for the
// columns c in [begin, end): each column's sum in double, rows in order.
SL_VECTOR_CLONES void LayerNormBackwardParamColumns(const float* x, const float* mean,
                                                    const float* rstd, const float* dy,
                                                    float* dgamma, float* dbeta, int64_t rows,
                                                    int64_t width, int64_t begin, int64_t end) {
  const int64_t cols = end - begin;
  const int64_t body = cols - cols % kDLanes;
  std::vector<double> dgamma_acc(cols, 0.0), dbeta_acc(cols, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * width + begin;
    const float* dyr = dy + t * width + begin;
    const double mu = mean[t];
    const double rs = rstd[t];
    VecD xv, dyv, acc;
    for (int64_t i = 0; i < body; i += kDLanes) {
      LoadWide(xr + i, &xv);
      LoadWide(dyr + i, &dyv);
      const VecD xhat = (xv - mu) * rs;
      LoadD(dgamma_acc.data() + i, &acc);
      StoreD(acc + dyv * xhat, dgamma_acc.data() + i);
      LoadD(dbeta_acc.data() + i, &acc);
      StoreD(acc + dyv, dbeta_acc.data() + i);
    }
    for (int64_t i = body; i < cols; ++i) {
      const double xhat = (xr[i] - mu) * rs;
      dgamma_acc[i] += dyr[i] * xhat;
      dbeta_acc[i] += dyr[i];
    }
  }
  for (int64_t i = 0; i < cols; ++i) {
    dgamma[begin + i] += static_cast<float>(dgamma_acc[i]);
    dbeta[begin + i] += static_cast<float>(dbeta_acc[i]);
  }
}

}  // namespace ops_parts

namespace {

// Intra-op parts of row-wise kernels: at least this many elements each.
constexpr int64_t kMinPartElements = 16384;

int64_t MinRows(int64_t width) {
  return std::max<int64_t>(1, kMinPartElements / std::max<int64_t>(1, width));
}

}  // namespace

void LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd, int64_t rows, int64_t width) {
  ParallelFor(rows, MinRows(width), 1, [&](int64_t begin, int64_t end) {
    ops_parts::LayerNormForwardRows(x + begin * width, gamma, beta, y + begin * width,
                                    mean + begin, rstd + begin, end - begin, width);
  });
}

// The rows' dx, then the columns' parameter gradients: each element of
// dgamma and dbeta is summed over the rows in order whatever the parts.
void LayerNormBackward(const float* x, const float* gamma, const float* mean, const float* rstd,
                       const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows,
                       int64_t width) {
  ParallelFor(rows, MinRows(width), 1, [&](int64_t begin, int64_t end) {
    ops_parts::LayerNormBackwardDxRows(x + begin * width, gamma, mean + begin, rstd + begin,
                                       dy + begin * width, dx + begin * width, end - begin,
                                       width);
  });
  ParallelFor(width, std::max<int64_t>(kDLanes, kMinPartElements / std::max<int64_t>(1, rows)),
              kDLanes, [&](int64_t begin, int64_t end) {
                ops_parts::LayerNormBackwardParamColumns(x, mean, rstd, dy, dgamma, dbeta, rows,
                                                         width, begin, end);
              });
}

namespace {

// GELU through one vectorised exp (see ops.h for the identities used); the
// public functions are compiled per vector target (vector_clones.h).
using simd::VecF;
using simd::VecI;
constexpr int kLanes = simd::kFloatLanes;

SL_INLINE void Load(const float* p, VecF* v) { std::memcpy(v, p, sizeof(VecF)); }
SL_INLINE void Store(const VecF& v, float* p) { std::memcpy(p, &v, sizeof(VecF)); }

// *v = exp(*v) lane by lane. Range reduction x = n ln2 + r, |r| <= ln2 / 2,
// with ln2 split in two parts (the high part exact in 9 bits so n * high is
// exact), exp(r) by its Taylor polynomial of degree 7 (truncation error below
// 0.347^8 / 8! = 5e-9, i.e. under 0.05 ulp), times 2^n built in the exponent
// bits. Arguments are clamped to [-87, 88], so results stay normal and finite
// (exp(-87) = 1.6e-38, exp(88) = 1.7e38); NaN stays NaN. Measured error
// against double-precision exp: at most 2 ulp (ops_test VectorisedGelu*).
SL_INLINE void ExpInPlace(VecF* v) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693359375f;        // 355 / 512, exact
  constexpr float kLn2Low = -2.12194440054690583e-4f;  // ln 2 - kLn2High
  constexpr float kRound = 12582912.0f;           // 1.5 * 2^23: adding it rounds to an integer
  VecF x = *v;
  x = x < -87.0f ? VecF{} - 87.0f : x;
  x = x > 88.0f ? VecF{} + 88.0f : x;
  const VecF shifted = x * kLog2e + kRound;
  const VecF n = shifted - kRound;  // round(x / ln 2), exactly an integer in float
  VecI ni;
  std::memcpy(&ni, &shifted, sizeof ni);
  ni -= 0x4B400000;  // the bits of kRound: leaves n as an int32
  const VecF r = (x - n * kLn2High) - n * kLn2Low;
  VecF p = r * (1.0f / 5040) + (1.0f / 720);
  p = p * r + (1.0f / 120);
  p = p * r + (1.0f / 24);
  p = p * r + (1.0f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const VecI bits = (ni + 127) << 23;  // 2^n, n in [-126, 127]
  VecF scale;
  std::memcpy(&scale, &bits, sizeof scale);
  *v = p * scale;
}

// s = sigmoid(2u) = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// so that 0.5 (1 + tanh(u)) = s; du = du/dx.
SL_INLINE void GeluSigmoid(const VecF& x, VecF* s, VecF* du) {
  const float c = static_cast<float>(kSqrt2OverPi);
  const float a = static_cast<float>(kGeluCubic);
  const VecF x2 = x * x;
  VecF e = (x + a * x2 * x) * (-2.0f * c);
  ExpInPlace(&e);
  *s = 1.0f / (e + 1.0f);
  if (du != nullptr) *du = c * (1.0f + (3.0f * a) * x2);
}

SL_INLINE void GeluForwardBlock(const float* x, float* y) {
  VecF v, s;
  Load(x, &v);
  GeluSigmoid(v, &s, nullptr);
  Store(v * s, y);
}

// gelu'(x) = s + x * 2 s (1 - s) * du, since d tanh(u)/du = 1 - tanh^2 =
// 4 s (1 - s).
SL_INLINE void GeluBackwardBlock(const float* x, const float* dy, float* dx) {
  VecF v, g, s, du;
  Load(x, &v);
  Load(dy, &g);
  GeluSigmoid(v, &s, &du);
  Store(g * (s + 2.0f * v * s * (1.0f - s) * du), dx);
}

// out[j] = scale * exp(x[j] - shift) for j < n (out may be x, or null to
// store nothing); returns the sum of exp(x[j] - shift), accumulated in 16
// float lanes and then in double. exp as ExpInPlace (at most 2 ulp).
SL_INLINE double ExpShifted(const float* x, float shift, float scale, float* out, int64_t n) {
  VecF acc{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    VecF v;
    Load(x + j, &v);
    v -= shift;
    ExpInPlace(&v);
    acc += v;
    if (out != nullptr) Store(v * scale, out + j);
  }
  double sum = 0.0;
  for (int lane = 0; lane < kLanes; ++lane) sum += acc[lane];
  if (j < n) {  // the tail, through a padded block; only its n - j lanes count
    float in[kLanes] = {}, e[kLanes];
    std::memcpy(in, x + j, sizeof(float) * (n - j));
    VecF v;
    Load(in, &v);
    v -= shift;
    ExpInPlace(&v);
    Store(v, e);
    for (int64_t t = 0; t < n - j; ++t) {
      sum += e[t];
      if (out != nullptr) out[j + t] = e[t] * scale;
    }
  }
  return sum;
}

// Max of x[0..n), n >= 1.
SL_INLINE float RowMax(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

}  // namespace

namespace ops_parts {

SL_VECTOR_CLONES void GeluForwardPart(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) GeluForwardBlock(x + i, y + i);
  if (i < n) {  // the tail, through a padded block
    float in[kLanes] = {}, out[kLanes];
    std::memcpy(in, x + i, sizeof(float) * (n - i));
    GeluForwardBlock(in, out);
    std::memcpy(y + i, out, sizeof(float) * (n - i));
  }
}

SL_VECTOR_CLONES void GeluBackwardPart(const float* x, const float* dy, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) GeluBackwardBlock(x + i, dy + i, dx + i);
  if (i < n) {
    float in[kLanes] = {}, grad[kLanes] = {}, out[kLanes];
    std::memcpy(in, x + i, sizeof(float) * (n - i));
    std::memcpy(grad, dy + i, sizeof(float) * (n - i));
    GeluBackwardBlock(in, grad, out);
    std::memcpy(dx + i, out, sizeof(float) * (n - i));
  }
}


// Attention of the (batch, head) pairs [begin, end), pair = b * heads + h.
SL_VECTOR_CLONES void AttentionForwardPairs(const float* qkv, float* probs, float* y, int64_t seq,
                                            int64_t heads, int64_t head_dim, bool bf16,
                                            int64_t begin, int64_t end) {
  const int64_t tok_stride = heads * 3 * head_dim;  // qkv row stride
  const int64_t y_stride = heads * head_dim;        // y row stride
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t pair = begin; pair < end; ++pair) {
    const int64_t b = pair / heads, h = pair % heads;
    {
      const float* q = qkv + b * seq * tok_stride + h * 3 * head_dim;
      const float* k = q + head_dim;
      const float* v = q + 2 * head_dim;
      float* p = probs + (b * heads + h) * seq * seq;
      // Scores S = scale * Q K^T into p, then a causal softmax in place.
      StridedGemm(false, true, seq, seq, head_dim, scale, q, tok_stride, k, tok_stride, 0.0f, p,
                  seq);
      for (int64_t i = 0; i < seq; ++i) {
        float* row = p + i * seq;
        const float mx = RowMax(row, i + 1);
        const float inv = static_cast<float>(1.0 / ExpShifted(row, mx, 1.0f, row, i + 1));
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        if (bf16) RoundToBFloat16(row, i + 1);
        for (int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
      }
      // Y = P V, written into this head's slot of each token's row.
      StridedGemm(false, false, seq, head_dim, seq, 1.0f, p, seq, v, tok_stride, 0.0f,
                  y + b * seq * y_stride + h * head_dim, y_stride);
    }
  }
}

void AttentionBackwardPairs(const float* qkv, const float* probs, const float* dy, float* dqkv,
                            int64_t seq, int64_t heads, int64_t head_dim, bool bf16,
                            int64_t begin, int64_t end) {
  const int64_t tok_stride = heads * 3 * head_dim;
  const int64_t y_stride = heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> ds(seq * seq);  // dP, then dS (gradient of the scaled scores)
  for (int64_t pair = begin; pair < end; ++pair) {
    const int64_t b = pair / heads, h = pair % heads;
    {
      const int64_t off = b * seq * tok_stride + h * 3 * head_dim;
      const float* q = qkv + off;
      const float* k = q + head_dim;
      const float* v = q + 2 * head_dim;
      float* dq = dqkv + off;
      float* dk = dq + head_dim;
      float* dv = dq + 2 * head_dim;
      const float* p = probs + (b * heads + h) * seq * seq;
      const float* dyh = dy + b * seq * y_stride + h * head_dim;
      // dV = P^T dY.
      StridedGemm(true, false, seq, head_dim, seq, 1.0f, p, seq, dyh, y_stride, 0.0f, dv,
                  tok_stride);
      // dP = dY V^T.
      StridedGemm(false, true, seq, seq, head_dim, 1.0f, dyh, y_stride, v, tok_stride, 0.0f,
                  ds.data(), seq);
      // Softmax backward: dS = P * (dP - sum_j P dP), zero above the diagonal.
      for (int64_t i = 0; i < seq; ++i) {
        const float* pr = p + i * seq;
        float* row = ds.data() + i * seq;
        double dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(pr[j]) * row[j];
        const float d = static_cast<float>(dot);
        for (int64_t j = 0; j <= i; ++j) row[j] = pr[j] * (row[j] - d);
        if (bf16) RoundToBFloat16(row, i + 1);
        for (int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
      }
      // S = scale * Q K^T  =>  dQ = scale * dS K, dK = scale * dS^T Q.
      StridedGemm(false, false, seq, head_dim, seq, scale, ds.data(), seq, k, tok_stride, 0.0f,
                  dq, tok_stride);
      StridedGemm(true, false, seq, head_dim, seq, scale, ds.data(), seq, q, tok_stride, 0.0f,
                  dk, tok_stride);
    }
  }
}

}  // namespace ops_parts

void GeluForward(const float* x, float* y, int64_t n) {
  ParallelFor(n, kMinPartElements, kLanes, [&](int64_t begin, int64_t end) {
    ops_parts::GeluForwardPart(x + begin, y + begin, end - begin);
  });
}

void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  ParallelFor(n, kMinPartElements, kLanes, [&](int64_t begin, int64_t end) {
    ops_parts::GeluBackwardPart(x + begin, dy + begin, dx + begin, end - begin);
  });
}

namespace {
// pre[0, width) = x + b, rounded to bf16 when asked.
void BiasRow(const float* x, const float* b, float* pre, int64_t width, bool bf16) {
  for (int64_t j = 0; j < width; ++j) pre[j] = x[j] + b[j];
  if (bf16) RoundToBFloat16(pre, width);
}
}  // namespace

void BiasGeluForward(const float* x, const float* b, float* y, int64_t rows, int64_t width,
                     bool bf16) {
  ParallelFor(rows, MinRows(width), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> pre(static_cast<size_t>(width));
    for (int64_t t = begin; t < end; ++t) {
      BiasRow(x + t * width, b, pre.data(), width, bf16);
      ops_parts::GeluForwardPart(pre.data(), y + t * width, width);
      if (bf16) RoundToBFloat16(y + t * width, width);
    }
  });
}

void BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx, int64_t rows,
                      int64_t width, bool bf16) {
  ParallelFor(rows, MinRows(width), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> pre(static_cast<size_t>(width));
    for (int64_t t = begin; t < end; ++t) {
      BiasRow(x + t * width, b, pre.data(), width, bf16);
      ops_parts::GeluBackwardPart(pre.data(), dy + t * width, dx + t * width, width);
      if (bf16) RoundToBFloat16(dx + t * width, width);
    }
  });
}

// Parts of whole (batch, head) pairs: each pair's products and softmax are
// its own, whatever the parts.
void AttentionForward(const float* qkv, float* probs, float* y, int64_t batch, int64_t seq,
                      int64_t heads, int64_t head_dim, bool bf16) {
  ParallelFor(batch * heads, 1, 1, [&](int64_t begin, int64_t end) {
    ops_parts::AttentionForwardPairs(qkv, probs, y, seq, heads, head_dim, bf16, begin, end);
  });
}

void AttentionBackward(const float* qkv, const float* probs, const float* dy, float* dqkv,
                       int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, bool bf16) {
  ParallelFor(batch * heads, 1, 1, [&](int64_t begin, int64_t end) {
    ops_parts::AttentionBackwardPairs(qkv, probs, dy, dqkv, seq, heads, head_dim, bf16, begin,
                                      end);
  });
}

void RoundToBFloat16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = BFloat16ToFloat(FloatToBFloat16(x[i]));
}

void EmbeddingForward(const int32_t* tokens, const float* table, float* y, int64_t rows,
                      int64_t width, int64_t vocab_begin, int64_t vocab_local) {
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t local = static_cast<int64_t>(tokens[t]) - vocab_begin;
    float* yr = y + t * width;
    if (local >= 0 && local < vocab_local) {
      std::memcpy(yr, table + local * width, sizeof(float) * width);
    } else {
      std::memset(yr, 0, sizeof(float) * width);
    }
  }
}

void EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable, int64_t rows,
                       int64_t width, int64_t vocab_begin, int64_t vocab_local) {
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t local = static_cast<int64_t>(tokens[t]) - vocab_begin;
    if (local < 0 || local >= vocab_local) continue;
    float* dr = dtable + local * width;
    const float* g = dy + t * width;
    for (int64_t i = 0; i < width; ++i) dr[i] += g[i];
  }
}

void AddPositionForward(const float* pos_table, float* y, int64_t rows, int64_t seq,
                        int64_t width) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* pr = pos_table + (t % seq) * width;
    float* yr = y + t * width;
    for (int64_t i = 0; i < width; ++i) yr[i] += pr[i];
  }
}

void AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                         int64_t width) {
  // Sum the batch in double first, then accumulate once into dpos.
  std::vector<double> acc(seq * width, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    double* ar = acc.data() + (t % seq) * width;
    const float* g = dy + t * width;
    for (int64_t i = 0; i < width; ++i) ar[i] += g[i];
  }
  const int64_t used = std::min(rows, seq) * width;
  for (int64_t i = 0; i < used; ++i) dpos[i] += static_cast<float>(acc[i]);
}

namespace ops_parts {

SL_VECTOR_CLONES void LocalRowMaxRows(const float* logits, float* row_max, int64_t rows,
                                      int64_t vocab_local) {
  for (int64_t t = 0; t < rows; ++t) {
    row_max[t] = vocab_local > 0 ? RowMax(logits + t * vocab_local, vocab_local)
                                 : -std::numeric_limits<float>::infinity();
  }
}

SL_VECTOR_CLONES void LocalSumExpAndTargetRows(const float* logits, const float* row_max,
                                               const int32_t* targets, float* sum_exp,
                                               float* target_logit, int64_t rows,
                                               int64_t vocab_begin, int64_t vocab_local) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* lr = logits + t * vocab_local;
    sum_exp[t] = static_cast<float>(ExpShifted(lr, row_max[t], 1.0f, nullptr, vocab_local));
    const int64_t local = static_cast<int64_t>(targets[t]) - vocab_begin;
    target_logit[t] = (local >= 0 && local < vocab_local) ? lr[local] : 0.0f;
  }
}

SL_VECTOR_CLONES void CrossEntropyBackwardRows(const float* logits, const float* row_max,
                                               const float* sum_exp, const int32_t* targets,
                                               float scale, float* dlogits, int64_t rows,
                                               int64_t vocab_begin, int64_t vocab_local) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* lr = logits + t * vocab_local;
    float* dr = dlogits + t * vocab_local;
    const float inv = static_cast<float>(1.0 / static_cast<double>(sum_exp[t]));
    ExpShifted(lr, row_max[t], scale * inv, dr, vocab_local);  // scale * softmax
    const int64_t local = static_cast<int64_t>(targets[t]) - vocab_begin;
    if (local >= 0 && local < vocab_local) dr[local] -= scale;
  }
}

}  // namespace ops_parts

void TokenLoss(const float* row_max, const float* sum_exp, const float* target_logit,
               float* loss, int64_t rows) {
  for (int64_t t = 0; t < rows; ++t) {
    loss[t] = static_cast<float>(std::log(static_cast<double>(sum_exp[t])) +
                                 static_cast<double>(row_max[t]) - target_logit[t]);
  }
}

void LocalRowMax(const float* logits, float* row_max, int64_t rows, int64_t vocab_local) {
  ParallelFor(rows, MinRows(vocab_local), 1, [&](int64_t begin, int64_t end) {
    ops_parts::LocalRowMaxRows(logits + begin * vocab_local, row_max + begin, end - begin,
                               vocab_local);
  });
}

void LocalSumExpAndTarget(const float* logits, const float* row_max, const int32_t* targets,
                          float* sum_exp, float* target_logit, int64_t rows, int64_t vocab_begin,
                          int64_t vocab_local) {
  ParallelFor(rows, MinRows(vocab_local), 1, [&](int64_t begin, int64_t end) {
    ops_parts::LocalSumExpAndTargetRows(logits + begin * vocab_local, row_max + begin,
                                        targets + begin, sum_exp + begin, target_logit + begin,
                                        end - begin, vocab_begin, vocab_local);
  });
}

void CrossEntropyBackward(const float* logits, const float* row_max, const float* sum_exp,
                          const int32_t* targets, float scale, float* dlogits, int64_t rows,
                          int64_t vocab_begin, int64_t vocab_local) {
  ParallelFor(rows, MinRows(vocab_local), 1, [&](int64_t begin, int64_t end) {
    ops_parts::CrossEntropyBackwardRows(logits + begin * vocab_local, row_max + begin,
                                        sum_exp + begin, targets + begin, scale,
                                        dlogits + begin * vocab_local, end - begin, vocab_begin,
                                        vocab_local);
  });
}

void AddInPlace(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

#undef SL_INLINE

}  // namespace shardline::worker::train

// The CUDA kernels of the GPU plugin's training math; see train_kernels.h.
// Index math mirrors worker/train/ops.cc line for line where it can, so the
// two are easy to compare. Reductions accumulate in double (as ops.cc does);
// elementwise math is float with the same formulas (no fast-math).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "worker/gpu/train_kernels.h"

namespace shardline::gpu {
namespace {

constexpr int kThreads = 256;  // every kernel's block size; a multiple of 32
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this
constexpr float kLayerNormEpsilon = 1e-5f;        // == ops.h's kLayerNormEpsilon
constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
constexpr double kGeluCubic = 0.044715;

int BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}
int RowBlocks(int64_t rows) { return static_cast<int>(rows > kMaxBlocks ? kMaxBlocks : rows); }

// Grid-stride loop over [0, n) in int64.
#define SL_FOR_EACH(i, n)                                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)
// Grid-stride loop over rows, one block per row (uniform within a block, so
// __syncthreads inside is safe).
#define SL_FOR_EACH_ROW(r, rows) \
  for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces `v` over the block; every thread gets the result. Every thread of
// the block must call it; blockDim.x a multiple of 32; smem holds 33 T.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T identity, T* smem) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  __syncthreads();  // a previous call's readers of smem[32] are done
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? smem[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) smem[32] = v;
  }
  __syncthreads();
  return smem[32];
}

// x rounded to the nearest bf16, stored as fp32: float16.h's
// FloatToBFloat16 then BFloat16ToFloat, on the bits.
__device__ float RoundBf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u = ((u >> 16) | 0x40u) << 16;  // NaN: quiet, high half kept
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
  }
  return __uint_as_float(u);
}

__global__ void ScaleMatrixKernel(float* c, int64_t m, int64_t n, int64_t ldc, int64_t stride_c,
                                  int64_t batch, float beta) {
  const int64_t per = m * n;
  SL_FOR_EACH(e, batch * per) {
    const int64_t b = e / per;
    const int64_t r = e - b * per;
    float* p = c + b * stride_c + (r / n) * ldc + (r % n);
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

__global__ void BroadcastRowsKernel(const float* b, float* y, int64_t rows, int64_t out) {
  SL_FOR_EACH(e, rows * out) y[e] = b[e % out];
}

// Block (32, 8): threadIdx.x picks the column, threadIdx.y strides the rows;
// the 8 partial sums meet in shared memory. Deterministic.
constexpr int kColX = 32;
constexpr int kColY = 8;
__global__ void ColumnSumKernel(const float* dy, float* db, int64_t rows, int64_t cols) {
  __shared__ double part[kColY][kColX];
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kColX + threadIdx.x;
  double acc = 0.0;
  if (o < cols) {
    for (int64_t t = threadIdx.y; t < rows; t += kColY) acc += dy[t * cols + o];
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < cols) {
    for (int y = 1; y < kColY; ++y) acc += part[y][threadIdx.x];
    db[o] += static_cast<float>(acc);
  }
}

__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta,
                                       float* y, float* mean, float* rstd, int64_t rows,
                                       int64_t width) {
  __shared__ double smem[33];
  SL_FOR_EACH_ROW(t, rows) {
    const float* xr = x + t * width;
    float* yr = y + t * width;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i];
    sum = BlockReduce(sum, SumOp(), 0.0, smem);
    const double mu = width > 0 ? sum / width : 0.0;
    double sq = 0.0;  // two-pass variance, as ops.cc
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      const double d = xr[i] - mu;
      sq += d * d;
    }
    sq = BlockReduce(sq, SumOp(), 0.0, smem);
    const double var = width > 0 ? sq / width : 0.0;
    const double rs = 1.0 / sqrt(var + kLayerNormEpsilon);
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      yr[i] = static_cast<float>((xr[i] - mu) * rs * gamma[i] + beta[i]);
    }
    if (threadIdx.x == 0) {
      mean[t] = static_cast<float>(mu);
      rstd[t] = static_cast<float>(rs);
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
__global__ void LayerNormBackwardDxKernel(const float* x, const float* gamma, const float* mean,
                                          const float* rstd, const float* dy, float* dx,
                                          int64_t rows, int64_t width) {
  __shared__ double smem[33];
  SL_FOR_EACH_ROW(t, rows) {
    const float* xr = x + t * width;
    const float* dyr = dy + t * width;
    float* dxr = dx + t * width;
    const double mu = mean[t];
    const double rs = rstd[t];
    double sum_g = 0.0;
    double sum_g_xhat = 0.0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      const double xhat = (xr[i] - mu) * rs;
      const double g = static_cast<double>(dyr[i]) * gamma[i];
      sum_g += g;
      sum_g_xhat += g * xhat;
    }
    sum_g = BlockReduce(sum_g, SumOp(), 0.0, smem);
    sum_g_xhat = BlockReduce(sum_g_xhat, SumOp(), 0.0, smem);
    const double mean_g = width > 0 ? sum_g / width : 0.0;
    const double mean_g_xhat = width > 0 ? sum_g_xhat / width : 0.0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      const double xhat = (xr[i] - mu) * rs;
      const double g = static_cast<double>(dyr[i]) * gamma[i];
      dxr[i] = static_cast<float>(rs * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

// dgamma[i] += sum_t dy[t, i] * xhat[t, i]; dbeta[i] += sum_t dy[t, i].
// Block (32, 8) as ColumnSumKernel.
__global__ void LayerNormBackwardParamsKernel(const float* x, const float* mean,
                                              const float* rstd, const float* dy, float* dgamma,
                                              float* dbeta, int64_t rows, int64_t width) {
  __shared__ double part_g[kColY][kColX];
  __shared__ double part_b[kColY][kColX];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kColX + threadIdx.x;
  double acc_g = 0.0;
  double acc_b = 0.0;
  if (i < width) {
    for (int64_t t = threadIdx.y; t < rows; t += kColY) {
      const double xhat = (x[t * width + i] - static_cast<double>(mean[t])) * rstd[t];
      const double g = dy[t * width + i];
      acc_g += g * xhat;
      acc_b += g;
    }
  }
  part_g[threadIdx.y][threadIdx.x] = acc_g;
  part_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && i < width) {
    for (int y = 1; y < kColY; ++y) {
      acc_g += part_g[y][threadIdx.x];
      acc_b += part_b[y][threadIdx.x];
    }
    dgamma[i] += static_cast<float>(acc_g);
    dbeta[i] += static_cast<float>(acc_b);
  }
}

__device__ float Gelu(float v) {
  const float u = static_cast<float>(kSqrt2OverPi) * (v + static_cast<float>(kGeluCubic) * v * v * v);
  return 0.5f * v * (1.0f + tanhf(u));
}

__device__ float GeluGrad(float v) {
  const float c = static_cast<float>(kSqrt2OverPi);
  const float a = static_cast<float>(kGeluCubic);
  const float u = c * (v + a * v * v * v);
  const float th = tanhf(u);
  const float du = c * (1.0f + 3.0f * a * v * v);
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
}

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n) {
  SL_FOR_EACH(i, n) y[i] = Gelu(x[i]);
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, int64_t n) {
  SL_FOR_EACH(i, n) dx[i] = dy[i] * GeluGrad(x[i]);
}

// pre = x + b (b broadcast over rows), rounded to bf16 when bf16: formed
// again in the backward, never stored.
__global__ void BiasGeluForwardKernel(const float* x, const float* b, float* y, int64_t rows,
                                      int64_t width, bool bf16) {
  SL_FOR_EACH(i, rows * width) {
    float pre = x[i] + b[i % width];
    if (bf16) pre = RoundBf16(pre);
    const float v = Gelu(pre);
    y[i] = bf16 ? RoundBf16(v) : v;
  }
}

__global__ void BiasGeluBackwardKernel(const float* x, const float* b, const float* dy, float* dx,
                                       int64_t rows, int64_t width, bool bf16) {
  SL_FOR_EACH(i, rows * width) {
    float pre = x[i] + b[i % width];
    if (bf16) pre = RoundBf16(pre);
    const float g = dy[i] * GeluGrad(pre);
    dx[i] = bf16 ? RoundBf16(g) : g;
  }
}

__global__ void CausalSoftmaxKernel(float* p, int64_t rows, int64_t seq, bool bf16) {
  __shared__ float smem_f[33];
  __shared__ double smem_d[33];
  SL_FOR_EACH_ROW(r, rows) {
    const int64_t i = r % seq;  // query position: attends to j <= i
    float* row = p + r * seq;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = BlockReduce(mx, MaxOp(), -INFINITY, smem_f);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    sum = BlockReduce(sum, SumOp(), 0.0, smem_d);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
      const float v = row[j] * inv;
      row[j] = j > i ? 0.0f : bf16 ? RoundBf16(v) : v;  // each j is this thread's own
    }
  }
}

__global__ void CausalSoftmaxBackwardKernel(const float* p, float* ds, int64_t rows,
                                            int64_t seq, bool bf16) {
  __shared__ double smem[33];
  SL_FOR_EACH_ROW(r, rows) {
    const int64_t i = r % seq;
    const float* pr = p + r * seq;
    float* row = ds + r * seq;
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
      dot += static_cast<double>(pr[j]) * row[j];
    }
    dot = BlockReduce(dot, SumOp(), 0.0, smem);
    const float d = static_cast<float>(dot);
    for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
      const float v = pr[j] * (row[j] - d);
      row[j] = j > i ? 0.0f : bf16 ? RoundBf16(v) : v;
    }
  }
}

__global__ void EmbeddingForwardKernel(const int32_t* tokens, const float* table, float* y,
                                       int64_t rows, int64_t width, int64_t vocab_begin,
                                       int64_t vocab_local) {
  SL_FOR_EACH(e, rows * width) {
    const int64_t t = e / width;
    const int64_t local = static_cast<int64_t>(tokens[t]) - vocab_begin;
    y[e] = (local >= 0 && local < vocab_local) ? table[local * width + (e - t * width)] : 0.0f;
  }
}

__global__ void EmbeddingBackwardKernel(const int32_t* tokens, const float* dy, float* dtable,
                                        int64_t rows, int64_t width, int64_t vocab_begin,
                                        int64_t vocab_local) {
  SL_FOR_EACH(e, rows * width) {
    const int64_t t = e / width;
    const int64_t local = static_cast<int64_t>(tokens[t]) - vocab_begin;
    if (local >= 0 && local < vocab_local) atomicAdd(dtable + local * width + (e - t * width), dy[e]);
  }
}

__global__ void AddPositionForwardKernel(const float* pos_table, float* y, int64_t rows,
                                         int64_t seq, int64_t width) {
  SL_FOR_EACH(e, rows * width) {
    const int64_t t = e / width;
    y[e] += pos_table[(t % seq) * width + (e - t * width)];
  }
}

// One thread per dpos element e = s * width + i (s < min(rows, seq)): sums
// dy[t, i] over t = s, s + seq, ... in double, then adds once. Deterministic.
__global__ void AddPositionBackwardKernel(const float* dy, float* dpos, int64_t rows, int64_t seq,
                                          int64_t width) {
  const int64_t used = (rows < seq ? rows : seq) * width;
  SL_FOR_EACH(e, used) {
    const int64_t s = e / width;
    const int64_t i = e - s * width;
    double acc = 0.0;
    for (int64_t t = s; t < rows; t += seq) acc += dy[t * width + i];
    dpos[e] += static_cast<float>(acc);
  }
}

__global__ void LocalRowMaxKernel(const float* logits, float* row_max, int64_t rows,
                                  int64_t vocab_local) {
  __shared__ float smem[33];
  SL_FOR_EACH_ROW(t, rows) {
    const float* lr = logits + t * vocab_local;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab_local; j += blockDim.x) mx = fmaxf(mx, lr[j]);
    mx = BlockReduce(mx, MaxOp(), -INFINITY, smem);
    if (threadIdx.x == 0) row_max[t] = mx;
  }
}

__global__ void LocalSumExpAndTargetKernel(const float* logits, const float* row_max,
                                           const int32_t* targets, float* sum_exp,
                                           float* target_logit, int64_t rows,
                                           int64_t vocab_begin, int64_t vocab_local) {
  __shared__ double smem[33];
  SL_FOR_EACH_ROW(t, rows) {
    const float* lr = logits + t * vocab_local;
    const float mx = row_max[t];
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < vocab_local; j += blockDim.x) {
      sum += exp(static_cast<double>(lr[j] - mx));  // as ops.cc: float difference, double exp
    }
    sum = BlockReduce(sum, SumOp(), 0.0, smem);
    if (threadIdx.x == 0) {
      sum_exp[t] = static_cast<float>(sum);
      const int64_t local = static_cast<int64_t>(targets[t]) - vocab_begin;
      target_logit[t] = (local >= 0 && local < vocab_local) ? lr[local] : 0.0f;
    }
  }
}

__global__ void TokenLossKernel(const float* row_max, const float* sum_exp,
                                const float* target_logit, float* loss, int64_t rows) {
  SL_FOR_EACH(t, rows) {
    loss[t] = static_cast<float>(log(static_cast<double>(sum_exp[t])) +
                                 static_cast<double>(row_max[t]) - target_logit[t]);
  }
}

// Off-target entries in float (relative error a few ulp); the target entry
// in double, since softmax - 1 cancels when the softmax is near 1.
__global__ void CrossEntropyBackwardKernel(const float* logits, const float* row_max,
                                           const float* sum_exp, const int32_t* targets,
                                           float scale, float* dlogits, int64_t rows,
                                           int64_t vocab_begin, int64_t vocab_local) {
  SL_FOR_EACH(e, rows * vocab_local) {
    const int64_t t = e / vocab_local;
    const int64_t j = e - t * vocab_local;
    const int64_t target = static_cast<int64_t>(targets[t]) - vocab_begin;
    if (j == target) {
      const double p = exp(static_cast<double>(logits[e]) - row_max[t]) /
                       static_cast<double>(sum_exp[t]);
      dlogits[e] = static_cast<float>(scale * (p - 1.0));
    } else {
      dlogits[e] = scale * (expf(logits[e] - row_max[t]) / sum_exp[t]);
    }
  }
}

__global__ void AddInPlaceKernel(const float* x, float* y, int64_t n) {
  SL_FOR_EACH(i, n) y[i] += x[i];
}

__global__ void RoundBf16Kernel(float* x, int64_t n) {
  SL_FOR_EACH(i, n) x[i] = RoundBf16(x[i]);
}

__global__ void ScaleKernel(float* x, float alpha, int64_t n) {
  SL_FOR_EACH(i, n) x[i] *= alpha;
}

// adamw.cc's loop body, element for element (nvcc may contract the products
// and sums into FMAs, so a GPU's result can differ from the CPU's in the last
// bit).
__global__ void AdamWStepKernel(float step_size, float inv_sqrt_bc2, float b1, float b2,
                                float one_minus_b1, float one_minus_b2, float eps, float decay,
                                float* param, const float* grad, float* exp_avg,
                                float* exp_avg_sq, const uint8_t* decay_mask, int64_t n) {
  SL_FOR_EACH(i, n) {
    const float d = decay_mask == nullptr ? decay : (decay_mask[i] != 0 ? decay : 1.0f);
    const float p = param[i] * d;
    const float g = grad[i];
    const float m = b1 * exp_avg[i] + one_minus_b1 * g;
    const float v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - step_size * m / (sqrtf(v) * inv_sqrt_bc2 + eps);
  }
}

__global__ void MaskedSumSquaresKernel(const float* x, const uint8_t* mask, int64_t n,
                                       double* partial) {
  __shared__ double smem[33];
  double acc = 0.0;
  SL_FOR_EACH(i, n) {
    if (mask[i] != 0) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  acc = BlockReduce(acc, SumOp(), 0.0, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

}  // namespace

cudaError_t LaunchScaleMatrix(cudaStream_t stream, float* c, int64_t m, int64_t n, int64_t ldc,
                              int64_t stride_c, int64_t batch, float beta) {
  if (m <= 0 || n <= 0 || batch <= 0) return cudaSuccess;
  ScaleMatrixKernel<<<BlocksFor(batch * m * n), kThreads, 0, stream>>>(c, m, n, ldc, stride_c,
                                                                        batch, beta);
  return cudaGetLastError();
}

cudaError_t LaunchBroadcastRows(cudaStream_t stream, const float* b, float* y, int64_t rows,
                                int64_t out) {
  if (rows <= 0 || out <= 0) return cudaSuccess;
  BroadcastRowsKernel<<<BlocksFor(rows * out), kThreads, 0, stream>>>(b, y, rows, out);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSumAccumulate(cudaStream_t stream, const float* dy, float* db,
                                      int64_t rows, int64_t cols) {
  if (cols <= 0) return cudaSuccess;
  const int64_t blocks = (cols + kColX - 1) / kColX;
  ColumnSumKernel<<<static_cast<unsigned>(blocks), dim3(kColX, kColY), 0, stream>>>(dy, db, rows,
                                                                                    cols);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormForward(cudaStream_t stream, const float* x, const float* gamma,
                                   const float* beta, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t width) {
  if (rows <= 0) return cudaSuccess;
  LayerNormForwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(x, gamma, beta, y, mean, rstd,
                                                                   rows, width);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(cudaStream_t stream, const float* x, const float* gamma,
                                    const float* mean, const float* rstd, const float* dy,
                                    float* dx, float* dgamma, float* dbeta, int64_t rows,
                                    int64_t width) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  LayerNormBackwardDxKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(x, gamma, mean, rstd, dy,
                                                                      dx, rows, width);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int64_t blocks = (width + kColX - 1) / kColX;
  LayerNormBackwardParamsKernel<<<static_cast<unsigned>(blocks), dim3(kColX, kColY), 0,
                                  stream>>>(x, mean, rstd, dy, dgamma, dbeta, rows, width);
  return cudaGetLastError();
}

cudaError_t LaunchGeluForward(cudaStream_t stream, const float* x, float* y, int64_t n) {
  if (n <= 0) return cudaSuccess;
  GeluForwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(cudaStream_t stream, const float* x, const float* dy, float* dx,
                               int64_t n) {
  if (n <= 0) return cudaSuccess;
  GeluBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t LaunchBiasGeluForward(cudaStream_t stream, const float* x, const float* b, float* y,
                                  int64_t rows, int64_t width, bool bf16) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  BiasGeluForwardKernel<<<BlocksFor(rows * width), kThreads, 0, stream>>>(x, b, y, rows, width,
                                                                          bf16);
  return cudaGetLastError();
}

cudaError_t LaunchBiasGeluBackward(cudaStream_t stream, const float* x, const float* b,
                                   const float* dy, float* dx, int64_t rows, int64_t width,
                                   bool bf16) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  BiasGeluBackwardKernel<<<BlocksFor(rows * width), kThreads, 0, stream>>>(x, b, dy, dx, rows,
                                                                           width, bf16);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmax(cudaStream_t stream, float* p, int64_t rows, int64_t seq,
                                bool bf16) {
  if (rows <= 0 || seq <= 0) return cudaSuccess;
  CausalSoftmaxKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(p, rows, seq, bf16);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmaxBackward(cudaStream_t stream, const float* p, float* ds,
                                        int64_t rows, int64_t seq, bool bf16) {
  if (rows <= 0 || seq <= 0) return cudaSuccess;
  CausalSoftmaxBackwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(p, ds, rows, seq,
                                                                        bf16);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(cudaStream_t stream, const int32_t* tokens,
                                   const float* table, float* y, int64_t rows, int64_t width,
                                   int64_t vocab_begin, int64_t vocab_local) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  EmbeddingForwardKernel<<<BlocksFor(rows * width), kThreads, 0, stream>>>(
      tokens, table, y, rows, width, vocab_begin, vocab_local);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const int32_t* tokens, const float* dy,
                                    float* dtable, int64_t rows, int64_t width,
                                    int64_t vocab_begin, int64_t vocab_local) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  EmbeddingBackwardKernel<<<BlocksFor(rows * width), kThreads, 0, stream>>>(
      tokens, dy, dtable, rows, width, vocab_begin, vocab_local);
  return cudaGetLastError();
}

cudaError_t LaunchAddPositionForward(cudaStream_t stream, const float* pos_table, float* y,
                                     int64_t rows, int64_t seq, int64_t width) {
  if (rows <= 0 || width <= 0 || seq <= 0) return cudaSuccess;
  AddPositionForwardKernel<<<BlocksFor(rows * width), kThreads, 0, stream>>>(pos_table, y, rows,
                                                                             seq, width);
  return cudaGetLastError();
}

cudaError_t LaunchAddPositionBackward(cudaStream_t stream, const float* dy, float* dpos,
                                      int64_t rows, int64_t seq, int64_t width) {
  if (rows <= 0 || width <= 0 || seq <= 0) return cudaSuccess;
  const int64_t used = (rows < seq ? rows : seq) * width;
  AddPositionBackwardKernel<<<BlocksFor(used), kThreads, 0, stream>>>(dy, dpos, rows, seq,
                                                                      width);
  return cudaGetLastError();
}

cudaError_t LaunchLocalRowMax(cudaStream_t stream, const float* logits, float* row_max,
                              int64_t rows, int64_t vocab_local) {
  if (rows <= 0) return cudaSuccess;
  LocalRowMaxKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(logits, row_max, rows,
                                                              vocab_local);
  return cudaGetLastError();
}

cudaError_t LaunchLocalSumExpAndTarget(cudaStream_t stream, const float* logits,
                                       const float* row_max, const int32_t* targets,
                                       float* sum_exp, float* target_logit, int64_t rows,
                                       int64_t vocab_begin, int64_t vocab_local) {
  if (rows <= 0) return cudaSuccess;
  LocalSumExpAndTargetKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
      logits, row_max, targets, sum_exp, target_logit, rows, vocab_begin, vocab_local);
  return cudaGetLastError();
}

cudaError_t LaunchTokenLoss(cudaStream_t stream, const float* row_max, const float* sum_exp,
                            const float* target_logit, float* loss, int64_t rows) {
  if (rows <= 0) return cudaSuccess;
  TokenLossKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(row_max, sum_exp, target_logit, loss,
                                                            rows);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(cudaStream_t stream, const float* logits,
                                       const float* row_max, const float* sum_exp,
                                       const int32_t* targets, float scale, float* dlogits,
                                       int64_t rows, int64_t vocab_begin, int64_t vocab_local) {
  if (rows <= 0 || vocab_local <= 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<BlocksFor(rows * vocab_local), kThreads, 0, stream>>>(
      logits, row_max, sum_exp, targets, scale, dlogits, rows, vocab_begin, vocab_local);
  return cudaGetLastError();
}

cudaError_t LaunchAddInPlace(cudaStream_t stream, const float* x, float* y, int64_t n) {
  if (n <= 0) return cudaSuccess;
  AddInPlaceKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchRoundBf16(cudaStream_t stream, float* x, int64_t n) {
  if (n <= 0) return cudaSuccess;
  RoundBf16Kernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(cudaStream_t stream, float* x, float alpha, int64_t n) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, alpha, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdamWStep(cudaStream_t stream, float step_size, float inv_sqrt_bc2, float b1,
                            float b2, float one_minus_b1, float one_minus_b2, float eps,
                            float decay, float* param, const float* grad, float* exp_avg,
                            float* exp_avg_sq, const uint8_t* decay_mask, int64_t n) {
  if (n <= 0) return cudaSuccess;
  AdamWStepKernel<<<BlocksFor(n), kThreads, 0, stream>>>(step_size, inv_sqrt_bc2, b1, b2,
                                                          one_minus_b1, one_minus_b2, eps, decay,
                                                          param, grad, exp_avg, exp_avg_sq,
                                                          decay_mask, n);
  return cudaGetLastError();
}

cudaError_t LaunchMaskedSumSquares(cudaStream_t stream, const float* x, const uint8_t* mask,
                                   int64_t n, double* partial, int* blocks) {
  const int b = BlocksFor(n);
  *blocks = b < kMaxSumSquaresBlocks ? b : kMaxSumSquaresBlocks;
  if (n <= 0) return cudaSuccess;
  MaskedSumSquaresKernel<<<*blocks, kThreads, 0, stream>>>(x, mask, n, partial);
  return cudaGetLastError();
}

}  // namespace shardline::gpu

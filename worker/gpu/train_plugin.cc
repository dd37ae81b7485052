// Part of libshardline_gpu.so, the only object that links CUDA and cuBLAS:
// the training math of plugin_abi.h (ShardlineGpuTrainApi) on device
// buffers. Products go through cuBLAS; everything else through the kernels of
// train_kernels.cu. The worker side is worker/gpu/gpu_ops.h.
//
// Row-major products on column-major cuBLAS: a row-major [m, n] matrix with
// row stride ld is, read column-major with the same ld, its transpose
// [n, m]. So C = op(A) op(B) (row-major) is computed as the column-major
// C^T = op(B)^T op(A)^T, i.e. cublasSgemm(op_b, op_a, n, m, k, B, ldb, A,
// lda, C, ldc) with op_x = transpose iff trans_x, and the row strides passed
// unchanged as leading dimensions.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "worker/gpu/plugin_abi.h"
#include "worker/gpu/train_kernels.h"

struct ShardlineGpuTrainCtx {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  float* scratch = nullptr;  // attention_backward's dS, grown on demand
  size_t scratch_floats = 0;
  // masked_sum_squares(_many)'s per-block sums: kMaxSumSquaresBlocks per
  // piece, for partials_pieces pieces (made at first use, grown on demand).
  double* partials = nullptr;
  int64_t partials_pieces = 0;
  bool bf16_products = false;  // set_bf16_products
  // copy_to_host_async's stream and events (made at its first call):
  // compute_mark is recorded on `stream` before each copy, copies_done on
  // copy_stream after it.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t compute_mark = nullptr;
  cudaEvent_t copies_done = nullptr;
  std::string error;  // message of the last failed call
};

struct ShardlineGpuHostCopies {
  cudaEvent_t event = nullptr;
  int device = 0;
};

namespace {

using Ctx = ShardlineGpuTrainCtx;
using shardline::gpu::LaunchAddInPlace;

int Fail(Ctx* ctx, int code, const char* format, ...) __attribute__((format(printf, 3, 4)));
int Fail(Ctx* ctx, int code, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  ctx->error = buffer;
  return code;
}

int CodeOf(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return SHARDLINE_GPU_OK;
    case cudaErrorMemoryAllocation:
      return SHARDLINE_GPU_RESOURCE_EXHAUSTED;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
      return SHARDLINE_GPU_INVALID_ARGUMENT;
    default:
      return SHARDLINE_GPU_UNAVAILABLE;
  }
}

int Check(Ctx* ctx, const char* what, cudaError_t e) {
  if (e == cudaSuccess) return SHARDLINE_GPU_OK;
  return Fail(ctx, CodeOf(e), "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int CheckBlas(Ctx* ctx, const char* what, cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS) return SHARDLINE_GPU_OK;
  const int code = s == CUBLAS_STATUS_INVALID_VALUE ? SHARDLINE_GPU_INVALID_ARGUMENT
                   : s == CUBLAS_STATUS_ALLOC_FAILED ? SHARDLINE_GPU_RESOURCE_EXHAUSTED
                                                     : SHARDLINE_GPU_UNAVAILABLE;
  return Fail(ctx, code, "%s: %s", what, cublasGetStatusString(s));
}

// Makes ctx's device current (the calling thread may use another) and checks
// that no size is negative.
int Enter(Ctx* ctx, const char* what, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes) {
    if (s < 0) return Fail(ctx, SHARDLINE_GPU_INVALID_ARGUMENT, "%s: negative size %lld", what,
                           static_cast<long long>(s));
  }
  return Check(ctx, "cudaSetDevice", cudaSetDevice(ctx->device));
}

#define SL_RETURN_IF_ERROR(expr)      \
  do {                                \
    const int sl_code_ = (expr);      \
    if (sl_code_ != SHARDLINE_GPU_OK) \
      return sl_code_;                \
  } while (0)

// C (row-major, row stride ldc) = alpha * op(A) op(B) + beta * C for `batch`
// matrices at strides stride_a/b/c (elements). See the file comment for the
// column-major mapping. beta == 0 never reads C. With `bf16` (products
// whose inputs the caller made bf16-exact) they run on the bf16 tensor
// cores (CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS converts A and B to bf16,
// exactly here, and accumulates in fp32).
int StridedBatchedGemm(Ctx* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float* a, int64_t lda, int64_t stride_a,
                       const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                       int64_t ldc, int64_t stride_c, int64_t batch, bool bf16 = false) {
  if (m <= 0 || n <= 0 || batch <= 0) return SHARDLINE_GPU_OK;
  if (k <= 0) {  // empty product: C = beta * C
    return Check(ctx, "scale kernel (k == 0 product)",
                 shardline::gpu::LaunchScaleMatrix(ctx->stream, c, m, n, ldc, stride_c, batch,
                                                   beta));
  }
  for (int64_t v : {m, n, k, lda, ldb, ldc, batch}) {
    if (v > INT_MAX) {
      return Fail(ctx, SHARDLINE_GPU_INVALID_ARGUMENT,
                  "gemm: dimension %lld exceeds cuBLAS's int32 (m=%lld n=%lld k=%lld); split "
                  "the product",
                  static_cast<long long>(v), static_cast<long long>(m),
                  static_cast<long long>(n), static_cast<long long>(k));
    }
  }
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1 && bf16) {
    return CheckBlas(ctx, "cublasGemmEx (bf16 tensor cores, fp32 accumulation)",
                     cublasGemmEx(ctx->cublas, op_b, op_a, static_cast<int>(n),
                                  static_cast<int>(m), static_cast<int>(k), &alpha, b, CUDA_R_32F,
                                  static_cast<int>(ldb), a, CUDA_R_32F, static_cast<int>(lda),
                                  &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                                  CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
  }
  if (bf16) {
    return CheckBlas(
        ctx, "cublasGemmStridedBatchedEx (bf16 tensor cores, fp32 accumulation)",
        cublasGemmStridedBatchedEx(
            ctx->cublas, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
            &alpha, b, CUDA_R_32F, static_cast<int>(ldb), static_cast<long long>(stride_b), a,
            CUDA_R_32F, static_cast<int>(lda), static_cast<long long>(stride_a), &beta, c,
            CUDA_R_32F, static_cast<int>(ldc), static_cast<long long>(stride_c),
            static_cast<int>(batch), CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
  }
  if (batch == 1) {
    return CheckBlas(ctx, "cublasSgemm",
                     cublasSgemm(ctx->cublas, op_b, op_a, static_cast<int>(n),
                                 static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                 static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                                 static_cast<int>(ldc)));
  }
  return CheckBlas(
      ctx, "cublasSgemmStridedBatched",
      cublasSgemmStridedBatched(ctx->cublas, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                static_cast<int>(k), &alpha, b, static_cast<int>(ldb),
                                static_cast<long long>(stride_b), a, static_cast<int>(lda),
                                static_cast<long long>(stride_a), &beta, c,
                                static_cast<int>(ldc), static_cast<long long>(stride_c),
                                static_cast<int>(batch)));
}

// ops.h's Gemm: dense row-major operands (gemm, linear_forward,
// linear_backward: the products set_bf16_products covers).
int DenseGemm(Ctx* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, const float* b, float beta, float* c) {
  const int64_t lda = std::max<int64_t>(1, trans_a ? m : k);
  const int64_t ldb = std::max<int64_t>(1, trans_b ? k : n);
  return StridedBatchedGemm(ctx, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                            std::max<int64_t>(1, n), 0, 1, ctx->bf16_products);
}

// --- context and memory ------------------------------------------------------

int CtxCreate(int32_t device, Ctx** out, char* error, size_t error_len) {
  *out = nullptr;
  Ctx probe;  // collects the message until the real context exists
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  int code = SHARDLINE_GPU_OK;
  if (e != cudaSuccess) {
    code = Fail(&probe, SHARDLINE_GPU_UNAVAILABLE, "cudaGetDeviceCount: %s (%s)",
                cudaGetErrorString(e), cudaGetErrorName(e));
  } else if (count == 0) {
    code = Fail(&probe, SHARDLINE_GPU_UNAVAILABLE, "cudaGetDeviceCount: no CUDA device");
  } else if (device < 0 || device >= count) {
    code = Fail(&probe, SHARDLINE_GPU_INVALID_ARGUMENT,
                "device %d does not exist; this machine has devices 0..%d", device, count - 1);
  }
  auto* ctx = new Ctx;
  ctx->device = device;
  if (code == SHARDLINE_GPU_OK) code = Check(&probe, "cudaSetDevice", cudaSetDevice(device));
  if (code == SHARDLINE_GPU_OK) {
    code = Check(&probe, "cudaStreamCreateWithFlags",
                 cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  }
  if (code == SHARDLINE_GPU_OK) code = CheckBlas(&probe, "cublasCreate", cublasCreate(&ctx->cublas));
  if (code == SHARDLINE_GPU_OK) {
    code = CheckBlas(&probe, "cublasSetStream", cublasSetStream(ctx->cublas, ctx->stream));
  }
  if (code == SHARDLINE_GPU_OK) {
    // Plain fp32 (no TF32 tensor cores) so results match the CPU path.
    code = CheckBlas(&probe, "cublasSetMathMode",
                     cublasSetMathMode(ctx->cublas, CUBLAS_DEFAULT_MATH));
  }
  if (code != SHARDLINE_GPU_OK) {
    if (ctx->cublas != nullptr) cublasDestroy(ctx->cublas);
    if (ctx->stream != nullptr) cudaStreamDestroy(ctx->stream);
    delete ctx;
    if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", probe.error.c_str());
    return code;
  }
  *out = ctx;
  return SHARDLINE_GPU_OK;
}

void CtxDestroy(Ctx* ctx) {
  if (ctx == nullptr) return;
  cudaSetDevice(ctx->device);
  if (ctx->stream != nullptr) cudaStreamSynchronize(ctx->stream);
  if (ctx->copy_stream != nullptr) {
    cudaStreamSynchronize(ctx->copy_stream);
    cudaStreamDestroy(ctx->copy_stream);
  }
  if (ctx->compute_mark != nullptr) cudaEventDestroy(ctx->compute_mark);
  if (ctx->copies_done != nullptr) cudaEventDestroy(ctx->copies_done);
  if (ctx->scratch != nullptr) cudaFree(ctx->scratch);
  if (ctx->partials != nullptr) cudaFree(ctx->partials);
  if (ctx->cublas != nullptr) cublasDestroy(ctx->cublas);
  if (ctx->stream != nullptr) cudaStreamDestroy(ctx->stream);
  delete ctx;
}

const char* LastError(const Ctx* ctx) { return ctx->error.c_str(); }

int Alloc(Ctx* ctx, size_t bytes, void** ptr) {
  *ptr = nullptr;
  SL_RETURN_IF_ERROR(Enter(ctx, "alloc", {}));
  const cudaError_t e = cudaMalloc(ptr, bytes == 0 ? 1 : bytes);
  if (e == cudaErrorMemoryAllocation) {
    return Fail(ctx, SHARDLINE_GPU_RESOURCE_EXHAUSTED,
                "cudaMalloc(%zu bytes) on device %d: out of memory", bytes, ctx->device);
  }
  return Check(ctx, "cudaMalloc", e);
}

int HostAlloc(Ctx* ctx, size_t bytes, void** ptr) {
  *ptr = nullptr;
  SL_RETURN_IF_ERROR(Enter(ctx, "host_alloc", {}));
  const cudaError_t e = cudaHostAlloc(ptr, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (e == cudaErrorMemoryAllocation) {
    return Fail(ctx, SHARDLINE_GPU_RESOURCE_EXHAUSTED,
                "cudaHostAlloc(%zu bytes): out of page-locked host memory; free host memory, "
                "or run fewer ranks on this host", bytes);
  }
  return Check(ctx, "cudaHostAlloc", e);
}

void HostFree(Ctx* ctx, void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(ctx->device);
  cudaFreeHost(ptr);
}

void Free(Ctx* ctx, void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(ctx->device);
  cudaFree(ptr);
}

int Copy(Ctx* ctx, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  SL_RETURN_IF_ERROR(Enter(ctx, "copy", {}));
  if (bytes == 0) return SHARDLINE_GPU_OK;
  SL_RETURN_IF_ERROR(
      Check(ctx, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream)));
  return Check(ctx, "cudaStreamSynchronize (after a copy)", cudaStreamSynchronize(ctx->stream));
}

int CopyToDevice(Ctx* ctx, void* dst, const void* src, size_t bytes) {
  return Copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice);
}
int CopyToHost(Ctx* ctx, void* dst, const void* src, size_t bytes) {
  return Copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost);
}

// --- Copies beside the stream ------------------------------------------------

int EnsureCopyStream(Ctx* ctx) {
  if (ctx->copy_stream != nullptr) return SHARDLINE_GPU_OK;
  SL_RETURN_IF_ERROR(Check(ctx, "cudaEventCreateWithFlags (copy stream)",
                           cudaEventCreateWithFlags(&ctx->compute_mark, cudaEventDisableTiming)));
  SL_RETURN_IF_ERROR(Check(ctx, "cudaEventCreateWithFlags (copy stream)",
                           cudaEventCreateWithFlags(&ctx->copies_done, cudaEventDisableTiming)));
  return Check(ctx, "cudaStreamCreateWithFlags (copy stream)",
               cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking));
}

int CopyToHostAsync(Ctx* ctx, void* dst, const void* src, size_t bytes) {
  SL_RETURN_IF_ERROR(Enter(ctx, "copy_to_host_async", {}));
  if (bytes == 0) return SHARDLINE_GPU_OK;
  SL_RETURN_IF_ERROR(EnsureCopyStream(ctx));
  SL_RETURN_IF_ERROR(Check(ctx, "cudaEventRecord (before a copy to host)",
                           cudaEventRecord(ctx->compute_mark, ctx->stream)));
  SL_RETURN_IF_ERROR(Check(ctx, "cudaStreamWaitEvent (copy stream)",
                           cudaStreamWaitEvent(ctx->copy_stream, ctx->compute_mark, 0)));
  SL_RETURN_IF_ERROR(Check(ctx, "cudaMemcpyAsync (copy stream)",
                           cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                                           ctx->copy_stream)));
  return Check(ctx, "cudaEventRecord (after a copy to host)",
               cudaEventRecord(ctx->copies_done, ctx->copy_stream));
}

int HostCopiesRecord(Ctx* ctx, ShardlineGpuHostCopies** copies) {
  *copies = nullptr;
  SL_RETURN_IF_ERROR(Enter(ctx, "host_copies_record", {}));
  auto* c = new ShardlineGpuHostCopies;
  c->device = ctx->device;
  int code = Check(ctx, "cudaEventCreateWithFlags (host copies)",
                   cudaEventCreateWithFlags(&c->event, cudaEventDisableTiming));
  // Never recorded (no copy yet): cudaEventSynchronize returns at once.
  if (code == SHARDLINE_GPU_OK && ctx->copy_stream != nullptr) {
    code = Check(ctx, "cudaEventRecord (host copies)", cudaEventRecord(c->event, ctx->copy_stream));
  }
  if (code != SHARDLINE_GPU_OK) {
    if (c->event != nullptr) cudaEventDestroy(c->event);
    delete c;
    return code;
  }
  *copies = c;
  return SHARDLINE_GPU_OK;
}

int HostCopiesWait(ShardlineGpuHostCopies* copies, char* error, size_t error_len) {
  const cudaError_t e = cudaEventSynchronize(copies->event);
  if (e == cudaSuccess) return SHARDLINE_GPU_OK;
  std::snprintf(error, error_len, "cudaEventSynchronize (copies to host) on device %d: %s (%s)",
                copies->device, cudaGetErrorString(e), cudaGetErrorName(e));
  return CodeOf(e);
}

void HostCopiesDestroy(ShardlineGpuHostCopies* copies) {
  if (copies == nullptr) return;
  cudaEventDestroy(copies->event);
  delete copies;
}

int OrderAfterHostCopies(Ctx* ctx) {
  SL_RETURN_IF_ERROR(Enter(ctx, "order_after_host_copies", {}));
  if (ctx->copy_stream == nullptr) return SHARDLINE_GPU_OK;
  return Check(ctx, "cudaStreamWaitEvent (after copies to host)",
               cudaStreamWaitEvent(ctx->stream, ctx->copies_done, 0));
}

int Zero(Ctx* ctx, void* ptr, size_t bytes) {
  SL_RETURN_IF_ERROR(Enter(ctx, "zero", {}));
  if (bytes == 0) return SHARDLINE_GPU_OK;
  return Check(ctx, "cudaMemsetAsync", cudaMemsetAsync(ptr, 0, bytes, ctx->stream));
}

int Stream(Ctx* ctx, void** stream) {
  *stream = nullptr;
  SL_RETURN_IF_ERROR(Enter(ctx, "train_stream", {}));
  *stream = static_cast<void*>(ctx->stream);
  return SHARDLINE_GPU_OK;
}

int Synchronize(Ctx* ctx) {
  SL_RETURN_IF_ERROR(Enter(ctx, "synchronize", {}));
  return Check(ctx, "cudaStreamSynchronize", cudaStreamSynchronize(ctx->stream));
}

// --- ops.h -------------------------------------------------------------------

int Gemm(Ctx* ctx, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, float alpha,
         const float* a, const float* b, float beta, float* c) {
  SL_RETURN_IF_ERROR(Enter(ctx, "gemm", {m, n, k}));
  return DenseGemm(ctx, trans_a != 0, trans_b != 0, m, n, k, alpha, a, b, beta, c);
}

int LinearForward(Ctx* ctx, const float* x, const float* w, const float* b, float* y,
                  int64_t rows, int64_t in, int64_t out) {
  SL_RETURN_IF_ERROR(Enter(ctx, "linear_forward", {rows, in, out}));
  if (b == nullptr) return DenseGemm(ctx, false, true, rows, out, in, 1.0f, x, w, 0.0f, y);
  SL_RETURN_IF_ERROR(Check(ctx, "bias broadcast kernel",
                           shardline::gpu::LaunchBroadcastRows(ctx->stream, b, y, rows, out)));
  return DenseGemm(ctx, false, true, rows, out, in, 1.0f, x, w, 1.0f, y);
}

int LinearBackward(Ctx* ctx, const float* x, const float* w, const float* dy, float* dx,
                   float* dw, float* db, int64_t rows, int64_t in, int64_t out) {
  SL_RETURN_IF_ERROR(Enter(ctx, "linear_backward", {rows, in, out}));
  // dx[T, in] = dy[T, out] w[out, in].
  if (dx != nullptr) {
    SL_RETURN_IF_ERROR(DenseGemm(ctx, false, false, rows, in, out, 1.0f, dy, w, 0.0f, dx));
  }
  // dw[out, in] += dy^T x.
  SL_RETURN_IF_ERROR(DenseGemm(ctx, true, false, out, in, rows, 1.0f, dy, x, 1.0f, dw));
  if (db == nullptr) return SHARDLINE_GPU_OK;
  return Check(ctx, "bias gradient kernel",
               shardline::gpu::LaunchColumnSumAccumulate(ctx->stream, dy, db, rows, out));
}

int LayerNormForward(Ctx* ctx, const float* x, const float* gamma, const float* beta, float* y,
                     float* mean, float* rstd, int64_t rows, int64_t width) {
  SL_RETURN_IF_ERROR(Enter(ctx, "layer_norm_forward", {rows, width}));
  return Check(ctx, "layer norm forward kernel",
               shardline::gpu::LaunchLayerNormForward(ctx->stream, x, gamma, beta, y, mean, rstd,
                                                      rows, width));
}

int LayerNormBackward(Ctx* ctx, const float* x, const float* gamma, const float* mean,
                      const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta,
                      int64_t rows, int64_t width) {
  SL_RETURN_IF_ERROR(Enter(ctx, "layer_norm_backward", {rows, width}));
  return Check(ctx, "layer norm backward kernels",
               shardline::gpu::LaunchLayerNormBackward(ctx->stream, x, gamma, mean, rstd, dy, dx,
                                                       dgamma, dbeta, rows, width));
}

int GeluForward(Ctx* ctx, const float* x, float* y, int64_t n) {
  SL_RETURN_IF_ERROR(Enter(ctx, "gelu_forward", {n}));
  return Check(ctx, "gelu forward kernel", shardline::gpu::LaunchGeluForward(ctx->stream, x, y, n));
}

int GeluBackward(Ctx* ctx, const float* x, const float* dy, float* dx, int64_t n) {
  SL_RETURN_IF_ERROR(Enter(ctx, "gelu_backward", {n}));
  return Check(ctx, "gelu backward kernel",
               shardline::gpu::LaunchGeluBackward(ctx->stream, x, dy, dx, n));
}

int BiasGeluForward(Ctx* ctx, const float* x, const float* b, float* y, int64_t rows,
                    int64_t width, int32_t bf16) {
  SL_RETURN_IF_ERROR(Enter(ctx, "bias_gelu_forward", {rows, width}));
  return Check(ctx, "bias+gelu forward kernel",
               shardline::gpu::LaunchBiasGeluForward(ctx->stream, x, b, y, rows, width,
                                                     bf16 != 0));
}

int BiasGeluBackward(Ctx* ctx, const float* x, const float* b, const float* dy, float* dx,
                     int64_t rows, int64_t width, int32_t bf16) {
  SL_RETURN_IF_ERROR(Enter(ctx, "bias_gelu_backward", {rows, width}));
  return Check(ctx, "bias+gelu backward kernel",
               shardline::gpu::LaunchBiasGeluBackward(ctx->stream, x, b, dy, dx, rows, width,
                                                      bf16 != 0));
}

// Attention: per batch element b, one strided-batched product over the heads
// (on the bf16 tensor cores for ops.h's bf16 attention).
// Head h of token s of batch b starts at qkv + (b * seq + s) * tok + h * 3 * hd
// (q; k at + hd, v at + 2 * hd), so within one b the heads are 3 * hd apart
// and the tokens tok apart: row stride tok, batch stride 3 * hd. probs and dS
// are dense [batch, heads, seq, seq]: row stride seq, batch stride seq * seq.
// y / dy rows are heads * hd apart, heads hd apart.
int AttentionForward(Ctx* ctx, const float* qkv, float* probs, float* y, int64_t batch, int64_t seq,
                     int64_t heads, int64_t head_dim, int32_t bf16_flag) {
  const bool bf16 = bf16_flag != 0;
  SL_RETURN_IF_ERROR(Enter(ctx, "attention_forward", {batch, seq, heads, head_dim}));
  const int64_t tok = heads * 3 * head_dim;  // qkv row stride
  const int64_t ys = heads * head_dim;       // y row stride
  const int64_t ss = seq * seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t b = 0; b < batch; ++b) {
    const float* q = qkv + b * seq * tok;
    const float* k = q + head_dim;
    float* p = probs + b * heads * ss;
    // S = scale * Q K^T into p.
    SL_RETURN_IF_ERROR(StridedBatchedGemm(ctx, false, true, seq, seq, head_dim, scale, q, tok,
                                          3 * head_dim, k, tok, 3 * head_dim, 0.0f, p, seq, ss,
                                          heads, bf16));
  }
  SL_RETURN_IF_ERROR(Check(
      ctx, "causal softmax kernel",
      shardline::gpu::LaunchCausalSoftmax(ctx->stream, probs, batch * heads * seq, seq, bf16)));
  for (int64_t b = 0; b < batch; ++b) {
    const float* v = qkv + b * seq * tok + 2 * head_dim;
    const float* p = probs + b * heads * ss;
    // Y = P V into this head's slot of each token's row.
    SL_RETURN_IF_ERROR(StridedBatchedGemm(ctx, false, false, seq, head_dim, seq, 1.0f, p, seq, ss,
                                          v, tok, 3 * head_dim, 0.0f, y + b * seq * ys, ys,
                                          head_dim, heads, bf16));
  }
  return SHARDLINE_GPU_OK;
}

int AttentionBackward(Ctx* ctx, const float* qkv, const float* probs, const float* dy, float* dqkv,
                      int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                      int32_t bf16_flag) {
  const bool bf16 = bf16_flag != 0;
  SL_RETURN_IF_ERROR(Enter(ctx, "attention_backward", {batch, seq, heads, head_dim}));
  const int64_t tok = heads * 3 * head_dim;
  const int64_t ys = heads * head_dim;
  const int64_t ss = seq * seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t need = static_cast<size_t>(batch * heads * ss);
  if (need == 0) return SHARDLINE_GPU_OK;
  if (need > ctx->scratch_floats) {
    if (ctx->scratch != nullptr) cudaFree(ctx->scratch);  // synchronises the device
    ctx->scratch = nullptr;
    ctx->scratch_floats = 0;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, need * sizeof(float));
    if (e != cudaSuccess) {
      return Fail(ctx, CodeOf(e), "cudaMalloc(%zu bytes) for attention scratch: %s",
                  need * sizeof(float), cudaGetErrorString(e));
    }
    ctx->scratch = static_cast<float*>(p);
    ctx->scratch_floats = need;
  }
  float* ds = ctx->scratch;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t off = b * seq * tok;
    const float* v = qkv + off + 2 * head_dim;
    float* dv = dqkv + off + 2 * head_dim;
    const float* p = probs + b * heads * ss;
    const float* dyh = dy + b * seq * ys;
    // dV = P^T dY.
    SL_RETURN_IF_ERROR(StridedBatchedGemm(ctx, true, false, seq, head_dim, seq, 1.0f, p, seq, ss,
                                          dyh, ys, head_dim, 0.0f, dv, tok, 3 * head_dim, heads,
                                          bf16));
    // dP = dY V^T.
    SL_RETURN_IF_ERROR(StridedBatchedGemm(ctx, false, true, seq, seq, head_dim, 1.0f, dyh, ys,
                                          head_dim, v, tok, 3 * head_dim, 0.0f, ds + b * heads * ss,
                                          seq, ss, heads, bf16));
  }
  SL_RETURN_IF_ERROR(Check(ctx, "causal softmax backward kernel",
                           shardline::gpu::LaunchCausalSoftmaxBackward(
                               ctx->stream, probs, ds, batch * heads * seq, seq, bf16)));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t off = b * seq * tok;
    const float* q = qkv + off;
    const float* k = q + head_dim;
    float* dq = dqkv + off;
    float* dk = dq + head_dim;
    const float* dsb = ds + b * heads * ss;
    // S = scale * Q K^T  =>  dQ = scale * dS K, dK = scale * dS^T Q.
    SL_RETURN_IF_ERROR(StridedBatchedGemm(ctx, false, false, seq, head_dim, seq, scale, dsb, seq,
                                          ss, k, tok, 3 * head_dim, 0.0f, dq, tok, 3 * head_dim,
                                          heads, bf16));
    SL_RETURN_IF_ERROR(StridedBatchedGemm(ctx, true, false, seq, head_dim, seq, scale, dsb, seq, ss,
                                          q, tok, 3 * head_dim, 0.0f, dk, tok, 3 * head_dim, heads,
                                          bf16));
  }
  return SHARDLINE_GPU_OK;
}

int EmbeddingForward(Ctx* ctx, const int32_t* tokens, const float* table, float* y, int64_t rows,
                     int64_t width, int64_t vocab_begin, int64_t vocab_local) {
  SL_RETURN_IF_ERROR(Enter(ctx, "embedding_forward", {rows, width, vocab_begin, vocab_local}));
  return Check(ctx, "embedding forward kernel",
               shardline::gpu::LaunchEmbeddingForward(ctx->stream, tokens, table, y, rows, width,
                                                      vocab_begin, vocab_local));
}

int EmbeddingBackward(Ctx* ctx, const int32_t* tokens, const float* dy, float* dtable,
                      int64_t rows, int64_t width, int64_t vocab_begin, int64_t vocab_local) {
  SL_RETURN_IF_ERROR(Enter(ctx, "embedding_backward", {rows, width, vocab_begin, vocab_local}));
  return Check(ctx, "embedding backward kernel",
               shardline::gpu::LaunchEmbeddingBackward(ctx->stream, tokens, dy, dtable, rows,
                                                       width, vocab_begin, vocab_local));
}

int AddPositionForward(Ctx* ctx, const float* pos_table, float* y, int64_t rows, int64_t seq,
                       int64_t width) {
  SL_RETURN_IF_ERROR(Enter(ctx, "add_position_forward", {rows, seq, width}));
  if (rows > 0 && seq == 0) {
    return Fail(ctx, SHARDLINE_GPU_INVALID_ARGUMENT, "add_position_forward: seq is 0");
  }
  return Check(ctx, "position add kernel",
               shardline::gpu::LaunchAddPositionForward(ctx->stream, pos_table, y, rows, seq,
                                                        width));
}

int AddPositionBackward(Ctx* ctx, const float* dy, float* dpos, int64_t rows, int64_t seq,
                        int64_t width) {
  SL_RETURN_IF_ERROR(Enter(ctx, "add_position_backward", {rows, seq, width}));
  return Check(ctx, "position backward kernel",
               shardline::gpu::LaunchAddPositionBackward(ctx->stream, dy, dpos, rows, seq,
                                                         width));
}

int LocalRowMax(Ctx* ctx, const float* logits, float* row_max, int64_t rows,
                int64_t vocab_local) {
  SL_RETURN_IF_ERROR(Enter(ctx, "local_row_max", {rows, vocab_local}));
  return Check(ctx, "row max kernel",
               shardline::gpu::LaunchLocalRowMax(ctx->stream, logits, row_max, rows,
                                                 vocab_local));
}

int LocalSumExpAndTarget(Ctx* ctx, const float* logits, const float* row_max,
                         const int32_t* targets, float* sum_exp, float* target_logit,
                         int64_t rows, int64_t vocab_begin, int64_t vocab_local) {
  SL_RETURN_IF_ERROR(Enter(ctx, "local_sum_exp_and_target", {rows, vocab_begin, vocab_local}));
  return Check(ctx, "sum-exp kernel",
               shardline::gpu::LaunchLocalSumExpAndTarget(ctx->stream, logits, row_max, targets,
                                                          sum_exp, target_logit, rows,
                                                          vocab_begin, vocab_local));
}

int TokenLoss(Ctx* ctx, const float* row_max, const float* sum_exp, const float* target_logit,
              float* loss, int64_t rows) {
  SL_RETURN_IF_ERROR(Enter(ctx, "token_loss", {rows}));
  return Check(ctx, "token loss kernel",
               shardline::gpu::LaunchTokenLoss(ctx->stream, row_max, sum_exp, target_logit, loss,
                                               rows));
}

int CrossEntropyBackward(Ctx* ctx, const float* logits, const float* row_max,
                         const float* sum_exp, const int32_t* targets, float scale,
                         float* dlogits, int64_t rows, int64_t vocab_begin, int64_t vocab_local) {
  SL_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_backward", {rows, vocab_begin, vocab_local}));
  return Check(ctx, "cross entropy backward kernel",
               shardline::gpu::LaunchCrossEntropyBackward(ctx->stream, logits, row_max, sum_exp,
                                                          targets, scale, dlogits, rows,
                                                          vocab_begin, vocab_local));
}

int AddInPlace(Ctx* ctx, const float* x, float* y, int64_t n) {
  SL_RETURN_IF_ERROR(Enter(ctx, "add_in_place", {n}));
  return Check(ctx, "add kernel", LaunchAddInPlace(ctx->stream, x, y, n));
}

int CopyDevice(Ctx* ctx, void* dst, const void* src, size_t bytes) {
  SL_RETURN_IF_ERROR(Enter(ctx, "copy_device", {}));
  if (bytes == 0) return SHARDLINE_GPU_OK;
  return Check(ctx, "cudaMemcpyAsync (device to device)",
               cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

int SetBf16Products(Ctx* ctx, int32_t on) {
  ctx->bf16_products = on != 0;
  return SHARDLINE_GPU_OK;
}

int RoundBf16(Ctx* ctx, float* x, int64_t n) {
  SL_RETURN_IF_ERROR(Enter(ctx, "round_bf16", {n}));
  return Check(ctx, "bf16 rounding kernel", shardline::gpu::LaunchRoundBf16(ctx->stream, x, n));
}

int Scale(Ctx* ctx, float* x, float alpha, int64_t n) {
  SL_RETURN_IF_ERROR(Enter(ctx, "scale", {n}));
  return Check(ctx, "scale kernel", shardline::gpu::LaunchScale(ctx->stream, x, alpha, n));
}

int AdamWStep(Ctx* ctx, const ShardlineAdamWScalars* k, float* param, const float* grad,
              float* exp_avg, float* exp_avg_sq, const uint8_t* decay_mask, int64_t n) {
  SL_RETURN_IF_ERROR(Enter(ctx, "adamw_step", {n}));
  if (k == nullptr) return Fail(ctx, SHARDLINE_GPU_INVALID_ARGUMENT, "adamw_step: scalars is null");
  return Check(ctx, "adamw kernel",
               shardline::gpu::LaunchAdamWStep(ctx->stream, k->step_size, k->inv_sqrt_bc2, k->b1,
                                               k->b2, k->one_minus_b1, k->one_minus_b2, k->eps,
                                               k->decay, param, grad, exp_avg, exp_avg_sq,
                                               decay_mask, n));
}

// masked_sum_squares over `pieces` pieces: each piece's block sums go to its
// own kMaxSumSquaresBlocks slots of ctx->partials, all come back in one copy
// (one wait for the stream), and are added to *sum piece by piece, block by
// block. `what` names the call in errors.
int SumSquares(Ctx* ctx, const char* what, int64_t pieces, const float* const* x,
               const uint8_t* const* mask, const int64_t* n, double* sum) {
  SL_RETURN_IF_ERROR(Enter(ctx, what, {pieces}));
  for (int64_t p = 0; p < pieces; ++p) {
    if (n[p] < 0) {
      return Fail(ctx, SHARDLINE_GPU_INVALID_ARGUMENT, "%s: negative size %lld (piece %lld)",
                  what, static_cast<long long>(n[p]), static_cast<long long>(p));
    }
  }
  constexpr int64_t kBlocks = shardline::gpu::kMaxSumSquaresBlocks;
  if (pieces > ctx->partials_pieces) {
    // Growing waits for the stream once (cudaFree); a step's pieces repeat.
    if (ctx->partials != nullptr) cudaFree(ctx->partials);
    ctx->partials = nullptr;
    ctx->partials_pieces = 0;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, sizeof(double) * kBlocks * pieces);
    if (e != cudaSuccess) {
      return Fail(ctx, CodeOf(e), "cudaMalloc for %s' partial sums: %s", what,
                  cudaGetErrorString(e));
    }
    ctx->partials = static_cast<double*>(p);
    ctx->partials_pieces = pieces;
  }
  std::vector<int> blocks(static_cast<size_t>(pieces), 0);
  int64_t used = 0;  // doubles to copy back: up to the last piece's last block
  for (int64_t p = 0; p < pieces; ++p) {
    if (n[p] == 0) continue;
    SL_RETURN_IF_ERROR(Check(ctx, "sum of squares kernel",
                             shardline::gpu::LaunchMaskedSumSquares(
                                 ctx->stream, x[p], mask[p], n[p], ctx->partials + p * kBlocks,
                                 &blocks[p])));
    used = p * kBlocks + blocks[p];
  }
  if (used == 0) return SHARDLINE_GPU_OK;
  std::vector<double> host(static_cast<size_t>(used));
  SL_RETURN_IF_ERROR(
      Copy(ctx, host.data(), ctx->partials, sizeof(double) * used, cudaMemcpyDeviceToHost));
  double total = *sum;
  for (int64_t p = 0; p < pieces; ++p) {
    for (int b = 0; b < blocks[p]; ++b) total += host[p * kBlocks + b];
  }
  *sum = total;
  return SHARDLINE_GPU_OK;
}

int MaskedSumSquares(Ctx* ctx, const float* x, const uint8_t* mask, int64_t n, double* sum) {
  return SumSquares(ctx, "masked_sum_squares", 1, &x, &mask, &n, sum);
}

int MaskedSumSquaresMany(Ctx* ctx, int64_t pieces, const float* const* x,
                         const uint8_t* const* mask, const int64_t* n, double* sum) {
  return SumSquares(ctx, "masked_sum_squares_many", pieces, x, mask, n, sum);
}

const ShardlineGpuTrainApi kTrainApi = {
    SHARDLINE_GPU_ABI_VERSION,
    CtxCreate,
    CtxDestroy,
    LastError,
    Alloc,
    Free,
    CopyToDevice,
    CopyToHost,
    Zero,
    Synchronize,
    Gemm,
    LinearForward,
    LinearBackward,
    LayerNormForward,
    LayerNormBackward,
    GeluForward,
    GeluBackward,
    AttentionForward,
    AttentionBackward,
    EmbeddingForward,
    EmbeddingBackward,
    AddPositionForward,
    AddPositionBackward,
    LocalRowMax,
    LocalSumExpAndTarget,
    TokenLoss,
    CrossEntropyBackward,
    AddInPlace,
    CopyDevice,
    Scale,
    AdamWStep,
    MaskedSumSquares,
    RoundBf16,
    SetBf16Products,
    HostAlloc,
    HostFree,
    CopyToHostAsync,
    HostCopiesRecord,
    HostCopiesWait,
    HostCopiesDestroy,
    OrderAfterHostCopies,
    BiasGeluForward,
    BiasGeluBackward,
    Stream,
    MaskedSumSquaresMany,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ShardlineGpuTrainApi*
shardline_gpu_train_api(void) {
  return &kTrainApi;
}

// CPU stand-in for the cuBLAS calls of train_plugin.cc: a naive column-major
// reference with cuBLAS's leading-dimension checks, so the row-major mapping
// and the attention strides are checked against cuBLAS's documented
// semantics (not against the library itself). For train_kernels_emu_test.
#pragma once
#include <cstring>
#include "cuda_runtime_api.h"
struct cublasContext {};
typedef cublasContext* cublasHandle_t;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_ALLOC_FAILED = 3 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0 };
inline cublasStatus_t cublasCreate(cublasHandle_t* h) { *h = new cublasContext; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
inline const char* cublasGetStatusString(cublasStatus_t) { return "mock"; }
// Naive column-major reference with cuBLAS's argument checks, for every
// product (cublasGemmStridedBatchedEx; the others call it): fp32 operands,
// accumulated in double; CUBLAS_COMPUTE_32F_FAST_16BF converts A and B to
// bf16 (round to nearest even) before the products, as the tensor cores
// read them.
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16BF = 75 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
inline float EmuBf16(float f) {
  unsigned int u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  u += 0x7fffu + ((u >> 16) & 1u); u &= 0xffff0000u;
  float r; std::memcpy(&r, &u, 4); return r;
}
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha_v, const void* Av, cudaDataType_t at, int lda, long long sa, const void* Bv, cudaDataType_t bt, int ldb, long long sb, const void* beta_v, void* Cv, cudaDataType_t ct, int ldc, long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha = *static_cast<const float*>(alpha_v), beta = *static_cast<const float*>(beta_v);
  const bool bf16 = compute == CUBLAS_COMPUTE_32F_FAST_16BF;
  for (int bi = 0; bi < batch; ++bi) {
    const float* a = static_cast<const float*>(Av) + bi * sa; const float* b = static_cast<const float*>(Bv) + bi * sb;
    float* c = static_cast<float*>(Cv) + bi * sc;
    for (int i = 0; i < m; ++i) for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        float av = ta == CUBLAS_OP_N ? a[i + (long)p * lda] : a[p + (long)i * lda];
        float bv = tb == CUBLAS_OP_N ? b[p + (long)j * ldb] : b[j + (long)p * ldb];
        if (bf16) { av = EmuBf16(av); bv = EmuBf16(bv); }
        s += (double)av * bv;
      }
      float& cv = c[i + (long)j * ldc];
      cv = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + beta * cv);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha_v, const void* Av, cudaDataType_t at, int lda, const void* Bv, cudaDataType_t bt, int ldb, const void* beta_v, void* Cv, cudaDataType_t ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha_v, Av, at, lda, 0, Bv, bt, ldb, 0, beta_v, Cv, ct, ldc, 0, 1, compute, algo);
}
// The fp32 products: the same reference without the bf16 conversion.
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const float* A, int lda, long long sa, const float* B, int ldb, long long sb, const float* beta, float* C, int ldc, long long sc, int batch) {
  return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F, ldb, sb, beta, C, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta, float* C, int ldc) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

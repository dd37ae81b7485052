// CPU stand-in for the cuBLAS calls of train_plugin.cc: a naive column-major
// reference with cuBLAS's leading-dimension checks, so the row-major mapping
// and the attention strides are checked against cuBLAS's documented
// semantics (not against the library itself). For train_kernels_emu_test.
#pragma once
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
// Naive column-major reference with cuBLAS's argument checks.
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const float* A, int lda, long long sa, const float* B, int ldb, long long sb, const float* beta, float* C, int ldc, long long sc, int batch) {
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  for (int b = 0; b < batch; ++b) {
    const float* a = A + b * sa; const float* bb = B + b * sb; float* c = C + b * sc;
    for (int i = 0; i < m; ++i) for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const float av = ta == CUBLAS_OP_N ? a[i + (long)p * lda] : a[p + (long)i * lda];
        const float bv = tb == CUBLAS_OP_N ? bb[p + (long)j * ldb] : bb[j + (long)p * ldb];
        s += (double)av * bv;
      }
      float& cv = c[i + (long)j * ldc];
      cv = *beta == 0.0f ? (float)(*alpha * s) : (float)(*alpha * s + *beta * cv);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta, float* C, int ldc) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

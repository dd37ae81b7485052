// The CUDA kernels of the GPU plugin's training math (train_plugin.cc wraps
// them, with cuBLAS, into plugin_abi.h's ShardlineGpuTrainApi). Part of
// libshardline_gpu.so only; never included by the worker.
//
//   cudaError_t e = LaunchGeluForward(stream, x, y, n);  // enqueued on `stream`
//
// Each launcher enqueues its kernel(s) on `stream` and returns
// cudaGetLastError() (launch errors only; execution errors surface at the
// next synchronising call). Sizes are elements; all pointers are device
// pointers. Semantics are those of the same-named function in
// worker/train/ops.h; the ones with no ops.h twin say what they do.
#ifndef SHARDLINE_WORKER_GPU_TRAIN_KERNELS_H_
#define SHARDLINE_WORKER_GPU_TRAIN_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace shardline::gpu {

// c[b][i * ldc + j] = beta * c[...] (0 when beta == 0, never reading c), for
// b < batch (batch stride stride_c), i < m, j < n: an empty (k == 0) product.
cudaError_t LaunchScaleMatrix(cudaStream_t stream, float* c, int64_t m, int64_t n, int64_t ldc,
                              int64_t stride_c, int64_t batch, float beta);
// y[t, o] = b[o] for t < rows, o < out.
cudaError_t LaunchBroadcastRows(cudaStream_t stream, const float* b, float* y, int64_t rows,
                                int64_t out);
// db[o] += sum over t < rows of dy[t, o].
cudaError_t LaunchColumnSumAccumulate(cudaStream_t stream, const float* dy, float* db,
                                      int64_t rows, int64_t cols);

cudaError_t LaunchLayerNormForward(cudaStream_t stream, const float* x, const float* gamma,
                                   const float* beta, float* y, float* mean, float* rstd,
                                   int64_t rows, int64_t width);
cudaError_t LaunchLayerNormBackward(cudaStream_t stream, const float* x, const float* gamma,
                                    const float* mean, const float* rstd, const float* dy,
                                    float* dx, float* dgamma, float* dbeta, int64_t rows,
                                    int64_t width);
cudaError_t LaunchGeluForward(cudaStream_t stream, const float* x, float* y, int64_t n);
cudaError_t LaunchGeluBackward(cudaStream_t stream, const float* x, const float* dy, float* dx,
                               int64_t n);
// ops.h's BiasGeluForward / BiasGeluBackward over [rows, width].
cudaError_t LaunchBiasGeluForward(cudaStream_t stream, const float* x, const float* b, float* y,
                                  int64_t rows, int64_t width, bool bf16);
cudaError_t LaunchBiasGeluBackward(cudaStream_t stream, const float* x, const float* b,
                                   const float* dy, float* dx, int64_t rows, int64_t width,
                                   bool bf16);

// p holds rows = batch * heads * seq rows of `seq` scores, row r being query
// position r % seq: in place, the causal softmax of ops.h's AttentionForward
// (entries above the diagonal become 0); bf16: each probability rounded to
// bf16 (ops.h's bf16 attention).
cudaError_t LaunchCausalSoftmax(cudaStream_t stream, float* p, int64_t rows, int64_t seq,
                                bool bf16);
// ds holds dP in the same layout: in place, dS = P * (dP - sum_j P dP) for
// j <= i, 0 above the diagonal; bf16: dS rounded to bf16.
cudaError_t LaunchCausalSoftmaxBackward(cudaStream_t stream, const float* p, float* ds,
                                        int64_t rows, int64_t seq, bool bf16);

cudaError_t LaunchEmbeddingForward(cudaStream_t stream, const int32_t* tokens,
                                   const float* table, float* y, int64_t rows, int64_t width,
                                   int64_t vocab_begin, int64_t vocab_local);
cudaError_t LaunchEmbeddingBackward(cudaStream_t stream, const int32_t* tokens, const float* dy,
                                    float* dtable, int64_t rows, int64_t width,
                                    int64_t vocab_begin, int64_t vocab_local);
cudaError_t LaunchAddPositionForward(cudaStream_t stream, const float* pos_table, float* y,
                                     int64_t rows, int64_t seq, int64_t width);
cudaError_t LaunchAddPositionBackward(cudaStream_t stream, const float* dy, float* dpos,
                                      int64_t rows, int64_t seq, int64_t width);
cudaError_t LaunchLocalRowMax(cudaStream_t stream, const float* logits, float* row_max,
                              int64_t rows, int64_t vocab_local);
cudaError_t LaunchLocalSumExpAndTarget(cudaStream_t stream, const float* logits,
                                       const float* row_max, const int32_t* targets,
                                       float* sum_exp, float* target_logit, int64_t rows,
                                       int64_t vocab_begin, int64_t vocab_local);
cudaError_t LaunchTokenLoss(cudaStream_t stream, const float* row_max, const float* sum_exp,
                            const float* target_logit, float* loss, int64_t rows);
cudaError_t LaunchCrossEntropyBackward(cudaStream_t stream, const float* logits,
                                       const float* row_max, const float* sum_exp,
                                       const int32_t* targets, float scale, float* dlogits,
                                       int64_t rows, int64_t vocab_begin, int64_t vocab_local);
cudaError_t LaunchAddInPlace(cudaStream_t stream, const float* x, float* y, int64_t n);

// x[i] = x[i] rounded to bfloat16 (round to nearest even; a NaN stays a
// NaN), stored as fp32: worker/comm/float16.h's FloatToBFloat16 and back.
cudaError_t LaunchRoundBf16(cudaStream_t stream, float* x, int64_t n);
// x[i] *= alpha.
cudaError_t LaunchScale(cudaStream_t stream, float* x, float alpha, int64_t n);
// worker/train/adamw.h AdamWStep with its per-step constants precomputed
// (AdamWScalars' fields): the same formula per element (nvcc may fuse
// multiply-adds, so the last bit can differ from the CPU's).
cudaError_t LaunchAdamWStep(cudaStream_t stream, float step_size, float inv_sqrt_bc2, float b1,
                            float b2, float one_minus_b1, float one_minus_b2, float eps,
                            float decay, float* param, const float* grad, float* exp_avg,
                            float* exp_avg_sq, const uint8_t* decay_mask, int64_t n);
// The largest `blocks` LaunchMaskedSumSquares uses.
constexpr int kMaxSumSquaresBlocks = 1024;
// partial[b] (b < *blocks, at most kMaxSumSquaresBlocks) = the sum in double
// of x[i]^2 with mask[i] != 0 over block b's grid-stride elements; the sum
// of the partials is the whole sum. *blocks is set before the launch.
cudaError_t LaunchMaskedSumSquares(cudaStream_t stream, const float* x, const uint8_t* mask,
                                   int64_t n, double* partial, int* blocks);

}  // namespace shardline::gpu

#endif  // SHARDLINE_WORKER_GPU_TRAIN_KERNELS_H_

// CPU fp32 kernels of the GPT trainer: the forward and backward math of one
// tensor-parallel slice of a transformer layer, with no communication. The
// model (model.h) calls these between its tensor-parallel collectives.
//
//   LinearForward(x, w, b, y, /*rows=*/T, /*in=*/h, /*out=*/3 * h);
//   LinearBackward(x, w, dy, dx, dw, db, T, h, 3 * h);   // dw, db accumulate
//
// Conventions:
//   * Every buffer is fp32, row-major, dense; every size is in ELEMENTS.
//   * "rows" (T) is tokens = batch * seq, flattened; a token's features are
//     contiguous.
//   * Linear weights are [out, in] (torch.nn.Linear / Megatron-LM layout).
//   * Parameter gradients (dw, db, dgamma, ...) ACCUMULATE (+=) so that
//     micro-batches add up; activation gradients (dx, ...) are OVERWRITTEN.
//   * Output buffers must not alias inputs unless a function says so.
//   * Matrix products go through cblas_sgemm (OpenBLAS, one thread per call).
//   * Intra-op threads (parallel.h SetIntraOpThreads): products split the
//     rows or columns of their output, row-wise kernels their rows,
//     element-wise kernels their elements, attention its (batch, head)
//     pairs; sums over rows (bias, LayerNorm gamma/beta gradients) split
//     their columns. Each output element is computed the same way whatever
//     the split: results are bit-identical for every thread count
//     (ops_test IntraOpThreadsGiveBitIdenticalResults).
// Thread-safety: pure functions over caller-owned buffers; safe to call from
// many threads on disjoint buffers.
#ifndef SHARDLINE_WORKER_TRAIN_OPS_H_
#define SHARDLINE_WORKER_TRAIN_OPS_H_

#include <cstdint>

#include "worker/train/parallel.h"  // SetIntraOpThreads

namespace shardline::worker::train {

// C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. A is [m, k]
// (or [k, m] when trans_a), B is [k, n] (or [n, k] when trans_b). With
// beta == 0, C's old contents are ignored (may be uninitialised).
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c);

// y[T, out] = x[T, in] w[out, in]^T + b[out]; b may be null (no bias).
void LinearForward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                   int64_t in, int64_t out);

// Given dy[T, out]: dx[T, in] = dy w (overwritten; skipped when dx is null),
// dw[out, in] += dy^T x, db[out] += sum over rows of dy (skipped when db is
// null).
void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, int64_t rows, int64_t in, int64_t out);

// LayerNorm over the last dimension (Ba et al., 2016), eps inside the sqrt:
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), var the
// biased variance. Saves mean[T] and rstd[T] for the backward.
constexpr float kLayerNormEpsilon = 1e-5f;
void LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd, int64_t rows, int64_t width);

// dx[T, width] overwritten; dgamma[width] += and dbeta[width] +=.
void LayerNormBackward(const float* x, const float* gamma, const float* mean, const float* rstd,
                       const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows,
                       int64_t width);

// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel, 2016, Section 2):
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Elementwise over n.
// y may alias x in the forward.
// Computed as x s with s = 1 / (1 + exp(-2u)) (= 0.5 (1 + tanh(u)), without
// the cancellation of 1 + tanh(u) for negative x), and the derivative as
// s + 2 x s (1 - s) du/dx (d tanh(u)/du = 4 s (1 - s)), through one
// vectorised exp (ops.cc: 16 lanes, compiled for AVX-512, AVX2 and baseline
// x86-64, picked at load time). Accuracy against the double-precision
// formula, checked over every float of [-12, 12] in steps of 2^-10
// (ops_test VectorisedGeluMatchesTheDoubleFormula): relative error at most
// 2e-7 (1 + |2u|), i.e. 1.5e-6 for |x| <= 3; below x = -10 the value is
// about 6e-39 x instead of underflowing to 0; the derivative also within
// 1.2e-7 absolute where it crosses zero. NaN gives NaN; results for one
// element do not depend on n or on its position.
void GeluForward(const float* x, float* y, int64_t n);
// dx = dy * gelu'(x); dx may alias dy.
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n);

// The MLP's first activation with its bias fused in (as Megatron-LM's
// bias_gelu fusion): x [rows, width] is the product without its bias, b
// [width] the bias. Forward: y = gelu(pre), pre = x + b (b broadcast over
// rows); pre is not stored: the backward forms it again from x and b, so the
// pair reads and writes the [rows, width] tensor once each way instead of
// adding the bias in a pass of its own. Backward: dx = dy * gelu'(pre) (the
// gradient of pre, which is also the bias's and the product's). bf16: pre is
// rounded to bfloat16 before gelu (the value a bf16 model keeps), y and dx
// after. Bit-identical to adding b, RoundToBFloat16 (bf16), then GeluForward /
// GeluBackward and RoundToBFloat16 (bf16). y may alias x; dx may alias dy.
void BiasGeluForward(const float* x, const float* b, float* y, int64_t rows, int64_t width,
                     bool bf16);
void BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx, int64_t rows,
                      int64_t width, bool bf16);

// Causal multi-head self-attention over `heads` heads of width head_dim
// (Vaswani et al., 2017, Section 3.2.1: softmax(q k^T / sqrt(head_dim)) v,
// position j attends to positions <= j).
//   qkv[batch, seq, heads, 3, head_dim]: the QKV projection's output; per
//     token its features are ordered [head][q|k|v][head_dim] (plan/model.h).
//   probs[batch, heads, seq, seq]: saved softmax probabilities (entries
//     above the diagonal are 0).
//   y[batch, seq, heads, head_dim]: per token the heads' outputs, head-major,
//     the input of the attention output projection.
// bf16 (bf16 mixed precision, worker/train/bf16_device.h; the caller hands
// in bf16 q, k and v): the probabilities are rounded to bf16 as they are
// written (so probs holds bf16 values, which backward reads), so that both
// products read bf16 operands, as they do on a GPU's bf16 tensor cores; the
// scores and the softmax are computed in fp32 either way.
void AttentionForward(const float* qkv, float* probs, float* y, int64_t batch, int64_t seq,
                      int64_t heads, int64_t head_dim, bool bf16 = false);

// Given dy (shaped like y), overwrites dqkv (shaped like qkv). bf16 (the
// caller hands in bf16 q, k, v, dy and forward's bf16 probabilities): dP
// and the softmax backward are fp32, and the scores' gradient dS is rounded
// to bf16 before the two products that read it (dQ = dS K, dK = dS^T Q),
// so that every product reads bf16 operands, as FlashAttention-2's backward
// (Dao, 2023, Algorithm 2) feeds its tensor cores.
void AttentionBackward(const float* qkv, const float* probs, const float* dy, float* dqkv,
                       int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                       bool bf16 = false);

// Rounds host memory x[0, n) (ELEMENTS) to the nearest bf16 (ties to even)
// in place; NaN stays NaN (worker/comm/float16.h). Values stay stored as
// fp32 (a bf16 value is an fp32 with its low 16 bits zero).
void RoundToBFloat16(float* x, int64_t n);

// Vocab-parallel embedding lookup (Megatron-LM's VocabParallelEmbedding):
// this rank holds rows [vocab_begin, vocab_begin + vocab_local) of the word
// table table[vocab_local, width]. y[T, width] = table[token - vocab_begin]
// for tokens in range, else 0 (the tensor-parallel all-reduce sums the
// partial results). Tokens must be in [0, vocab_size) globally.
void EmbeddingForward(const int32_t* tokens, const float* table, float* y, int64_t rows,
                      int64_t width, int64_t vocab_begin, int64_t vocab_local);

// dtable[token - vocab_begin] += dy[t] for tokens in range.
void EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable, int64_t rows,
                       int64_t width, int64_t vocab_begin, int64_t vocab_local);

// y[t, :] += pos_table[t % seq, :] for every row t (rows = batch * seq): adds
// learned position embeddings. dpos[t % seq] += dy[t] in the backward.
void AddPositionForward(const float* pos_table, float* y, int64_t rows, int64_t seq,
                        int64_t width);
void AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                         int64_t width);

// Vocab-parallel cross entropy (Megatron-LM's vocab_parallel_cross_entropy),
// in three parts around the tensor-parallel all-reduces:
//   1. LocalRowMax: row_max[t] = max_j logits[t, j] over this rank's
//      vocab_local columns. (all-reduce MAX over tp)
//   2. LocalSumExpAndTarget: sum_exp[t] = sum_j exp(logits[t, j] - row_max[t])
//      and target_logit[t] = logits[t, target[t] - vocab_begin] if the target
//      is in this rank's range, else 0. (all-reduce SUM of both over tp)
//   3. loss[t] = log(sum_exp[t]) + row_max[t] - target_logit[t]  (TokenLoss)
//   Backward: dlogits[t, j] = scale * (softmax[t, j] - [j == target[t]])
//   with softmax = exp(logits - row_max) / sum_exp, overwritten.
void LocalRowMax(const float* logits, float* row_max, int64_t rows, int64_t vocab_local);
void LocalSumExpAndTarget(const float* logits, const float* row_max, const int32_t* targets,
                          float* sum_exp, float* target_logit, int64_t rows,
                          int64_t vocab_begin, int64_t vocab_local);
void TokenLoss(const float* row_max, const float* sum_exp, const float* target_logit,
               float* loss, int64_t rows);
void CrossEntropyBackward(const float* logits, const float* row_max, const float* sum_exp,
                          const int32_t* targets, float scale, float* dlogits, int64_t rows,
                          int64_t vocab_begin, int64_t vocab_local);

// y[i] += x[i] for i < n (residual connections, gradient accumulation).
void AddInPlace(const float* x, float* y, int64_t n);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_OPS_H_

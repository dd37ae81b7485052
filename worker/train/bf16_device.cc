#include "worker/train/bf16_device.h"

namespace shardline::worker::train {

// const float* name = the pointer `expr` (a StatusOr) holds, or return its
// error.
#define SL_ASSIGN_OR_RETURN(name, expr)                 \
  absl::StatusOr<const float*> name##_or = (expr);      \
  if (!name##_or.ok()) return name##_or.status();       \
  const float* name = *name##_or

absl::StatusOr<const float*> Bf16Device::Rounded(const float* x, int64_t n,
                                                 DeviceBuffer<float>* buf) {
  if (x == nullptr) return nullptr;
  if (buf->size() < n) {
    if (absl::Status s = buf->Resize(inner_, n); !s.ok()) return s;
  }
  if (absl::Status s = inner_.Copy(buf->data(), x, sizeof(float) * static_cast<size_t>(n));
      !s.ok())
    return s;
  if (absl::Status s = inner_.RoundToBFloat16(buf->data(), n); !s.ok()) return s;
  return buf->data();
}

absl::StatusOr<const float*> Bf16Device::Operand(const float* x, int64_t n,
                                                 DeviceBuffer<float>* buf) {
  if (inner_.bf16_products()) return x;
  return Rounded(x, n, buf);
}

absl::Status Bf16Device::Round(absl::Status s, float* y, int64_t n) {
  if (s.ok() && y != nullptr) return inner_.RoundToBFloat16(y, n);
  return s;
}

absl::Status Bf16Device::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float* a, const float* b, float beta, float* c) {
  SL_ASSIGN_OR_RETURN(ra, Rounded(a, m * k, &scratch_a_));
  SL_ASSIGN_OR_RETURN(rb, Rounded(b, k * n, &scratch_b_));
  return Round(inner_.Gemm(trans_a, trans_b, m, n, k, alpha, ra, rb, beta, c), c, m * n);
}

absl::Status Bf16Device::LinearForward(const float* x, const float* w, const float* b, float* y,
                                       int64_t rows, int64_t in, int64_t out) {
  SL_ASSIGN_OR_RETURN(rx, Operand(x, rows * in, &scratch_a_));
  SL_ASSIGN_OR_RETURN(rw, Rounded(w, out * in, &scratch_b_));  // fp32 master weights
  SL_ASSIGN_OR_RETURN(rb, Rounded(b, out, &scratch_c_));  // added to the product, not an operand
  return Round(inner_.LinearForward(rx, rw, rb, y, rows, in, out), y, rows * out);
}

absl::Status Bf16Device::LinearBackward(const float* x, const float* w, const float* dy,
                                        float* dx, float* dw, float* db, int64_t rows, int64_t in,
                                        int64_t out) {
  // dw and db accumulate in fp32 (parameter gradients); dx is an activation
  // gradient.
  // db sums dy directly: dy is an activation gradient, bf16 already.
  SL_ASSIGN_OR_RETURN(rx, Operand(x, rows * in, &scratch_a_));
  SL_ASSIGN_OR_RETURN(rw, Rounded(w, out * in, &scratch_b_));  // fp32 master weights
  SL_ASSIGN_OR_RETURN(rdy, Operand(dy, rows * out, &scratch_c_));
  return Round(inner_.LinearBackward(rx, rw, rdy, dx, dw, db, rows, in, out), dx, rows * in);
}

absl::Status Bf16Device::LayerNormForward(const float* x, const float* gamma, const float* beta,
                                          float* y, float* mean, float* rstd, int64_t rows,
                                          int64_t width) {
  return Round(inner_.LayerNormForward(x, gamma, beta, y, mean, rstd, rows, width), y,
               rows * width);
}

absl::Status Bf16Device::LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                           const float* rstd, const float* dy, float* dx,
                                           float* dgamma, float* dbeta, int64_t rows,
                                           int64_t width) {
  return Round(
      inner_.LayerNormBackward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, width), dx,
      rows * width);
}

absl::Status Bf16Device::GeluForward(const float* x, float* y, int64_t n) {
  return Round(inner_.GeluForward(x, y, n), y, n);
}

absl::Status Bf16Device::GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  return Round(inner_.GeluBackward(x, dy, dx, n), dx, n);
}

absl::Status Bf16Device::AttentionForward(const float* qkv, float* probs, float* y,
                                          int64_t batch, int64_t seq, int64_t heads,
                                          int64_t head_dim, bool /*bf16*/) {
  const int64_t width = heads * head_dim;
  SL_ASSIGN_OR_RETURN(rqkv, Rounded(qkv, batch * seq * 3 * width, &scratch_a_));
  return Round(inner_.AttentionForward(rqkv, probs, y, batch, seq, heads, head_dim,
                                       /*bf16=*/true),
               y, batch * seq * width);
}

absl::Status Bf16Device::AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                           float* dqkv, int64_t batch, int64_t seq,
                                           int64_t heads, int64_t head_dim, bool /*bf16*/) {
  const int64_t width = heads * head_dim;
  SL_ASSIGN_OR_RETURN(rqkv, Rounded(qkv, batch * seq * 3 * width, &scratch_a_));
  SL_ASSIGN_OR_RETURN(rdy, Rounded(dy, batch * seq * width, &scratch_b_));
  return Round(inner_.AttentionBackward(rqkv, probs, rdy, dqkv, batch, seq, heads, head_dim,
                                        /*bf16=*/true),
               dqkv, batch * seq * 3 * width);
}

absl::Status Bf16Device::EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                          int64_t rows, int64_t width, int64_t vocab_begin,
                                          int64_t vocab_local) {
  // A gathered row of the fp32 table rounded = the row of its bf16 copy.
  return Round(inner_.EmbeddingForward(tokens, table, y, rows, width, vocab_begin, vocab_local),
               y, rows * width);
}

absl::Status Bf16Device::EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                           int64_t rows, int64_t width, int64_t vocab_begin,
                                           int64_t vocab_local) {
  return inner_.EmbeddingBackward(tokens, dy, dtable, rows, width, vocab_begin, vocab_local);
}

absl::Status Bf16Device::AddPositionForward(const float* pos_table, float* y, int64_t rows,
                                            int64_t seq, int64_t width) {
  SL_ASSIGN_OR_RETURN(rpos, Rounded(pos_table, seq * width, &scratch_a_));
  return Round(inner_.AddPositionForward(rpos, y, rows, seq, width), y, rows * width);
}

absl::Status Bf16Device::AddPositionBackward(const float* dy, float* dpos, int64_t rows,
                                             int64_t seq, int64_t width) {
  return inner_.AddPositionBackward(dy, dpos, rows, seq, width);
}

absl::Status Bf16Device::LocalRowMax(const float* logits, float* row_max, int64_t rows,
                                     int64_t vocab_local) {
  return inner_.LocalRowMax(logits, row_max, rows, vocab_local);
}

absl::Status Bf16Device::LocalSumExpAndTarget(const float* logits, const float* row_max,
                                              const int32_t* targets, float* sum_exp,
                                              float* target_logit, int64_t rows,
                                              int64_t vocab_begin, int64_t vocab_local) {
  return inner_.LocalSumExpAndTarget(logits, row_max, targets, sum_exp, target_logit, rows,
                                     vocab_begin, vocab_local);
}

absl::Status Bf16Device::TokenLoss(const float* row_max, const float* sum_exp,
                                   const float* target_logit, float* loss, int64_t rows) {
  return inner_.TokenLoss(row_max, sum_exp, target_logit, loss, rows);
}

absl::Status Bf16Device::CrossEntropyBackward(const float* logits, const float* row_max,
                                              const float* sum_exp, const int32_t* targets,
                                              float scale, float* dlogits, int64_t rows,
                                              int64_t vocab_begin, int64_t vocab_local) {
  return Round(inner_.CrossEntropyBackward(logits, row_max, sum_exp, targets, scale, dlogits,
                                           rows, vocab_begin, vocab_local),
               dlogits, rows * vocab_local);
}

absl::Status Bf16Device::AddInPlace(const float* x, float* y, int64_t n) {
  return Round(inner_.AddInPlace(x, y, n), y, n);
}

#undef SL_ASSIGN_OR_RETURN

}  // namespace shardline::worker::train

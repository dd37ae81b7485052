#include "worker/gpu/gpu_ops.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace shardline::worker {

absl::StatusOr<std::unique_ptr<GpuOps>> GpuOps::Create(const GpuPlugin& plugin, int device) {
  const ShardlineGpuTrainApi* api = plugin.train_api();
  if (api == nullptr) {
    return absl::UnavailableError(
        "the GPU plugin has no training math (no shardline_gpu_train_api: a test stand-in?)");
  }
  char error[512] = {0};
  ShardlineGpuTrainCtx* ctx = nullptr;
  const int code = api->train_ctx_create(device, &ctx, error, sizeof(error));
  if (code != SHARDLINE_GPU_OK) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("GPU ops on device ", device, ": ", error));
  }
  void* stream = nullptr;
  if (api->train_stream(ctx, &stream) != SHARDLINE_GPU_OK || stream == nullptr) {
    const std::string why = api->train_last_error(ctx);
    api->train_ctx_destroy(ctx);
    return absl::UnavailableError(
        absl::StrCat("GPU ops on device ", device, ": no stream (train_stream): ", why));
  }
  return std::unique_ptr<GpuOps>(new GpuOps(api, ctx, device, stream));
}

GpuOps::~GpuOps() { api_.train_ctx_destroy(ctx_); }

absl::Status GpuOps::ToStatus(int code, const char* op) const {
  if (code == SHARDLINE_GPU_OK) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("GPU ", op, " on device ", device_, ": ",
                                   api_.train_last_error(ctx_)));
}

absl::StatusOr<void*> GpuOps::AllocBytes(size_t bytes) {
  void* ptr = nullptr;
  absl::Status s = ToStatus(api_.train_alloc(ctx_, bytes, &ptr), "alloc");
  if (!s.ok()) return s;
  return ptr;
}

void GpuOps::Free(void* ptr) { api_.train_free(ctx_, ptr); }

absl::StatusOr<void*> GpuOps::HostAllocBytes(size_t bytes) {
  void* ptr = nullptr;
  absl::Status s = ToStatus(api_.host_alloc(ctx_, bytes, &ptr), "host alloc");
  if (!s.ok()) return s;
  return ptr;
}

void GpuOps::HostFree(void* ptr) { api_.host_free(ctx_, ptr); }

absl::Status GpuOps::CopyToDevice(void* dst, const void* src, size_t bytes) {
  ++host_waits_;
  return ToStatus(api_.train_copy_to_device(ctx_, dst, src, bytes), "copy to device");
}

absl::Status GpuOps::CopyToHost(void* dst, const void* src, size_t bytes) {
  ++host_waits_;
  return ToStatus(api_.train_copy_to_host(ctx_, dst, src, bytes), "copy to host");
}

absl::Status GpuHostCopies::Wait() {
  absl::MutexLock lock(&mu_);
  if (!result_.has_value()) {
    char error[512] = {0};
    const int code = api_.host_copies_wait(copies_, error, sizeof(error));
    result_ = code == SHARDLINE_GPU_OK
                  ? absl::OkStatus()
                  : absl::Status(static_cast<absl::StatusCode>(code), error);
  }
  return *result_;
}

absl::Status GpuOps::CopyToHostAsync(void* dst, const void* src, size_t bytes) {
  return ToStatus(api_.copy_to_host_async(ctx_, dst, src, bytes), "copy to host (copy stream)");
}

absl::StatusOr<std::shared_ptr<GpuHostCopies>> GpuOps::RecordHostCopies() {
  ShardlineGpuHostCopies* copies = nullptr;
  absl::Status s = ToStatus(api_.host_copies_record(ctx_, &copies), "record of copies to host");
  if (!s.ok()) return s;
  return std::make_shared<GpuHostCopies>(api_, copies);
}

absl::Status GpuOps::OrderAfterHostCopies() {
  return ToStatus(api_.order_after_host_copies(ctx_), "order after copies to host");
}

absl::Status GpuOps::Zero(void* ptr, size_t bytes) {
  return ToStatus(api_.train_zero(ctx_, ptr, bytes), "zero");
}

absl::Status GpuOps::Synchronize() {
  ++synchronizations_;
  ++host_waits_;
  return ToStatus(api_.train_synchronize(ctx_), "synchronize");
}

absl::Status GpuOps::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          float alpha, const float* a, const float* b, float beta, float* c) {
  return ToStatus(api_.gemm(ctx_, trans_a ? 1 : 0, trans_b ? 1 : 0, m, n, k, alpha, a, b, beta, c),
                  "gemm");
}

absl::Status GpuOps::LinearForward(const float* x, const float* w, const float* b, float* y,
                                   int64_t rows, int64_t in, int64_t out) {
  return ToStatus(api_.linear_forward(ctx_, x, w, b, y, rows, in, out), "linear_forward");
}

absl::Status GpuOps::LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                                    float* dw, float* db, int64_t rows, int64_t in,
                                    int64_t out) {
  return ToStatus(api_.linear_backward(ctx_, x, w, dy, dx, dw, db, rows, in, out),
                  "linear_backward");
}

absl::Status GpuOps::LayerNormForward(const float* x, const float* gamma, const float* beta,
                                      float* y, float* mean, float* rstd, int64_t rows,
                                      int64_t width) {
  return ToStatus(api_.layer_norm_forward(ctx_, x, gamma, beta, y, mean, rstd, rows, width),
                  "layer_norm_forward");
}

absl::Status GpuOps::LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                       const float* rstd, const float* dy, float* dx,
                                       float* dgamma, float* dbeta, int64_t rows,
                                       int64_t width) {
  return ToStatus(
      api_.layer_norm_backward(ctx_, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, width),
      "layer_norm_backward");
}

absl::Status GpuOps::GeluForward(const float* x, float* y, int64_t n) {
  return ToStatus(api_.gelu_forward(ctx_, x, y, n), "gelu_forward");
}

absl::Status GpuOps::GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  return ToStatus(api_.gelu_backward(ctx_, x, dy, dx, n), "gelu_backward");
}

absl::Status GpuOps::BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                                     int64_t width, bool bf16) {
  return ToStatus(api_.bias_gelu_forward(ctx_, x, b, y, rows, width, bf16 ? 1 : 0),
                  "bias_gelu_forward");
}

absl::Status GpuOps::BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx,
                                      int64_t rows, int64_t width, bool bf16) {
  return ToStatus(api_.bias_gelu_backward(ctx_, x, b, dy, dx, rows, width, bf16 ? 1 : 0),
                  "bias_gelu_backward");
}

absl::Status GpuOps::AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                      int64_t seq, int64_t heads, int64_t head_dim, bool bf16) {
  return ToStatus(
      api_.attention_forward(ctx_, qkv, probs, y, batch, seq, heads, head_dim, bf16 ? 1 : 0),
      "attention_forward");
}

absl::Status GpuOps::AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                       float* dqkv, int64_t batch, int64_t seq, int64_t heads,
                                       int64_t head_dim, bool bf16) {
  return ToStatus(api_.attention_backward(ctx_, qkv, probs, dy, dqkv, batch, seq, heads,
                                          head_dim, bf16 ? 1 : 0),
                  "attention_backward");
}

absl::Status GpuOps::EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                      int64_t rows, int64_t width, int64_t vocab_begin,
                                      int64_t vocab_local) {
  return ToStatus(
      api_.embedding_forward(ctx_, tokens, table, y, rows, width, vocab_begin, vocab_local),
      "embedding_forward");
}

absl::Status GpuOps::EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                       int64_t rows, int64_t width, int64_t vocab_begin,
                                       int64_t vocab_local) {
  return ToStatus(
      api_.embedding_backward(ctx_, tokens, dy, dtable, rows, width, vocab_begin, vocab_local),
      "embedding_backward");
}

absl::Status GpuOps::AddPositionForward(const float* pos_table, float* y, int64_t rows,
                                        int64_t seq, int64_t width) {
  return ToStatus(api_.add_position_forward(ctx_, pos_table, y, rows, seq, width),
                  "add_position_forward");
}

absl::Status GpuOps::AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                                         int64_t width) {
  return ToStatus(api_.add_position_backward(ctx_, dy, dpos, rows, seq, width),
                  "add_position_backward");
}

absl::Status GpuOps::LocalRowMax(const float* logits, float* row_max, int64_t rows,
                                 int64_t vocab_local) {
  return ToStatus(api_.local_row_max(ctx_, logits, row_max, rows, vocab_local), "local_row_max");
}

absl::Status GpuOps::LocalSumExpAndTarget(const float* logits, const float* row_max,
                                          const int32_t* targets, float* sum_exp,
                                          float* target_logit, int64_t rows, int64_t vocab_begin,
                                          int64_t vocab_local) {
  return ToStatus(api_.local_sum_exp_and_target(ctx_, logits, row_max, targets, sum_exp,
                                                target_logit, rows, vocab_begin, vocab_local),
                  "local_sum_exp_and_target");
}

absl::Status GpuOps::TokenLoss(const float* row_max, const float* sum_exp,
                               const float* target_logit, float* loss, int64_t rows) {
  return ToStatus(api_.token_loss(ctx_, row_max, sum_exp, target_logit, loss, rows),
                  "token_loss");
}

absl::Status GpuOps::CrossEntropyBackward(const float* logits, const float* row_max,
                                          const float* sum_exp, const int32_t* targets,
                                          float scale, float* dlogits, int64_t rows,
                                          int64_t vocab_begin, int64_t vocab_local) {
  return ToStatus(api_.cross_entropy_backward(ctx_, logits, row_max, sum_exp, targets, scale,
                                              dlogits, rows, vocab_begin, vocab_local),
                  "cross_entropy_backward");
}

absl::Status GpuOps::AddInPlace(const float* x, float* y, int64_t n) {
  return ToStatus(api_.add_in_place(ctx_, x, y, n), "add_in_place");
}

absl::Status GpuOps::Copy(void* dst, const void* src, size_t bytes) {
  return ToStatus(api_.copy_device(ctx_, dst, src, bytes), "copy_device");
}

absl::Status GpuOps::SetBf16Products(bool on) {
  return ToStatus(api_.set_bf16_products(ctx_, on ? 1 : 0), "set_bf16_products");
}

absl::Status GpuOps::RoundToBFloat16(float* x, int64_t n) {
  return ToStatus(api_.round_bf16(ctx_, x, n), "round_bf16");
}

absl::Status GpuOps::Scale(float* x, float alpha, int64_t n) {
  return ToStatus(api_.scale(ctx_, x, alpha, n), "scale");
}

absl::Status GpuOps::AdamWStep(const ShardlineAdamWScalars& scalars, float* param,
                               const float* grad, float* exp_avg, float* exp_avg_sq,
                               const uint8_t* decay_mask, int64_t n) {
  return ToStatus(
      api_.adamw_step(ctx_, &scalars, param, grad, exp_avg, exp_avg_sq, decay_mask, n),
      "adamw_step");
}

absl::Status GpuOps::AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask, int64_t n,
                                                  double* sum) {
  ++host_waits_;
  return ToStatus(api_.masked_sum_squares(ctx_, x, mask, n, sum), "masked_sum_squares");
}

absl::Status GpuOps::AccumulateMaskedSumsOfSquares(int64_t pieces, const float* const* x,
                                                   const uint8_t* const* mask, const int64_t* n,
                                                   double* sum) {
  ++host_waits_;
  return ToStatus(api_.masked_sum_squares_many(ctx_, pieces, x, mask, n, sum),
                  "masked_sum_squares_many");
}

}  // namespace shardline::worker

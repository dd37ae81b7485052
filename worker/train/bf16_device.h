// bf16 mixed precision: a Device (device.h) that runs every call on another
// one (the CPU or a GPU) and rounds to bfloat16 where a bf16 model holds
// bf16 values, so a run of `training.precision: bf16` has the same numbers
// on every device (the same roundings, fp32 accumulation inside each
// kernel). The rounding runs on the wrapped device (its RoundToBFloat16);
// the dense products are its own on bf16-exact inputs, on bf16 hardware
// where it has some (Device::SetBf16Products: a GPU's tensor cores).
//
//   Bf16Device bf16(*CpuDevice::Default());
//   options.device = &bf16;  // the trainer does this for precision bf16
//
// The rules (those of Megatron-LM's bf16 training and of torch autocast):
//   * Matrix products (Gemm, LinearForward, LinearBackward) read bf16
//     inputs: the weights' fp32 master values, the biases, activations and
//     activation gradients are rounded to bf16 before the product; the
//     product accumulates in fp32 (as cuBLAS does with CUBLAS_COMPUTE_32F).
//     Attention is one call: bf16 q, k, v (and dy) in, bf16 y (and dqkv)
//     out; inside, the wrapped device's bf16 attention (ops.h): scores and
//     softmax in fp32, the probabilities rounded to bf16 (kept so for
//     backward, as Megatron-LM keeps its bf16 softmax output), the score
//     gradients rounded to bf16 before their products, so that every
//     product reads bf16 operands (on a GPU, the tensor cores).
//   * Activations and activation gradients are bf16: every output that is
//     one (LinearForward's y, LayerNorm's y and dx, GELU's y and dx,
//     attention's y and dqkv, the embedding's y, residual sums of AddInPlace
//     and bias/position additions, the cross entropy's dlogits) is rounded
//     to bf16 after the kernel computed it in fp32.
//   * fp32 stays fp32: LayerNorm's statistics, the attention scores and
//     the softmax's arithmetic, the loss and its
//     row statistics (LocalRowMax, LocalSumExpAndTarget, TokenLoss), and
//     every PARAMETER gradient (dw, db, dgamma, dbeta, the embedding tables'
//     gradients), which accumulate in fp32 over micro-batches from bf16
//     inputs (Megatron's fp32 main_grad with gradient accumulation fusion).
//     The trainer reduces them over dp in fp32, and keeps fp32 master
//     weights and AdamW moments (trainer.h).
// Rounding is round-to-nearest-even (worker/comm/float16.h); values stay
// stored as fp32 (a bf16 value is an fp32 with its low 16 bits zero).
//
// Memory: the rounded copies of inputs are scratch buffers of the wrapped
// device that grow to the largest input seen (weights included) and are
// kept for this object's life. On a device whose products read bf16
// operands (bf16_products(): a GPU's tensor cores) the activations and
// activation gradients, bf16 already, go in as they are (no copies of the
// large operands); the weights and biases are still rounded copies. Errors: the wrapped device's (device.h).
// Thread-safety: one thread at a time (the scratch is this object's); the
// wrapped device must outlive this.
#ifndef SHARDLINE_WORKER_TRAIN_BF16_DEVICE_H_
#define SHARDLINE_WORKER_TRAIN_BF16_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/train/device.h"

namespace shardline::worker::train {

class Bf16Device final : public Device {
 public:
  // `inner`: not owned.
  explicit Bf16Device(Device& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name() + " (bf16)"; }
  bool host_memory() const override { return inner_.host_memory(); }
  absl::StatusOr<void*> AllocBytes(size_t bytes) override { return inner_.AllocBytes(bytes); }
  void Free(void* ptr) override { inner_.Free(ptr); }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return inner_.CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return inner_.CopyToHost(dst, src, bytes);
  }
  absl::Status Zero(void* ptr, size_t bytes) override { return inner_.Zero(ptr, bytes); }
  absl::Status Synchronize() override { return inner_.Synchronize(); }
  void* cuda_stream() override { return inner_.cuda_stream(); }
  // Host memory for copies (pinned on a GPU) and the copies beside the math
  // are the inner device's.
  absl::StatusOr<void*> AllocHostBytes(size_t bytes) override {
    return inner_.AllocHostBytes(bytes);
  }
  void FreeHost(void* ptr) override { inner_.FreeHost(ptr); }
  absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes) override {
    return inner_.CopyToHostAsync(dst, src, bytes);
  }
  absl::StatusOr<std::shared_ptr<HostCopies>> RecordHostCopies() override {
    return inner_.RecordHostCopies();
  }
  absl::Status OrderAfterHostCopies() override { return inner_.OrderAfterHostCopies(); }
  void ReleaseCachedMemory() override { inner_.ReleaseCachedMemory(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c) override;
  absl::Status LinearForward(const float* x, const float* w, const float* b, float* y,
                             int64_t rows, int64_t in, int64_t out) override;
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, int64_t rows, int64_t in,
                              int64_t out) override;
  absl::Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                float* mean, float* rstd, int64_t rows, int64_t width) override;
  absl::Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t width) override;
  absl::Status GeluForward(const float* x, float* y, int64_t n) override;
  absl::Status GeluBackward(const float* x, const float* dy, float* dx, int64_t n) override;
  // The wrapped device's, rounding inside (pre, y and dx), whatever `bf16`
  // says; b (a parameter, fp32) is added unrounded.
  absl::Status BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                               int64_t width, bool bf16) override {
    return inner_.BiasGeluForward(x, b, y, rows, width, /*bf16=*/true);
  }
  absl::Status BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx,
                                int64_t rows, int64_t width, bool bf16) override {
    return inner_.BiasGeluBackward(x, b, dy, dx, rows, width, /*bf16=*/true);
  }
  // The wrapped device's bf16 attention, whatever `bf16` says.
  absl::Status AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim, bool bf16) override;
  absl::Status AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                 float* dqkv, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t head_dim, bool bf16) override;
  absl::Status EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                int64_t rows, int64_t width, int64_t vocab_begin,
                                int64_t vocab_local) override;
  absl::Status EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                 int64_t rows, int64_t width, int64_t vocab_begin,
                                 int64_t vocab_local) override;
  absl::Status AddPositionForward(const float* pos_table, float* y, int64_t rows, int64_t seq,
                                  int64_t width) override;
  absl::Status AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                                   int64_t width) override;
  absl::Status LocalRowMax(const float* logits, float* row_max, int64_t rows,
                           int64_t vocab_local) override;
  absl::Status LocalSumExpAndTarget(const float* logits, const float* row_max,
                                    const int32_t* targets, float* sum_exp, float* target_logit,
                                    int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local) override;
  absl::Status TokenLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                         float* loss, int64_t rows) override;
  absl::Status CrossEntropyBackward(const float* logits, const float* row_max,
                                    const float* sum_exp, const int32_t* targets, float scale,
                                    float* dlogits, int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local) override;
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override;
  // The optimizer's state is fp32 (master weights, gradients, moments): these
  // are the inner device's, unrounded.
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    return inner_.Copy(dst, src, bytes);
  }
  absl::Status Scale(float* x, float alpha, int64_t n) override {
    return inner_.Scale(x, alpha, n);
  }
  absl::Status AdamWStep(const AdamWConfig& config, float lr, int64_t t, float* param,
                         const float* grad, float* exp_avg, float* exp_avg_sq,
                         const uint8_t* decay_mask, int64_t n) override {
    return inner_.AdamWStep(config, lr, t, param, grad, exp_avg, exp_avg_sq, decay_mask, n);
  }
  absl::Status AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask, int64_t n,
                                            double* sum) override {
    return inner_.AccumulateMaskedSumOfSquares(x, mask, n, sum);
  }
  absl::Status AccumulateMaskedSumsOfSquares(const std::vector<MaskedPiece>& pieces,
                                             double* sum) override {
    return inner_.AccumulateMaskedSumsOfSquares(pieces, sum);
  }

  absl::Status SetBf16Products(bool on) override { return inner_.SetBf16Products(on); }
  bool bf16_products() const override { return inner_.bf16_products(); }
  // Rounding is idempotent: the inner device's.
  absl::Status RoundToBFloat16(float* x, int64_t n) override {
    return inner_.RoundToBFloat16(x, n);
  }

 private:
  // x rounded to bf16 in *buf (grown as needed), a buffer of the inner
  // device; null stays null.
  absl::StatusOr<const float*> Rounded(const float* x, int64_t n, DeviceBuffer<float>* buf);
  // The same for an activation or activation-gradient operand of a dense
  // product (bf16-exact already: every such value is an output this device
  // rounded, or a message or sum of them that was) when the device has
  // bf16_products(): then x as it is, no copy. Weights and biases (fp32
  // master values) always go through Rounded, so the numbers never depend on
  // how the device converts its operands.
  absl::StatusOr<const float*> Operand(const float* x, int64_t n, DeviceBuffer<float>* buf);
  // y[0, n) rounded in place after the call that wrote it succeeded.
  absl::Status Round(absl::Status s, float* y, int64_t n);

  Device& inner_;
  DeviceBuffer<float> scratch_a_, scratch_b_, scratch_c_;
};

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_BF16_DEVICE_H_

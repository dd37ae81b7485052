// The trainer's compute device (worker/train/device.h) on one NVIDIA GPU:
// an adapter over GpuOps (cuBLAS and the plugin's CUDA kernels, loaded at
// run time through the GPU plugin), so the trainer runs its layers on the GPU
// while its optimizer and communication stay on the host (trainer.h).
//
//   absl::StatusOr<GpuPlugin> plugin = GpuPlugin::Load(GpuPlugin::DefaultPath());
//   absl::StatusOr<std::unique_ptr<GpuComputeDevice>> gpu =
//       GpuComputeDevice::Create(*plugin, /*device=*/0);
//   if (!gpu.ok()) { /* Unavailable: no GPU; train on CpuDevice */ }
//   options.device = gpu->get();   // one GpuComputeDevice per rank
//
// Memory: host_memory() is false: the trainer keeps its state here when its
// backends take device memory (NCCL) or it has none, else on the host with
// copies (trainer.h "Where the state lives"). A freed block is kept and
// handed to the next allocation of the same size (train::BlockPool: the
// shapes of a step repeat, so after the first step nothing reaches
// cudaMalloc/cudaFree, which synchronise the device); blocks are reused in
// the order of this device's one stream. When cudaMalloc runs out of memory
// the idle blocks are freed and it is tried once more.
// Errors: GpuOps' (gpu_ops.h): InvalidArgument, ResourceExhausted,
// Unavailable, the message naming the CUDA/cuBLAS call and the device.
// Results match the CPU device within fp32 tolerance (cuBLAS vs OpenBLAS
// summation order; atomics in EmbeddingBackward), not bit for bit.
//
// Thread-compatible: one thread at a time (GpuOps owns one stream and one
// cuBLAS handle); ranks that run as threads each create their own. Must not
// outlive the GpuPlugin's library (never unloaded).
#ifndef SHARDLINE_WORKER_GPU_GPU_COMPUTE_DEVICE_H_
#define SHARDLINE_WORKER_GPU_GPU_COMPUTE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/gpu/gpu_ops.h"
#include "worker/gpu/gpu_plugin.h"
#include "worker/train/device.h"

namespace shardline::worker {

class GpuComputeDevice final : public train::Device {
 public:
  // A device on CUDA device ordinal `device` of `plugin`. Errors (GpuOps::Create):
  //   Unavailable: no usable GPU or driver, or a plugin without training
  //     math (the message names the CUDA error); train on CpuDevice.
  //   InvalidArgument: no device with that ordinal.
  static absl::StatusOr<std::unique_ptr<GpuComputeDevice>> Create(const GpuPlugin& plugin,
                                                                   int device);

  // Loads the plugin at `plugin_path` (when empty: GpuPlugin::DefaultPath(),
  // next to the executable, else the executable's Bazel runfiles copy) and
  // creates a device on `device_name`, "cuda:N" or "cuda" (= "cuda:0").
  // Errors: InvalidArgument for another name; GpuPlugin::Load's (Unavailable:
  // the plugin or its CUDA libraries are missing; FailedPrecondition: the
  // plugin speaks another ABI version); Create's.
  static absl::StatusOr<std::unique_ptr<GpuComputeDevice>> FromName(
      const std::string& device_name, const std::string& plugin_path = "");
  // The CUDA ordinal of "cuda:N" (N) or "cuda" (0); InvalidArgument for any
  // other name. FromName's parsing, without loading anything.
  static absl::StatusOr<int> Ordinal(const std::string& device_name);

  std::string name() const override;
  bool host_memory() const override { return false; }
  GpuOps& ops() { return *ops_; }

  ~GpuComputeDevice() override;

  absl::StatusOr<void*> AllocBytes(size_t bytes) override;
  void Free(void* ptr) override;
  // Page-locked (cudaHostAlloc): the checkpoint copies' memory.
  absl::StatusOr<void*> AllocHostBytes(size_t bytes) override {
    return ops_->HostAllocBytes(bytes);
  }
  void FreeHost(void* ptr) override { ops_->HostFree(ptr); }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return ops_->CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return ops_->CopyToHost(dst, src, bytes);
  }
  absl::Status Zero(void* ptr, size_t bytes) override { return ops_->Zero(ptr, bytes); }
  absl::Status Synchronize() override { return ops_->Synchronize(); }
  void* cuda_stream() override { return ops_->stream(); }
  // On the context's copy stream, beside the math (gpu_ops.h).
  absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes) override {
    return ops_->CopyToHostAsync(dst, src, bytes);
  }
  absl::StatusOr<std::shared_ptr<train::HostCopies>> RecordHostCopies() override;
  absl::Status OrderAfterHostCopies() override { return ops_->OrderAfterHostCopies(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c) override {
    return ops_->Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
  absl::Status LinearForward(const float* x, const float* w, const float* b, float* y,
                             int64_t rows, int64_t in, int64_t out) override {
    return ops_->LinearForward(x, w, b, y, rows, in, out);
  }
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, int64_t rows, int64_t in,
                              int64_t out) override {
    return ops_->LinearBackward(x, w, dy, dx, dw, db, rows, in, out);
  }
  absl::Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                float* mean, float* rstd, int64_t rows, int64_t width) override {
    return ops_->LayerNormForward(x, gamma, beta, y, mean, rstd, rows, width);
  }
  absl::Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t width) override {
    return ops_->LayerNormBackward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, width);
  }
  absl::Status GeluForward(const float* x, float* y, int64_t n) override {
    return ops_->GeluForward(x, y, n);
  }
  absl::Status GeluBackward(const float* x, const float* dy, float* dx, int64_t n) override {
    return ops_->GeluBackward(x, dy, dx, n);
  }
  absl::Status BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                               int64_t width, bool bf16) override {
    return ops_->BiasGeluForward(x, b, y, rows, width, bf16);
  }
  absl::Status BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx,
                                int64_t rows, int64_t width, bool bf16) override {
    return ops_->BiasGeluBackward(x, b, dy, dx, rows, width, bf16);
  }
  absl::Status AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim, bool bf16) override {
    return ops_->AttentionForward(qkv, probs, y, batch, seq, heads, head_dim, bf16);
  }
  absl::Status AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                 float* dqkv, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t head_dim, bool bf16) override {
    return ops_->AttentionBackward(qkv, probs, dy, dqkv, batch, seq, heads, head_dim, bf16);
  }
  absl::Status EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                int64_t rows, int64_t width, int64_t vocab_begin,
                                int64_t vocab_local) override {
    return ops_->EmbeddingForward(tokens, table, y, rows, width, vocab_begin, vocab_local);
  }
  absl::Status EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                 int64_t rows, int64_t width, int64_t vocab_begin,
                                 int64_t vocab_local) override {
    return ops_->EmbeddingBackward(tokens, dy, dtable, rows, width, vocab_begin, vocab_local);
  }
  absl::Status AddPositionForward(const float* pos_table, float* y, int64_t rows, int64_t seq,
                                  int64_t width) override {
    return ops_->AddPositionForward(pos_table, y, rows, seq, width);
  }
  absl::Status AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                                   int64_t width) override {
    return ops_->AddPositionBackward(dy, dpos, rows, seq, width);
  }
  absl::Status LocalRowMax(const float* logits, float* row_max, int64_t rows,
                           int64_t vocab_local) override {
    return ops_->LocalRowMax(logits, row_max, rows, vocab_local);
  }
  absl::Status LocalSumExpAndTarget(const float* logits, const float* row_max,
                                    const int32_t* targets, float* sum_exp, float* target_logit,
                                    int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local) override {
    return ops_->LocalSumExpAndTarget(logits, row_max, targets, sum_exp, target_logit, rows,
                                      vocab_begin, vocab_local);
  }
  absl::Status TokenLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                         float* loss, int64_t rows) override {
    return ops_->TokenLoss(row_max, sum_exp, target_logit, loss, rows);
  }
  absl::Status CrossEntropyBackward(const float* logits, const float* row_max,
                                    const float* sum_exp, const int32_t* targets, float scale,
                                    float* dlogits, int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local) override {
    return ops_->CrossEntropyBackward(logits, row_max, sum_exp, targets, scale, dlogits, rows,
                                      vocab_begin, vocab_local);
  }
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override {
    return ops_->AddInPlace(x, y, n);
  }
  absl::Status RoundToBFloat16(float* x, int64_t n) override {
    return ops_->RoundToBFloat16(x, n);
  }
  // bf16 tensor-core products (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF).
  absl::Status SetBf16Products(bool on) override {
    absl::Status s = ops_->SetBf16Products(on);
    if (s.ok()) bf16_products_ = on;
    return s;
  }
  bool bf16_products() const override { return bf16_products_; }
  void ReleaseCachedMemory() override;
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    return ops_->Copy(dst, src, bytes);
  }
  absl::Status Scale(float* x, float alpha, int64_t n) override {
    return ops_->Scale(x, alpha, n);
  }
  absl::Status AdamWStep(const train::AdamWConfig& config, float lr, int64_t t, float* param,
                         const float* grad, float* exp_avg, float* exp_avg_sq,
                         const uint8_t* decay_mask, int64_t n) override;
  absl::Status AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask, int64_t n,
                                            double* sum) override {
    return ops_->AccumulateMaskedSumOfSquares(x, mask, n, sum);
  }
  // One read-back for all pieces (plugin_abi.h masked_sum_squares_many).
  absl::Status AccumulateMaskedSumsOfSquares(const std::vector<MaskedPiece>& pieces,
                                             double* sum) override;

 private:
  explicit GpuComputeDevice(std::unique_ptr<GpuOps> ops)
      : ops_(std::move(ops)), pool_(SIZE_MAX, 0) {}
  std::unique_ptr<GpuOps> ops_;
  bool bf16_products_ = false;  // SetBf16Products
  // Freed blocks for reuse (every size, no cap: when cudaMalloc runs out,
  // the idle blocks are freed and it is tried once more).
  train::BlockPool pool_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GPU_GPU_COMPUTE_DEVICE_H_

// The trainer's fp32 math (worker/train/ops.h) on one GPU, through the GPU
// plugin's training table (plugin_abi.h's ShardlineGpuTrainApi: cuBLAS plus
// the plugin's CUDA kernels). Same functions, same contracts (parameter
// gradients accumulate, activation gradients are overwritten), but every
// float/int32 pointer is a DEVICE pointer on this object's device.
//
//   absl::StatusOr<GpuPlugin> plugin = GpuPlugin::Load(GpuPlugin::DefaultPath());
//   absl::StatusOr<std::unique_ptr<GpuOps>> ops = GpuOps::Create(*plugin, /*device=*/0);
//   if (absl::IsUnavailable(ops.status())) { /* no GPU: use the CPU ops */ }
//   float* x = *(*ops)->Alloc<float>(n);
//   (*ops)->CopyToDevice(x, host.data(), n * sizeof(float));
//   (*ops)->GeluForward(x, x, n);
//   (*ops)->CopyToHost(host.data(), x, n * sizeof(float));  // waits for the GELU
//
// Ordering: every op is enqueued on this object's one CUDA stream and returns
// once enqueued, so ops run in call order; CopyToHost and Synchronize wait.
// A returned error is a launch error (or a bad argument); an error while a
// kernel runs is returned by the next CopyToHost/CopyToDevice/Synchronize.
// Every error's message names the CUDA/cuBLAS call. Codes: InvalidArgument
// (negative size, a product too large for cuBLAS's int32 dimensions),
// ResourceExhausted (out of device memory), Unavailable (CUDA or cuBLAS
// failed: the device is unusable).
//
// Thread-compatible: one thread at a time (the stream and cuBLAS handle are
// not shared safely); use one GpuOps per thread. Must not outlive the
// GpuPlugin's library (which is never unloaded).
#ifndef SHARDLINE_WORKER_GPU_GPU_OPS_H_
#define SHARDLINE_WORKER_GPU_GPU_OPS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/gpu/gpu_plugin.h"
#include "worker/gpu/plugin_abi.h"

namespace shardline::worker {

// GpuOps::RecordHostCopies' handle (plugin_abi.h host_copies_record).
// Thread-safe; may outlive the GpuOps that made it.
class GpuHostCopies {
 public:
  GpuHostCopies(const ShardlineGpuTrainApi& api, ShardlineGpuHostCopies* copies)
      : api_(api), copies_(copies) {}
  ~GpuHostCopies() { api_.host_copies_destroy(copies_); }
  GpuHostCopies(const GpuHostCopies&) = delete;
  GpuHostCopies& operator=(const GpuHostCopies&) = delete;
  // Blocks until the recorded copies are done (cudaEventSynchronize); the
  // first result is kept and returned by every later call. Errors:
  // Unavailable (the device failed; the CUDA error is named).
  absl::Status Wait() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const ShardlineGpuTrainApi& api_;
  ShardlineGpuHostCopies* const copies_;
  absl::Mutex mu_;
  std::optional<absl::Status> result_ ABSL_GUARDED_BY(mu_);
};

class GpuOps {
 public:
  // Creates a stream and a cuBLAS handle on CUDA device `device`. Errors:
  //   Unavailable: the plugin has no training table (the fake plugin), or
  //     there is no usable GPU (the CUDA error is named); use the CPU ops.
  //   InvalidArgument: no device with that ordinal.
  static absl::StatusOr<std::unique_ptr<GpuOps>> Create(const GpuPlugin& plugin, int device);

  ~GpuOps();  // waits for the stream, then frees the stream and handle
  GpuOps(const GpuOps&) = delete;
  GpuOps& operator=(const GpuOps&) = delete;

  int device() const { return device_; }

  // Device memory (cudaMalloc: synchronous). Free(nullptr) is a no-op.
  absl::StatusOr<void*> AllocBytes(size_t bytes);
  template <typename T>
  absl::StatusOr<T*> Alloc(int64_t count) {
    absl::StatusOr<void*> p = AllocBytes(static_cast<size_t>(count) * sizeof(T));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  void Free(void* ptr);
  // Page-locked host memory (cudaHostAlloc; the plugin's host_alloc).
  // HostFree(nullptr) is a no-op. Errors: ResourceExhausted, Unavailable.
  absl::StatusOr<void*> HostAllocBytes(size_t bytes);
  void HostFree(void* ptr);
  // Copies wait for earlier ops and for the copy itself.
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
  absl::Status Zero(void* ptr, size_t bytes);  // enqueued
  absl::Status Synchronize();
  // Calls so far that made the host wait for the stream (tests count them
  // per step): Synchronize alone, and every waiting call (Synchronize,
  // CopyToDevice, CopyToHost, AccumulateMaskedSumOfSquares).
  int64_t synchronizations() const { return synchronizations_; }
  int64_t host_waits() const { return host_waits_; }
  // The context's CUDA stream (cudaStream_t; plugin_abi.h train_stream),
  // every op's, for ordering a communicator's stream against it. Never null.
  void* stream() const { return stream_; }
  // Device -> host copies on a copy stream beside the math
  // (worker/train/device.h CopyToHostAsync, RecordHostCopies,
  // OrderAfterHostCopies; plugin_abi.h copy_to_host_async ...).
  absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes);
  absl::StatusOr<std::shared_ptr<GpuHostCopies>> RecordHostCopies();
  absl::Status OrderAfterHostCopies();

  // worker/train/ops.h, on device pointers.
  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c);
  absl::Status LinearForward(const float* x, const float* w, const float* b, float* y,
                             int64_t rows, int64_t in, int64_t out);
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, int64_t rows, int64_t in, int64_t out);
  absl::Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                float* mean, float* rstd, int64_t rows, int64_t width);
  absl::Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t width);
  absl::Status GeluForward(const float* x, float* y, int64_t n);
  absl::Status GeluBackward(const float* x, const float* dy, float* dx, int64_t n);
  absl::Status BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                               int64_t width, bool bf16);
  absl::Status BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx,
                                int64_t rows, int64_t width, bool bf16);
  absl::Status AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim, bool bf16);
  // Uses a scratch buffer of batch*heads*seq*seq floats owned by this object
  // (grown on demand, which synchronises the device once).
  absl::Status AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                 float* dqkv, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t head_dim, bool bf16);
  absl::Status EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                int64_t rows, int64_t width, int64_t vocab_begin,
                                int64_t vocab_local);
  // Scatter-adds with atomics: not bit-deterministic when tokens repeat.
  absl::Status EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                 int64_t rows, int64_t width, int64_t vocab_begin,
                                 int64_t vocab_local);
  absl::Status AddPositionForward(const float* pos_table, float* y, int64_t rows, int64_t seq,
                                  int64_t width);
  absl::Status AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                                   int64_t width);
  absl::Status LocalRowMax(const float* logits, float* row_max, int64_t rows,
                           int64_t vocab_local);
  absl::Status LocalSumExpAndTarget(const float* logits, const float* row_max,
                                    const int32_t* targets, float* sum_exp, float* target_logit,
                                    int64_t rows, int64_t vocab_begin, int64_t vocab_local);
  absl::Status TokenLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                         float* loss, int64_t rows);
  absl::Status CrossEntropyBackward(const float* logits, const float* row_max,
                                    const float* sum_exp, const int32_t* targets, float scale,
                                    float* dlogits, int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local);
  absl::Status AddInPlace(const float* x, float* y, int64_t n);

  // The optimizer's state (plugin_abi.h; worker/train/device.h's functions
  // of the same names): device-to-device copy (bytes), x *= alpha, AdamW
  // with its per-step constants, and *sum (host) += the masked sum of
  // squares (waits for the stream).
  absl::Status Copy(void* dst, const void* src, size_t bytes);
  absl::Status RoundToBFloat16(float* x, int64_t n);
  // plugin_abi.h set_bf16_products.
  absl::Status SetBf16Products(bool on);
  absl::Status Scale(float* x, float alpha, int64_t n);
  absl::Status AdamWStep(const ShardlineAdamWScalars& scalars, float* param, const float* grad,
                         float* exp_avg, float* exp_avg_sq, const uint8_t* decay_mask, int64_t n);
  absl::Status AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask, int64_t n,
                                            double* sum);
  // The same over `pieces` pieces (arrays of HOST memory, buffers on the
  // device), one wait for the stream (plugin_abi.h masked_sum_squares_many).
  absl::Status AccumulateMaskedSumsOfSquares(int64_t pieces, const float* const* x,
                                             const uint8_t* const* mask, const int64_t* n,
                                             double* sum);

 private:
  GpuOps(const ShardlineGpuTrainApi* api, ShardlineGpuTrainCtx* ctx, int device, void* stream)
      : api_(*api), ctx_(ctx), device_(device), stream_(stream) {}
  // Plugin code -> absl::Status, with `op` and the context's message.
  absl::Status ToStatus(int code, const char* op) const;

  const ShardlineGpuTrainApi& api_;  // static storage in the plugin
  ShardlineGpuTrainCtx* const ctx_;  // owned; train_ctx_destroy in ~GpuOps
  const int device_;
  void* const stream_;  // ctx_'s
  int64_t synchronizations_ = 0;
  int64_t host_waits_ = 0;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GPU_GPU_OPS_H_

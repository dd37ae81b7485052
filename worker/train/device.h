// The compute device the trainer's math runs on: the functions of ops.h plus
// memory management, behind one interface, so the model (model.h) runs
// unchanged on the CPU (CpuDevice, here) or on a GPU (worker/gpu's
// GpuComputeDevice, over the GPU plugin's cuBLAS and CUDA kernels).
//
//   Device& device = *CpuDevice::Default();
//   DeviceBuffer<float> x;
//   absl::Status s = x.Resize(device, n);                          // n elements
//   if (s.ok()) s = device.CopyToDevice(x.data(), host.data(), n * sizeof(float));
//   if (s.ok()) s = device.GeluForward(x.data(), x.data(), n);
//   if (s.ok()) s = device.CopyToHost(host.data(), x.data(), n * sizeof(float));
//
// Conventions (as ops.h, whose comments give every function's math):
//   * Every float/int32 pointer given to a math function is memory of THIS
//     device (from AllocBytes / DeviceBuffer); sizes of the math functions are
//     ELEMENTS, sizes of the memory functions are BYTES (named `bytes`).
//   * Parameter gradients accumulate (+=), activation gradients and outputs
//     are overwritten.
//   * Ordering: calls on one Device take effect in call order. A GPU device
//     enqueues on one stream and returns once enqueued; CopyToHost,
//     CopyToDevice and Synchronize wait, so host memory passed to a copy may
//     be reused when it returns.
//   * host_memory(): true when device memory IS host memory (CpuDevice). The
//     trainer then computes on its host buffers directly (no copies); else it
//     stages parameters, gradients, pipeline messages and tensor-parallel
//     all-reduces through host memory (trainer.h, model.h).
//
// Errors (every absl::Status below): CpuDevice never fails except
// AllocBytes (ResourceExhausted when the allocation fails). A GPU device
// returns InvalidArgument (a negative size; a product beyond cuBLAS's int32
// dimensions), ResourceExhausted (out of device memory) or Unavailable (CUDA
// or cuBLAS failed: the device is unusable), the message naming the failed
// call; an error raised while a kernel ran is returned by the next
// synchronising call (a copy or Synchronize). After an error, outputs are
// unspecified.
//
// Thread-safety: a Device is used by one thread at a time (a GPU device owns
// one stream and one cuBLAS handle). CpuDevice is stateless and thread-safe:
// CpuDevice::Default() is shared by every rank thread of a process.
#ifndef SHARDLINE_WORKER_TRAIN_DEVICE_H_
#define SHARDLINE_WORKER_TRAIN_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/train/adamw.h"

namespace shardline::worker::train {

// Device::RecordHostCopies' handle: the copies recorded in it are in host
// memory once Wait returns OK.
class HostCopies {
 public:
  virtual ~HostCopies() = default;
  // Blocks until the recorded copies are done; returns the device's error if
  // one failed (Unavailable). Thread-safe, from any thread, any number of
  // times (the same result each time); the device may be in use meanwhile.
  virtual absl::Status Wait() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu", "cuda:0", ...: for messages and logs.
  virtual std::string name() const = 0;
  // Whether this device's memory is host memory (see the file comment).
  virtual bool host_memory() const = 0;

  // --- Memory (sizes in BYTES) ----------------------------------------------
  // `bytes` of device memory, contents unspecified.
  // bytes == 0 may return null. Errors: ResourceExhausted (out of memory),
  // Unavailable (the device failed).
  virtual absl::StatusOr<void*> AllocBytes(size_t bytes) = 0;
  // Frees AllocBytes' memory (waits for the device first where it must).
  // Free(nullptr) is a no-op.
  virtual void Free(void* ptr) = 0;
  // `bytes` of host memory that CopyToDevice and CopyToHost move fastest:
  // page-locked (pinned) on a GPU, so that the copy engine reads and
  // writes it directly; ordinary memory here (the default). bytes == 0 may
  // return null. Errors: ResourceExhausted (out of host memory, or of
  // page-locked memory), Unavailable (the device failed).
  virtual absl::StatusOr<void*> AllocHostBytes(size_t bytes);
  // Frees AllocHostBytes' memory. FreeHost(nullptr) is a no-op.
  virtual void FreeHost(void* ptr);
  // Host -> device and device -> host; wait for earlier calls and for the copy.
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Sets `bytes` of device memory to 0 (all-zero bits: 0.0f, int32 0).
  virtual absl::Status Zero(void* ptr, size_t bytes) = 0;
  // Waits for every earlier call; returns the first error of any.
  virtual absl::Status Synchronize() = 0;
  // The CUDA stream (a cudaStream_t) every call of this device is enqueued
  // on, so that a backend with streams of its own (NCCL) orders its
  // operations against this device's work on the GPU instead of the host
  // waiting for both (worker/train/parallel.h Collectives::OnDevice). Null
  // (the default) where calls do not run on a CUDA stream.
  virtual void* cuda_stream() { return nullptr; }

  // --- Device -> host copies that run beside later calls (checkpoints) -----
  // Enqueues a copy of `bytes` from device memory `src` to host memory `dst`
  // (AllocHostBytes memory), ordered after every earlier call, and returns
  // at once: on a GPU it runs on a copy stream of its own while later calls
  // compute. Until the copies are waited for (HostCopies::Wait on a handle
  // recorded after them), `dst` must not be read; until OrderAfterHostCopies
  // has been called, no later call may write `src`. Default (CpuDevice,
  // and any device without a copy stream): CopyToHost, the copy is done on
  // return. Errors: as CopyToHost.
  virtual absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes);
  // A handle on every CopyToHostAsync enqueued on this device so far, to wait
  // for them from any thread (the checkpoint writer's), while this device
  // goes on with later calls. Default: a handle that is done already.
  // Errors: Unavailable (the device failed).
  virtual absl::StatusOr<std::shared_ptr<HostCopies>> RecordHostCopies();
  // Every call after this one runs after every CopyToHostAsync enqueued so
  // far has read its source (on a GPU the compute stream waits for the copy
  // stream; the host does not wait). The trainer calls it before it writes
  // the state a checkpoint copies. Default: nothing to order.
  virtual absl::Status OrderAfterHostCopies() { return absl::OkStatus(); }

  // --- ops.h on device pointers (sizes in ELEMENTS) --------------------------
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float* a, const float* b, float beta,
                            float* c) = 0;
  virtual absl::Status LinearForward(const float* x, const float* w, const float* b, float* y,
                                     int64_t rows, int64_t in, int64_t out) = 0;
  virtual absl::Status LinearBackward(const float* x, const float* w, const float* dy,
                                      float* dx, float* dw, float* db, int64_t rows,
                                      int64_t in, int64_t out) = 0;
  virtual absl::Status LayerNormForward(const float* x, const float* gamma, const float* beta,
                                        float* y, float* mean, float* rstd, int64_t rows,
                                        int64_t width) = 0;
  virtual absl::Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                         const float* rstd, const float* dy, float* dx,
                                         float* dgamma, float* dbeta, int64_t rows,
                                         int64_t width) = 0;
  virtual absl::Status GeluForward(const float* x, float* y, int64_t n) = 0;
  virtual absl::Status GeluBackward(const float* x, const float* dy, float* dx, int64_t n) = 0;
  // ops.h's BiasGeluForward / BiasGeluBackward: gelu of x + b with the bias
  // add fused in (the MLP's first layer), bf16 rounding inside when bf16.
  // Bf16Device passes bf16 = true whatever the caller says.
  virtual absl::Status BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                                       int64_t width, bool bf16) = 0;
  virtual absl::Status BiasGeluBackward(const float* x, const float* b, const float* dy,
                                        float* dx, int64_t rows, int64_t width, bool bf16) = 0;
  // bf16: ops.h's bf16 attention (bf16 probabilities and score gradients,
  // every product on bf16 operands: a GPU's bf16 tensor cores). Bf16Device
  // asks the device it wraps for it whatever its caller passed (the model
  // passes false: fp32 unless the device is the bf16 precision).
  virtual absl::Status AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                        int64_t seq, int64_t heads, int64_t head_dim,
                                        bool bf16) = 0;
  virtual absl::Status AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                         float* dqkv, int64_t batch, int64_t seq,
                                         int64_t heads, int64_t head_dim, bool bf16) = 0;
  virtual absl::Status EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                        int64_t rows, int64_t width, int64_t vocab_begin,
                                        int64_t vocab_local) = 0;
  // GPU: scatter-adds with atomics, not bit-deterministic when tokens repeat.
  virtual absl::Status EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                         int64_t rows, int64_t width, int64_t vocab_begin,
                                         int64_t vocab_local) = 0;
  virtual absl::Status AddPositionForward(const float* pos_table, float* y, int64_t rows,
                                          int64_t seq, int64_t width) = 0;
  virtual absl::Status AddPositionBackward(const float* dy, float* dpos, int64_t rows,
                                           int64_t seq, int64_t width) = 0;
  virtual absl::Status LocalRowMax(const float* logits, float* row_max, int64_t rows,
                                   int64_t vocab_local) = 0;
  virtual absl::Status LocalSumExpAndTarget(const float* logits, const float* row_max,
                                            const int32_t* targets, float* sum_exp,
                                            float* target_logit, int64_t rows,
                                            int64_t vocab_begin, int64_t vocab_local) = 0;
  virtual absl::Status TokenLoss(const float* row_max, const float* sum_exp,
                                 const float* target_logit, float* loss, int64_t rows) = 0;
  virtual absl::Status CrossEntropyBackward(const float* logits, const float* row_max,
                                            const float* sum_exp, const int32_t* targets,
                                            float scale, float* dlogits, int64_t rows,
                                            int64_t vocab_begin, int64_t vocab_local) = 0;
  virtual absl::Status AddInPlace(const float* x, float* y, int64_t n) = 0;
  // x[0, n) (ELEMENTS) rounded to the nearest bfloat16, ties to even, in
  // place (ops.h RoundToBFloat16); bf16 mixed precision (bf16_device.h).
  virtual absl::Status RoundToBFloat16(float* x, int64_t n) = 0;
  // From now on Gemm, LinearForward and LinearBackward (not attention) may
  // read their inputs as bf16 and run on bf16 hardware with fp32
  // accumulation (a GPU's tensor cores); the caller promises bf16-exact
  // inputs (Bf16Device rounds them), so the numbers are the fp32 products'
  // up to summation order. The trainer sets it for precision bf16 and clears
  // it otherwise. Default: nothing to change (CpuDevice's fp32 products on
  // bf16-exact inputs are those numbers already).
  virtual absl::Status SetBf16Products(bool on) { return absl::OkStatus(); }
  // True while this device's Gemm / LinearForward / LinearBackward read
  // their operands as bf16, rounding them to nearest even themselves (after
  // SetBf16Products(true) on a device with bf16 hardware): Bf16Device then
  // hands them the activation operands, bf16 already, without rounded copies.
  virtual bool bf16_products() const { return false; }
  // Gives the blocks kept for reuse (BlockPool) back to the driver. The
  // trainer calls it when it is destroyed. Default: nothing kept.
  virtual void ReleaseCachedMemory() {}

  // --- The optimizer's state on this device (trainer.h "Where the state
  // lives"); pointers are memory of this device, sizes as marked ----------
  // dst[0, bytes) = src[0, bytes), device to device, ordered like the math.
  // The ranges must not overlap.
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // x[i] *= alpha for i in [0, n) (ELEMENTS): gradient clipping.
  virtual absl::Status Scale(float* x, float alpha, int64_t n) = 0;
  // adamw.h's AdamWStep over n ELEMENTS (same float arithmetic per element;
  // decay_mask is n bytes of this device's memory, or null).
  virtual absl::Status AdamWStep(const AdamWConfig& config, float lr, int64_t t, float* param,
                                 const float* grad, float* exp_avg, float* exp_avg_sq,
                                 const uint8_t* decay_mask, int64_t n) = 0;
  // *sum (HOST memory) += the sum over i in [0, n) (ELEMENTS) with
  // mask[i] != 0 of x[i]^2, accumulated in double (the global gradient
  // norm). mask is n bytes of this device's memory. Waits for the device (the
  // result is on the host). CpuDevice adds each term into *sum in index
  // order; a GPU sums blocks of terms first (the last bits may differ).
  virtual absl::Status AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask,
                                                    int64_t n, double* sum) = 0;
  // One piece of AccumulateMaskedSumsOfSquares: n ELEMENTS of x with their
  // n mask bytes (this device's memory).
  struct MaskedPiece {
    const float* x = nullptr;
    const uint8_t* mask = nullptr;
    int64_t n = 0;
  };
  // AccumulateMaskedSumOfSquares over each piece in order, with the same
  // result bit for bit, but one wait for the device in all (the gradient
  // norm over every unit of a step). Default: one call per piece.
  virtual absl::Status AccumulateMaskedSumsOfSquares(const std::vector<MaskedPiece>& pieces,
                                                     double* sum);
};


// Freed device blocks kept for reuse by an allocation of exactly the same
// size (a training step asks for the same activation shapes at every
// micro-batch and step), so a device allocates from its driver only while
// the shapes are new. Used by CpuDevice and the GPU device
// (worker/gpu/gpu_compute_device.h). Blocks are handed back in the order the
// device's own calls use them: on a device whose calls run in issue order
// (one stream), a block freed after its last use and taken by a later call
// is never used by both at once. Thread-safe.
class BlockPool {
 public:
  // Keeps at most `max_idle_bytes` idle, and only blocks of `min_block`
  // bytes or more.
  BlockPool(size_t max_idle_bytes, size_t min_block);
  ~BlockPool();  // the idle blocks must have been drained (TakeIdle)
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // An idle block of exactly `bytes`, now live; null when there is none.
  void* Reuse(size_t bytes);
  // Records a new live block of `bytes` from the driver (so Release knows
  // its size); blocks below min_block are not recorded.
  void Track(void* ptr, size_t bytes);
  // A live block is no longer used: true when the pool keeps it idle, false
  // when the caller must give it back to the driver (untracked, or the pool
  // is full).
  bool Release(void* ptr);
  // Removes and returns every idle block (to free them: on destruction, or
  // before retrying an allocation the driver refused).
  std::vector<void*> TakeIdle();
  size_t idle_bytes() const;

 private:
  struct State;
  const size_t max_idle_bytes_, min_block_;
  State* const state_;  // owned
};

// ops.h on host memory: every call is the ops.h function itself (bit-identical
// results, no copies). Never fails except AllocBytes. Thread-safe. BLAS
// threads: SetIntraOpThreads (parallel.h).
//
// Memory: AllocBytes returns host memory; a fresh block is zero-filled, a
// reused one holds what its last user left (unspecified, as on every
// device). Freed blocks of 64 KiB
// or more are kept for reuse by an allocation of exactly the same size (a
// training step asks for the same activation shapes at every micro-batch
// and step; handing the pages back and faulting them in again took about
// 10% of a nanoGPT step), up to kMaxCachedBytes of idle blocks in all;
// beyond that, and for smaller blocks, Free returns memory to malloc.
class CpuDevice final : public Device {
 public:
  // Idle bytes CpuDevice keeps for reuse, at most.
  static constexpr size_t kMaxCachedBytes = size_t{256} << 20;
  // Blocks smaller than this are never kept.
  static constexpr size_t kMinCachedBlock = size_t{64} << 10;

  CpuDevice();
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  // The process-wide instance (never destroyed); TrainingOptions' default.
  static CpuDevice* Default();

  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  absl::StatusOr<void*> AllocBytes(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Zero(void* ptr, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

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
  absl::Status BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                               int64_t width, bool bf16) override;
  absl::Status BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx,
                                int64_t rows, int64_t width, bool bf16) override;
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
  absl::Status RoundToBFloat16(float* x, int64_t n) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status Scale(float* x, float alpha, int64_t n) override;
  absl::Status AdamWStep(const AdamWConfig& config, float lr, int64_t t, float* param,
                         const float* grad, float* exp_avg, float* exp_avg_sq,
                         const uint8_t* decay_mask, int64_t n) override;
  absl::Status AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask, int64_t n,
                                            double* sum) override;

  // Idle bytes held for reuse now (<= kMaxCachedBytes); for tests.
  size_t cached_bytes() const { return pool_.idle_bytes(); }

 private:
  BlockPool pool_;
};

// Where a Buffer's memory comes from: the device's own (AllocBytes / Free)
// or the host memory it copies to and from fastest (AllocHostBytes /
// FreeHost: pinned on a GPU).
enum class Memory { kDevice, kHost };

// `count` elements of T in one Device's memory (or its host memory),
// freed on destruction (RAII). Move-only. Empty (null data, size 0) by
// default. Not thread-safe; the Device must outlive the buffer.
template <typename T, Memory kMemory>
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Reset();
      std::swap(device_, other.device_);
      std::swap(data_, other.data_);
      std::swap(size_, other.size_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Makes the buffer hold `count` (>= 0) elements on `device`, contents
  // unspecified; keeps the allocation when it already holds exactly `count`
  // elements on `device`. Errors: InvalidArgument for a negative count;
  // device.AllocBytes' or AllocHostBytes' (the buffer is then empty).
  absl::Status Resize(Device& device, int64_t count) {
    if (count < 0) return absl::InvalidArgumentError("Buffer::Resize: negative element count");
    if (device_ == &device && size_ == count) return absl::OkStatus();
    Reset();
    if (count == 0) return absl::OkStatus();
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    absl::StatusOr<void*> p =
        kMemory == Memory::kDevice ? device.AllocBytes(bytes) : device.AllocHostBytes(bytes);
    if (!p.ok()) return p.status();
    device_ = &device;
    data_ = static_cast<T*>(*p);
    size_ = count;
    return absl::OkStatus();
  }

  // Frees the memory; the buffer is empty after.
  void Reset() {
    if (device_ != nullptr && data_ != nullptr) {
      if (kMemory == Memory::kDevice) {
        device_->Free(data_);
      } else {
        device_->FreeHost(data_);
      }
    }
    device_ = nullptr;
    data_ = nullptr;
    size_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }  // elements
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }
  bool empty() const { return size_ == 0; }

 private:
  Device* device_ = nullptr;  // not owned
  T* data_ = nullptr;
  int64_t size_ = 0;
};

// Device memory: what the math reads and writes.
template <typename T>
using DeviceBuffer = Buffer<T, Memory::kDevice>;
// Host memory the device copies to and from fastest (Device::AllocHostBytes).
template <typename T>
using HostBuffer = Buffer<T, Memory::kHost>;

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_DEVICE_H_

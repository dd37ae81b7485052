// A test device for the trainer's device paths on any machine.
#ifndef SHARDLINE_WORKER_TRAIN_STAGING_DEVICE_H_
#define SHARDLINE_WORKER_TRAIN_STAGING_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/train/device.h"

namespace shardline::worker::train::testing {

// CpuDevice's math on memory the trainer must treat as device memory
// (host_memory() false): fresh allocations are NaN (reading unwritten memory
// shows), live bytes, allocations and host<->device copies are counted.
// Bit-identical to CpuDevice. Thread-safe (shared by every rank thread of a
// test). Its memory IS host memory underneath, so the fake GPU plugin's
// loopback NCCL communicators (worker/gpu/fake_plugin.cc) can use it as
// device memory.
//
// With `stream_ordered`, cuda_stream() hands out a stand-in stream (this
// object's address), so the trainer orders the NCCL backend against it on
// "the device" (model.h Collectives::Order / Finish) as on a GPU. Only the
// fake plugin may be given it (which never reads it: its stream_wait_event
// blocks the calling thread until the operation is done, as a stream whose
// work runs as it is enqueued would wait); a real plugin would take it for
// a cudaStream_t.
class StagingDevice : public Device {
 public:
  explicit StagingDevice(bool stream_ordered = false) : stream_ordered_(stream_ordered) {}
  std::string name() const override { return "staging"; }
  bool host_memory() const override { return false; }
  void* cuda_stream() override { return stream_ordered_ ? this : nullptr; }
  absl::StatusOr<void*> AllocBytes(size_t bytes) override {
    if (bytes == 0) return nullptr;
    // A header before the block remembers its size.
    char* block = static_cast<char*>(std::malloc(bytes + kHeader));
    if (block == nullptr) return absl::ResourceExhaustedError("staging: out of memory");
    std::memcpy(block, &bytes, sizeof(bytes));
    float* data = reinterpret_cast<float*>(block + kHeader);
    for (size_t i = 0; i < bytes / sizeof(float); ++i)
      data[i] = std::numeric_limits<float>::quiet_NaN();
    live_bytes_ += static_cast<int64_t>(bytes);
    ++allocations_;
    return data;
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    char* block = static_cast<char*>(ptr) - kHeader;
    size_t bytes = 0;
    std::memcpy(&bytes, block, sizeof(bytes));
    live_bytes_ -= static_cast<int64_t>(bytes);
    std::free(block);
  }
  // "Pinned" host memory: plain memory whose blocks are remembered, so a
  // test can tell that copies went there (InHostMemory).
  absl::StatusOr<void*> AllocHostBytes(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::malloc(bytes);
    if (p == nullptr) return absl::ResourceExhaustedError("staging: out of host memory");
    absl::MutexLock lock(&host_mu_);
    host_blocks_[static_cast<const char*>(p)] = bytes;
    ++host_allocations_;
    return p;
  }
  void FreeHost(void* ptr) override {
    if (ptr == nullptr) return;
    {
      absl::MutexLock lock(&host_mu_);
      host_blocks_.erase(static_cast<const char*>(ptr));
    }
    std::free(ptr);
  }
  // Whether [p, p + bytes) lies in one live AllocHostBytes block.
  bool InHostMemory(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    absl::MutexLock lock(&host_mu_);
    auto it = host_blocks_.upper_bound(c);
    if (it == host_blocks_.begin()) return false;
    --it;
    return c + bytes <= it->first + it->second;
  }
  int64_t host_allocations() const {
    absl::MutexLock lock(&host_mu_);
    return host_allocations_;
  }
  int64_t live_host_blocks() const {
    absl::MutexLock lock(&host_mu_);
    return static_cast<int64_t>(host_blocks_.size());
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    ++copies_;
    copied_bytes_ += static_cast<int64_t>(bytes);
    return cpu().CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    ++copies_;
    copied_bytes_ += static_cast<int64_t>(bytes);
    return cpu().CopyToHost(dst, src, bytes);
  }
  absl::Status Zero(void* ptr, size_t bytes) override { return cpu().Zero(ptr, bytes); }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  // Copies beside the math, as late as a GPU's copy stream may run them:
  // a CopyToHostAsync copies nothing until the same thread's (rank's)
  // OrderAfterHostCopies, or a Wait on a HostCopies that thread recorded
  // (from any thread), runs that thread's pending copies. A caller that
  // writes a source before OrderAfterHostCopies, or reads a destination
  // before Wait, sees the wrong bytes. Synchronize does not run them (a
  // GPU's stream synchronisation does not wait for the copy stream).
  absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes) override {
    absl::MutexLock lock(&copy_mu_);
    pending_copies_[std::this_thread::get_id()].push_back(PendingCopy{dst, src, bytes});
    ++async_copies_;
    copied_bytes_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<HostCopies>> RecordHostCopies() override {
    return std::make_shared<PendingHostCopies>(this, std::this_thread::get_id());
  }
  absl::Status OrderAfterHostCopies() override {
    RunPendingCopies(std::this_thread::get_id());
    return absl::OkStatus();
  }
  // CopyToHostAsync calls so far, and those not yet run.
  int64_t async_copies() const {
    absl::MutexLock lock(&copy_mu_);
    return async_copies_;
  }
  int64_t pending_copies() const {
    absl::MutexLock lock(&copy_mu_);
    int64_t n = 0;
    for (const auto& [thread, copies] : pending_copies_) n += static_cast<int64_t>(copies.size());
    return n;
  }

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c) override {
    return cpu().Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
  absl::Status LinearForward(const float* x, const float* w, const float* b, float* y,
                             int64_t rows, int64_t in, int64_t out) override {
    return cpu().LinearForward(x, w, b, y, rows, in, out);
  }
  absl::Status LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, int64_t rows, int64_t in,
                              int64_t out) override {
    return cpu().LinearBackward(x, w, dy, dx, dw, db, rows, in, out);
  }
  absl::Status LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                float* mean, float* rstd, int64_t rows, int64_t width) override {
    return cpu().LayerNormForward(x, gamma, beta, y, mean, rstd, rows, width);
  }
  absl::Status LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t width) override {
    return cpu().LayerNormBackward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, width);
  }
  absl::Status GeluForward(const float* x, float* y, int64_t n) override {
    return cpu().GeluForward(x, y, n);
  }
  absl::Status GeluBackward(const float* x, const float* dy, float* dx, int64_t n) override {
    return cpu().GeluBackward(x, dy, dx, n);
  }
  absl::Status BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                               int64_t width, bool bf16) override {
    return cpu().BiasGeluForward(x, b, y, rows, width, bf16);
  }
  absl::Status BiasGeluBackward(const float* x, const float* b, const float* dy, float* dx,
                                int64_t rows, int64_t width, bool bf16) override {
    return cpu().BiasGeluBackward(x, b, dy, dx, rows, width, bf16);
  }
  absl::Status AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim, bool bf16) override {
    return cpu().AttentionForward(qkv, probs, y, batch, seq, heads, head_dim, bf16);
  }
  absl::Status AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                 float* dqkv, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t head_dim, bool bf16) override {
    return cpu().AttentionBackward(qkv, probs, dy, dqkv, batch, seq, heads, head_dim, bf16);
  }
  absl::Status EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                int64_t rows, int64_t width, int64_t vocab_begin,
                                int64_t vocab_local) override {
    return cpu().EmbeddingForward(tokens, table, y, rows, width, vocab_begin, vocab_local);
  }
  absl::Status EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                 int64_t rows, int64_t width, int64_t vocab_begin,
                                 int64_t vocab_local) override {
    return cpu().EmbeddingBackward(tokens, dy, dtable, rows, width, vocab_begin, vocab_local);
  }
  absl::Status AddPositionForward(const float* pos_table, float* y, int64_t rows, int64_t seq,
                                  int64_t width) override {
    return cpu().AddPositionForward(pos_table, y, rows, seq, width);
  }
  absl::Status AddPositionBackward(const float* dy, float* dpos, int64_t rows, int64_t seq,
                                   int64_t width) override {
    return cpu().AddPositionBackward(dy, dpos, rows, seq, width);
  }
  absl::Status LocalRowMax(const float* logits, float* row_max, int64_t rows,
                           int64_t vocab_local) override {
    return cpu().LocalRowMax(logits, row_max, rows, vocab_local);
  }
  absl::Status LocalSumExpAndTarget(const float* logits, const float* row_max,
                                    const int32_t* targets, float* sum_exp, float* target_logit,
                                    int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local) override {
    return cpu().LocalSumExpAndTarget(logits, row_max, targets, sum_exp, target_logit, rows,
                                      vocab_begin, vocab_local);
  }
  absl::Status TokenLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                         float* loss, int64_t rows) override {
    return cpu().TokenLoss(row_max, sum_exp, target_logit, loss, rows);
  }
  absl::Status CrossEntropyBackward(const float* logits, const float* row_max,
                                    const float* sum_exp, const int32_t* targets, float scale,
                                    float* dlogits, int64_t rows, int64_t vocab_begin,
                                    int64_t vocab_local) override {
    return cpu().CrossEntropyBackward(logits, row_max, sum_exp, targets, scale, dlogits, rows,
                                      vocab_begin, vocab_local);
  }
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override {
    return cpu().AddInPlace(x, y, n);
  }
  absl::Status RoundToBFloat16(float* x, int64_t n) override {
    return cpu().RoundToBFloat16(x, n);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    return cpu().Copy(dst, src, bytes);
  }
  absl::Status Scale(float* x, float alpha, int64_t n) override {
    return cpu().Scale(x, alpha, n);
  }
  absl::Status AdamWStep(const AdamWConfig& config, float lr, int64_t t, float* param,
                         const float* grad, float* exp_avg, float* exp_avg_sq,
                         const uint8_t* decay_mask, int64_t n) override {
    return cpu().AdamWStep(config, lr, t, param, grad, exp_avg, exp_avg_sq, decay_mask, n);
  }
  absl::Status AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask, int64_t n,
                                            double* sum) override {
    return cpu().AccumulateMaskedSumOfSquares(x, mask, n, sum);
  }

  int64_t live_bytes() const { return live_bytes_; }
  int64_t allocations() const { return allocations_; }
  int64_t copies() const { return copies_; }
  // Bytes moved between host and device (CopyToDevice + CopyToHost).
  int64_t copied_bytes() const { return copied_bytes_; }

 private:
  static constexpr size_t kHeader = 64;  // keeps the data 16-byte aligned
  static CpuDevice& cpu() { return *CpuDevice::Default(); }
  const bool stream_ordered_;
  std::atomic<int64_t> live_bytes_{0}, allocations_{0}, copies_{0}, copied_bytes_{0};
  mutable absl::Mutex host_mu_;
  std::map<const char*, size_t> host_blocks_ ABSL_GUARDED_BY(host_mu_);  // start -> bytes
  int64_t host_allocations_ ABSL_GUARDED_BY(host_mu_) = 0;

  struct PendingCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  class PendingHostCopies final : public HostCopies {
   public:
    PendingHostCopies(StagingDevice* device, std::thread::id thread)
        : device_(device), thread_(thread) {}
    absl::Status Wait() override {
      device_->RunPendingCopies(thread_);
      return absl::OkStatus();
    }

   private:
    StagingDevice* const device_;
    const std::thread::id thread_;
  };
  void RunPendingCopies(std::thread::id thread) {
    absl::MutexLock lock(&copy_mu_);
    auto it = pending_copies_.find(thread);
    if (it == pending_copies_.end()) return;
    for (const PendingCopy& c : it->second) std::memcpy(c.dst, c.src, c.bytes);
    pending_copies_.erase(it);
  }
  mutable absl::Mutex copy_mu_;
  // By the thread (rank) that enqueued them.
  std::map<std::thread::id, std::vector<PendingCopy>> pending_copies_ ABSL_GUARDED_BY(copy_mu_);
  int64_t async_copies_ ABSL_GUARDED_BY(copy_mu_) = 0;
};

}  // namespace shardline::worker::train::testing

#endif  // SHARDLINE_WORKER_TRAIN_STAGING_DEVICE_H_

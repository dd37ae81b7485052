#include "worker/train/device.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/train/ops.h"

namespace shardline::worker::train {

absl::StatusOr<void*> Device::AllocHostBytes(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = std::malloc(bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", bytes, " bytes for copies of ", name(),
                     "; free host memory, or run fewer ranks on this host"));
  }
  return p;
}

void Device::FreeHost(void* ptr) { std::free(ptr); }

absl::Status Device::CopyToHostAsync(void* dst, const void* src, size_t bytes) {
  return CopyToHost(dst, src, bytes);
}

namespace {
// Copies that were done when they returned (Device's synchronous default).
class DoneHostCopies final : public HostCopies {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};
}  // namespace

absl::StatusOr<std::shared_ptr<HostCopies>> Device::RecordHostCopies() {
  return std::make_shared<DoneHostCopies>();
}

// Idle blocks by size, and the size of every live tracked block (Release
// gets only the pointer).
struct BlockPool::State {
  mutable absl::Mutex mu;
  absl::flat_hash_map<size_t, std::vector<void*>> idle ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<void*, size_t> live ABSL_GUARDED_BY(mu);
  size_t idle_bytes ABSL_GUARDED_BY(mu) = 0;
};

BlockPool::BlockPool(size_t max_idle_bytes, size_t min_block)
    : max_idle_bytes_(max_idle_bytes), min_block_(min_block), state_(new State) {}

BlockPool::~BlockPool() { delete state_; }

void* BlockPool::Reuse(size_t bytes) {
  if (bytes < min_block_) return nullptr;
  absl::MutexLock lock(&state_->mu);
  auto it = state_->idle.find(bytes);
  if (it == state_->idle.end() || it->second.empty()) return nullptr;
  void* reused = it->second.back();
  it->second.pop_back();
  state_->idle_bytes -= bytes;
  state_->live.emplace(reused, bytes);
  return reused;
}

void BlockPool::Track(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes < min_block_) return;
  absl::MutexLock lock(&state_->mu);
  state_->live.emplace(ptr, bytes);
}

bool BlockPool::Release(void* ptr) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->live.find(ptr);
  if (it == state_->live.end()) return false;
  const size_t bytes = it->second;
  state_->live.erase(it);
  if (state_->idle_bytes + bytes > max_idle_bytes_) return false;
  state_->idle[bytes].push_back(ptr);
  state_->idle_bytes += bytes;
  return true;
}

std::vector<void*> BlockPool::TakeIdle() {
  absl::MutexLock lock(&state_->mu);
  std::vector<void*> out;
  for (auto& [bytes, blocks] : state_->idle) out.insert(out.end(), blocks.begin(), blocks.end());
  state_->idle.clear();
  state_->idle_bytes = 0;
  return out;
}

size_t BlockPool::idle_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->idle_bytes;
}

CpuDevice::CpuDevice() : pool_(kMaxCachedBytes, kMinCachedBlock) {}

CpuDevice::~CpuDevice() {
  for (void* p : pool_.TakeIdle()) std::free(p);
}

CpuDevice* CpuDevice::Default() {
  static CpuDevice* const device = new CpuDevice();
  return device;
}

absl::StatusOr<void*> CpuDevice::AllocBytes(size_t bytes) {
  if (bytes == 0) return nullptr;
  // A reused block is not zero-filled again: its contents are unspecified,
  // as AllocBytes' are on every device (memset took ~3% of a nanoGPT CPU
  // step; the trainer passes its tests with reused blocks poisoned with NaN).
  if (void* reused = pool_.Reuse(bytes); reused != nullptr) return reused;
  void* p = std::calloc(bytes, 1);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu: cannot allocate ", bytes, " bytes of host memory"));
  }
  pool_.Track(p, bytes);
  return p;
}

void CpuDevice::Free(void* ptr) {
  if (ptr == nullptr) return;
  if (!pool_.Release(ptr)) std::free(ptr);
}

absl::Status CpuDevice::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::Zero(void* ptr, size_t bytes) {
  if (bytes > 0) std::memset(ptr, 0, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* a, const float* b, float beta, float* c) {
  train::Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  return absl::OkStatus();
}

absl::Status CpuDevice::LinearForward(const float* x, const float* w, const float* b, float* y,
                                      int64_t rows, int64_t in, int64_t out) {
  train::LinearForward(x, w, b, y, rows, in, out);
  return absl::OkStatus();
}

absl::Status CpuDevice::LinearBackward(const float* x, const float* w, const float* dy,
                                       float* dx, float* dw, float* db, int64_t rows,
                                       int64_t in, int64_t out) {
  train::LinearBackward(x, w, dy, dx, dw, db, rows, in, out);
  return absl::OkStatus();
}

absl::Status CpuDevice::LayerNormForward(const float* x, const float* gamma, const float* beta,
                                         float* y, float* mean, float* rstd, int64_t rows,
                                         int64_t width) {
  train::LayerNormForward(x, gamma, beta, y, mean, rstd, rows, width);
  return absl::OkStatus();
}

absl::Status CpuDevice::LayerNormBackward(const float* x, const float* gamma, const float* mean,
                                          const float* rstd, const float* dy, float* dx,
                                          float* dgamma, float* dbeta, int64_t rows,
                                          int64_t width) {
  train::LayerNormBackward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, width);
  return absl::OkStatus();
}

absl::Status CpuDevice::GeluForward(const float* x, float* y, int64_t n) {
  train::GeluForward(x, y, n);
  return absl::OkStatus();
}

absl::Status CpuDevice::GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  train::GeluBackward(x, dy, dx, n);
  return absl::OkStatus();
}

absl::Status CpuDevice::BiasGeluForward(const float* x, const float* b, float* y, int64_t rows,
                                        int64_t width, bool bf16) {
  train::BiasGeluForward(x, b, y, rows, width, bf16);
  return absl::OkStatus();
}

absl::Status CpuDevice::BiasGeluBackward(const float* x, const float* b, const float* dy,
                                         float* dx, int64_t rows, int64_t width, bool bf16) {
  train::BiasGeluBackward(x, b, dy, dx, rows, width, bf16);
  return absl::OkStatus();
}

absl::Status CpuDevice::AttentionForward(const float* qkv, float* probs, float* y, int64_t batch,
                                         int64_t seq, int64_t heads, int64_t head_dim,
                                         bool bf16) {
  train::AttentionForward(qkv, probs, y, batch, seq, heads, head_dim, bf16);
  return absl::OkStatus();
}

absl::Status CpuDevice::AttentionBackward(const float* qkv, const float* probs, const float* dy,
                                          float* dqkv, int64_t batch, int64_t seq,
                                          int64_t heads, int64_t head_dim, bool bf16) {
  train::AttentionBackward(qkv, probs, dy, dqkv, batch, seq, heads, head_dim, bf16);
  return absl::OkStatus();
}

absl::Status CpuDevice::EmbeddingForward(const int32_t* tokens, const float* table, float* y,
                                         int64_t rows, int64_t width, int64_t vocab_begin,
                                         int64_t vocab_local) {
  train::EmbeddingForward(tokens, table, y, rows, width, vocab_begin, vocab_local);
  return absl::OkStatus();
}

absl::Status CpuDevice::EmbeddingBackward(const int32_t* tokens, const float* dy, float* dtable,
                                          int64_t rows, int64_t width, int64_t vocab_begin,
                                          int64_t vocab_local) {
  train::EmbeddingBackward(tokens, dy, dtable, rows, width, vocab_begin, vocab_local);
  return absl::OkStatus();
}

absl::Status CpuDevice::AddPositionForward(const float* pos_table, float* y, int64_t rows,
                                           int64_t seq, int64_t width) {
  train::AddPositionForward(pos_table, y, rows, seq, width);
  return absl::OkStatus();
}

absl::Status CpuDevice::AddPositionBackward(const float* dy, float* dpos, int64_t rows,
                                            int64_t seq, int64_t width) {
  train::AddPositionBackward(dy, dpos, rows, seq, width);
  return absl::OkStatus();
}

absl::Status CpuDevice::LocalRowMax(const float* logits, float* row_max, int64_t rows,
                                    int64_t vocab_local) {
  train::LocalRowMax(logits, row_max, rows, vocab_local);
  return absl::OkStatus();
}

absl::Status CpuDevice::LocalSumExpAndTarget(const float* logits, const float* row_max,
                                             const int32_t* targets, float* sum_exp,
                                             float* target_logit, int64_t rows,
                                             int64_t vocab_begin, int64_t vocab_local) {
  train::LocalSumExpAndTarget(logits, row_max, targets, sum_exp, target_logit, rows, vocab_begin,
                              vocab_local);
  return absl::OkStatus();
}

absl::Status CpuDevice::TokenLoss(const float* row_max, const float* sum_exp,
                                  const float* target_logit, float* loss, int64_t rows) {
  train::TokenLoss(row_max, sum_exp, target_logit, loss, rows);
  return absl::OkStatus();
}

absl::Status CpuDevice::CrossEntropyBackward(const float* logits, const float* row_max,
                                             const float* sum_exp, const int32_t* targets,
                                             float scale, float* dlogits, int64_t rows,
                                             int64_t vocab_begin, int64_t vocab_local) {
  train::CrossEntropyBackward(logits, row_max, sum_exp, targets, scale, dlogits, rows,
                              vocab_begin, vocab_local);
  return absl::OkStatus();
}

absl::Status CpuDevice::AddInPlace(const float* x, float* y, int64_t n) {
  train::AddInPlace(x, y, n);
  return absl::OkStatus();
}

absl::Status CpuDevice::RoundToBFloat16(float* x, int64_t n) {
  train::RoundToBFloat16(x, n);
  return absl::OkStatus();
}

absl::Status CpuDevice::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::Scale(float* x, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
  return absl::OkStatus();
}

absl::Status CpuDevice::AdamWStep(const AdamWConfig& config, float lr, int64_t t, float* param,
                                  const float* grad, float* exp_avg, float* exp_avg_sq,
                                  const uint8_t* decay_mask, int64_t n) {
  train::AdamWStep(config, lr, t, param, grad, exp_avg, exp_avg_sq, decay_mask, n);
  return absl::OkStatus();
}

absl::Status Device::AccumulateMaskedSumsOfSquares(const std::vector<MaskedPiece>& pieces,
                                                   double* sum) {
  for (const MaskedPiece& p : pieces) {
    absl::Status s = AccumulateMaskedSumOfSquares(p.x, p.mask, p.n, sum);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::AccumulateMaskedSumOfSquares(const float* x, const uint8_t* mask,
                                                     int64_t n, double* sum) {
  double s = *sum;
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i]) s += static_cast<double>(x[i]) * x[i];
  }
  *sum = s;
  return absl::OkStatus();
}

}  // namespace shardline::worker::train

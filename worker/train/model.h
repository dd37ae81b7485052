// The GPT's pieces on one tensor-parallel rank, forward and backward, with
// Megatron-LM's tensor-parallel collectives (Shoeybi et al., "Megatron-LM",
// 2019, Section 3, Figure 3): the transformer layer, the vocab-parallel
// embedding, and the output head with the vocab-parallel cross entropy. The
// math runs on a compute Device (device.h): the CPU, or a GPU.
//
//   Device& device = *CpuDevice::Default();
//   Collectives tp(tp_backend, &comm_time);
//   LayerActivations saved;
//   DeviceBuffer<float> y;
//   absl::Status s = LayerForward(device, shape, params, tp, std::move(x), &y, &saved);
//   s = LayerBackward(device, shape, params, grads, tp, saved, dy.data(), dx.data());
//
// Shapes (elements): T = batch * seq tokens; h = hidden; the layer's QKV is
// column-parallel ([3h/tp, h] per rank: this rank's heads), the attention
// output projection row-parallel ([h, h/tp]), fc1 column-parallel
// ([f/tp, h]), fc2 row-parallel ([h, f/tp]); LayerNorms and the biases of
// the row-parallel layers are replicated. The residual stream [T, h] is
// replicated over tp. Forward all-reduces the outputs of the row-parallel
// layers; backward all-reduces the input gradients of the column-parallel
// layers (the paper's f and g operators). The word embedding is split over
// the vocabulary ([V/tp, h] per rank).
//
// Memory: every pointer and buffer given to or kept by these functions
// (parameters, gradients, tokens, targets, activations) is memory of the
// `device` argument. The tensor-parallel collectives run where the tp
// backend reads: on the device's buffers themselves when its memory is host
// memory or the backend takes device memory (NCCL); else (a GPU with Gloo)
// Collectives stages each all-reduce through a host buffer (copy to host,
// all-reduce, copy back) and counts the copies as communication time.
//
// Every function returns the status of its device calls (device.h's errors:
// InvalidArgument, ResourceExhausted, Unavailable) and of its collectives
// (the Backend's errors: Unavailable, DeadlineExceeded, Aborted); on error
// the outputs are unspecified. Parameter gradients accumulate (+=),
// activation gradients are overwritten (ops.h). On CpuDevice every result is
// bit-identical to calling ops.h directly. Not thread-safe per call;
// distinct calls on distinct buffers and devices may run concurrently.
#ifndef SHARDLINE_WORKER_TRAIN_MODEL_H_
#define SHARDLINE_WORKER_TRAIN_MODEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/backend.h"
#include "worker/train/device.h"

namespace shardline::worker::train {

// Told when the calling thread starts and stops waiting on a communicator
// (every Collectives wait, including a staged all-reduce's copies): the
// worker's progress reports say COLLECTIVE while a rank's training thread
// is inside one (worker/rank_progress.h). Called on the waiting thread;
// must be cheap and must not block.
class CommWaitObserver {
 public:
  virtual ~CommWaitObserver() = default;
  virtual void WaitBegins() = 0;
  virtual void WaitEnds() = 0;
};

// Sets the calling thread's observer (null: none, the default) for as long
// as it lives, then puts the previous one back. Thread-local: the waits of
// other threads (e.g. other ranks' trainers in one test process) are not
// reported to it. `observer` is not owned and must outlive the scope.
class ScopedCommWaitObserver {
 public:
  explicit ScopedCommWaitObserver(CommWaitObserver* observer);
  ~ScopedCommWaitObserver();
  ScopedCommWaitObserver(const ScopedCommWaitObserver&) = delete;
  ScopedCommWaitObserver& operator=(const ScopedCommWaitObserver&) = delete;

 private:
  CommWaitObserver* const previous_;
};

// One wait of the calling thread, reported to its observer (if any) for as
// long as it lives: WaitBegins at construction, WaitEnds at destruction.
// Collectives' waits use it; so does a caller that is still held up by a
// failed collective (worker/training_loop.cc).
class ObservedCommWait {
 public:
  ObservedCommWait();
  ~ObservedCommWait();
  ObservedCommWait(const ObservedCommWait&) = delete;
  ObservedCommWait& operator=(const ObservedCommWait&) = delete;

 private:
  CommWaitObserver* const observer_;
};

// Collectives over one group, counting the time spent waiting (the "time
// in communication" the trainer reports). A group of size 1 costs nothing.
// Buffers are where the backend reads them: host memory for Gloo, device
// memory for a backend with device_memory() (NCCL); the functions below move
// data between the two where the caller's memory is the other kind. Not
// thread-safe.
//
// Ordering against a device's calls (Order, Finish, OnDevice): where the
// device has a CUDA stream (Device::cuda_stream) and the backend orders on
// streams (Backend::stream_ordered: NCCL), the backend's streams wait for
// the device's stream and the device's stream for the operation, with CUDA
// events: the host waits for neither. The operations are then kept until
// Settle, which waits for them on the host and returns their errors; a
// result the host reads back (a loss, a norm) is trustworthy only after
// Settle (the backend aborts a stuck or failed operation by itself, and the
// device then goes on with whatever the buffer holds). Elsewhere (a device
// without a stream, Gloo) Order synchronises the device and Finish waits
// on the host, as before stream ordering. The time counted as
// communication is the host's waiting: Settle's, with stream ordering.
class Collectives {
 public:
  // `backend` and `comm_time` are not owned and may be shared by several
  // Collectives of one thread.
  Collectives(Backend* backend, absl::Duration* comm_time)
      : backend_(backend), comm_time_(comm_time) {}
  int size() const { return backend_ == nullptr ? 1 : backend_->size(); }
  int rank() const { return backend_ == nullptr ? 0 : backend_->rank(); }
  // The device through which host-memory calls reach a backend that takes
  // device memory (not owned; null: none). Unused where the device's memory
  // is host memory.
  void set_staging_device(Device* device) { staging_ = device; }
  // All-reduces `count` floats of HOST memory in place; to a device-memory
  // backend through a buffer of the staging device (copy in, all-reduce, copy
  // out). Errors: the Backend's, the staging device's copies'.
  absl::Status AllReduce(float* data, int64_t count, ReduceOp op);
  // Broadcasts `count` floats of HOST memory from group rank `root`, staged
  // like AllReduce.
  absl::Status Broadcast(float* data, int64_t count, int root);
  // All-reduces `count` floats of `device`'s memory in place: directly when
  // the device's memory is host memory or the backend takes device memory
  // (OnDevice: ordered on the device's stream, or after a host
  // synchronisation), else through a host buffer (copy to host, all-reduce,
  // copy back), the copies counted as communication time. Errors: the
  // device's and the Backend's (with stream ordering, an operation's own
  // error may come only from Settle).
  absl::Status AllReduce(Device& device, float* data, int64_t count, ReduceOp op);
  // Waits for `work`, counting the time.
  absl::Status Wait(const std::shared_ptr<Work>& work);

  // Whether operations on `device`'s memory are ordered on its stream (see
  // the class comment) rather than by the host.
  bool StreamOrdered(Device& device) const {
    return backend_ != nullptr && backend_->stream_ordered() && device.cuda_stream() != nullptr;
  }
  // Operations issued on backend() from now on read what `device`'s calls so
  // far wrote: on the device (Backend::OrderAfter) with stream ordering,
  // else by device.Synchronize() (free on host memory). Errors: the
  // device's; the backend's (its group failed; a CUDA error).
  absl::Status Order(Device& device);
  // `device`'s calls from now on see what `work` (issued on backend())
  // wrote: on the device (Work::OrderBefore) with stream ordering, `work`
  // then kept until Settle; else waited for here. Errors: `work`'s (with
  // stream ordering, only those it already has), a CUDA error.
  absl::Status Finish(Device& device, std::shared_ptr<Work> work);
  // Order(device), `issue()` (an operation on backend() over `device`'s
  // memory), Finish(device, that operation).
  absl::Status OnDevice(Device& device, const std::function<std::shared_ptr<Work>()>& issue);
  // Waits for every operation Finish kept, oldest first (all of them, also
  // after an error), counting the time, and returns the first error. OK
  // when none is kept.
  absl::Status Settle();
  // Operations Finish kept that Settle has not yet waited for.
  size_t unsettled() const { return unsettled_.size(); }
  Backend* backend() const { return backend_; }
  // Whether the backend takes device memory of a device whose memory is not
  // host memory (so host buffers must be staged through `device`).
  bool StagesHostMemory(const Device* device) const {
    return backend_ != nullptr && backend_->device_memory() && device != nullptr &&
           !device->host_memory();
  }

 private:
  // Runs `issue` on `count` floats of host memory `data`: directly, or on a
  // staging-device copy.
  absl::Status OnHostMemory(float* data, int64_t count,
                            const std::function<std::shared_ptr<Work>(float*)>& issue);

  Backend* backend_;
  absl::Duration* comm_time_;
  Device* staging_ = nullptr;
  std::deque<std::shared_ptr<Work>> unsettled_;  // Finish's, in issue order
};

struct LayerShape {
  int64_t batch = 1;       // samples in the micro-batch
  int64_t seq = 1;         // tokens per sample
  int64_t hidden = 1;      // h
  int64_t heads = 1;       // heads on THIS rank (num_heads / tp)
  int64_t head_dim = 1;    // h / num_heads
  int64_t ffn = 1;         // fc1 outputs on THIS rank (ffn_hidden_size / tp)
  int64_t tokens() const { return batch * seq; }
  int64_t local_width() const { return heads * head_dim; }  // h / tp
};

// One layer's tp-local parameters (device pointers into unit buffers), in
// plan/model.h's names and layouts. Gradients use the same struct.
struct LayerParams {
  float* ln1_weight = nullptr;   // [h]
  float* ln1_bias = nullptr;     // [h]
  float* qkv_weight = nullptr;   // [3h/tp, h]
  float* qkv_bias = nullptr;     // [3h/tp]
  float* dense_weight = nullptr; // [h, h/tp]
  float* dense_bias = nullptr;   // [h]
  float* ln2_weight = nullptr;   // [h]
  float* ln2_bias = nullptr;     // [h]
  float* fc1_weight = nullptr;   // [f/tp, h]
  float* fc1_bias = nullptr;     // [f/tp]
  float* fc2_weight = nullptr;   // [h, f/tp]
  float* fc2_bias = nullptr;     // [h]
};

// What a layer's forward keeps for its backward (device memory).
struct LayerActivations {
  DeviceBuffer<float> x;                          // [T, h] input
  DeviceBuffer<float> ln1, ln1_mean, ln1_rstd;    // [T, h], [T], [T]
  DeviceBuffer<float> qkv;                        // [T, 3h/tp]
  DeviceBuffer<float> probs;                      // [batch, heads, seq, seq]
  DeviceBuffer<float> attention;                  // [T, h/tp]
  DeviceBuffer<float> mid;                        // [T, h] after the attention residual
  DeviceBuffer<float> ln2, ln2_mean, ln2_rstd;    // [T, h], [T], [T]
  DeviceBuffer<float> fc1;                        // [T, f/tp] fc1 product, before bias and GELU
  DeviceBuffer<float> gelu;                       // [T, f/tp]
};

// y[T, h] = the pre-LayerNorm transformer layer of x[T, h]:
//   mid = x + Dense(Attention(QKV(LN1(x)))),  y = mid + FC2(GELU(FC1(LN2(mid)))).
// Takes x (kept as saved->x, no copy); *y is (re)allocated on `device`.
absl::Status LayerForward(Device& device, const LayerShape& shape, const LayerParams& params,
                          Collectives& tp, DeviceBuffer<float> x, DeviceBuffer<float>* y,
                          LayerActivations* saved);

// dx[T, h] from dy[T, h] (distinct device buffers); grads accumulate into
// `grads`.
absl::Status LayerBackward(Device& device, const LayerShape& shape, const LayerParams& params,
                           const LayerParams& grads, Collectives& tp,
                           const LayerActivations& saved, const float* dy, float* dx);

// y[T, h] = word[token] + position[t mod seq]. `word` holds this rank's
// vocabulary rows [vocab_begin, vocab_begin + vocab_local); the partial
// lookups are all-reduced over tp, then positions ([seq, h], replicated)
// are added. tokens[T] and y are device memory.
absl::Status EmbeddingForward(Device& device, const LayerShape& shape, const int32_t* tokens,
                              const float* word, const float* position, int64_t vocab_begin,
                              int64_t vocab_local, Collectives& tp, float* y);
// dword[V/tp, h] and dposition[seq, h] accumulate from dy[T, h].
absl::Status EmbeddingBackward(Device& device, const LayerShape& shape, const int32_t* tokens,
                               const float* dy, float* dword, float* dposition,
                               int64_t vocab_begin, int64_t vocab_local);

// What the head's forward keeps for its backward (device memory).
struct HeadActivations {
  DeviceBuffer<float> x, ln;                 // [T, h]
  DeviceBuffer<float> ln_mean, ln_rstd;      // [T]
  DeviceBuffer<float> logits;                // [T, V/tp]
  DeviceBuffer<float> row_max;               // [T], over the whole vocabulary
  DeviceBuffer<float> sums;                  // [2T]: sum_exp[T] (whole vocabulary), then
                                             // the target's logit[T]
  const int32_t* targets = nullptr;          // [T], the caller's (outlives this)
  const float* sum_exp() const { return sums.data(); }
};

// Final LayerNorm, logits against the (tied) word embedding word[V/tp, h],
// and each token's cross entropy, written to token_loss[T] (device; the
// same on every tp rank). The host reads it when it needs the loss (the
// trainer once per step, summing each micro-batch's in double: MeanLoss),
// so the head adds no host wait. Takes x[T, h] (kept in *saved) and
// targets[T] (device; the pointer is kept in *saved and must outlive it).
absl::Status HeadForward(Device& device, const LayerShape& shape, DeviceBuffer<float> x,
                         const int32_t* targets, const float* ln_weight, const float* ln_bias,
                         const float* word, int64_t vocab_begin, int64_t vocab_local,
                         Collectives& tp, HeadActivations* saved, float* token_loss);

// The mean of token_loss[T] (HOST), summed in double in token order: one
// micro-batch's loss from HeadForward's output.
double MeanLoss(const float* token_loss, int64_t T);

// Backward of loss_scale * (mean cross entropy): dx[T, h] (overwritten);
// gradients of the final LayerNorm and of the word embedding accumulate.
absl::Status HeadBackward(Device& device, const LayerShape& shape, const float* ln_weight,
                          const float* word, int64_t vocab_begin, int64_t vocab_local,
                          float loss_scale, const HeadActivations& saved, Collectives& tp,
                          float* dln_weight, float* dln_bias, float* dword, float* dx);

// Logits of the last token of each sample, gathered over tp into HOST
// memory: out[batch, V]. (Sampling text.)
absl::Status LastTokenLogits(Device& device, const LayerShape& shape,
                             const HeadActivations& saved, int64_t vocab_size, Collectives& tp,
                             std::vector<float>* out);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_MODEL_H_

// The GPT's pieces on one tensor-parallel rank, forward and backward, with
// Megatron-LM's tensor-parallel collectives (Shoeybi et al., "Megatron-LM",
// 2019, Section 3, Figure 3): the transformer layer, the vocab-parallel
// embedding, and the output head with the vocab-parallel cross entropy.
//
//   TensorParallel tp(tp_backend, &comm_seconds);
//   LayerActivations saved;
//   absl::Status s = LayerForward(shape, params, tp, x, y, &saved);
//   s = LayerBackward(shape, params, grads, tp, saved, dy, dx);
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
// Every function returns the status of its collectives (the Backend's
// errors: Unavailable, DeadlineExceeded, Aborted); on error the outputs are
// unspecified. Parameter gradients accumulate (+=), activation gradients are
// overwritten (ops.h). Not thread-safe per call; distinct calls on distinct
// buffers may run concurrently.
#ifndef SHARDLINE_WORKER_TRAIN_MODEL_H_
#define SHARDLINE_WORKER_TRAIN_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/backend.h"

namespace shardline::worker::train {

// All-reduces over one group and counts the time spent waiting (the
// "time in communication" the trainer reports). A group of size 1 costs
// nothing. Not thread-safe.
class Collectives {
 public:
  // `backend` and `comm_time` are not owned and may be shared by several
  // Collectives of one thread.
  Collectives(Backend* backend, absl::Duration* comm_time)
      : backend_(backend), comm_time_(comm_time) {}
  int size() const { return backend_ == nullptr ? 1 : backend_->size(); }
  int rank() const { return backend_ == nullptr ? 0 : backend_->rank(); }
  absl::Status AllReduce(float* data, int64_t count, ReduceOp op);
  // Waits for `work`, counting the time.
  absl::Status Wait(const std::shared_ptr<Work>& work);
  Backend* backend() const { return backend_; }

 private:
  Backend* backend_;
  absl::Duration* comm_time_;
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

// One layer's tp-local parameters (pointers into unit buffers), in
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

// What a layer's forward keeps for its backward.
struct LayerActivations {
  std::vector<float> x;                // [T, h] input
  std::vector<float> ln1, ln1_mean, ln1_rstd;
  std::vector<float> qkv;              // [T, 3h/tp]
  std::vector<float> probs;            // [batch, heads, seq, seq]
  std::vector<float> attention;        // [T, h/tp]
  std::vector<float> mid;              // [T, h] after the attention residual
  std::vector<float> ln2, ln2_mean, ln2_rstd;
  std::vector<float> fc1;              // [T, f/tp] before GELU
  std::vector<float> gelu;             // [T, f/tp]
};

// y[T, h] = the pre-LayerNorm transformer layer of x[T, h]:
//   mid = x + Dense(Attention(QKV(LN1(x)))),  y = mid + FC2(GELU(FC1(LN2(mid)))).
absl::Status LayerForward(const LayerShape& shape, const LayerParams& params, Collectives& tp,
                          const float* x, float* y, LayerActivations* saved);

// dx[T, h] from dy[T, h]; grads accumulate into `grads`.
absl::Status LayerBackward(const LayerShape& shape, const LayerParams& params,
                           const LayerParams& grads, Collectives& tp,
                           const LayerActivations& saved, const float* dy, float* dx);

// y[T, h] = word[token] + position[t mod seq]. `word` holds this rank's
// vocabulary rows [vocab_begin, vocab_begin + vocab_local); the partial
// lookups are all-reduced over tp, then positions ([seq, h], replicated)
// are added.
absl::Status EmbeddingForward(const LayerShape& shape, const int32_t* tokens, const float* word,
                              const float* position, int64_t vocab_begin, int64_t vocab_local,
                              Collectives& tp, float* y);
void EmbeddingBackward(const LayerShape& shape, const int32_t* tokens, const float* dy,
                       float* dword, float* dposition, int64_t vocab_begin, int64_t vocab_local);

// What the head's forward keeps for its backward.
struct HeadActivations {
  std::vector<float> x, ln, ln_mean, ln_rstd;  // [T, h]
  std::vector<float> logits;                    // [T, V/tp]
  std::vector<float> row_max, sum_exp;          // [T], over the whole vocabulary
  std::vector<int32_t> targets;                 // [T]
};

// Final LayerNorm, logits against the (tied) word embedding word[V/tp, h],
// and the mean cross entropy over the T tokens, returned in *loss (the same
// on every tp rank).
absl::Status HeadForward(const LayerShape& shape, const float* x, const int32_t* targets,
                         const float* ln_weight, const float* ln_bias, const float* word,
                         int64_t vocab_begin, int64_t vocab_local, Collectives& tp,
                         HeadActivations* saved, double* loss);

// Backward of loss_scale * (mean cross entropy): dx[T, h]; gradients of the
// final LayerNorm and of the word embedding accumulate.
absl::Status HeadBackward(const LayerShape& shape, const float* ln_weight, const float* word,
                          int64_t vocab_begin, int64_t vocab_local, float loss_scale,
                          const HeadActivations& saved, Collectives& tp, float* dln_weight,
                          float* dln_bias, float* dword, float* dx);

// Logits of the last token of each sample, gathered over tp: out[batch, V].
// (Sampling text.)
absl::Status LastTokenLogits(const LayerShape& shape, const HeadActivations& saved,
                             int64_t vocab_size, Collectives& tp, std::vector<float>* out);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_MODEL_H_

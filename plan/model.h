// The GPT parameter list, its exact size, and the training FLOPs of one
// iteration.
//
//   absl::StatusOr<std::vector<ParameterSpec>> params = GptParameters(model);
//   int64_t n = GptParameterCount(model);   // == sum of params' numel()
//   double f = TrainingFlopsPerIteration(model, /*global_batch=*/12, false);
//
// Pure functions. Thread-safe.
#ifndef SHARDLINE_PLAN_MODEL_H_
#define SHARDLINE_PLAN_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/config.h"

namespace shardline::plan {

// Where a parameter sits in the network.
enum class ParameterRole {
  kEmbedding,  // word and position embeddings (with the first pipeline chunk)
  kLayer,      // inside transformer layer `layer`
  kHead,       // final LayerNorm (with the last pipeline chunk)
};

// One parameter of the full (unsplit) model. Weights are stored [out, in]
// (row-major), as Megatron-LM and torch.nn.Linear do.
struct ParameterSpec {
  std::string name;            // e.g. "layers.3.attention.qkv.weight"
  std::vector<int64_t> shape;  // global shape, elements per dimension
  // The dimension tensor parallelism splits evenly over tp ranks, or -1 when
  // every tp rank holds the whole tensor. Column-parallel layers (QKV, fc1)
  // split dim 0 (outputs); row-parallel layers (attention dense, fc2) split
  // dim 1 (inputs); the word embedding is vocab-parallel (dim 0).
  int tp_split_dim = -1;
  ParameterRole role = ParameterRole::kLayer;
  int64_t layer = -1;  // transformer layer index for kLayer, else -1

  // Elements in the global tensor (1 for a 0-d shape, 0 if any dim is 0).
  int64_t numel() const;
  // Elements each tp rank holds: numel() / tp when split, else numel().
  int64_t local_numel(int tp) const;
  // The shape on one tp rank: shape with shape[tp_split_dim] / tp.
  std::vector<int64_t> local_shape(int tp) const;
  // The global row-major index of element `local_index` (row-major over
  // local_shape(tp)) of tp rank `tp_rank`'s slice. Preconditions: 1 <= tp,
  // 0 <= tp_rank < tp, tp divides the split dim, local_index < local_numel(tp).
  int64_t global_index(int tp, int tp_rank, int64_t local_index) const;
};

// The parameters of `model` in forward order: embedding, then per layer
//   layers.{i}.input_layernorm.{weight,bias}            [h]
//   layers.{i}.attention.qkv.{weight,bias}              [3h, h], [3h]   split 0
//   layers.{i}.attention.dense.weight                   [h, h]          split 1
//   layers.{i}.attention.dense.bias                     [h]
//   layers.{i}.post_attention_layernorm.{weight,bias}   [h]
//   layers.{i}.mlp.fc1.{weight,bias}                    [f, h], [f]     split 0
//   layers.{i}.mlp.fc2.weight                           [h, f]          split 1
//   layers.{i}.mlp.fc2.bias                             [h]
// then final_layernorm.{weight,bias} [h]. Embedding:
//   embedding.word_embeddings.weight [V, h] split 0 (tied to the output head),
//   embedding.position_embeddings.weight [s, h].
// QKV rows are ordered [head][q|k|v][head_dim] so that a contiguous split of
// dim 0 gives each tp rank the q, k and v of its own heads.
// Errors: InvalidArgument from ValidateGptConfig.
absl::StatusOr<std::vector<ParameterSpec>> GptParameters(const GptConfig& model);

// Exact parameter count, closed form (tied head counted once):
//   V*h + s*h + L*(4h^2 + 2hf + 9h + f) + 2h.
// Equals the sum of numel() over GptParameters(model). Requires a valid model.
int64_t GptParameterCount(const GptConfig& model);

// Model FLOPs of one training iteration (forward + backward, counting a
// multiply-add as 2 FLOPs) over `global_batch` samples of seq_length tokens,
// after Narayanan et al., "Efficient Large-Scale Language Model Training on
// GPU Clusters Using Megatron-LM", SC'21, Section 5.1 and Appendix. Per layer
// and sample the forward pass costs 8sh^2 + 4shf (QKV, dense, MLP) + 4s^2h
// (scores and weighted values); the output head 2shV. Backward is twice the
// forward; activation recomputation adds one more forward of the layers.
// With f = 4h this is the paper's Eq. (3),
//   96 B s L h^2 (1 + s/(6h) + V/(16 L h))   with recomputation,
//   72 B s L h^2 (1 + s/(6h) + V/(12 L h))   without.
double TrainingFlopsPerIteration(const GptConfig& model, int64_t global_batch,
                                 bool activation_recompute);

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_MODEL_H_

#include "plan/model.h"

#include "absl/strings/str_cat.h"

namespace shardline::plan {

int64_t ParameterSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ParameterSpec::local_numel(int tp) const {
  return tp_split_dim < 0 ? numel() : numel() / tp;
}

std::vector<int64_t> ParameterSpec::local_shape(int tp) const {
  std::vector<int64_t> local = shape;
  if (tp_split_dim >= 0) local[tp_split_dim] /= tp;
  return local;
}

int64_t ParameterSpec::global_index(int tp, int tp_rank, int64_t local_index) const {
  const int d = tp_split_dim;
  if (tp == 1 || d < 0) return local_index;
  // Index = (outer, j, inner) over shape = [outer dims..., dim d, inner dims...].
  int64_t inner = 1;
  for (size_t k = static_cast<size_t>(d) + 1; k < shape.size(); ++k) inner *= shape[k];
  const int64_t dim = shape[static_cast<size_t>(d)];
  const int64_t local_dim = dim / tp;
  const int64_t i = local_index % inner;
  const int64_t rest = local_index / inner;
  const int64_t j = rest % local_dim;
  const int64_t outer = rest / local_dim;
  return (outer * dim + static_cast<int64_t>(tp_rank) * local_dim + j) * inner + i;
}

absl::StatusOr<std::vector<ParameterSpec>> GptParameters(const GptConfig& m) {
  if (absl::Status s = ValidateGptConfig(m); !s.ok()) return s;
  const int64_t h = m.hidden_size, f = m.ffn();
  std::vector<ParameterSpec> out;
  out.reserve(4 + 12 * m.num_layers);
  auto add = [&out](std::string name, std::vector<int64_t> shape, int split, ParameterRole role,
                    int64_t layer) {
    out.push_back(ParameterSpec{std::move(name), std::move(shape), split, role, layer});
  };
  add("embedding.word_embeddings.weight", {m.vocab_size, h}, 0, ParameterRole::kEmbedding, -1);
  add("embedding.position_embeddings.weight", {m.seq_length, h}, -1, ParameterRole::kEmbedding,
      -1);
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    const ParameterRole r = ParameterRole::kLayer;
    add(p + "input_layernorm.weight", {h}, -1, r, i);
    add(p + "input_layernorm.bias", {h}, -1, r, i);
    add(p + "attention.qkv.weight", {3 * h, h}, 0, r, i);
    add(p + "attention.qkv.bias", {3 * h}, 0, r, i);
    add(p + "attention.dense.weight", {h, h}, 1, r, i);
    add(p + "attention.dense.bias", {h}, -1, r, i);
    add(p + "post_attention_layernorm.weight", {h}, -1, r, i);
    add(p + "post_attention_layernorm.bias", {h}, -1, r, i);
    add(p + "mlp.fc1.weight", {f, h}, 0, r, i);
    add(p + "mlp.fc1.bias", {f}, 0, r, i);
    add(p + "mlp.fc2.weight", {h, f}, 1, r, i);
    add(p + "mlp.fc2.bias", {h}, -1, r, i);
  }
  add("final_layernorm.weight", {h}, -1, ParameterRole::kHead, -1);
  add("final_layernorm.bias", {h}, -1, ParameterRole::kHead, -1);
  return out;
}

int64_t GptParameterCount(const GptConfig& m) {
  const int64_t h = m.hidden_size, f = m.ffn();
  return m.vocab_size * h + m.seq_length * h +
         m.num_layers * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h;
}

double TrainingFlopsPerIteration(const GptConfig& m, int64_t global_batch,
                                 bool activation_recompute) {
  const double b = static_cast<double>(global_batch);
  const double s = static_cast<double>(m.seq_length);
  const double h = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn());
  const double v = static_cast<double>(m.vocab_size);
  const double layers = static_cast<double>(m.num_layers);
  const double layer_forward = b * (8 * s * h * h + 4 * s * h * f + 4 * s * s * h);
  const double head_forward = 2 * b * s * h * v;
  // Forward (1) + backward (2) [+ recomputed forward of the layers (1)].
  const double layer_passes = activation_recompute ? 4.0 : 3.0;
  return layer_passes * layers * layer_forward + 3.0 * head_forward;
}

}  // namespace shardline::plan

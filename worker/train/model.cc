#include "worker/train/model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/train/ops.h"

namespace shardline::worker::train {

absl::Status Collectives::Wait(const std::shared_ptr<Work>& work) {
  const absl::Time start = absl::Now();
  absl::Status s = work->Wait();
  if (comm_time_ != nullptr) *comm_time_ += absl::Now() - start;
  return s;
}

absl::Status Collectives::AllReduce(float* data, int64_t count, ReduceOp op) {
  if (size() == 1) return absl::OkStatus();
  return Wait(backend_->AllReduce(data, static_cast<size_t>(count), DType::kFloat32, op));
}

namespace {

// y[t, :] += bias[:] for every row.
void AddBias(const float* bias, float* y, int64_t rows, int64_t width) {
  for (int64_t t = 0; t < rows; ++t) AddInPlace(bias, y + t * width, width);
}

}  // namespace

absl::Status LayerForward(const LayerShape& shape, const LayerParams& p, Collectives& tp,
                          const float* x, float* y, LayerActivations* a) {
  const int64_t T = shape.tokens(), h = shape.hidden, w = shape.local_width(), f = shape.ffn;
  a->x.assign(x, x + T * h);
  a->ln1.resize(T * h);
  a->ln1_mean.resize(T);
  a->ln1_rstd.resize(T);
  LayerNormForward(x, p.ln1_weight, p.ln1_bias, a->ln1.data(), a->ln1_mean.data(),
                   a->ln1_rstd.data(), T, h);
  a->qkv.resize(T * 3 * w);
  LinearForward(a->ln1.data(), p.qkv_weight, p.qkv_bias, a->qkv.data(), T, h, 3 * w);
  a->probs.resize(shape.batch * shape.heads * shape.seq * shape.seq);
  a->attention.resize(T * w);
  AttentionForward(a->qkv.data(), a->probs.data(), a->attention.data(), shape.batch, shape.seq,
                   shape.heads, shape.head_dim);
  // Row-parallel output projection: partial sums over this rank's heads.
  std::vector<float> partial(T * h);
  LinearForward(a->attention.data(), p.dense_weight, nullptr, partial.data(), T, w, h);
  if (absl::Status s = tp.AllReduce(partial.data(), T * h, ReduceOp::kSum); !s.ok()) return s;
  AddBias(p.dense_bias, partial.data(), T, h);
  a->mid.assign(x, x + T * h);
  AddInPlace(partial.data(), a->mid.data(), T * h);

  a->ln2.resize(T * h);
  a->ln2_mean.resize(T);
  a->ln2_rstd.resize(T);
  LayerNormForward(a->mid.data(), p.ln2_weight, p.ln2_bias, a->ln2.data(), a->ln2_mean.data(),
                   a->ln2_rstd.data(), T, h);
  a->fc1.resize(T * f);
  LinearForward(a->ln2.data(), p.fc1_weight, p.fc1_bias, a->fc1.data(), T, h, f);
  a->gelu.resize(T * f);
  GeluForward(a->fc1.data(), a->gelu.data(), T * f);
  LinearForward(a->gelu.data(), p.fc2_weight, nullptr, partial.data(), T, f, h);
  if (absl::Status s = tp.AllReduce(partial.data(), T * h, ReduceOp::kSum); !s.ok()) return s;
  AddBias(p.fc2_bias, partial.data(), T, h);
  std::memcpy(y, a->mid.data(), sizeof(float) * T * h);
  AddInPlace(partial.data(), y, T * h);
  return absl::OkStatus();
}

absl::Status LayerBackward(const LayerShape& shape, const LayerParams& p, const LayerParams& g,
                           Collectives& tp, const LayerActivations& a, const float* dy,
                           float* dx) {
  const int64_t T = shape.tokens(), h = shape.hidden, w = shape.local_width(), f = shape.ffn;
  // MLP. fc2 is row-parallel: its input gradient needs no communication.
  std::vector<float> dact(T * f);
  LinearBackward(a.gelu.data(), p.fc2_weight, dy, dact.data(), g.fc2_weight, g.fc2_bias, T, f, h);
  GeluBackward(a.fc1.data(), dact.data(), dact.data(), T * f);
  // fc1 is column-parallel: sum the input gradient over tp.
  std::vector<float> dln(T * h);
  LinearBackward(a.ln2.data(), p.fc1_weight, dact.data(), dln.data(), g.fc1_weight, g.fc1_bias, T,
                 h, f);
  if (absl::Status s = tp.AllReduce(dln.data(), T * h, ReduceOp::kSum); !s.ok()) return s;
  std::vector<float> dmid(T * h);
  LayerNormBackward(a.mid.data(), p.ln2_weight, a.ln2_mean.data(), a.ln2_rstd.data(), dln.data(),
                    dmid.data(), g.ln2_weight, g.ln2_bias, T, h);
  AddInPlace(dy, dmid.data(), T * h);

  // Attention.
  std::vector<float> dattention(T * w);
  LinearBackward(a.attention.data(), p.dense_weight, dmid.data(), dattention.data(),
                 g.dense_weight, g.dense_bias, T, w, h);
  std::vector<float> dqkv(T * 3 * w);
  AttentionBackward(a.qkv.data(), a.probs.data(), dattention.data(), dqkv.data(), shape.batch,
                    shape.seq, shape.heads, shape.head_dim);
  LinearBackward(a.ln1.data(), p.qkv_weight, dqkv.data(), dln.data(), g.qkv_weight, g.qkv_bias, T,
                 h, 3 * w);
  if (absl::Status s = tp.AllReduce(dln.data(), T * h, ReduceOp::kSum); !s.ok()) return s;
  LayerNormBackward(a.x.data(), p.ln1_weight, a.ln1_mean.data(), a.ln1_rstd.data(), dln.data(),
                    dx, g.ln1_weight, g.ln1_bias, T, h);
  AddInPlace(dmid.data(), dx, T * h);
  return absl::OkStatus();
}

absl::Status EmbeddingForward(const LayerShape& shape, const int32_t* tokens, const float* word,
                              const float* position, int64_t vocab_begin, int64_t vocab_local,
                              Collectives& tp, float* y) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  train::EmbeddingForward(tokens, word, y, T, h, vocab_begin, vocab_local);
  if (absl::Status s = tp.AllReduce(y, T * h, ReduceOp::kSum); !s.ok()) return s;
  AddPositionForward(position, y, T, shape.seq, h);
  return absl::OkStatus();
}

void EmbeddingBackward(const LayerShape& shape, const int32_t* tokens, const float* dy,
                       float* dword, float* dposition, int64_t vocab_begin, int64_t vocab_local) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  train::EmbeddingBackward(tokens, dy, dword, T, h, vocab_begin, vocab_local);
  AddPositionBackward(dy, dposition, T, shape.seq, h);
}

absl::Status HeadForward(const LayerShape& shape, const float* x, const int32_t* targets,
                         const float* ln_weight, const float* ln_bias, const float* word,
                         int64_t vocab_begin, int64_t vocab_local, Collectives& tp,
                         HeadActivations* a, double* loss) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  a->x.assign(x, x + T * h);
  a->targets.assign(targets, targets + T);
  a->ln.resize(T * h);
  a->ln_mean.resize(T);
  a->ln_rstd.resize(T);
  LayerNormForward(x, ln_weight, ln_bias, a->ln.data(), a->ln_mean.data(), a->ln_rstd.data(), T,
                   h);
  // Logits of this rank's vocabulary slice against the tied embedding.
  a->logits.resize(T * vocab_local);
  LinearForward(a->ln.data(), word, nullptr, a->logits.data(), T, h, vocab_local);
  a->row_max.resize(T);
  LocalRowMax(a->logits.data(), a->row_max.data(), T, vocab_local);
  if (absl::Status s = tp.AllReduce(a->row_max.data(), T, ReduceOp::kMax); !s.ok()) return s;
  // sum_exp and the target's logit travel in one all-reduce.
  std::vector<float> sums(2 * T);
  LocalSumExpAndTarget(a->logits.data(), a->row_max.data(), targets, sums.data(), sums.data() + T,
                       T, vocab_begin, vocab_local);
  if (absl::Status s = tp.AllReduce(sums.data(), 2 * T, ReduceOp::kSum); !s.ok()) return s;
  a->sum_exp.assign(sums.begin(), sums.begin() + T);
  std::vector<float> token_loss(T);
  TokenLoss(a->row_max.data(), a->sum_exp.data(), sums.data() + T, token_loss.data(), T);
  double total = 0;
  for (float l : token_loss) total += l;
  *loss = total / static_cast<double>(T);
  return absl::OkStatus();
}

absl::Status HeadBackward(const LayerShape& shape, const float* ln_weight, const float* word,
                          int64_t vocab_begin, int64_t vocab_local, float loss_scale,
                          const HeadActivations& a, Collectives& tp, float* dln_weight,
                          float* dln_bias, float* dword, float* dx) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  std::vector<float> dlogits(T * vocab_local);
  CrossEntropyBackward(a.logits.data(), a.row_max.data(), a.sum_exp.data(), a.targets.data(),
                       loss_scale / static_cast<float>(T), dlogits.data(), T, vocab_begin,
                       vocab_local);
  std::vector<float> dln(T * h);
  LinearBackward(a.ln.data(), word, dlogits.data(), dln.data(), dword, nullptr, T, h, vocab_local);
  if (absl::Status s = tp.AllReduce(dln.data(), T * h, ReduceOp::kSum); !s.ok()) return s;
  LayerNormBackward(a.x.data(), ln_weight, a.ln_mean.data(), a.ln_rstd.data(), dln.data(), dx,
                    dln_weight, dln_bias, T, h);
  return absl::OkStatus();
}

absl::Status LastTokenLogits(const LayerShape& shape, const HeadActivations& a,
                             int64_t vocab_size, Collectives& tp, std::vector<float>* out) {
  const int64_t vocab_local = vocab_size / tp.size();
  std::vector<float> mine(shape.batch * vocab_local);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const float* row = a.logits.data() + ((b + 1) * shape.seq - 1) * vocab_local;
    std::memcpy(mine.data() + b * vocab_local, row, sizeof(float) * vocab_local);
  }
  std::vector<float> gathered(tp.size() * mine.size());
  if (tp.size() == 1) {
    gathered = mine;
  } else {
    absl::Status s = tp.Wait(tp.backend()->AllGather(mine.data(), mine.size(), gathered.data(),
                                                     DType::kFloat32));
    if (!s.ok()) return s;
  }
  // gathered is [tp][batch][V/tp]; out is [batch][V].
  out->assign(shape.batch * vocab_size, 0.0f);
  for (int r = 0; r < tp.size(); ++r) {
    for (int64_t b = 0; b < shape.batch; ++b) {
      std::memcpy(out->data() + b * vocab_size + r * vocab_local,
                  gathered.data() + (r * shape.batch + b) * vocab_local,
                  sizeof(float) * vocab_local);
    }
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker::train

#include "worker/train/model.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::worker::train {

#define SL_RETURN_IF_ERROR(expr)               \
  do {                                         \
    absl::Status sl_status_ = (expr);          \
    if (!sl_status_.ok()) return sl_status_;   \
  } while (0)

namespace {

thread_local CommWaitObserver* t_wait_observer = nullptr;

}  // namespace

ObservedCommWait::ObservedCommWait() : observer_(t_wait_observer) {
  if (observer_ != nullptr) observer_->WaitBegins();
}

ObservedCommWait::~ObservedCommWait() {
  if (observer_ != nullptr) observer_->WaitEnds();
}

ScopedCommWaitObserver::ScopedCommWaitObserver(CommWaitObserver* observer)
    : previous_(t_wait_observer) {
  t_wait_observer = observer;
}

ScopedCommWaitObserver::~ScopedCommWaitObserver() { t_wait_observer = previous_; }

absl::Status Collectives::Wait(const std::shared_ptr<Work>& work) {
  const ObservedCommWait observed;
  const absl::Time start = absl::Now();
  absl::Status s = work->Wait();
  if (comm_time_ != nullptr) *comm_time_ += absl::Now() - start;
  return s;
}

absl::Status Collectives::OnHostMemory(
    float* data, int64_t count, const std::function<std::shared_ptr<Work>(float*)>& issue) {
  if (!StagesHostMemory(staging_)) return Wait(issue(data));
  const ObservedCommWait observed;
  const absl::Time start = absl::Now();
  DeviceBuffer<float> staged;
  const size_t bytes = sizeof(float) * static_cast<size_t>(count);
  absl::Status s = staged.Resize(*staging_, count);
  if (s.ok()) s = staging_->CopyToDevice(staged.data(), data, bytes);
  if (s.ok()) s = issue(staged.data())->Wait();
  if (s.ok()) s = staging_->CopyToHost(data, staged.data(), bytes);
  if (comm_time_ != nullptr) *comm_time_ += absl::Now() - start;
  return s;
}

absl::Status Collectives::AllReduce(float* data, int64_t count, ReduceOp op) {
  if (size() == 1) return absl::OkStatus();
  return OnHostMemory(data, count, [&](float* p) {
    return backend_->AllReduce(p, static_cast<size_t>(count), DType::kFloat32, op);
  });
}

absl::Status Collectives::Broadcast(float* data, int64_t count, int root) {
  if (size() == 1) return absl::OkStatus();
  return OnHostMemory(data, count, [&](float* p) {
    return backend_->Broadcast(p, static_cast<size_t>(count), DType::kFloat32, root);
  });
}

absl::Status Collectives::Order(Device& device) {
  if (StreamOrdered(device)) return backend_->OrderAfter(DeviceStream{device.cuda_stream()});
  return device.host_memory() ? absl::OkStatus() : device.Synchronize();
}

absl::Status Collectives::Finish(Device& device, std::shared_ptr<Work> work) {
  if (!StreamOrdered(device)) return Wait(work);
  const absl::Status ordered = work->OrderBefore(DeviceStream{device.cuda_stream()});
  unsettled_.push_back(std::move(work));  // waited for by Settle even if that failed
  SL_RETURN_IF_ERROR(ordered);
  // Those already seen to finish leave; a failed one's error is returned
  // now (what is still kept is waited for by the next Settle).
  while (unsettled_.size() > 1 && unsettled_.front()->IsCompleted()) {
    absl::Status s = unsettled_.front()->Wait();
    unsettled_.pop_front();
    SL_RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

absl::Status Collectives::OnDevice(Device& device,
                                   const std::function<std::shared_ptr<Work>()>& issue) {
  SL_RETURN_IF_ERROR(Order(device));
  return Finish(device, issue());
}

absl::Status Collectives::Settle() {
  if (unsettled_.empty()) return absl::OkStatus();
  const ObservedCommWait observed;
  const absl::Time start = absl::Now();
  absl::Status first;
  for (const std::shared_ptr<Work>& w : unsettled_) {
    absl::Status s = w->Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  unsettled_.clear();
  if (comm_time_ != nullptr) *comm_time_ += absl::Now() - start;
  return first;
}

absl::Status Collectives::AllReduce(Device& device, float* data, int64_t count, ReduceOp op) {
  if (size() == 1) return absl::OkStatus();
  if (device.host_memory() || backend_->device_memory()) {
    // The backend runs on its own stream: ordered after the device's work.
    return OnDevice(device, [&] {
      return backend_->AllReduce(data, static_cast<size_t>(count), DType::kFloat32, op);
    });
  }
  // Staged through host memory; the copies count as communication.
  const ObservedCommWait observed;
  const absl::Time start = absl::Now();
  std::vector<float> host(static_cast<size_t>(count));
  const size_t bytes = sizeof(float) * host.size();
  absl::Status s = device.CopyToHost(host.data(), data, bytes);
  if (s.ok()) {
    s = backend_->AllReduce(host.data(), host.size(), DType::kFloat32, op)->Wait();
  }
  if (s.ok()) s = device.CopyToDevice(data, host.data(), bytes);
  if (comm_time_ != nullptr) *comm_time_ += absl::Now() - start;
  return s;
}

namespace {

// y[t, :] += bias[:] for every row t < rows: the position-embedding add
// with a one-row table (ops.h AddPositionForward, seq = 1), one kernel on
// every device.
absl::Status AddBias(Device& d, const float* bias, float* y, int64_t rows, int64_t width) {
  return d.AddPositionForward(bias, y, rows, /*seq=*/1, width);
}

}  // namespace

absl::Status LayerForward(Device& d, const LayerShape& shape, const LayerParams& p,
                          Collectives& tp, DeviceBuffer<float> x, DeviceBuffer<float>* y,
                          LayerActivations* a) {
  const int64_t T = shape.tokens(), h = shape.hidden, w = shape.local_width(), f = shape.ffn;
  a->x = std::move(x);
  SL_RETURN_IF_ERROR(a->ln1.Resize(d, T * h));
  SL_RETURN_IF_ERROR(a->ln1_mean.Resize(d, T));
  SL_RETURN_IF_ERROR(a->ln1_rstd.Resize(d, T));
  SL_RETURN_IF_ERROR(d.LayerNormForward(a->x.data(), p.ln1_weight, p.ln1_bias, a->ln1.data(),
                                        a->ln1_mean.data(), a->ln1_rstd.data(), T, h));
  SL_RETURN_IF_ERROR(a->qkv.Resize(d, T * 3 * w));
  SL_RETURN_IF_ERROR(
      d.LinearForward(a->ln1.data(), p.qkv_weight, p.qkv_bias, a->qkv.data(), T, h, 3 * w));
  SL_RETURN_IF_ERROR(a->probs.Resize(d, shape.batch * shape.heads * shape.seq * shape.seq));
  SL_RETURN_IF_ERROR(a->attention.Resize(d, T * w));
  // fp32 attention unless `d` is the bf16 precision (Bf16Device asks for
  // bf16 attention itself).
  SL_RETURN_IF_ERROR(d.AttentionForward(a->qkv.data(), a->probs.data(), a->attention.data(),
                                        shape.batch, shape.seq, shape.heads, shape.head_dim,
                                        /*bf16=*/false));
  // Row-parallel output projection: partial sums over this rank's heads.
  DeviceBuffer<float> partial;
  SL_RETURN_IF_ERROR(partial.Resize(d, T * h));
  SL_RETURN_IF_ERROR(
      d.LinearForward(a->attention.data(), p.dense_weight, nullptr, partial.data(), T, w, h));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, partial.data(), T * h, ReduceOp::kSum));
  SL_RETURN_IF_ERROR(AddBias(d, p.dense_bias, partial.data(), T, h));
  // mid = x + attention output, in the projection's buffer (fp32 addition
  // commutes, so this equals x + partial bit for bit).
  SL_RETURN_IF_ERROR(d.AddInPlace(a->x.data(), partial.data(), T * h));
  a->mid = std::move(partial);

  SL_RETURN_IF_ERROR(a->ln2.Resize(d, T * h));
  SL_RETURN_IF_ERROR(a->ln2_mean.Resize(d, T));
  SL_RETURN_IF_ERROR(a->ln2_rstd.Resize(d, T));
  SL_RETURN_IF_ERROR(d.LayerNormForward(a->mid.data(), p.ln2_weight, p.ln2_bias, a->ln2.data(),
                                        a->ln2_mean.data(), a->ln2_rstd.data(), T, h));
  SL_RETURN_IF_ERROR(a->fc1.Resize(d, T * f));
  // fc1's product without its bias; the bias is added inside the GELU
  // (ops.h BiasGeluForward), so a->fc1 keeps the product, not x + b.
  SL_RETURN_IF_ERROR(
      d.LinearForward(a->ln2.data(), p.fc1_weight, nullptr, a->fc1.data(), T, h, f));
  SL_RETURN_IF_ERROR(a->gelu.Resize(d, T * f));
  SL_RETURN_IF_ERROR(
      d.BiasGeluForward(a->fc1.data(), p.fc1_bias, a->gelu.data(), T, f, /*bf16=*/false));
  DeviceBuffer<float> out;
  SL_RETURN_IF_ERROR(out.Resize(d, T * h));
  SL_RETURN_IF_ERROR(d.LinearForward(a->gelu.data(), p.fc2_weight, nullptr, out.data(), T, f, h));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, out.data(), T * h, ReduceOp::kSum));
  SL_RETURN_IF_ERROR(AddBias(d, p.fc2_bias, out.data(), T, h));
  // y = mid + MLP output (again in the product's buffer).
  SL_RETURN_IF_ERROR(d.AddInPlace(a->mid.data(), out.data(), T * h));
  *y = std::move(out);
  return absl::OkStatus();
}

absl::Status LayerBackward(Device& d, const LayerShape& shape, const LayerParams& p,
                           const LayerParams& g, Collectives& tp, const LayerActivations& a,
                           const float* dy, float* dx) {
  const int64_t T = shape.tokens(), h = shape.hidden, w = shape.local_width(), f = shape.ffn;
  // MLP. fc2 is row-parallel: its input gradient needs no communication.
  DeviceBuffer<float> dact;
  SL_RETURN_IF_ERROR(dact.Resize(d, T * f));
  SL_RETURN_IF_ERROR(d.LinearBackward(a.gelu.data(), p.fc2_weight, dy, dact.data(), g.fc2_weight,
                                      g.fc2_bias, T, f, h));
  SL_RETURN_IF_ERROR(d.BiasGeluBackward(a.fc1.data(), p.fc1_bias, dact.data(), dact.data(), T, f,
                                        /*bf16=*/false));
  // fc1 is column-parallel: sum the input gradient over tp.
  DeviceBuffer<float> dln;
  SL_RETURN_IF_ERROR(dln.Resize(d, T * h));
  SL_RETURN_IF_ERROR(d.LinearBackward(a.ln2.data(), p.fc1_weight, dact.data(), dln.data(),
                                      g.fc1_weight, g.fc1_bias, T, h, f));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, dln.data(), T * h, ReduceOp::kSum));
  DeviceBuffer<float> dmid;
  SL_RETURN_IF_ERROR(dmid.Resize(d, T * h));
  SL_RETURN_IF_ERROR(d.LayerNormBackward(a.mid.data(), p.ln2_weight, a.ln2_mean.data(),
                                         a.ln2_rstd.data(), dln.data(), dmid.data(),
                                         g.ln2_weight, g.ln2_bias, T, h));
  SL_RETURN_IF_ERROR(d.AddInPlace(dy, dmid.data(), T * h));

  // Attention.
  DeviceBuffer<float> dattention;
  SL_RETURN_IF_ERROR(dattention.Resize(d, T * w));
  SL_RETURN_IF_ERROR(d.LinearBackward(a.attention.data(), p.dense_weight, dmid.data(),
                                      dattention.data(), g.dense_weight, g.dense_bias, T, w, h));
  DeviceBuffer<float> dqkv;
  SL_RETURN_IF_ERROR(dqkv.Resize(d, T * 3 * w));
  SL_RETURN_IF_ERROR(d.AttentionBackward(a.qkv.data(), a.probs.data(), dattention.data(),
                                         dqkv.data(), shape.batch, shape.seq, shape.heads,
                                         shape.head_dim, /*bf16=*/false));
  SL_RETURN_IF_ERROR(d.LinearBackward(a.ln1.data(), p.qkv_weight, dqkv.data(), dln.data(),
                                      g.qkv_weight, g.qkv_bias, T, h, 3 * w));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, dln.data(), T * h, ReduceOp::kSum));
  SL_RETURN_IF_ERROR(d.LayerNormBackward(a.x.data(), p.ln1_weight, a.ln1_mean.data(),
                                         a.ln1_rstd.data(), dln.data(), dx, g.ln1_weight,
                                         g.ln1_bias, T, h));
  return d.AddInPlace(dmid.data(), dx, T * h);
}

absl::Status EmbeddingForward(Device& d, const LayerShape& shape, const int32_t* tokens,
                              const float* word, const float* position, int64_t vocab_begin,
                              int64_t vocab_local, Collectives& tp, float* y) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  SL_RETURN_IF_ERROR(d.EmbeddingForward(tokens, word, y, T, h, vocab_begin, vocab_local));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, y, T * h, ReduceOp::kSum));
  return d.AddPositionForward(position, y, T, shape.seq, h);
}

absl::Status EmbeddingBackward(Device& d, const LayerShape& shape, const int32_t* tokens,
                               const float* dy, float* dword, float* dposition,
                               int64_t vocab_begin, int64_t vocab_local) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  SL_RETURN_IF_ERROR(d.EmbeddingBackward(tokens, dy, dword, T, h, vocab_begin, vocab_local));
  return d.AddPositionBackward(dy, dposition, T, shape.seq, h);
}

absl::Status HeadForward(Device& d, const LayerShape& shape, DeviceBuffer<float> x,
                         const int32_t* targets, const float* ln_weight, const float* ln_bias,
                         const float* word, int64_t vocab_begin, int64_t vocab_local,
                         Collectives& tp, HeadActivations* a, float* token_loss) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  a->x = std::move(x);
  a->targets = targets;
  SL_RETURN_IF_ERROR(a->ln.Resize(d, T * h));
  SL_RETURN_IF_ERROR(a->ln_mean.Resize(d, T));
  SL_RETURN_IF_ERROR(a->ln_rstd.Resize(d, T));
  SL_RETURN_IF_ERROR(d.LayerNormForward(a->x.data(), ln_weight, ln_bias, a->ln.data(),
                                        a->ln_mean.data(), a->ln_rstd.data(), T, h));
  // Logits of this rank's vocabulary slice against the tied embedding.
  SL_RETURN_IF_ERROR(a->logits.Resize(d, T * vocab_local));
  SL_RETURN_IF_ERROR(
      d.LinearForward(a->ln.data(), word, nullptr, a->logits.data(), T, h, vocab_local));
  SL_RETURN_IF_ERROR(a->row_max.Resize(d, T));
  SL_RETURN_IF_ERROR(d.LocalRowMax(a->logits.data(), a->row_max.data(), T, vocab_local));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, a->row_max.data(), T, ReduceOp::kMax));
  // sum_exp and the target's logit travel in one all-reduce.
  SL_RETURN_IF_ERROR(a->sums.Resize(d, 2 * T));
  SL_RETURN_IF_ERROR(d.LocalSumExpAndTarget(a->logits.data(), a->row_max.data(),
                                            a->targets, a->sums.data(),
                                            a->sums.data() + T, T, vocab_begin, vocab_local));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, a->sums.data(), 2 * T, ReduceOp::kSum));
  return d.TokenLoss(a->row_max.data(), a->sums.data(), a->sums.data() + T, token_loss, T);
}

double MeanLoss(const float* token_loss, int64_t T) {
  double total = 0;
  for (int64_t t = 0; t < T; ++t) total += token_loss[t];
  return total / static_cast<double>(T);
}

absl::Status HeadBackward(Device& d, const LayerShape& shape, const float* ln_weight,
                          const float* word, int64_t vocab_begin, int64_t vocab_local,
                          float loss_scale, const HeadActivations& a, Collectives& tp,
                          float* dln_weight, float* dln_bias, float* dword, float* dx) {
  const int64_t T = shape.tokens(), h = shape.hidden;
  DeviceBuffer<float> dlogits;
  SL_RETURN_IF_ERROR(dlogits.Resize(d, T * vocab_local));
  SL_RETURN_IF_ERROR(d.CrossEntropyBackward(a.logits.data(), a.row_max.data(), a.sum_exp(),
                                            a.targets, loss_scale / static_cast<float>(T),
                                            dlogits.data(), T, vocab_begin, vocab_local));
  DeviceBuffer<float> dln;
  SL_RETURN_IF_ERROR(dln.Resize(d, T * h));
  SL_RETURN_IF_ERROR(d.LinearBackward(a.ln.data(), word, dlogits.data(), dln.data(), dword,
                                      nullptr, T, h, vocab_local));
  SL_RETURN_IF_ERROR(tp.AllReduce(d, dln.data(), T * h, ReduceOp::kSum));
  return d.LayerNormBackward(a.x.data(), ln_weight, a.ln_mean.data(), a.ln_rstd.data(),
                             dln.data(), dx, dln_weight, dln_bias, T, h);
}

absl::Status LastTokenLogits(Device& d, const LayerShape& shape, const HeadActivations& a,
                             int64_t vocab_size, Collectives& tp, std::vector<float>* out) {
  const int64_t vocab_local = vocab_size / tp.size();
  std::vector<float> mine(shape.batch * vocab_local);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const float* row = a.logits.data() + ((b + 1) * shape.seq - 1) * vocab_local;
    SL_RETURN_IF_ERROR(
        d.CopyToHost(mine.data() + b * vocab_local, row, sizeof(float) * vocab_local));
  }
  std::vector<float> gathered(tp.size() * mine.size());
  if (tp.size() == 1) {
    gathered = mine;
  } else if (tp.StagesHostMemory(&d)) {  // a backend on device memory (NCCL)
    DeviceBuffer<float> in, all;
    SL_RETURN_IF_ERROR(in.Resize(d, static_cast<int64_t>(mine.size())));
    SL_RETURN_IF_ERROR(all.Resize(d, static_cast<int64_t>(gathered.size())));
    SL_RETURN_IF_ERROR(d.CopyToDevice(in.data(), mine.data(), in.bytes()));
    SL_RETURN_IF_ERROR(
        tp.Wait(tp.backend()->AllGather(in.data(), mine.size(), all.data(), DType::kFloat32)));
    SL_RETURN_IF_ERROR(d.CopyToHost(gathered.data(), all.data(), all.bytes()));
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

#undef SL_RETURN_IF_ERROR

}  // namespace shardline::worker::train

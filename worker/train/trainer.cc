#include "worker/train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plan/model.h"
#include "plan/pipeline.h"
#include "plan/topology.h"
#include "plan/zero.h"
#include "worker/train/bf16_device.h"
#include "worker/train/device.h"
#include "worker/train/host_memory.h"
#include "worker/train/init.h"
#include "worker/train/model.h"
#include "worker/train/ops.h"

namespace shardline::worker::train {
namespace {

#define SL_RETURN_IF_ERROR(expr)               \
  do {                                         \
    absl::Status sl_status_ = (expr);          \
    if (!sl_status_.ok()) return sl_status_;   \
  } while (0)

// One ZeRO unit of this rank's model slice and every state kept for it.
// The state lives on the state device (Impl::state, trainer.h "Where the
// state lives").
struct UnitState {
  plan::Unit unit;
  int64_t shard = 0;  // padded / dp: elements of each dp rank's shard
  // The whole unit (padded). Always present for zero_stage 0-2; under
  // ZeRO-3 only between Acquire and Release.
  DeviceBuffer<float> params;
  int acquired = 0;                   // ZeRO-3 users of `params`
  DeviceBuffer<float> shard_params;   // ZeRO-3: this dp rank's shard, [shard]
  DeviceBuffer<float> grads;          // whole unit, during a step (lazy, zeroed when made)
  DeviceBuffer<float> shard_grads;    // ZeRO-2/3 after the reduce-scatter, [shard]
  DeviceBuffer<float> exp_avg, exp_avg_sq;  // AdamW: [padded] at stage 0, else [shard]
  DeviceBuffer<uint8_t> decay;        // [padded]: 1 where weight decay applies
  DeviceBuffer<uint8_t> norm;         // [padded]: 1 where this rank counts the element in the norm
  std::map<std::string, int64_t> offset;  // parameter name -> first element in the unit
  // A state device whose memory is not host memory: host copies of the
  // checkpointed state (params or shard_params, and the moments), filled by
  // Slices(save) and read back by FinishRestore, in the host memory the
  // device copies fastest (Device::AllocHostBytes: pinned on a GPU). Kept
  // once made: page-locking memory is slow, and the next checkpoint reuses
  // them.
  HostBuffer<float> host_params, host_exp_avg, host_exp_avg_sq;
  // Only when the state is on the host and the math on a device without host
  // memory (the ZeRO-Offload path; else the math runs on `params` and
  // `grads` themselves):
  DeviceBuffer<float> device_params;  // [padded]: a copy of `params`
  bool device_params_fresh = false;   // device_params == params (this step)
  DeviceBuffer<float> device_grads;   // [padded]: this step's gradients, not yet downloaded
  bool device_grads_live = false;     // device_grads zeroed and in use this step
};

// What a chunk runs: its units, by role.
struct ChunkLayout {
  int chunk = 0;
  int embedding_unit = -1;        // chunk 0
  std::vector<int> layer_units;   // forward order
  std::vector<int64_t> layers;    // global layer index of each
  int head_unit = -1;             // last chunk: final LayerNorm (+ tied copy)
};

// A forward's saved state until its backward.
struct Stash {
  const int32_t* tokens = nullptr;  // chunk 0, [batch * seq] on the device (PassInputs')
  std::vector<LayerActivations> layers;
  HeadActivations head;
};

// One pass's token ids and targets for all its micro-batches, uploaded to
// the compute device at once (one host wait, at the start of the pass, not
// one per micro-batch), and the per-token losses its heads write, read back
// once.
struct PassInputs {
  DeviceBuffer<int32_t> tokens, targets;  // [micro_batches, T]
  DeviceBuffer<float> token_loss;         // [micro_batches, T]
  int64_t T = 0;                          // tokens per micro-batch
  const int32_t* tokens_of(int mb) const { return tokens.data() + mb * T; }
  const int32_t* targets_of(int mb) const { return targets.data() + mb * T; }
  float* loss_of(int mb) { return token_loss.data() + mb * T; }
};

// A posted send and the buffer it reads.
struct PendingSend {
  std::shared_ptr<Work> work;
  std::shared_ptr<DeviceBuffer<float>> buffer;
};

}  // namespace

class Trainer::Impl {
 public:
  // Precision bf16: rounds as a bf16 model would, over the options' device.
  // First, so it is destroyed last (every buffer below may be its memory).
  std::unique_ptr<Bf16Device> bf16_device;
  TrainingOptions options;
  RankGroups groups;
  const Corpus* corpus = nullptr;
  plan::PipelinePlan pipeline;
  plan::PipelineSchedule schedule;
  std::vector<plan::ParameterSpec> specs;
  std::map<std::string, const plan::ParameterSpec*> spec_of;
  std::vector<UnitState> units;
  std::map<int, ChunkLayout> chunks;  // this pp rank's chunks
  int word_unit = -1;                 // unit holding the head's word embedding
  Device* device = nullptr;           // options.device or CpuDevice::Default() (not owned),
                                      // or bf16_device over it
  // Where the parameters, gradients, moments, ZeRO shards and pipeline
  // messages live: `device` itself (resident), or host memory
  // (CpuDevice::Default()) on the ZeRO-Offload path. Not owned.
  Device* state = nullptr;
  absl::Duration comm_time;
  Collectives tp{nullptr, &comm_time}, dp{nullptr, &comm_time}, pp{nullptr, &comm_time},
      embedding{nullptr, &comm_time};
  int64_t step = 0;
  // Between a rank's own consecutive chunks (pp == 1, vpp > 1), by tag.
  std::map<uint32_t, DeviceBuffer<float>> local_handoff;
  std::vector<PendingSend> pending_sends;
  // Data-parallel gradient all-reduces started during the backward, by unit
  // (StartGradReduce), and this step's backward passes done per chunk.
  std::map<int, std::shared_ptr<Work>> grad_reduces;
  // ZeRO-3 all-gathers started ahead of their unit's use (Prefetch), by unit.
  std::map<int, std::shared_ptr<Work>> prefetches;
  std::map<int, int> backwards_done;
  // RestoreSlices handed out host copies that FinishRestore must upload.
  bool restore_pending = false;
  // The last SaveSlicesAsync's device -> host copies (null before the
  // first), and whether the state may be written before the device is told
  // to order that after them (OrderAfterHostCopies).
  std::shared_ptr<HostCopies> saved_copies;
  bool copies_unordered = false;

  ~Impl() {
    DrainGradReduces();
    DrainPrefetches();
    DrainSettles();
    // The copies write into host buffers freed below (also those of a save
    // that failed before it recorded them).
    if (saved_copies == nullptr && copies_unordered) {
      absl::StatusOr<std::shared_ptr<HostCopies>> pending = sd().RecordHostCopies();
      if (pending.ok()) saved_copies = *std::move(pending);
    }
    if (saved_copies != nullptr) saved_copies->Wait().IgnoreError();
  }

  // Before the first write to the checkpointed state after SaveSlicesAsync:
  // the device runs it after the copies have read their sources.
  absl::Status OrderStateWrites() {
    if (!copies_unordered) return absl::OkStatus();
    copies_unordered = false;
    return sd().OrderAfterHostCopies();
  }

  int tp_rank() const { return groups.coordinates.tp_rank; }
  int dp_rank() const { return groups.coordinates.dp_rank; }
  int pp_rank() const { return groups.coordinates.pp_rank; }
  int num_chunks() const { return static_cast<int>(pipeline.chunks.size()); }
  int zero() const { return options.parallel.zero_stage; }
  int64_t vocab_local() const { return options.model.vocab_size / options.parallel.tp; }
  int64_t vocab_begin() const { return tp_rank() * vocab_local(); }

  LayerShape Shape(int64_t batch) const {
    const plan::GptConfig& m = options.model;
    LayerShape s;
    s.batch = batch;
    s.seq = m.seq_length;
    s.hidden = m.hidden_size;
    s.heads = m.num_heads / options.parallel.tp;
    s.head_dim = m.hidden_size / m.num_heads;
    s.ffn = m.ffn() / options.parallel.tp;
    return s;
  }

  // --- Units -------------------------------------------------------------

  // Whether the state lives where the math runs (no staging copies).
  bool resident() const { return state == device; }
  Device& sd() { return *state; }

  // The state device has finished every call issued so far, and an error of
  // a kernel surfaces here. Free on host memory.
  absl::Status StateSettled() {
    return state->host_memory() ? absl::OkStatus() : state->Synchronize();
  }

  // Every group's operations that the state device's stream was ordered
  // after (Collectives::Finish) are waited for on the host, and their errors
  // returned: before the host trusts anything read back from the device.
  absl::Status SettleAll() {
    absl::Status first;
    for (Collectives* c : {&tp, &dp, &pp, &embedding}) {
      absl::Status s = c->Settle();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
  // After a failed pass (or at destruction): the same, errors ignored (the
  // pass has returned its own), so no operation still writes into buffers
  // being reused or freed.
  void DrainSettles() { SettleAll().IgnoreError(); }

  // Unit s's whole-unit gradients, allocated and zeroed at first use in a step.
  absl::Status EnsureGrads(UnitState& s) {
    if (!s.grads.empty()) return absl::OkStatus();
    SL_RETURN_IF_ERROR(HostAlloc(s.grads.Resize(sd(), s.unit.padded)));
    return sd().Zero(s.grads.data(), s.grads.bytes());
  }

  // A failed allocation of host memory is the trainer's host-memory
  // shortage (Create and TrainStep turn std::bad_alloc into
  // HostOutOfMemoryError); other errors pass.
  absl::Status HostAlloc(absl::Status s) {
    if (absl::IsResourceExhausted(s) && state->host_memory()) throw std::bad_alloc();
    return s;
  }

  // Makes unit u's whole parameters available until Release: ZeRO-3
  // all-gathers them into `params`; with `to_device` on the offload path,
  // they are also uploaded to `device_params` (once per step:
  // ResetDeviceState drops the copies).
  absl::Status Acquire(int u, bool to_device = true) {
    UnitState& s = units[u];
    if (auto it = prefetches.find(u); it != prefetches.end()) {
      // Prefetch started the gather and holds the unit: the hold is ours.
      std::shared_ptr<Work> work = std::move(it->second);
      prefetches.erase(it);
      SL_RETURN_IF_ERROR(dp.Finish(sd(), std::move(work)));
    } else if (zero() == 3 && s.acquired++ == 0) {
      SL_RETURN_IF_ERROR(HostAlloc(s.params.Resize(sd(), s.unit.padded)));
      if (dp.size() == 1) {
        SL_RETURN_IF_ERROR(sd().Copy(s.params.data(), s.shard_params.data(), s.shard_params.bytes()));
      } else {
        SL_RETURN_IF_ERROR(dp.OnDevice(sd(), [&] {
          return dp.backend()->AllGather(s.shard_params.data(), s.shard, s.params.data(),
                                         DType::kFloat32);
        }));
      }
    }
    if (!to_device || resident() || s.device_params_fresh) return absl::OkStatus();
    SL_RETURN_IF_ERROR(s.device_params.Resize(*device, s.unit.padded));
    SL_RETURN_IF_ERROR(
        device->CopyToDevice(s.device_params.data(), s.params.data(), s.device_params.bytes()));
    s.device_params_fresh = true;
    return absl::OkStatus();
  }

  // ZeRO-3: starts unit u's all-gather now, so that it runs while the
  // current unit computes; the Acquire that uses it waits for it. Every dp
  // rank of a stage runs the same schedule, so they issue these gathers in
  // the same order. Nothing to do when the unit is already whole or on its
  // way, or without data parallelism.
  absl::Status Prefetch(int u) {
    if (u < 0 || zero() != 3 || dp.size() == 1) return absl::OkStatus();
    UnitState& s = units[u];
    if (s.acquired > 0 || prefetches.count(u) > 0) return absl::OkStatus();
    SL_RETURN_IF_ERROR(HostAlloc(s.params.Resize(sd(), s.unit.padded)));
    // After the device's work so far (the block may be one it just freed);
    // the device is ordered after the gather where the unit is acquired.
    SL_RETURN_IF_ERROR(dp.Order(sd()));
    prefetches[u] = dp.backend()->AllGather(s.shard_params.data(), s.shard, s.params.data(),
                                            DType::kFloat32);
    s.acquired = 1;  // held for the Acquire that takes it over
    return absl::OkStatus();
  }
  // After a failed step (or at destruction): waits for every prefetch still
  // in flight (its error is the step's, or moot) and drops its hold, so no
  // backend thread writes into parameters being freed.
  void DrainPrefetches() {
    for (auto& [u, work] : prefetches) {
      work->Wait().IgnoreError();
      units[u].acquired = 0;
      units[u].params.Reset();
    }
    prefetches.clear();
  }

  void Release(int u) {
    UnitState& s = units[u];
    if (zero() < 3) return;
    if (--s.acquired > 0) return;
    s.params.Reset();
    s.device_params.Reset();
    s.device_params_fresh = false;
  }

  // At the start of every step, evaluation and sample: the host parameters
  // may have changed since (an optimizer step, a restore), so the device
  // copies are uploaded again before use, no device gradient is live, no
  // prefetch is in flight and no ZeRO-3 unit is held (even after a step
  // that failed half-way). (SaveSlices' host copies are kept: the next
  // pass changes the state they copied, not them.)
  void ResetDeviceState() {
    DrainPrefetches();  // a failed pass's
    DrainSettles();
    for (UnitState& s : units) {
      s.device_params_fresh = false;
      s.device_grads_live = false;
      // No unit is held between passes; a failed pass may have left one.
      if (zero() == 3 && s.acquired > 0) {
        s.acquired = 0;
        s.params.Reset();
      }
    }
  }

  // Parameter `name` of unit u (acquired) where the math runs: the state
  // itself when resident, else the device copy.
  float* Param(int u, const std::string& name) {
    UnitState& s = units[u];
    return (resident() ? s.params.data() : s.device_params.data()) + s.offset.at(name);
  }
  // The same for gradients (zeroed at first use in a step). On the offload
  // path, DownloadGradients adds them into the state's buffer (StateGrad)
  // after the step's last backward.
  absl::StatusOr<float*> Grad(int u, const std::string& name) {
    UnitState& s = units[u];
    if (resident()) return StateGrad(u, name);
    if (!s.device_grads_live) {
      SL_RETURN_IF_ERROR(s.device_grads.Resize(*device, s.unit.padded));
      SL_RETURN_IF_ERROR(device->Zero(s.device_grads.data(), s.device_grads.bytes()));
      s.device_grads_live = true;
    }
    return s.device_grads.data() + s.offset.at(name);
  }
  absl::StatusOr<float*> StateGrad(int u, const std::string& name) {
    UnitState& s = units[u];
    SL_RETURN_IF_ERROR(EnsureGrads(s));
    return s.grads.data() + s.offset.at(name);
  }

  // Adds every unit's device gradients of this step into its state gradient
  // buffer (the offload path only).
  absl::Status DownloadGradients() {
    if (resident()) return absl::OkStatus();
    std::vector<float> host;
    for (UnitState& s : units) {
      if (!s.device_grads_live) continue;
      host.resize(s.unit.padded);
      SL_RETURN_IF_ERROR(
          device->CopyToHost(host.data(), s.device_grads.data(), s.device_grads.bytes()));
      SL_RETURN_IF_ERROR(EnsureGrads(s));
      SL_RETURN_IF_ERROR(sd().AddInPlace(host.data(), s.grads.data(), s.unit.padded));
      s.device_grads_live = false;
    }
    return absl::OkStatus();
  }

  // Host -> a new device buffer of `count` elements. The copy waits for the
  // device's stream, and so for every operation the stream was ordered
  // after: those are waited for first (SettleAll), so a stuck one is seen
  // as a collective and its error is its own.
  template <typename T>
  absl::Status Upload(const T* host, int64_t count, DeviceBuffer<T>* out) {
    SL_RETURN_IF_ERROR(SettleAll());
    SL_RETURN_IF_ERROR(out->Resize(*device, count));
    return device->CopyToDevice(out->data(), host, out->bytes());
  }

  // Unit u's layer pointers where the math runs (Param / Grad). For
  // gradients this may fail (device allocation); *status holds the error.
  LayerParams LayerPointers(int u, int64_t layer, bool grads, absl::Status* status = nullptr) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    auto at = [&](const char* suffix) -> float* {
      const std::string name = p + suffix;
      if (!grads) return Param(u, name);
      absl::StatusOr<float*> g = Grad(u, name);
      if (!g.ok()) {
        if (status != nullptr && status->ok()) *status = g.status();
        return nullptr;
      }
      return *g;
    };
    LayerParams l;
    l.ln1_weight = at("input_layernorm.weight");
    l.ln1_bias = at("input_layernorm.bias");
    l.qkv_weight = at("attention.qkv.weight");
    l.qkv_bias = at("attention.qkv.bias");
    l.dense_weight = at("attention.dense.weight");
    l.dense_bias = at("attention.dense.bias");
    l.ln2_weight = at("post_attention_layernorm.weight");
    l.ln2_bias = at("post_attention_layernorm.bias");
    l.fc1_weight = at("mlp.fc1.weight");
    l.fc1_bias = at("mlp.fc1.bias");
    l.fc2_weight = at("mlp.fc2.weight");
    l.fc2_bias = at("mlp.fc2.bias");
    return l;
  }

  static constexpr char kWord[] = "embedding.word_embeddings.weight";
  static constexpr char kPosition[] = "embedding.position_embeddings.weight";

  // --- Point-to-point between chunks ---------------------------------------

  // Tag of the message crossing the boundary between chunk c and c + 1 for
  // micro-batch mb: activations forward (direction 0), gradients back (1).
  uint32_t Tag(int mb, int boundary, int direction) const {
    return static_cast<uint32_t>((mb * num_chunks() + boundary) * 2 + direction);
  }

  // Pipeline messages are buffers of the state device: the activations
  // themselves when resident, host copies on the offload path.
  absl::Status SendTo(int chunk, uint32_t tag, DeviceBuffer<float> data) {
    const int peer = pipeline.chunks[chunk].pp_rank;
    if (peer == pp_rank()) {
      local_handoff[tag] = std::move(data);
      return absl::OkStatus();
    }
    // After the device has written the message. The device does not wait
    // for the send (a neighbour's matching receive may come later in its
    // schedule); the buffer is kept until the send is seen to finish.
    SL_RETURN_IF_ERROR(pp.Order(sd()));
    auto buffer = std::make_shared<DeviceBuffer<float>>(std::move(data));
    std::shared_ptr<Work> w = pp.backend()->Send(buffer->data(), static_cast<size_t>(buffer->size()),
                                                 DType::kFloat32, peer, tag);
    // Drop sends already done; keep the rest (and their buffers) alive.
    pending_sends.erase(std::remove_if(pending_sends.begin(), pending_sends.end(),
                                       [](const PendingSend& p) { return p.work->IsCompleted(); }),
                        pending_sends.end());
    pending_sends.push_back({std::move(w), std::move(buffer)});
    return absl::OkStatus();
  }

  // Receives `count` elements into *data (a state-device buffer).
  absl::Status RecvFrom(int chunk, uint32_t tag, int64_t count, DeviceBuffer<float>* data) {
    const int peer = pipeline.chunks[chunk].pp_rank;
    if (peer == pp_rank()) {
      auto it = local_handoff.find(tag);
      if (it == local_handoff.end() || it->second.size() != count)
        return absl::InternalError(absl::StrCat("pipeline: no local message with tag ", tag));
      *data = std::move(it->second);
      local_handoff.erase(it);
      return absl::OkStatus();
    }
    SL_RETURN_IF_ERROR(HostAlloc(data->Resize(sd(), count)));
    // The block may have just been freed by a kernel still queued on the
    // device; the backend writes it from its own stream (OnDevice orders it
    // after the device's work, and the device after it).
    return pp.OnDevice(sd(), [&] {
      return pp.backend()->Recv(data->data(), static_cast<size_t>(count), DType::kFloat32, peer,
                                tag);
    });
  }

  // Sends device activations x (chunk c's output or input gradient) on:
  // itself when resident, else a host copy.
  absl::Status SendActivations(int chunk, uint32_t tag, DeviceBuffer<float> x) {
    if (resident()) return SendTo(chunk, tag, std::move(x));
    DeviceBuffer<float> host;
    SL_RETURN_IF_ERROR(HostAlloc(host.Resize(sd(), x.size())));
    SL_RETURN_IF_ERROR(device->CopyToHost(host.data(), x.data(), x.bytes()));
    return SendTo(chunk, tag, std::move(host));
  }
  // Receives `count` activations into *x (a compute-device buffer).
  absl::Status RecvActivations(int chunk, uint32_t tag, int64_t count, DeviceBuffer<float>* x) {
    if (resident()) return RecvFrom(chunk, tag, count, x);
    DeviceBuffer<float> host;
    SL_RETURN_IF_ERROR(RecvFrom(chunk, tag, count, &host));
    SL_RETURN_IF_ERROR(x->Resize(*device, count));
    return device->CopyToDevice(x->data(), host.data(), x->bytes());
  }

  // At the end of a pass: every send done, and every operation the device
  // was ordered after waited for (SettleAll).
  absl::Status FinishPass() {
    for (PendingSend& p : pending_sends) {
      if (absl::Status s = pp.Wait(p.work); !s.ok()) return s;
    }
    pending_sends.clear();
    return SettleAll();
  }

  // --- Overlapping the data-parallel gradient reduction with the backward --

  // Whether a layer unit's dp all-reduce may start as soon as its last
  // backward of the step is done (as torch DDP's gradient buckets do): its
  // gradients are then final, and layer units are never shared with another
  // chunk (the tied word embedding is: it waits for the embedding group's
  // all-reduce). Host memory only (a device's gradients reach the host
  // buffers after the whole backward) and ZeRO 0-1 (an all-reduce of the
  // whole unit; ZeRO-2/3 reduce-scatter after the backward as before).
  bool OverlapsGradReduce() const {
    return resident() && device->host_memory() && zero() <= 1 && dp.size() > 1 &&
           dp.backend() != nullptr;
  }
  // Starts unit u's all-reduce on the dp group's ordered stream: every dp
  // rank of this pipeline stage runs the same schedule, so they issue these
  // in the same order; the dp group has no other collective during a
  // backward at ZeRO 0-1. The gradients stay untouched until it is waited
  // for (TrainStep's dp reductions, DrainGradReduces).
  absl::Status StartGradReduce(int u) {
    UnitState& s = units[u];
    SL_RETURN_IF_ERROR(EnsureGrads(s));
    grad_reduces[u] = dp.backend()->AllReduce(s.grads.data(), static_cast<size_t>(s.unit.padded),
                                              DType::kFloat32, ReduceOp::kAvg);
    return absl::OkStatus();
  }
  // The state device's later calls see what every operation of `works` (on
  // the dp group) wrote (Collectives::Finish: waited for on the host, or the
  // device's stream ordered after it and the host's wait left to Settle).
  // After a failure the rest are waited for, so none still writes into
  // buffers the caller frees; returns the first error.
  absl::Status FinishAll(std::vector<std::shared_ptr<Work>>* works) {
    absl::Status first;
    for (std::shared_ptr<Work>& w : *works) {
      absl::Status s = first.ok() ? dp.Finish(sd(), std::move(w)) : w->Wait();
      if (first.ok() && !s.ok()) first = s;
    }
    works->clear();
    return first;
  }
  // After a failed step (or at destruction): waits for every started
  // all-reduce, whose error the step has already returned or will not
  // matter, so no Gloo thread writes into gradients being reused or freed.
  void DrainGradReduces() {
    for (auto& [u, work] : grad_reduces) work->Wait().IgnoreError();
    grad_reduces.clear();
  }

  // --- Forward and backward of one chunk ----------------------------------

  // Runs chunk c forward for one micro-batch. tokens/targets are DEVICE
  // [batch * seq] (tokens used by chunk 0, targets by the last chunk; they
  // must outlive the stash and `head`). With `stash` null nothing is kept
  // for a backward. The last chunk writes each token's loss to
  // token_loss[batch * seq] (device) and, when `head` is given, leaves its
  // activations there. Activations live on the device; pipeline messages
  // travel in state-device buffers (host copies on the offload path).
  absl::Status Forward(int mb, int c, int64_t batch, const int32_t* tokens, const int32_t* targets,
                       Stash* stash, float* token_loss, HeadActivations* head) {
    const ChunkLayout& layout = chunks.at(c);
    const LayerShape shape = Shape(batch);
    const int64_t n = shape.tokens() * shape.hidden;
    DeviceBuffer<float> x;
    if (layout.embedding_unit >= 0) {
      SL_RETURN_IF_ERROR(x.Resize(*device, n));
      const int u = layout.embedding_unit;
      SL_RETURN_IF_ERROR(Acquire(u));
      absl::Status s = EmbeddingForward(*device, shape, tokens, Param(u, kWord),
                                        Param(u, kPosition), vocab_begin(), vocab_local(), tp,
                                        x.data());
      Release(u);
      SL_RETURN_IF_ERROR(s);
      if (stash != nullptr) stash->tokens = tokens;
    } else {
      SL_RETURN_IF_ERROR(RecvActivations(c - 1, Tag(mb, c - 1, 0), n, &x));
    }
    LayerActivations scratch;
    if (stash != nullptr) stash->layers.resize(layout.layer_units.size());
    for (size_t i = 0; i < layout.layer_units.size(); ++i) {
      const int u = layout.layer_units[i];
      SL_RETURN_IF_ERROR(Acquire(u));
      // The next unit's gather runs while this one computes.
      SL_RETURN_IF_ERROR(Prefetch(i + 1 < layout.layer_units.size() ? layout.layer_units[i + 1]
                                                                      : layout.head_unit));
      DeviceBuffer<float> y;
      absl::Status s = LayerForward(*device, shape, LayerPointers(u, layout.layers[i], false), tp,
                                    std::move(x), &y,
                                    stash != nullptr ? &stash->layers[i] : &scratch);
      Release(u);
      SL_RETURN_IF_ERROR(s);
      x = std::move(y);
    }
    if (layout.head_unit < 0) return SendActivations(c + 1, Tag(mb, c, 0), std::move(x));

    const int u = layout.head_unit;
    SL_RETURN_IF_ERROR(AcquireHead(u));
    HeadActivations local;
    HeadActivations* saved = stash != nullptr ? &stash->head : head != nullptr ? head : &local;
    absl::Status s = HeadForward(*device, shape, std::move(x), targets,
                                 Param(u, "final_layernorm.weight"),
                                 Param(u, "final_layernorm.bias"), Param(word_unit, kWord),
                                 vocab_begin(), vocab_local(), tp, saved, token_loss);
    ReleaseHead(u);
    return s;
  }

  absl::Status AcquireHead(int u) {
    if (absl::Status s = Acquire(u); !s.ok()) return s;
    return word_unit != u ? Acquire(word_unit) : absl::OkStatus();
  }
  void ReleaseHead(int u) {
    if (word_unit != u) Release(word_unit);
    Release(u);
  }

  absl::Status Backward(int mb, int c, Stash& stash, float loss_scale) {
    const ChunkLayout& layout = chunks.at(c);
    const LayerShape shape = Shape(options.parallel.micro_batch_size);
    const int64_t n = shape.tokens() * shape.hidden;
    DeviceBuffer<float> dy, dx;
    if (layout.head_unit >= 0) {
      SL_RETURN_IF_ERROR(dy.Resize(*device, n));
      const int u = layout.head_unit;
      SL_RETURN_IF_ERROR(AcquireHead(u));
      absl::StatusOr<float*> dln_weight = Grad(u, "final_layernorm.weight");
      absl::StatusOr<float*> dln_bias = Grad(u, "final_layernorm.bias");
      absl::StatusOr<float*> dword = Grad(word_unit, kWord);
      absl::Status s = !dln_weight.ok() ? dln_weight.status()
                       : !dln_bias.ok() ? dln_bias.status()
                       : !dword.ok()    ? dword.status()
                                        : absl::OkStatus();
      if (s.ok()) {
        s = HeadBackward(*device, shape, Param(u, "final_layernorm.weight"),
                         Param(word_unit, kWord), vocab_begin(), vocab_local(), loss_scale,
                         stash.head, tp, *dln_weight, *dln_bias, *dword, dy.data());
      }
      ReleaseHead(u);
      SL_RETURN_IF_ERROR(s);
    } else {
      SL_RETURN_IF_ERROR(RecvActivations(c + 1, Tag(mb, c, 1), n, &dy));
    }
    if (!layout.layer_units.empty()) SL_RETURN_IF_ERROR(dx.Resize(*device, n));
    const bool last_backward = ++backwards_done[c] == options.parallel.micro_batches;
    for (size_t k = layout.layer_units.size(); k-- > 0;) {
      const int u = layout.layer_units[k];
      SL_RETURN_IF_ERROR(Acquire(u));
      if (k > 0) SL_RETURN_IF_ERROR(Prefetch(layout.layer_units[k - 1]));
      absl::Status s;
      const LayerParams grads = LayerPointers(u, layout.layers[k], true, &s);
      if (s.ok()) {
        s = LayerBackward(*device, shape, LayerPointers(u, layout.layers[k], false), grads, tp,
                          stash.layers[k], dy.data(), dx.data());
      }
      Release(u);
      SL_RETURN_IF_ERROR(s);
      if (last_backward && OverlapsGradReduce()) SL_RETURN_IF_ERROR(StartGradReduce(u));
      std::swap(dx, dy);
    }
    if (layout.embedding_unit >= 0) {
      const int u = layout.embedding_unit;
      absl::StatusOr<float*> dword = Grad(u, kWord);
      if (!dword.ok()) return dword.status();
      absl::StatusOr<float*> dposition = Grad(u, kPosition);
      if (!dposition.ok()) return dposition.status();
      return EmbeddingBackward(*device, shape, stash.tokens, dy.data(), *dword,
                               *dposition, vocab_begin(), vocab_local());
    }
    return SendActivations(c - 1, Tag(mb, c - 1, 1), std::move(dy));
  }

  // --- Data ------------------------------------------------------------------

  // Tokens and targets of this dp rank's micro-batch mb of the global batch
  // starting at sample `first`.
  void Batch(bool validation, int64_t first, int mb, std::vector<int32_t>* tokens,
             std::vector<int32_t>* targets) const {
    const int64_t mbs = options.parallel.micro_batch_size, seq = options.model.seq_length;
    tokens->resize(mbs * seq);
    targets->resize(mbs * seq);
    const int64_t base = first + (static_cast<int64_t>(dp_rank()) * options.parallel.micro_batches + mb) * mbs;
    for (int64_t b = 0; b < mbs; ++b) {
      if (validation) {
        corpus->ValidationSample(base + b, seq, tokens->data() + b * seq, targets->data() + b * seq);
      } else {
        corpus->TrainSample(options.seed, base + b, seq, tokens->data() + b * seq,
                            targets->data() + b * seq);
      }
    }
  }

  // Every micro-batch's tokens and targets of the pass at global sample
  // `first` (Batch), uploaded at once, and room for their token losses.
  absl::Status UploadInputs(bool validation, int64_t first, PassInputs* in) {
    const int m = options.parallel.micro_batches;
    in->T = options.parallel.micro_batch_size * options.model.seq_length;
    std::vector<int32_t> tokens, targets, all_tokens, all_targets;
    for (int mb = 0; mb < m; ++mb) {
      Batch(validation, first, mb, &tokens, &targets);
      all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end());
      all_targets.insert(all_targets.end(), targets.begin(), targets.end());
    }
    SL_RETURN_IF_ERROR(Upload(all_tokens.data(), m * in->T, &in->tokens));
    SL_RETURN_IF_ERROR(Upload(all_targets.data(), m * in->T, &in->targets));
    return in->token_loss.Resize(*device, m * in->T);
  }
  // This rank's share of the pass's mean loss, to be summed over tp, dp and
  // pp: on tp rank 0 of the last stage, each micro-batch's mean token loss
  // (in double, MeanLoss) summed in micro-batch order, over micro-batches
  // times dp ranks; 0 elsewhere. There it reads the token losses back (a
  // host wait for the device): call where the host waits anyway.
  absl::StatusOr<float> PassLossShare(const PassInputs& in) {
    if (chunks.count(num_chunks() - 1) == 0 || tp_rank() != 0) return 0.0f;
    const int m = options.parallel.micro_batches;
    std::vector<float> host(static_cast<size_t>(m * in.T));
    SL_RETURN_IF_ERROR(device->CopyToHost(host.data(), in.token_loss.data(), in.token_loss.bytes()));
    double sum = 0;
    for (int mb = 0; mb < m; ++mb) sum += MeanLoss(host.data() + mb * in.T, in.T);
    return static_cast<float>(sum / (static_cast<double>(m) * dp.size()));
  }

  // --- The step ---------------------------------------------------------------

  absl::StatusOr<StepStats> TrainStep(bool request_checkpoint) {
    const absl::Time start = absl::Now();
    comm_time = absl::ZeroDuration();
    DrainGradReduces();  // a failed step's
    backwards_done.clear();
    ResetDeviceState();
    const int m = options.parallel.micro_batches;
    const int64_t global_batch = options.parallel.global_batch();
    const int64_t first = step * global_batch;
    PassInputs inputs;  // before the stashes, which point into it
    if (absl::Status s = UploadInputs(false, first, &inputs); !s.ok()) return s;
    std::map<std::pair<int, int>, Stash> stashes;
    const float loss_scale = 1.0f / static_cast<float>(m);
    for (const plan::Action& a : schedule.ranks[pp_rank()].actions) {
      const std::pair<int, int> key{a.micro_batch, a.chunk};
      if (a.kind == plan::Action::Kind::kForward) {
        const int mb = a.micro_batch;
        absl::Status s = Forward(mb, a.chunk, options.parallel.micro_batch_size,
                                 inputs.tokens_of(mb), inputs.targets_of(mb), &stashes[key],
                                 inputs.loss_of(mb), nullptr);
        if (!s.ok()) return s;
      } else {
        absl::Status s = Backward(a.micro_batch, a.chunk, stashes.at(key), loss_scale);
        stashes.erase(key);
        if (!s.ok()) return s;
      }
    }
    if (absl::Status s = FinishPass(); !s.ok()) return s;
    // From here on everything runs on the state device: the compute device
    // when resident, else the host (ZeRO-Offload style).
    if (absl::Status s = DownloadGradients(); !s.ok()) return s;

    // Tied word embedding: first and last stage add their gradients.
    if (groups.embedding != nullptr && embedding.size() > 1) {
      const int w = groups.coordinates.pp_rank == 0 ? chunks.begin()->second.embedding_unit
                                                    : word_unit;
      absl::StatusOr<float*> g = StateGrad(w, kWord);
      if (!g.ok()) return g.status();
      const plan::ParameterSpec& spec = *spec_of.at(kWord);
      if (absl::Status s = embedding.AllReduce(sd(), *g, spec.local_numel(options.parallel.tp),
                                               ReduceOp::kSum);
          !s.ok())
        return s;
    }

    // Data parallelism: every unit's reduction is issued at once, ordered
    // once after the device's work (the backend runs them in issue order),
    // then the device is ordered after each (Finish).
    for (UnitState& s : units) {
      SL_RETURN_IF_ERROR(EnsureGrads(s));
      if (zero() >= 2) SL_RETURN_IF_ERROR(HostAlloc(s.shard_grads.Resize(sd(), s.shard)));
    }
    if (dp.size() > 1) SL_RETURN_IF_ERROR(dp.Order(sd()));
    std::vector<std::shared_ptr<Work>> reductions;
    for (size_t u = 0; u < units.size(); ++u) {
      UnitState& s = units[u];
      if (zero() <= 1) {
        // Started during the backward (OverlapsGradReduce), or now.
        if (auto it = grad_reduces.find(static_cast<int>(u)); it != grad_reduces.end()) {
          reductions.push_back(std::move(it->second));
          grad_reduces.erase(it);
        } else if (dp.size() > 1) {
          reductions.push_back(dp.backend()->AllReduce(
              s.grads.data(), static_cast<size_t>(s.unit.padded), DType::kFloat32, ReduceOp::kAvg));
        }
      } else if (dp.size() == 1) {
        SL_RETURN_IF_ERROR(sd().Copy(s.shard_grads.data(), s.grads.data(), s.shard_grads.bytes()));
      } else {
        const std::vector<size_t> counts(dp.size(), static_cast<size_t>(s.shard));
        reductions.push_back(dp.backend()->ReduceScatter(
            s.grads.data(), s.shard_grads.data(), counts, DType::kFloat32, ReduceOp::kAvg));
      }
    }
    SL_RETURN_IF_ERROR(FinishAll(&reductions));
    if (zero() >= 2) {
      for (UnitState& s : units) s.grads.Reset();
    }
    // The norm and the loss below are read on the host (a documented
    // synchronisation): every operation they depend on is waited for first.
    SL_RETURN_IF_ERROR(SettleAll());
    const absl::StatusOr<float> loss_share = PassLossShare(inputs);
    if (!loss_share.ok()) return loss_share.status();

    // Global norm and the loss, in one buffer summed over tp, dp and pp.
    const int64_t my_begin = static_cast<int64_t>(dp_rank());
    double sumsq = 0;
    std::vector<Device::MaskedPiece> norm_pieces;
    for (UnitState& s : units) {
      const int64_t begin = my_begin * s.shard, end = std::min(begin + s.shard, s.unit.numel);
      if (end <= begin) continue;
      const float* g = zero() <= 1 ? s.grads.data() + begin : s.shard_grads.data();
      norm_pieces.push_back({g, s.norm.data() + begin, end - begin});
    }
    // One read-back for every unit (a wait for the device).
    SL_RETURN_IF_ERROR(sd().AccumulateMaskedSumsOfSquares(norm_pieces, &sumsq));
    // One all-reduce carries the global norm, the loss and whether any rank
    // asked for a checkpoint after this step (so every rank decides alike).
    float totals[3] = {static_cast<float>(sumsq), *loss_share, request_checkpoint ? 1.0f : 0.0f};
    for (Collectives* c : {&tp, &dp, &pp}) {
      if (absl::Status s = c->AllReduce(totals, 3, ReduceOp::kSum); !s.ok()) return s;
    }
    StepStats stats;
    stats.step = step;
    stats.grad_norm = std::sqrt(static_cast<double>(totals[0]));
    stats.loss = totals[1];
    stats.checkpoint_requested = totals[2] > 0.5f;
    stats.learning_rate = LearningRate(step, options.learning_rate);
    stats.tokens = global_batch * options.model.seq_length;
    const float clip =
        options.grad_clip > 0 && stats.grad_norm > options.grad_clip
            ? static_cast<float>(options.grad_clip / (stats.grad_norm + 1e-6))
            : 1.0f;

    // AdamW on what this rank owns, then share the updated parameters. A
    // checkpoint's copies of the state (SaveSlicesAsync) have read it first.
    SL_RETURN_IF_ERROR(OrderStateWrites());
    const float lr = static_cast<float>(stats.learning_rate);
    for (UnitState& s : units) {
      const int64_t begin = zero() == 0 ? 0 : my_begin * s.shard;
      const int64_t count = zero() == 0 ? s.unit.padded : s.shard;
      float* g = zero() <= 1 ? s.grads.data() + begin : s.shard_grads.data();
      float* p = zero() <= 2 ? s.params.data() + begin : s.shard_params.data();
      if (clip != 1.0f) SL_RETURN_IF_ERROR(sd().Scale(g, clip, count));
      SL_RETURN_IF_ERROR(sd().AdamWStep(options.adamw, lr, step + 1, p, g, s.exp_avg.data(),
                                        s.exp_avg_sq.data(), s.decay.data() + begin, count));
      if (zero() <= 1) SL_RETURN_IF_ERROR(sd().Zero(s.grads.data(), s.grads.bytes()));
    }
    // ZeRO-1/2: every dp rank updated its shard; all units' gathers are
    // issued at once after one synchronisation, then waited for.
    if ((zero() == 1 || zero() == 2) && dp.size() > 1) {
      SL_RETURN_IF_ERROR(dp.Order(sd()));
      std::vector<std::shared_ptr<Work>> gathers;
      for (UnitState& s : units) {
        gathers.push_back(dp.backend()->AllGather(s.params.data() + my_begin * s.shard, s.shard,
                                                  s.params.data(), DType::kFloat32));
      }
      SL_RETURN_IF_ERROR(FinishAll(&gathers));
    }
    if (zero() >= 2) {
      for (UnitState& s : units) s.shard_grads.Reset();
    }
    // The step's last kernels and collectives are done (and their errors
    // returned) before it counts as finished.
    SL_RETURN_IF_ERROR(SettleAll());
    SL_RETURN_IF_ERROR(StateSettled());
    ++step;
    stats.time = absl::Now() - start;
    stats.comm_time = comm_time;
    return stats;
  }

  // The checkpointed state buffers of unit s (its parameters as this
  // zero_stage keeps them, both moments), each with its host copy.
  std::array<std::pair<DeviceBuffer<float>*, HostBuffer<float>*>, 3> CheckpointCopies(
      UnitState& s) {
    return {{{zero() == 3 ? &s.shard_params : &s.params, &s.host_params},
             {&s.exp_avg, &s.host_exp_avg},
             {&s.exp_avg_sq, &s.host_exp_avg_sq}}};
  }

  // Save: the owned real elements of each piece (tp rank 0 only for
  // tp-replicated tensors, never the tied copy). Restore: what this rank
  // keeps under its zero_stage, tied copy included. Slices point into the
  // state itself on host memory, else into host copies (UnitState::host_*)
  // that Slices(save) fills and FinishRestore uploads.
  absl::StatusOr<std::vector<StateSlice>> Slices(bool save) {
    std::vector<StateSlice> out;
    const int tp_size = options.parallel.tp;
    const bool direct = sd().host_memory();
    // The host copies are reused: the last save's copies into them are done
    // first (the caller is done with its slices; see SaveSlicesAsync).
    if (!direct && saved_copies != nullptr) {
      const absl::Status copied = saved_copies->Wait();
      saved_copies = nullptr;
      // A restore overwrites the copies anyway; a failed device fails its
      // upload (FinishRestore).
      if (save && !copied.ok()) return copied;
    }
    for (UnitState& s : units) {
      float* params_data = (zero() == 3 ? s.shard_params : s.params).data();
      float* exp_avg_data = s.exp_avg.data();
      float* exp_avg_sq_data = s.exp_avg_sq.data();
      if (!direct) {
        for (const auto& [state_buffer, host] : CheckpointCopies(s)) {
          SL_RETURN_IF_ERROR(host->Resize(sd(), state_buffer->size()));
          if (save) {
            SL_RETURN_IF_ERROR(sd().CopyToHostAsync(host->data(), state_buffer->data(),
                                                    state_buffer->bytes()));
            copies_unordered = true;
          }
        }
        if (!save) restore_pending = true;
        params_data = s.host_params.data();
        exp_avg_data = s.host_exp_avg.data();
        exp_avg_sq_data = s.host_exp_avg_sq.data();
      }
      const int64_t shard_begin = static_cast<int64_t>(dp_rank()) * s.shard;
      const plan::ShardRange owned{std::min(shard_begin, s.unit.numel),
                                   std::min(shard_begin + s.shard, s.unit.numel)};
      for (const plan::UnitPiece& piece : s.unit.pieces) {
        const plan::ParameterSpec* spec = spec_of.at(piece.parameter);
        if (save && (piece.tied_copy || (spec->tp_split_dim < 0 && tp_rank() > 0))) continue;
        const plan::ShardRange whole{piece.offset, piece.offset + piece.numel};
        const plan::ShardRange mine{std::max(whole.begin, owned.begin),
                                    std::min(whole.end, owned.end)};
        auto add = [&](const std::string& tensor, plan::ShardRange r, float* base,
                       int64_t base_offset) {
          if (r.end <= r.begin) return;
          out.push_back(StateSlice{tensor, spec, tp_size, tp_rank(), r.begin - piece.offset,
                                   r.end - piece.offset, base + (r.begin - base_offset)});
        };
        // Parameters.
        if (zero() == 3) {
          add(piece.parameter, mine, params_data, shard_begin);
        } else {
          add(piece.parameter, save ? mine : whole, params_data, 0);
        }
        // AdamW moments: whole units at stage 0, else the shard.
        const plan::ShardRange moments = zero() == 0 && !save ? whole : mine;
        const int64_t moments_base = zero() == 0 ? 0 : shard_begin;
        add(piece.parameter + "/exp_avg", moments, exp_avg_data, moments_base);
        add(piece.parameter + "/exp_avg_sq", moments, exp_avg_sq_data, moments_base);
      }
    }
    if (save) {  // done at once where the state is host memory
      absl::StatusOr<std::shared_ptr<HostCopies>> recorded = sd().RecordHostCopies();
      if (!recorded.ok()) return recorded.status();
      saved_copies = *std::move(recorded);
    }
    return out;
  }

  // After RestoreSlices were filled: the host copies go to the state device
  // (nothing to do when the state is host memory).
  absl::Status UploadRestoredState() {
    if (!restore_pending) return absl::OkStatus();
    restore_pending = false;
    SL_RETURN_IF_ERROR(OrderStateWrites());
    for (UnitState& s : units) {
      for (const auto& [state_buffer, host] : CheckpointCopies(s)) {
        SL_RETURN_IF_ERROR(
            sd().CopyToDevice(state_buffer->data(), host->data(), state_buffer->bytes()));
      }
    }
    return absl::OkStatus();
  }

  // Forward only over every chunk of this rank for micro-batches in order:
  // a pipeline without backward (each F waits only for earlier chunks).
  absl::StatusOr<double> ForwardOnly(bool validation, int64_t first) {
    ResetDeviceState();
    const int m = options.parallel.micro_batches;
    PassInputs inputs;
    if (absl::Status s = UploadInputs(validation, first, &inputs); !s.ok()) return s;
    for (int mb = 0; mb < m; ++mb) {
      for (const auto& [c, layout] : chunks) {
        absl::Status s = Forward(mb, c, options.parallel.micro_batch_size, inputs.tokens_of(mb),
                                 inputs.targets_of(mb), nullptr, inputs.loss_of(mb), nullptr);
        if (!s.ok()) return s;
      }
    }
    if (absl::Status s = FinishPass(); !s.ok()) return s;
    absl::StatusOr<float> loss_share = PassLossShare(inputs);
    if (!loss_share.ok()) return loss_share.status();
    float total = *loss_share;
    for (Collectives* c : {&tp, &dp, &pp}) {
      if (absl::Status s = c->AllReduce(&total, 1, ReduceOp::kSum); !s.ok()) return s;
    }
    return static_cast<double>(total);
  }
};

constexpr char Trainer::Impl::kWord[];
constexpr char Trainer::Impl::kPosition[];

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() {
  // Every buffer of this trainer is freed with its Impl; the device's cache
  // of freed blocks then goes back to the driver, so that what comes next
  // (the next generation's communicators, their own allocations) finds the
  // memory free.
  Device* device = impl_->options.device;
  impl_.reset();
  if (device != nullptr) device->ReleaseCachedMemory();
}

int64_t Trainer::step() const { return impl_->step; }

std::string Trainer::state_location() const {
  if (!impl_->resident()) return "host";
  // The device itself, not the bf16 wrapper: the state is fp32 at every
  // precision.
  const Device* d = impl_->options.device;
  return d != nullptr ? d->name() : CpuDevice::Default()->name();
}

absl::StatusOr<StepStats> Trainer::TrainStep(bool request_checkpoint) {
  try {
    return impl_->TrainStep(request_checkpoint);
  } catch (const std::bad_alloc&) {
    // The gradient buffers and activations are allocated during the step.
    return HostOutOfMemoryError("running a training step", impl_->options.model,
                                impl_->options.parallel);
  }
}

absl::StatusOr<double> Trainer::EvaluateValidation(int64_t samples) {
  try {
    return EvaluateValidationUnguarded(samples);
  } catch (const std::bad_alloc&) {
    return HostOutOfMemoryError("evaluating the validation loss", impl_->options.model,
                                impl_->options.parallel);
  }
}

absl::StatusOr<double> Trainer::EvaluateValidationUnguarded(int64_t samples) {
  Impl& t = *impl_;
  if (t.corpus->validation_size() <= t.options.model.seq_length)
    return absl::FailedPreconditionError("the corpus has no validation split longer than seq_length");
  const int64_t global_batch = t.options.parallel.global_batch();
  const int64_t batches = std::max<int64_t>(1, (samples + global_batch - 1) / global_batch);
  double total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    absl::StatusOr<double> loss = t.ForwardOnly(true, b * global_batch);
    if (!loss.ok()) return loss.status();
    total += *loss;
  }
  return total / static_cast<double>(batches);
}

absl::StatusOr<std::string> Trainer::Sample(const std::string& prompt, int64_t length,
                                            double temperature, uint64_t seed) {
  try {
    return SampleUnguarded(prompt, length, temperature, seed);
  } catch (const std::bad_alloc&) {
    return HostOutOfMemoryError("sampling text", impl_->options.model, impl_->options.parallel);
  }
}

absl::StatusOr<std::string> Trainer::SampleUnguarded(const std::string& prompt, int64_t length,
                                                     double temperature, uint64_t seed) {
  Impl& t = *impl_;
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty; give at least one byte");
  if (length < 0) return absl::InvalidArgumentError(absl::StrCat("length=", length, " must be >= 0"));
  const int64_t seq = t.options.model.seq_length, vocab = t.options.model.vocab_size;
  std::vector<int32_t> text;
  for (unsigned char ch : prompt) text.push_back(ch);
  std::mt19937_64 rng(seed);
  std::string out;
  const LayerShape shape = t.Shape(1);
  const bool last_stage = t.chunks.count(t.num_chunks() - 1) > 0;
  t.ResetDeviceState();
  for (int64_t i = 0; i < length; ++i) {
    // The last seq tokens, left-padded with newlines.
    std::vector<int32_t> window(seq, '\n'), targets(seq, 0);
    const int64_t have = std::min<int64_t>(seq, text.size());
    std::copy(text.end() - have, text.end(), window.end() - have);
    DeviceBuffer<int32_t> device_window, device_targets;
    DeviceBuffer<float> unused_loss;
    if (absl::Status s = t.Upload(window.data(), seq, &device_window); !s.ok()) return s;
    if (absl::Status s = t.Upload(targets.data(), seq, &device_targets); !s.ok()) return s;
    if (absl::Status s = unused_loss.Resize(*t.device, seq); !s.ok()) return s;
    HeadActivations head;
    for (const auto& [c, layout] : t.chunks) {
      absl::Status s = t.Forward(0, c, 1, device_window.data(), device_targets.data(), nullptr,
                                 unused_loss.data(), &head);
      if (!s.ok()) return s;
    }
    if (absl::Status s = t.FinishPass(); !s.ok()) return s;
    float next = 0;
    if (last_stage) {
      std::vector<float> logits;
      if (absl::Status s = LastTokenLogits(*t.device, shape, head, vocab, t.tp, &logits); !s.ok())
        return s;
      int best = 0;
      if (temperature <= 0) {
        best = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      } else {
        const float top = *std::max_element(logits.begin(), logits.end());
        std::vector<double> weights(vocab);
        for (int64_t v = 0; v < vocab; ++v)
          weights[v] = std::exp((logits[v] - top) / temperature);
        best = std::discrete_distribution<int>(weights.begin(), weights.end())(rng);
      }
      next = static_cast<float>(best);
    }
    // The last stage tells the others (pp rank pp-1 is the broadcast root).
    if (absl::Status s = t.pp.Broadcast(&next, 1, t.pp.size() - 1); !s.ok()) return s;
    text.push_back(static_cast<int32_t>(next));
    out.push_back(static_cast<char>(static_cast<int32_t>(next)));
  }
  return out;
}

absl::StatusOr<std::vector<float>> Trainer::Parameter(const std::string& name) {
  try {
    return ParameterUnguarded(name);
  } catch (const std::bad_alloc&) {
    return HostOutOfMemoryError("reading a parameter", impl_->options.model,
                                impl_->options.parallel);
  }
}

absl::StatusOr<std::vector<float>> Trainer::ParameterUnguarded(const std::string& name) {
  Impl& t = *impl_;
  for (size_t u = 0; u < t.units.size(); ++u) {
    UnitState& s = t.units[u];
    auto it = s.offset.find(name);
    if (it == s.offset.end()) continue;
    if (absl::Status st = t.Acquire(static_cast<int>(u), /*to_device=*/false); !st.ok()) return st;
    const int64_t n = t.spec_of.at(name)->local_numel(t.options.parallel.tp);
    std::vector<float> out(static_cast<size_t>(n));
    const absl::Status copied =
        t.sd().CopyToHost(out.data(), s.params.data() + it->second, sizeof(float) * out.size());
    t.Release(static_cast<int>(u));
    if (!copied.ok()) return copied;
    return out;
  }
  return absl::NotFoundError(absl::StrCat("parameter '", name, "' is not held by pp rank ",
                                          t.pp_rank()));
}

absl::StatusOr<Trainer::SavedSlices> Trainer::SaveSlicesAsync() {
  SavedSlices saved;
  try {
    absl::StatusOr<std::vector<StateSlice>> slices = impl_->Slices(/*save=*/true);
    if (!slices.ok()) return slices.status();
    saved.slices = *std::move(slices);
  } catch (const std::bad_alloc&) {
    return HostOutOfMemoryError("copying the state for a checkpoint", impl_->options.model,
                                impl_->options.parallel);
  }
  saved.host_copies = !impl_->sd().host_memory();
  saved.ready = impl_->saved_copies;
  return saved;
}

absl::StatusOr<std::vector<Trainer::StateSlice>> Trainer::SaveSlices() {
  absl::StatusOr<SavedSlices> saved = SaveSlicesAsync();
  if (!saved.ok()) return saved.status();
  if (absl::Status s = saved->ready->Wait(); !s.ok()) return s;
  return std::move(saved->slices);
}

std::vector<Trainer::StateSlice> Trainer::RestoreSlices() {
  // Without save, Slices only sizes host memory: it cannot fail but for
  // std::bad_alloc.
  return *impl_->Slices(/*save=*/false);
}

absl::Status Trainer::FinishRestore(int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step=", step, " must be >= 0"));
  if (absl::Status s = impl_->UploadRestoredState(); !s.ok()) return s;
  impl_->step = step;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainingOptions& options,
                                                         const RankGroups& groups,
                                                         const Corpus* corpus) {
  // A model too large for the host fails here as a status, not as an
  // uncaught std::bad_alloc that aborts the process (exit 134).
  try {
    return Build(options, groups, corpus);
  } catch (const std::bad_alloc&) {
    return HostOutOfMemoryError("building the trainer", options.model, options.parallel);
  }
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Build(const TrainingOptions& options,
                                                        const RankGroups& groups,
                                                        const Corpus* corpus) {
  const plan::ParallelConfig& par = options.parallel;
  if (absl::Status s = plan::ValidateConfig(options.model, par); !s.ok()) return s;
  Device* const device = options.device != nullptr ? options.device : CpuDevice::Default();
  if (corpus == nullptr) return absl::InvalidArgumentError("corpus is null");
  if (options.model.vocab_size < 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.vocab_size=", options.model.vocab_size,
        " is smaller than the byte vocabulary the data uses; set vocab_size to 256 (or more)"));
  }
  if (absl::Status s = corpus->CheckSequenceLength(options.model.seq_length); !s.ok()) return s;
  const plan::RankCoordinates& c = groups.coordinates;
  absl::StatusOr<plan::Topology> topology = plan::Topology::Create(par.tp, par.pp, par.dp);
  if (!topology.ok()) return topology.status();
  if (absl::StatusOr<int> rank = topology->CheckedRankOf(c); !rank.ok()) return rank.status();
  auto check_group = [](const char* name, Backend* b, int size, int rank) -> absl::Status {
    if (size == 1 && b == nullptr) return absl::OkStatus();
    if (b == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("groups.", name, " is null but ", name, "=", size));
    if (b->size() != size || b->rank() != rank) {
      return absl::InvalidArgumentError(absl::StrCat("groups.", name, " has size ", b->size(),
                                                     " and rank ", b->rank(), "; expected size ",
                                                     size, " and rank ", rank));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_group("tp", groups.tp, par.tp, c.tp_rank); !s.ok()) return s;
  if (absl::Status s = check_group("dp", groups.dp, par.dp, c.dp_rank); !s.ok()) return s;
  if (absl::Status s = check_group("pp", groups.pp, par.pp, c.pp_rank); !s.ok()) return s;
  const bool end_stage = par.pp > 1 && (c.pp_rank == 0 || c.pp_rank == par.pp - 1);
  if (end_stage) {
    if (absl::Status s = check_group("embedding", groups.embedding, 2, c.pp_rank == 0 ? 0 : 1);
        !s.ok())
      return s;
  }

  // Where the state lives: with the math when the backends can read it
  // there (trainer.h "Where the state lives").
  const std::pair<const char*, Backend*> backends[] = {
      {"tp", groups.tp}, {"dp", groups.dp}, {"pp", groups.pp},
      {"embedding", end_stage ? groups.embedding : nullptr}};
  const char* host_group = nullptr;    // a group whose backend takes host memory
  const char* device_group = nullptr;  // ... device memory
  for (const auto& [name, backend] : backends) {
    if (backend == nullptr || backend->size() == 1) continue;
    (backend->device_memory() ? device_group : host_group) = name;
  }
  bool resident = true;
  if (!device->host_memory()) {
    if (device_group != nullptr && (host_group != nullptr || options.host_optimizer)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "groups.", device_group, " takes device memory (NCCL) but ",
          host_group != nullptr ? absl::StrCat("groups.", host_group, " takes host memory (Gloo)")
                                : std::string("host_optimizer is set"),
          "; on device ", device->name(),
          " give every group the same kind of backend (all NCCL: the state on the device; all "
          "Gloo: the state on the host), and host_optimizer only with Gloo"));
    }
    resident = !options.host_optimizer && host_group == nullptr;
  }

  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.options = options;
  t.device = device;
  if (par.precision == plan::Precision::kMixed) {
    t.bf16_device = std::make_unique<Bf16Device>(*device);
    t.device = t.bf16_device.get();
  }
  // bf16's products read bf16-exact inputs (Bf16Device): a GPU runs them on
  // its tensor cores. The device may have served another precision before.
  SL_RETURN_IF_ERROR(device->SetBf16Products(par.precision == plan::Precision::kMixed));
  t.state = resident ? t.device : CpuDevice::Default();
  t.groups = groups;
  if (!end_stage) t.groups.embedding = nullptr;
  t.corpus = corpus;
  t.tp = Collectives(groups.tp, &t.comm_time);
  t.dp = Collectives(groups.dp, &t.comm_time);
  t.pp = Collectives(groups.pp, &t.comm_time);
  t.embedding = Collectives(t.groups.embedding, &t.comm_time);
  for (Collectives* c : {&t.tp, &t.dp, &t.pp, &t.embedding}) c->set_staging_device(t.device);

  absl::StatusOr<plan::PipelinePlan> pipeline = plan::PartitionLayers(options.model.num_layers, par.pp, par.vpp);
  if (!pipeline.ok()) return pipeline.status();
  t.pipeline = *std::move(pipeline);
  absl::StatusOr<plan::PipelineSchedule> schedule =
      plan::BuildSchedule(par.schedule, par.pp, par.vpp, par.micro_batches);
  if (!schedule.ok()) return schedule.status();
  t.schedule = *std::move(schedule);
  absl::StatusOr<std::vector<plan::ParameterSpec>> specs = plan::GptParameters(options.model);
  if (!specs.ok()) return specs.status();
  t.specs = *std::move(specs);
  for (const plan::ParameterSpec& s : t.specs) t.spec_of[s.name] = &s;
  absl::StatusOr<plan::ZeroPlan> zero = plan::MakeZeroPlan(options.model, par, t.pipeline);
  if (!zero.ok()) return zero.status();

  // This rank's units, initialised from (seed, name, global index).
  for (const plan::Unit& unit : zero->units) {
    if (unit.tp_rank != c.tp_rank || unit.pp_rank != c.pp_rank) continue;
    UnitState s;
    s.unit = unit;
    s.shard = unit.padded / par.dp;
    std::vector<float> full(unit.padded, 0.0f);
    std::vector<uint8_t> decay(unit.padded, 0), norm(unit.padded, 0);
    for (const plan::UnitPiece& piece : unit.pieces) {
      s.offset[piece.parameter] = piece.offset;
      const plan::ParameterSpec& spec = *t.spec_of.at(piece.parameter);
      if (piece.numel == 0) continue;
      InitializeLocalSlice(options.seed, spec, options.model.num_layers, par.tp, c.tp_rank,
                           full.data() + piece.offset);
      const bool decays = spec.shape.size() >= 2;
      const bool counted = !piece.tied_copy && (spec.tp_split_dim >= 0 || c.tp_rank == 0);
      std::fill(decay.begin() + piece.offset, decay.begin() + piece.offset + piece.numel,
                decays ? 1 : 0);
      std::fill(norm.begin() + piece.offset, norm.begin() + piece.offset + piece.numel,
                counted ? 1 : 0);
    }
    // Onto the state device.
    Device& sd = t.sd();
    auto upload = [&](auto& buffer, const auto* host, int64_t count) -> absl::Status {
      SL_RETURN_IF_ERROR(t.HostAlloc(buffer.Resize(sd, count)));
      return sd.CopyToDevice(buffer.data(), host, buffer.bytes());
    };
    SL_RETURN_IF_ERROR(upload(s.decay, decay.data(), unit.padded));
    SL_RETURN_IF_ERROR(upload(s.norm, norm.data(), unit.padded));
    if (par.zero_stage == 3) {
      SL_RETURN_IF_ERROR(upload(s.shard_params, full.data() + c.dp_rank * s.shard, s.shard));
    } else {
      SL_RETURN_IF_ERROR(upload(s.params, full.data(), unit.padded));
    }
    const int64_t moments = par.zero_stage == 0 ? unit.padded : s.shard;
    for (DeviceBuffer<float>* m : {&s.exp_avg, &s.exp_avg_sq}) {
      SL_RETURN_IF_ERROR(t.HostAlloc(m->Resize(sd, moments)));
      SL_RETURN_IF_ERROR(sd.Zero(m->data(), m->bytes()));
    }
    const int index = static_cast<int>(t.units.size());
    ChunkLayout& layout = t.chunks[unit.chunk];
    layout.chunk = unit.chunk;
    if (unit.name == "embedding") {
      layout.embedding_unit = index;
    } else if (unit.name == "head") {
      layout.head_unit = index;
    } else {
      layout.layer_units.push_back(index);
      layout.layers.push_back(std::stoll(unit.name.substr(std::string("layers.").size())));
    }
    t.units.push_back(std::move(s));
  }
  // The head's word embedding: its tied copy, or the embedding unit when the
  // first and last chunk share this rank.
  for (auto& [chunk, layout] : t.chunks) {
    if (layout.head_unit < 0) continue;
    t.word_unit = t.units[layout.head_unit].offset.count(Impl::kWord) ? layout.head_unit
                                                                      : t.chunks.at(0).embedding_unit;
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

#undef SL_RETURN_IF_ERROR

}  // namespace shardline::worker::train

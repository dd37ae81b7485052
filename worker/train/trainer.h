// The trainer: one rank's slice of a GPT (tp x pp x dp, ZeRO 0-3) trained on
// byte-level text, one optimizer step at a time.
//
//   TrainingOptions options = ...;                       // model, layout, optimizer
//   options.device = gpu.get();                          // optional: layers on a GPU
//   RankGroups groups{coords, tp.get(), dp.get(), pp.get(), embedding.get()};
//   absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(options, groups, &corpus);
//   absl::StatusOr<StepStats> s = (*t)->TrainStep();     // every rank, in lockstep
//
// What one step does (every rank of the world calls TrainStep together):
//  1. The planner's pipeline schedule (GPipe, 1F1B or interleaved 1F1B)
//     runs F/B actions over this rank's chunks for its dp rank's m
//     micro-batches, sending activations and gradients to the neighbouring
//     pp ranks (Send/Recv on the pp group, tag = (micro_batch, chunk,
//     direction)). Tensor parallelism happens inside the layers (model.h).
//     ZeRO-3 all-gathers each unit for the layer that uses it and frees it
//     after; the next unit's gather is started before the current layer
//     computes (prefetch: one more unit whole at a time), so it runs beside
//     the computation. Parameter gradients accumulate in one flat buffer per
//     unit.
//  2. pp > 1: the tied word-embedding gradient is all-reduced between the
//     first and the last stage (the embedding group), as Megatron-LM does.
//  3. Data parallelism: zero_stage 0 and 1 all-reduce (average) each unit's
//     gradients over dp; 2 and 3 reduce-scatter them, keeping only this dp
//     rank's shard (docs/ARCHITECTURE.md "ZeRO shard rule").
//  4. Gradient clipping by the global norm: each element counted once (a
//     tp-replicated parameter on tp rank 0 only, the tied copy never, each
//     dp shard by its owner), summed over tp, dp and pp.
//  5. AdamW with warmup + cosine learning rate: zero_stage 0 updates whole
//     units; 1-3 update this dp rank's shard only (AdamW moments are
//     shard-sized); 1 and 2 then all-gather the updated parameters; 3 keeps
//     only the shard.
// The loss is the mean token cross entropy over the global batch; the
// global batch is micro_batch_size * micro_batches * dp samples, sample k of
// step s being global sample s * global_batch + k (Corpus::TrainSample), dp
// rank d taking samples [d * m * mbs, (d + 1) * m * mbs). So any layout with
// the same global batch follows the same loss curve (docs/ARCHITECTURE.md "Numbers
// that are contracts").
//
// Compute device (TrainingOptions::device, device.h): the layers' forward
// and backward run on it.
//
// Where the state lives (the fp32 master parameters, the gradient buffers,
// AdamW's moments, ZeRO shards, pipeline messages; clipping and AdamW run
// where it lives, through device.h's Copy / Scale / AdamWStep /
// AccumulateMaskedSumOfSquares):
//   * Resident, on the compute device itself: whenever the device's memory
//     is host memory (CpuDevice; results bit-identical to calling ops.h),
//     and on any other device (a GPU) when every group of size > 1 has a
//     backend that takes device memory (Backend::device_memory(), NCCL) or
//     there is none (world 1), unless TrainingOptions::host_optimizer. The
//     host then only feeds token ids and reads back the loss and the
//     gradient norm (and the checkpoint state, SaveSlices). Collectives run
//     on the device buffers. On a device with a CUDA stream and NCCL
//     (model.h Collectives: Order / Finish) they are ordered against the
//     compute stream with CUDA events: each operation's streams wait for
//     the compute stream's work so far, and the compute stream for the
//     operation (pipeline sends excepted: the compute stream does not wait
//     for a send, whose buffer is kept until it is seen to finish). The
//     host waits only at these points of a step: the upload of every
//     micro-batch's tokens and targets at once, at its start; after the dp
//     and embedding reductions, for the gradient norm (every unit's sum
//     read back at once; then clipping and AdamW) and the per-token losses
//     the heads left on the device (read back once); the all-reduce of the norm and loss over the groups (host
//     memory, staged through the device); the end of the step. None comes
//     per layer or per micro-batch (worker/gpu:gpu_trainer_emu_test counts
//     them). At each, the operations the compute stream was
//     ordered after are waited for first (Collectives::Settle), so their
//     errors are their own and a stuck one is seen as a collective
//     (worker/rank_progress.h); one the host is not waiting for is still
//     aborted at its deadline by the backend's watchdog (nccl_backend.h).
//     Elsewhere (a device without a stream; Gloo) the device is
//     synchronised before each collective and the collective waited for.
//   * On the host (ZeRO-Offload, Ren et al., 2021): a GPU whose groups use
//     Gloo, or host_optimizer. Then
//       - each unit's parameters are uploaded when first used in a step
//         (ZeRO-3: after its all-gather, and freed with it), and reused for
//         the rest of the step (also for EvaluateValidation's batch and
//         Sample's call);
//       - each unit's gradients accumulate on the device during the step and
//         are downloaded and added into the host gradient buffer after the
//         last backward, before the embedding-group and dp reductions;
//       - activations stay on the device; pipeline messages are copied to and
//         from host buffers at the chunk boundaries; tensor-parallel
//         all-reduces are staged through host memory (model.h), counted as
//         comm_time.
//   A GPU with an NCCL group and a Gloo group is refused (InvalidArgument).
// Device memory per rank, resident: every unit's parameters, gradients and
// moments (ZeRO shards where sharded) plus the activations of the
// micro-batches in flight; offload: parameters and gradients (whole units)
// plus the activations.
//
// Precision: fp32 parameters, gradients and moments. At precision bf16
// (plan::Precision::kMixed) the layers' math runs through a Bf16Device
// (bf16_device.h): bf16 matrix-product inputs and activations, fp32
// accumulation; master weights, parameter gradients (their accumulation and
// the dp reduction) and AdamW moments stay fp32, so checkpoints are the same
// as fp32's. Gradients are reduced in fp32 rather than bf16: they are sums
// over micro-batches and dp ranks whose small terms bf16 (8 bits of
// mantissa) would drop, and fp32 keeps the dp reduction exact enough for
// every layout to follow the single-rank curve (2e-3 relative in bf16,
// bf16_device_test). On a GPU the rounding runs in the plugin's kernel
// (Device::RoundToBFloat16) and the dense products on the bf16 tensor cores
// (Device::SetBf16Products), attention's too (ops.h's bf16 attention, the
// same on the CPU): the same numbers as the CPU up to summation order.
// Gradient accumulation
// keeps a full gradient buffer per unit during the step (as Megatron-LM's
// distributed optimizer); ZeRO-2/3 reduce-scatter it once per step.
//
// Thread-safety: a Trainer is used by one thread. The backends and the
// device it is given must outlive it; the backends carry no other traffic
// while a step runs, and a device that is not thread-safe (a GPU device,
// device.h) serves one Trainer (one rank).
#ifndef SHARDLINE_WORKER_TRAIN_TRAINER_H_
#define SHARDLINE_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plan/config.h"
#include "plan/model.h"
#include "plan/topology.h"
#include "worker/comm/backend.h"
#include "worker/train/adamw.h"
#include "worker/train/data.h"
#include "worker/train/device.h"

namespace shardline::worker::train {

struct TrainingOptions {
  plan::GptConfig model;
  // tp, pp, dp, vpp, zero_stage, zero_alignment, micro_batches (m per dp
  // rank), micro_batch_size, schedule, precision (fp32, or kMixed: bf16;
  // see "Precision" above).
  plan::ParallelConfig parallel;
  uint64_t seed = 1234;  // initial weights and data order
  LearningRateSchedule learning_rate;
  AdamWConfig adamw;
  double grad_clip = 1.0;  // max global L2 norm; 0 turns clipping off
  // Where the layers' math runs (see the file comment). Not owned; must
  // outlive the Trainer; null means CpuDevice::Default(). Ranks that run as
  // threads of one process each need their own GPU device object.
  Device* device = nullptr;
  // Keep the state on the host (the ZeRO-Offload path, "Where the state
  // lives") even where it could live on `device`: the baseline the GPU
  // benchmark sets beside the resident path. Ignored on a device whose
  // memory is host memory; refused with a backend that takes device memory.
  bool host_optimizer = false;
};

// This rank's place and its communicators. Backends are not owned. A group
// of size 1 may be null. `embedding` is the {first, last} stage group of
// this rank's pipeline; only those two stages need it (null elsewhere and
// when pp == 1).
struct RankGroups {
  plan::RankCoordinates coordinates;
  Backend* tp = nullptr;
  Backend* dp = nullptr;
  Backend* pp = nullptr;
  Backend* embedding = nullptr;
};

struct StepStats {
  int64_t step = 0;           // the step just finished (0-based)
  double loss = 0;            // mean token cross entropy of the global batch
  double grad_norm = 0;       // global L2 norm before clipping
  double learning_rate = 0;   // used by this step
  int64_t tokens = 0;         // tokens in the global batch
  absl::Duration time;        // wall time of the step on this rank
  absl::Duration comm_time;   // of which waiting on collectives / send / recv
  bool checkpoint_requested = false;  // some rank asked to save after this step
};

class Trainer {
 public:
  // Builds this rank's units and initial weights. Errors: InvalidArgument
  // when the configuration is invalid (plan::ValidateConfig's message), the
  // vocabulary is smaller than the 256 byte values, a needed group is
  // missing or has the wrong size
  // (names the group), or the corpus is too short for seq_length;
  // a GPU device given groups with NCCL and Gloo backends together, or
  // host_optimizer with an NCCL backend (names both);
  // ResourceExhausted when the host runs out of memory for this rank's
  // units (std::bad_alloc; host_memory.h's HostOutOfMemoryError, naming
  // what to change), or the device (device.h).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainingOptions& options,
                                                         const RankGroups& groups,
                                                         const Corpus* corpus);
  ~Trainer();

  // One optimizer step over the global batch of step(). Every rank calls it
  // together. `request_checkpoint` is this rank's wish to save after this
  // step (e.g. an operator's drain); StepStats::checkpoint_requested is
  // true on every rank when any rank asked, so all ranks agree on the step
  // to save. Errors: the backends' (Unavailable naming a lost peer,
  // DeadlineExceeded, Aborted); the device's (device.h: ResourceExhausted
  // out of device memory, Unavailable the device failed, InvalidArgument a
  // product too large for it); ResourceExhausted when the host runs out of
  // memory (std::bad_alloc, as Create); after an error the trainer's state
  // is unspecified (restore from a checkpoint).
  absl::StatusOr<StepStats> TrainStep(bool request_checkpoint = false);

  // Mean validation loss over validation samples [0, samples) (forward
  // only, all ranks together; samples is rounded up to whole global
  // batches). Errors: as TrainStep; FailedPrecondition without a
  // validation split.
  absl::StatusOr<double> EvaluateValidation(int64_t samples);

  // Continues `prompt` (at least one byte) by `length` bytes sampled with
  // `temperature` (0 = greedy) from the model, the RNG seeded by `seed`.
  // Every rank calls it together and gets the same text.
  absl::StatusOr<std::string> Sample(const std::string& prompt, int64_t length,
                                     double temperature, uint64_t seed);

  // The next step to run (0-based); the data cursor is step() * global_batch.
  int64_t step() const;

  // The device the state lives on ("Where the state lives"): the compute
  // device's name when resident ("cpu", "cuda:0"), "host" on the offload
  // path. For logs.
  std::string state_location() const;

  // The current value of parameter `name`'s tp-local slice (row-major over
  // its local shape), gathered over dp under ZeRO-3. Only the ranks of this
  // rank's dp group take part (they must all call it). Errors: NotFound
  // when this rank's stage does not hold `name`; backend errors.
  absl::StatusOr<std::vector<float>> Parameter(const std::string& name);

  // --- Checkpoint state -----------------------------------------------------

  // A contiguous run of one tensor's tp-local slice (row-major over
  // spec->local_shape(tp)), elements [begin, end), living at `data`. Tensor
  // names are the parameter's name for weights, "<name>/exp_avg" and
  // "<name>/exp_avg_sq" for AdamW's moments; every one has the parameter's
  // global shape (spec->shape) and is split over tp like it.
  struct StateSlice {
    std::string tensor;
    const plan::ParameterSpec* spec = nullptr;
    int tp = 1;
    int tp_rank = 0;
    int64_t begin = 0;
    int64_t end = 0;
    float* data = nullptr;
  };

  // What this rank writes in a checkpoint: for each unit, the real elements
  // its dp shard owns (docs/ARCHITECTURE.md "ZeRO shard rule") of every parameter and
  // both moments, whatever the zero_stage (replicated states are written
  // once, spread over the dp ranks); a tp-replicated tensor only from tp
  // rank 0; never the last stage's tied copy of the word embedding; never
  // padding. Together the ranks cover every element of every tensor exactly
  // once. Pointers stay valid until the next TrainStep, EvaluateValidation,
  // Sample or Restore call.
  // Under ZeRO-3 parameters come from the shard (no gathering). Where the
  // state is not in host memory ("Where the state lives") the slices point
  // into host copies made by this call (it waits for the device) in the
  // host memory the device copies fastest (Device::AllocHostBytes: pinned
  // on a GPU), kept for the next call. Errors: the device's (device.h:
  // Unavailable, the device failed; ResourceExhausted, out of page-locked
  // host memory).
  absl::StatusOr<std::vector<StateSlice>> SaveSlices();

  // SaveSlices without waiting for the device: the copies of a state that
  // is not in host memory are enqueued (Device::CopyToHostAsync: on a GPU a
  // copy stream of their own, beside the next step's forward and backward,
  // which go on at once; the next step's optimizer runs after the copies
  // have read the state) and `ready` is done when they are in host memory.
  struct SavedSlices {
    std::vector<StateSlice> slices;
    // Wait() before reading any slice's data; thread-safe, so the checkpoint
    // writer's thread may wait while this trainer trains (device.h
    // HostCopies). Done already when the state is in host memory.
    std::shared_ptr<HostCopies> ready;
    // True: the slices point into the trainer's host copies, which keep the
    // saved values whatever TrainStep, EvaluateValidation or Sample do, until
    // the next SaveSlices, SaveSlicesAsync or RestoreSlices call (which
    // reuse them: be done reading them first). False: they point into the
    // state itself, valid as SaveSlices' (until the next TrainStep ...).
    bool host_copies = false;
  };
  // Errors: SaveSlices'.
  absl::StatusOr<SavedSlices> SaveSlicesAsync();

  // What this rank needs to continue from a checkpoint under ITS layout:
  // every element it keeps (stage 0: whole units; 1/2: whole parameters,
  // shard moments; 3: shard parameters and moments), including the tied
  // copy. Fill each `data[0 .. end-begin)`, then call FinishRestore.
  std::vector<StateSlice> RestoreSlices();

  // Sets the step (the data cursor is step * global_batch and AdamW's bias
  // correction continues from it) after RestoreSlices were filled, and
  // copies them to the device where the state is not in host memory.
  // InvalidArgument for a negative step; the device's errors.
  absl::Status FinishRestore(int64_t step);

  class Impl;

 private:
  explicit Trainer(std::unique_ptr<Impl> impl);
  // Create without catching std::bad_alloc.
  static absl::StatusOr<std::unique_ptr<Trainer>> Build(const TrainingOptions& options,
                                                        const RankGroups& groups,
                                                        const Corpus* corpus);
  // The public calls of the same names without catching std::bad_alloc
  // (which they turn into HostOutOfMemoryError).
  absl::StatusOr<double> EvaluateValidationUnguarded(int64_t samples);
  absl::StatusOr<std::string> SampleUnguarded(const std::string& prompt, int64_t length,
                                              double temperature, uint64_t seed);
  absl::StatusOr<std::vector<float>> ParameterUnguarded(const std::string& name);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_TRAINER_H_

// Does this rank's model fit in this host's memory? Checked before the
// trainer allocates anything, so that a model too large for the host fails
// with a status naming the sizes instead of std::bad_alloc (exit 134).
//
//   absl::Status s = CheckHostMemory(options.model, options.parallel,
//                                    {coordinates}, ProbeHostMemory);
//   // ResourceExhausted: "not enough host memory: rank 0 (tp_rank 0,
//   //   pp_rank 0, dp_rank 0) needs 3.00 TiB (... bytes) for its model
//   //   states (...) but this process can get 21.90 GiB (... bytes,
//   //   MemAvailable); to fit, spread the model over more ranks ..."
//
// The need is the planner's (plan::MakePlan's per-rank MemoryEstimate, the
// number `shardctl plan` prints): parameters, gradients and AdamW moments
// under the ZeRO stage, in the trainer's fp32 (also at precision bf16, whose
// states the trainer keeps in fp32; `shardctl plan --precision bf16` counts
// ZeRO's 2 + 2 + 12 bytes instead). It leaves out activations,
// communication buffers and the trainer's per-element bookkeeping, so it is
// a lower bound: a rank this check refuses cannot train on this host; one it
// accepts can still run out of memory later (the trainer then returns
// ResourceExhausted from std::bad_alloc, trainer.h).
//
// The host memory probe reads /proc, /sys/fs/cgroup and the rlimits;
// everything else is pure. Thread-safe.
#ifndef SHARDLINE_WORKER_TRAIN_HOST_MEMORY_H_
#define SHARDLINE_WORKER_TRAIN_HOST_MEMORY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plan/config.h"
#include "plan/memory.h"
#include "plan/topology.h"

namespace shardline::worker::train {

// What this process can still allocate, and which limit says so.
struct HostMemory {
  int64_t available = 0;  // bytes
  // Which limit: "MemAvailable", "RLIMIT_AS headroom", "RLIMIT_DATA
  // headroom" or "cgroup memory limit headroom".
  std::string limit;
};

// Answers how much memory this process can get. Tests inject a fixed one.
using HostMemoryProbe = std::function<absl::StatusOr<HostMemory>()>;

// The smallest of: MemAvailable (/proc/meminfo); RLIMIT_AS minus VmSize and
// RLIMIT_DATA minus VmData (/proc/self/status) when those limits are set;
// the memory cgroup's limit minus its usage plus its inactive file cache
// (which the kernel reclaims first; v2 memory.max, memory.current, v1
// memory.limit_in_bytes, memory.usage_in_bytes) when one is set. Errors:
// Unavailable when not even /proc/meminfo can be read (callers skip the
// check then: better to try than to refuse blindly).
absl::StatusOr<HostMemory> ProbeHostMemory();

// The planner's model-state bytes of the rank at `coordinates` of
// `parallel`'s layout (plan::MakePlan(...).memory[rank]). Errors:
// InvalidArgument from plan::MakePlan (an invalid model or layout), or when
// the coordinates are outside the layout.
absl::StatusOr<plan::MemoryEstimate> EstimateRankMemory(const plan::GptConfig& model,
                                                        const plan::ParallelConfig& parallel,
                                                        const plan::RankCoordinates& coordinates);

// Checks that the ranks at `ranks` (all in this process: one for a worker,
// every rank for shardline-train-local) fit in what `probe` says is
// available (a null probe means ProbeHostMemory). Errors: ResourceExhausted
// naming the need (total and per kind), what is available and from which limit,
// and what to change (tp/pp, zero_stage with dp, micro_batch, a bigger host),
// with IsHostMemoryShortage true; EstimateRankMemory's errors. A failing probe
// is not an error (nothing is checked).
absl::Status CheckHostMemory(const plan::GptConfig& model, const plan::ParallelConfig& parallel,
                             const std::vector<plan::RankCoordinates>& ranks,
                             const HostMemoryProbe& probe);

// The ResourceExhausted error of a std::bad_alloc while `what` ran (e.g.
// "building the trainer"), with the same advice as CheckHostMemory's, and
// IsHostMemoryShortage true.
absl::Status HostOutOfMemoryError(const std::string& what, const plan::GptConfig& model,
                                  const plan::ParallelConfig& parallel);

// True for CheckHostMemory's and HostOutOfMemoryError's errors: this host
// cannot run this rank of this spec, so retrying the same assignment here
// cannot succeed (the spec's layout or the host must change). Recognised by
// a status payload, not by the message.
bool IsHostMemoryShortage(const absl::Status& status);

// "3.00 TiB (3298534883328 bytes)".
std::string BytesText(int64_t bytes);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_HOST_MEMORY_H_

// The worker's training loop for one generation: builds the trainer for the
// assignment on its communicators, restores the named checkpoint, runs
// steps until train_steps, saves checkpoints every interval_steps, and
// reports progress (activity, step, loss, tokens/s) through the agent.
//
//   TrainingLoop loop(agent, options);
//   absl::StatusOr<TrainingLoop::Outcome> r = loop.Run(assignment, comms);
//
// A generation change (the agent's directive callback aborts the
// communicators) makes the running step fail with Aborted; Run then
// returns kGenerationOver and the caller re-joins. Errors that are this
// worker's own (a failed step while the generation is still live, a
// checkpoint that cannot be written or read) are returned for the caller to
// report with ReportError.
//
// Thread-safety: one thread calls Run at a time.
#ifndef SHARDLINE_WORKER_TRAINING_LOOP_H_
#define SHARDLINE_WORKER_TRAINING_LOOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "worker/agent.h"
#include "worker/checkpointer.h"
#include "worker/communicators.h"
#include "worker/fault_injection.h"
#include "worker/rank_progress.h"
#include "worker/train/data.h"
#include "worker/train/device.h"
#include "worker/train/host_memory.h"
#include "worker/worker_metrics.h"

namespace shardline::worker {

struct TrainingLoopOptions {
  // Log a line every this many steps (rank 0 of the world only).
  int64_t log_interval = 10;
  // Bytes of text every rank samples together after the last step (logged
  // by rank 0); 0 skips sampling.
  int64_t sample_length = 0;
  std::string sample_prompt = "\n";
  // Threads of the rank's kernels (worker/train/parallel.h).
  int threads = 1;
  // Where to log (one line per call).
  std::function<void(const std::string&)> log;
  // Where to count steps, checkpoints and restores (not owned; may be null).
  WorkerMetrics* metrics = nullptr;
  // Where the layers' math runs (train::TrainingOptions::device): not owned,
  // must outlive the loop; null means the CPU.
  train::Device* device = nullptr;
  // What this process can allocate, asked before each assignment's trainer
  // is built (train::CheckHostMemory). Null means train::ProbeHostMemory;
  // tests inject a fixed answer.
  train::HostMemoryProbe host_memory;
  // Where the training thread's activity and each step's timing go for the
  // heartbeats' progress reports (not owned; may be null). Run sets IDLE,
  // CHECKPOINT (restore, a save), COMPUTE (a step; its waits say
  // COLLECTIVE), and IDLE again when it returns.
  RankProgressTracker* progress = nullptr;
  // Faults to inject (worker/fault_injection.h, a test facility; not
  // owned; null: none).
  FaultInjector* faults = nullptr;
};

class TrainingLoop {
 public:
  enum class Outcome {
    kFinished,        // train_steps done; DONE reported (the coordinator then stops the job)
    kGenerationOver,  // the generation ended (directive or a lost peer); re-join
  };

  // `agent` is not owned and must outlive the loop.
  TrainingLoop(WorkerAgent* agent, TrainingLoopOptions options);

  // Runs `assignment` (not a spare) on `comms`. Errors: InvalidArgument when
  // the job spec or the assignment cannot be trained (names the field);
  // NotFound / PermissionDenied when the corpus cannot be read;
  // ResourceExhausted with train::IsHostMemoryShortage true when this
  // rank's model states (the planner's estimate) exceed what the host can
  // give this process, checked before the trainer allocates anything, or
  // when the host runs out of memory building or stepping the trainer (the
  // message names the sizes and what to change in the spec; retrying this
  // assignment on this host cannot succeed); DataLoss when the checkpoint
  // to restore is damaged; a step's or a save's error while the generation
  // is still live.
  absl::StatusOr<Outcome> Run(const v1::Assignment& assignment, Communicators& comms);

  // Marks the moment this worker learned its generation ended (and why):
  // the next Run logs one recovery line with the time to communicators,
  // restore and the first resumed step. The earliest note wins until that
  // line is logged. Thread-safe (called from the directive callback).
  void NoteGenerationEnded(absl::Time when, std::string reason);
  // Marks when the next generation's communicators were ready. Thread-safe.
  void NoteCommunicatorsReady(absl::Time when);

  // Asks for a checkpoint after the next step (the coordinator's
  // CheckpointAtStep directive, e.g. before draining a worker). Every rank
  // of the world agrees on the step through the trainer's step all-reduce,
  // so ranks that learn of it at different times still save together.
  // Thread-safe.
  void RequestCheckpoint() { checkpoint_requested_.store(true); }

 private:
  absl::StatusOr<const train::Corpus*> CorpusFor(const v1::JobSpec& spec);
  void Log(const std::string& line) const;

  WorkerAgent* const agent_;
  std::atomic<bool> checkpoint_requested_{false};
  mutable absl::Mutex mu_;
  std::optional<absl::Time> ended_at_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> ready_at_ ABSL_GUARDED_BY(mu_);
  std::string ended_reason_ ABSL_GUARDED_BY(mu_);
  const TrainingLoopOptions options_;
  // By (path, validation_fraction): the corpus is read once per process.
  std::map<std::pair<std::string, double>, std::unique_ptr<train::Corpus>> corpora_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_TRAINING_LOOP_H_

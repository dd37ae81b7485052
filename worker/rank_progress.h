// RankProgressTracker: what this rank's training thread is doing and how
// long its latest step took, for the progress reports its heartbeats carry
// (progress.proto RankProgress; the agent's progress source, agent.h).
//
//   RankProgressTracker progress;
//   train::ScopedCommWaitObserver observe(&progress);  // on the training thread
//   progress.BeginGeneration(gen);
//   progress.SetActivity(v1::ACTIVITY_COMPUTE);
//   ... trainer.TrainStep() ...  // its waits say COLLECTIVE meanwhile
//   progress.StepDone(step, step_time, compute_time);
//   // heartbeat thread:
//   v1::RankProgress p;
//   progress.Fill(gen, &p);
//
// Activity: the one the training thread set (IDLE, COMPUTE, CHECKPOINT;
// IDLE initially), except while that thread waits on a communicator
// (train::CommWaitObserver, worker/train/model.h): then COLLECTIVE. The
// collectives part of a report is Communicators::Progress's.
//
// Steps are optimizer steps done (the trainer's step()); times are wall
// time; compute_time is the step's time minus its communication waits.
//
// Thread-safety: thread-safe; WaitBegins / WaitEnds are lock-free (they run
// for every collective of the training thread), the rest takes a mutex
// briefly. One training thread sets activities and waits: waits do not nest.
#ifndef SHARDLINE_WORKER_RANK_PROGRESS_H_
#define SHARDLINE_WORKER_RANK_PROGRESS_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/progress.pb.h"
#include "worker/train/model.h"

namespace shardline::worker {

class RankProgressTracker : public train::CommWaitObserver {
 public:
  // A new generation's training begins: no step completed in it yet (the
  // reports' step, step_time and compute_time are 0 until StepDone).
  void BeginGeneration(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  // What the training thread does from now on (not COLLECTIVE: that one is
  // the waits'; UNSPECIFIED is taken as IDLE).
  void SetActivity(shardline::v1::Activity activity);
  shardline::v1::Activity activity() const;

  // The step `step` (optimizer steps done) of the current generation
  // completed, taking `step_time`, of which `compute_time` not waiting on
  // a communicator.
  void StepDone(uint64_t step, absl::Duration step_time, absl::Duration compute_time)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sets `out`'s activity, and, when `generation` is the one of the latest
  // BeginGeneration, its step, step_time and compute_time (else 0: no step
  // of that generation is known). Leaves `out->collectives` alone.
  void Fill(uint64_t generation, shardline::v1::RankProgress* out) const ABSL_LOCKS_EXCLUDED(mu_);

  // train::CommWaitObserver.
  void WaitBegins() override { in_wait_.store(true, std::memory_order_relaxed); }
  void WaitEnds() override { in_wait_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<int> activity_{shardline::v1::ACTIVITY_IDLE};
  std::atomic<bool> in_wait_{false};
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration step_time_ ABSL_GUARDED_BY(mu_);
  absl::Duration compute_time_ ABSL_GUARDED_BY(mu_);
};

// Writes `d` into `out` (seconds and nanoseconds; negative durations as 0).
void DurationToProto(absl::Duration d, google::protobuf::Duration* out);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_RANK_PROGRESS_H_

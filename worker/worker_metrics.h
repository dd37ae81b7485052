// The worker's Prometheus series, served on --metrics-port by the same tiny
// HTTP server as the coordinator's (metrics/metrics.h).
//
//   WorkerMetrics m("shakespeare", "node0:cpu");
//   m.SetPlace(/*generation=*/2, /*rank=*/1);
//   m.ObserveStep(stats);                    // after every optimizer step
//   m.ObserveCheckpoint(absl::Seconds(0.3)); // after every save
//   std::string text = m.Render();
//
// Series, each labelled {job, worker_id}:
//   shardline_worker_generation              gauge, generation of the current assignment
//   shardline_worker_rank                    gauge, rank in it (-1: spare / none)
//   shardline_worker_step                    gauge, optimizer steps done
//   shardline_worker_loss                    gauge, loss of the last step (nats/token)
//   shardline_worker_tokens_per_second       gauge, global batch tokens / last step time
//   shardline_worker_step_seconds_total      counter, wall time in steps
//   shardline_worker_comm_seconds_total      counter, of which waiting on collectives/send/recv
//   shardline_worker_steps_total             counter, steps run by this process
//   shardline_worker_checkpoint_seconds_total counter, time saving checkpoints
//   shardline_worker_checkpoints_total       counter, saves done
//   shardline_worker_restores_total          counter, checkpoints restored
// Thread-safe.
#ifndef SHARDLINE_WORKER_WORKER_METRICS_H_
#define SHARDLINE_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/train/trainer.h"

namespace shardline::worker {

class WorkerMetrics {
 public:
  WorkerMetrics(std::string job_id, std::string worker_id);

  void SetPlace(uint64_t generation, int64_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  void ObserveStep(const train::StepStats& stats) ABSL_LOCKS_EXCLUDED(mu_);
  void ObserveCheckpoint(absl::Duration took) ABSL_LOCKS_EXCLUDED(mu_);
  void ObserveRestore() ABSL_LOCKS_EXCLUDED(mu_);

  // The exposition text (format 0.0.4).
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string labels_;  // {job="...",worker_id="..."}
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  double loss_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  double step_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double comm_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  double checkpoint_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checkpoints_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t restores_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_WORKER_METRICS_H_

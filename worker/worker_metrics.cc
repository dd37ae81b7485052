#include "worker/worker_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "metrics/metrics.h"
#include "worker/comm/backend.h"

namespace shardline::worker {

WorkerMetrics::WorkerMetrics(std::string job_id, std::string worker_id)
    : labels_(absl::StrCat("{job=\"", metrics::EscapeLabelValue(job_id), "\",worker_id=\"",
                           metrics::EscapeLabelValue(worker_id), "\"}")) {}

void WorkerMetrics::SetPlace(uint64_t generation, int64_t rank) {
  absl::MutexLock lock(&mu_);
  generation_ = generation;
  rank_ = rank;
}

void WorkerMetrics::ObserveStep(const train::StepStats& stats) {
  absl::MutexLock lock(&mu_);
  step_ = stats.step + 1;
  loss_ = stats.loss;
  const double secs = absl::ToDoubleSeconds(stats.time);
  tokens_per_second_ = secs > 0 ? static_cast<double>(stats.tokens) / secs : 0;
  step_seconds_ += secs;
  comm_seconds_ += absl::ToDoubleSeconds(stats.comm_time);
  ++steps_;
}

void WorkerMetrics::ObserveCheckpoint(absl::Duration took) {
  absl::MutexLock lock(&mu_);
  checkpoint_seconds_ += absl::ToDoubleSeconds(took);
  ++checkpoints_;
}

void WorkerMetrics::ObserveRestore() {
  absl::MutexLock lock(&mu_);
  ++restores_;
}

std::string WorkerMetrics::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  auto series = [&](const char* name, const char* type, const char* help, double value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                    labels_, " ", absl::StrFormat("%.17g", value), "\n");
  };
  series("shardline_worker_generation", "gauge", "Generation of the current assignment.",
         static_cast<double>(generation_));
  series("shardline_worker_rank", "gauge", "Rank in the current generation (-1: none).",
         static_cast<double>(rank_));
  series("shardline_worker_step", "gauge", "Optimizer steps done.", static_cast<double>(step_));
  series("shardline_worker_loss", "gauge", "Loss of the last step (nats per token).", loss_);
  series("shardline_worker_tokens_per_second", "gauge",
         "Tokens of the global batch over the last step's time.", tokens_per_second_);
  series("shardline_worker_step_seconds_total", "counter", "Wall time spent in steps.",
         step_seconds_);
  series("shardline_worker_comm_seconds_total", "counter",
         "Time in steps spent waiting on collectives, send and recv.", comm_seconds_);
  series("shardline_worker_steps_total", "counter", "Steps run by this process.",
         static_cast<double>(steps_));
  series("shardline_worker_checkpoint_seconds_total", "counter", "Time spent saving checkpoints.",
         checkpoint_seconds_);
  series("shardline_worker_checkpoints_total", "counter", "Checkpoints saved.",
         static_cast<double>(checkpoints_));
  series("shardline_worker_restores_total", "counter", "Checkpoints restored.",
         static_cast<double>(restores_));
  series("shardline_worker_gloo_stalled_op_threads", "gauge",
         "Collective threads of aborted communicators still blocked inside Gloo (each ends at "
         "the collective timeout, holding its group's sockets until then).",
         static_cast<double>(GlooStalledOpThreads()));
  return out;
}

}  // namespace shardline::worker

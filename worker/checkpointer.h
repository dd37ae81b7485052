// The worker's side of two-phase checkpoints (docs/ARCHITECTURE.md "Checkpoints";
// proto/shardline/v1/checkpoint.proto): save this rank's slices of the
// trainer state as one shard file and report it; restore a committed
// checkpoint onto this rank's (possibly different) layout.
//
//   Checkpointer ckpt(agent.checkpoints(), agent.clock());
//   absl::Status s = ckpt.Save(fence, rank, step, data_cursor, trainer, /*async=*/false);
//   s = ckpt.Restore(job_id, assignment.restore(), trainer);
//
// Save: BeginCheckpoint (every rank gets the same id and directory), write
// <directory>/rank-<rank>.bin (temp + fsync + rename) with a crc32c per
// piece, ReportShard. The last rank's report commits. In async mode the
// write + report run on a background thread while training goes on: a
// state in host memory is copied at once; a state on a GPU is copied into
// the trainer's pinned host copies on a copy stream beside the next step
// (Trainer::SaveSlicesAsync), which the background thread waits for. The
// step counts as saved only when the coordinator commits it. One save is in flight at a time: Save
// and Restore first wait for the previous one.
// Restore: GetManifest, then interval intersection of the manifest's pieces
// with this rank's RestoreSlices; every piece read is checked against its
// crc32c.
//
// Coordinator calls are retried while it answers UNAVAILABLE (restarting),
// for up to kRetryWindow (a minute, measured on the clock), with jittered
// backoff (100 ms doubling to 0.5 s by default, common/backoff.h). Give the
// checkpointer a client whose calls wait at least kMinCallTimeout
// (client::GrpcCheckpointClient's min_timeout): a report may wait for the
// commit's fsyncs on the coordinator, and a manifest can be large.
//
// Thread-safety: one thread calls Save / Restore / Finish; the background
// save runs on its own thread.
#ifndef SHARDLINE_WORKER_CHECKPOINTER_H_
#define SHARDLINE_WORKER_CHECKPOINTER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "worker/train/trainer.h"

namespace shardline::worker {

class Checkpointer {
 public:
  // How long a call is retried while the coordinator answers UNAVAILABLE.
  static constexpr absl::Duration kRetryWindow = absl::Minutes(1);
  // The least deadline the checkpoint client's calls should have.
  static constexpr absl::Duration kMinCallTimeout = absl::Minutes(1);
  // The retry backoff: 100 ms doubling to 0.5 s.
  static BackoffOptions DefaultBackoff();

  // `clock` (not owned, must outlive the checkpointer) paces the retries.
  Checkpointer(std::shared_ptr<client::CheckpointClient> checkpoints, const Clock* clock,
               BackoffOptions backoff = DefaultBackoff());
  ~Checkpointer();  // waits for a background save

  // Saves the state after `step` optimizer steps. Every rank of the
  // generation calls it with the same step. Errors: BeginCheckpoint's
  // (FailedPrecondition: not RUNNING, no checkpoint directory, an older
  // step, ...; Aborted: stale generation), the shard write's (names the
  // path), ReportShard's. In async mode, errors of the background part
  // come from the next Save, Restore or Finish, and `trainer` must outlive
  // the background part (Finish, or destroying the checkpointer, waits for
  // it): it may write from the trainer's host copies.
  absl::Status Save(const v1::Fence& fence, uint32_t rank, int64_t step, uint64_t data_cursor,
                    train::Trainer& trainer, bool async);

  // Waits for a background save and returns its status (OK when none).
  absl::Status Finish();

  // Loads checkpoint `ref` of `job_id` into `trainer` and sets its step.
  // Errors: NotFound (no such checkpoint or tensor); DataLoss (a piece's
  // checksum differs, a file is missing or short, an element is covered by
  // no piece: names tensor and file); Unavailable (the coordinator).
  absl::Status Restore(const std::string& job_id, const v1::CheckpointRef& ref,
                       train::Trainer& trainer);

  // What the last successful Save committed or left pending, for logs (for
  // a background save: PENDING until the next Save, Restore or Finish).
  const v1::CheckpointSummary& last_summary() const { return last_summary_; }

 private:
  // ReportShard (retried while UNAVAILABLE); the answer goes to *summary.
  absl::Status Report(const v1::Fence& fence, const std::string& checkpoint_id,
                      v1::ReportShardRequest request, v1::CheckpointSummary* summary);
  // Runs `call` until it answers something other than UNAVAILABLE or
  // kRetryWindow has passed; a failure's message starts with `rpc`.
  absl::Status WithRetry(const char* rpc, absl::FunctionRef<absl::Status()> call) const;

  const std::shared_ptr<client::CheckpointClient> checkpoints_;
  const Clock* const clock_;
  const BackoffOptions backoff_;
  std::thread background_;
  // Written by the background save's thread; read only after joining it.
  absl::Status background_status_;
  std::optional<v1::CheckpointSummary> background_summary_;
  // The calling thread's view: the last save's summary (a background save's
  // once Finish joined it).
  v1::CheckpointSummary last_summary_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_CHECKPOINTER_H_

#include "worker/checkpointer.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/shard_io.h"
#include "worker/checkpoint/trainer_state.h"

namespace shardline::worker {

BackoffOptions Checkpointer::DefaultBackoff() {
  BackoffOptions o;
  o.initial = absl::Milliseconds(100);
  o.max = absl::Milliseconds(500);
  return o;
}

Checkpointer::Checkpointer(std::shared_ptr<client::CheckpointClient> checkpoints,
                           const Clock* clock, BackoffOptions backoff)
    : checkpoints_(std::move(checkpoints)), clock_(clock), backoff_(backoff) {}

// A coordinator restarting (on its state file) should delay a save or a
// restore, not fail it.
absl::Status Checkpointer::WithRetry(const char* rpc,
                                     absl::FunctionRef<absl::Status()> call) const {
  Backoff backoff(backoff_);
  const absl::Status s =
      Retry(*clock_, backoff, clock_->Now() + kRetryWindow,
            [](const absl::Status& s) { return absl::IsUnavailable(s); }, call);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(rpc, ": ", s.message()));
}

Checkpointer::~Checkpointer() { Finish().IgnoreError(); }

absl::Status Checkpointer::Finish() {
  if (background_.joinable()) background_.join();
  if (background_summary_.has_value()) {
    // The background save's outcome, visible only after the join.
    last_summary_ = *std::move(background_summary_);
    background_summary_.reset();
  }
  absl::Status s = std::move(background_status_);
  background_status_ = absl::OkStatus();
  return s;
}

absl::Status Checkpointer::Report(const v1::Fence& fence, const std::string& checkpoint_id,
                                  v1::ReportShardRequest request,
                                  v1::CheckpointSummary* summary) {
  *request.mutable_fence() = fence;
  request.set_checkpoint_id(checkpoint_id);
  v1::ReportShardResponse response;
  // A repeat of a recorded report is answered with the current summary, so
  // retrying after a lost answer is safe.
  if (absl::Status s = WithRetry("ReportShard",
                                 [&] {
                                   absl::StatusOr<v1::ReportShardResponse> r =
                                       checkpoints_->ReportShard(request);
                                   if (r.ok()) response = *std::move(r);
                                   return r.status();
                                 });
      !s.ok()) {
    return s;
  }
  *summary = response.checkpoint();
  if (response.checkpoint().state() == v1::CHECKPOINT_STATE_ABORTED) {
    return absl::AbortedError(absl::StrCat("checkpoint ", checkpoint_id,
                                           " was aborted: ", response.checkpoint().abort_reason()));
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::Save(const v1::Fence& fence, uint32_t rank, int64_t step,
                                uint64_t data_cursor, train::Trainer& trainer, bool async) {
  if (absl::Status s = Finish(); !s.ok()) return s;
  v1::BeginCheckpointRequest begin;
  *begin.mutable_fence() = fence;
  begin.set_step(static_cast<uint64_t>(step));
  v1::BeginCheckpointResponse opened;
  if (absl::Status s = WithRetry("BeginCheckpoint",
                                 [&] {
                                   absl::StatusOr<v1::BeginCheckpointResponse> r =
                                       checkpoints_->BeginCheckpoint(begin);
                                   if (r.ok()) opened = *std::move(r);
                                   return r.status();
                                 });
      !s.ok()) {
    return s;
  }
  last_summary_.set_checkpoint_id(opened.checkpoint_id());
  last_summary_.set_step(static_cast<uint64_t>(step));
  last_summary_.set_state(v1::CHECKPOINT_STATE_PENDING);
  absl::StatusOr<train::Trainer::SavedSlices> saved = trainer.SaveSlicesAsync();
  if (!saved.ok()) return saved.status();
  const std::vector<checkpoint::LocalRun> runs = FromStateSlices(saved->slices);
  // What writes the shard. Synchronously, or from the trainer's host copies
  // (kept until the next save or restore, each of which waits for the
  // background save first): wait for the device's copies, write them as they
  // are. Asynchronously from the state itself, which the next step changes:
  // the writer copies it now.
  std::function<absl::StatusOr<v1::ReportShardRequest>()> write;
  if (!async || saved->host_copies) {
    write = [ready = saved->ready, runs, directory = opened.directory(),
             rank]() -> absl::StatusOr<v1::ReportShardRequest> {
      if (absl::Status s = ready->Wait(); !s.ok()) return s;
      return checkpoint::WriteShard(directory, static_cast<int>(rank), runs);
    };
  } else {
    auto writer = std::make_shared<checkpoint::AsyncShardWriter>();
    if (absl::Status s = writer->Start(opened.directory(), static_cast<int>(rank), runs);
        !s.ok())
      return s;
    write = [writer] { return writer->Wait(); };
  }
  // Writes, then reports into the summary `slot` gives (asked for only once
  // the shard is written).
  auto write_and_report = [this, write = std::move(write), fence, id = opened.checkpoint_id(),
                           data_cursor](absl::FunctionRef<v1::CheckpointSummary*()> slot) {
    absl::StatusOr<v1::ReportShardRequest> written = write();
    if (!written.ok()) return written.status();
    written->set_data_cursor(data_cursor);
    return Report(fence, id, *std::move(written), slot());
  };
  if (!async) return write_and_report([this] { return &last_summary_; });
  // The write and the report run in the background while training goes on.
  background_ = std::thread([this, write_and_report = std::move(write_and_report)] {
    background_status_ = write_and_report([this] { return &background_summary_.emplace(); });
  });
  return absl::OkStatus();
}

absl::Status Checkpointer::Restore(const std::string& job_id, const v1::CheckpointRef& ref,
                                   train::Trainer& trainer) {
  if (absl::Status s = Finish(); !s.ok()) return s;
  const std::vector<train::Trainer::StateSlice> slices = trainer.RestoreSlices();
  v1::GetManifestRequest request;
  request.set_job_id(job_id);
  request.set_checkpoint_id(ref.checkpoint_id());
  // Only the tensors this rank needs.
  std::vector<std::string> names;
  for (const train::Trainer::StateSlice& s : slices) {
    if (names.empty() || names.back() != s.tensor) names.push_back(s.tensor);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const std::string& n : names) request.add_tensors(n);
  v1::Manifest manifest;
  if (absl::Status s = WithRetry("GetManifest",
                                 [&] {
                                   absl::StatusOr<v1::Manifest> r =
                                       checkpoints_->GetManifest(request);
                                   if (r.ok()) manifest = *std::move(r);
                                   return r.status();
                                 });
      !s.ok()) {
    // Names the checkpoint, as every restore error does: the coordinator
    // falls back from a restore point named in a DataLoss report.
    return absl::Status(s.code(),
                        absl::StrCat("restoring ", ref.checkpoint_id(), ": ", s.message()));
  }
  if (absl::Status s = checkpoint::ReadRuns(manifest, manifest.directory(),
                                             FromStateSlices(slices));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("restoring ", ref.checkpoint_id(), ": ", s.message()));
  }
  return trainer.FinishRestore(static_cast<int64_t>(manifest.step()));
}

}  // namespace shardline::worker

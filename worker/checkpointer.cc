#include "worker/checkpointer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/shard_io.h"
#include "worker/checkpoint/trainer_state.h"

namespace shardline::worker {
namespace {


// Token and deadline of one call. Checkpoint calls may wait for a commit
// (fsyncs on the coordinator) or carry a large manifest: at least a minute.
void Prepare(const client::ConnectionOptions& connection, grpc::ClientContext* ctx) {
  if (!connection.token.empty()) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", connection.token));
  }
  ctx->set_deadline(
      absl::ToChronoTime(absl::Now() + std::max(connection.timeout, absl::Minutes(1))));
}

absl::Status FromGrpc(const grpc::Status& s, const char* rpc) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(rpc, ": ", s.error_message()));
}

// Calls `rpc` until it answers something other than UNAVAILABLE or a
// minute has passed: a coordinator restarting (on its state file) should
// delay a save or a restore, not fail it. Backoff 100 ms doubling to 0.5 s.
template <typename Rpc>
grpc::Status WithRetry(const client::ConnectionOptions& connection, Rpc rpc) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  absl::Duration backoff = absl::Milliseconds(100);
  for (;;) {
    grpc::ClientContext ctx;
    Prepare(connection, &ctx);
    grpc::Status s = rpc(&ctx);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + backoff > deadline) {
      return s;
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(500));
  }
}

}  // namespace

Checkpointer::Checkpointer(std::shared_ptr<grpc::Channel> channel,
                           client::ConnectionOptions connection)
    : channel_(std::move(channel)),
      connection_(std::move(connection)),
      stub_(v1::CheckpointService::NewStub(channel_)) {}

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
  grpc::Status rpc = WithRetry(connection_, [&](grpc::ClientContext* ctx) {
    return stub_->ReportShard(ctx, request, &response);
  });
  if (absl::Status s = FromGrpc(rpc, "ReportShard"); !s.ok()) return s;
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
  grpc::Status rpc = WithRetry(connection_, [&](grpc::ClientContext* ctx) {
    return stub_->BeginCheckpoint(ctx, begin, &opened);
  });
  if (absl::Status s = FromGrpc(rpc, "BeginCheckpoint"); !s.ok()) return s;
  last_summary_.set_checkpoint_id(opened.checkpoint_id());
  last_summary_.set_step(static_cast<uint64_t>(step));
  last_summary_.set_state(v1::CHECKPOINT_STATE_PENDING);
  const std::vector<checkpoint::LocalRun> runs =
      FromStateSlices(trainer.SaveSlices());
  if (!async) {
    absl::StatusOr<v1::ReportShardRequest> written =
        checkpoint::WriteShard(opened.directory(), static_cast<int>(rank), runs);
    if (!written.ok()) return written.status();
    written->set_data_cursor(data_cursor);
    return Report(fence, opened.checkpoint_id(), *std::move(written), &last_summary_);
  }
  // The state is copied now; the write and the report run in the
  // background while training goes on.
  auto writer = std::make_shared<checkpoint::AsyncShardWriter>();
  if (absl::Status s = writer->Start(opened.directory(), static_cast<int>(rank), runs); !s.ok())
    return s;
  background_ = std::thread([this, writer, fence, id = opened.checkpoint_id(), data_cursor] {
    absl::StatusOr<v1::ReportShardRequest> written = writer->Wait();
    if (!written.ok()) {
      background_status_ = written.status();
      return;
    }
    written->set_data_cursor(data_cursor);
    background_status_ = Report(fence, id, *std::move(written), &background_summary_.emplace());
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
  grpc::Status rpc = WithRetry(connection_, [&](grpc::ClientContext* ctx) {
    return stub_->GetManifest(ctx, request, &manifest);
  });
  if (absl::Status s = FromGrpc(rpc, "GetManifest"); !s.ok()) {
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

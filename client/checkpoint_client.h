// CheckpointClient: two-phase checkpoints and their manifests
// (CheckpointService in proto/shardline/v1/coordinator.proto; the protocol
// in checkpoint.proto), as an interface (fake in
// testing/fake_checkpoint_client.h) and its gRPC implementation.
//
//   GrpcCheckpointClient checkpoints(channel, options, /*min_timeout=*/absl::Minutes(1));
//   absl::StatusOr<v1::BeginCheckpointResponse> opened = checkpoints.BeginCheckpoint(begin);
//   ... write the shard under opened->directory() ...
//   absl::StatusOr<v1::ReportShardResponse> reported = checkpoints.ReportShard(report);
//
// Errors: every method returns the coordinator's status code; the gRPC
// implementation's messages are client::FromGrpcStatus's. The codes below
// are those particular to each call; any call may also return UNAVAILABLE
// (retry with backoff), DEADLINE_EXCEEDED (no answer within its deadline),
// UNAUTHENTICATED / PERMISSION_DENIED, INVALID_ARGUMENT (a field missing
// or malformed: names it) and NOT_FOUND (no such job). Fenced calls
// (BeginCheckpoint, ReportShard) may also return ABORTED (stale fence) and
// FAILED_PRECONDITION (the job is finished).
//
// Retries: every call is safe to repeat (ReportShard with identical
// content). No method retries by itself.
//
// Thread-safety: implementations are thread-safe.
#ifndef SHARDLINE_CLIENT_CHECKPOINT_CLIENT_H_
#define SHARDLINE_CLIENT_CHECKPOINT_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "client/coordinator_channels.h"
#include "grpcpp/grpcpp.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::client {

namespace v1 = ::shardline::v1;

namespace internal {
template <typename Service>
class ReplicaStubs;
}  // namespace internal

class CheckpointClient {
 public:
  virtual ~CheckpointClient() = default;

  // Opens the checkpoint of (fence's job and generation, step), or joins the
  // one another rank opened; returns its id and the directory to write the
  // shard in. Errors: FAILED_PRECONDITION (a spare; the job is not RUNNING
  // or has no checkpoint directory; step <= the newest committed step;
  // another step's checkpoint is PENDING; this (generation, step) was
  // already aborted); INVALID_ARGUMENT also for a step beyond train_steps.
  virtual absl::StatusOr<v1::BeginCheckpointResponse> BeginCheckpoint(
      const v1::BeginCheckpointRequest& request) = 0;
  // Reports the files and pieces this rank wrote (once per rank); returns
  // the checkpoint's summary, COMMITTED when this report completed the set,
  // or ABORTED (with abort_reason) when the commit failed. Errors:
  // NOT_FOUND (no such checkpoint); FAILED_PRECONDITION (not PENDING, or the
  // caller holds no rank); ALREADY_EXISTS (this rank reported different
  // content); INVALID_ARGUMENT also for pieces or files that do not add up
  // (names the tensor and field).
  virtual absl::StatusOr<v1::ReportShardResponse> ReportShard(
      const v1::ReportShardRequest& request) = 0;
  // Commits a checkpoint whose ranks have all reported (admin only).
  // Errors: NOT_FOUND; FAILED_PRECONDITION (ranks missing, or ABORTED);
  // DATA_LOSS (pieces leave a gap or overlap, or a file is missing or of
  // another size: the checkpoint is then ABORTED).
  virtual absl::StatusOr<v1::CheckpointSummary> CommitCheckpoint(
      const v1::CommitCheckpointRequest& request) = 0;
  // Aborts a PENDING checkpoint (an ABORTED one is returned unchanged).
  // Errors: NOT_FOUND; FAILED_PRECONDITION (COMMITTED); INVALID_ARGUMENT
  // (a worker token without fence, or another job's fence).
  virtual absl::StatusOr<v1::CheckpointSummary> AbortCheckpoint(
      const v1::AbortCheckpointRequest& request) = 0;
  // Lists the job's checkpoints, newest step first, a page at a time.
  // Errors: INVALID_ARGUMENT also for a malformed page_token.
  virtual absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request) = 0;
  // Returns a checkpoint's manifest (the newest committed one when
  // checkpoint_id is empty), only request.tensors when given. Errors:
  // NOT_FOUND (no such checkpoint, nothing committed yet, or a tensor not in
  // it: names it).
  virtual absl::StatusOr<v1::Manifest> GetManifest(const v1::GetManifestRequest& request) = 0;
};

// CheckpointClient over gRPC: every call carries options.token and a
// deadline of max(options.timeout, min_timeout) (client::Prepare); errors
// are client::FromGrpcStatus's. A worker passes a minimum of a minute: its
// reports may wait for a commit (fsyncs on the coordinator) and its
// manifests can be large.
class GrpcCheckpointClient final : public CheckpointClient {
 public:
  // One channel (one coordinator, or the first replica of options.address).
  GrpcCheckpointClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options,
                       absl::Duration min_timeout = absl::ZeroDuration());
  // Every call to the leader of `channels` (client/coordinator_channels.h).
  GrpcCheckpointClient(std::shared_ptr<CoordinatorChannels> channels, ConnectionOptions options,
                       absl::Duration min_timeout = absl::ZeroDuration());
  ~GrpcCheckpointClient() override;

  absl::StatusOr<v1::BeginCheckpointResponse> BeginCheckpoint(
      const v1::BeginCheckpointRequest& request) override;
  absl::StatusOr<v1::ReportShardResponse> ReportShard(
      const v1::ReportShardRequest& request) override;
  absl::StatusOr<v1::CheckpointSummary> CommitCheckpoint(
      const v1::CommitCheckpointRequest& request) override;
  absl::StatusOr<v1::CheckpointSummary> AbortCheckpoint(
      const v1::AbortCheckpointRequest& request) override;
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request) override;
  absl::StatusOr<v1::Manifest> GetManifest(const v1::GetManifestRequest& request) override;

 private:
  const ConnectionOptions options_;  // timeout: at least min_timeout
  const std::unique_ptr<internal::ReplicaStubs<v1::CheckpointService>> stubs_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_CHECKPOINT_CLIENT_H_

// CheckpointService of proto/shardline/v1/coordinator.proto over the
// CheckpointFlow (server/checkpoint_flow.h), which holds the business rules
// and the checkpoint files: each method authenticates (and checks the
// fence), then calls the flow. Every method is on gRPC's sync API: its body
// runs on a sync-server thread (server/rpc/call.h); a ReportShard that
// commits holds it for the commit's checks, store write and file writes.
//
// Errors per method, besides the codes of coordinator.proto "Errors" that
// any RPC may return (UNAUTHENTICATED / PERMISSION_DENIED first,
// UNAVAILABLE while shutting down or without the state store,
// RESOURCE_EXHAUSTED for an oversized message).
//   BeginCheckpoint (worker, fenced): INVALID_ARGUMENT
//     "fence.worker.job_id must be non-empty"; Coordinator::CheckFence's
//     (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ABORTED);
//     CheckpointFlow::Begin's (INVALID_ARGUMENT step beyond train_steps;
//     FAILED_PRECONDITION no rank, job not RUNNING, no checkpoint
//     directory; then CheckpointRegistry::Begin's: FAILED_PRECONDITION step
//     not above the newest usable committed one, another step PENDING,
//     already aborted or committed; UNAVAILABLE not recorded).
//   ReportShard (worker, fenced): the fence errors as above;
//     CheckpointFlow::ReportShard's (FAILED_PRECONDITION no rank; then
//     CheckpointRegistry::ReportShard's: INVALID_ARGUMENT a malformed
//     report, NOT_FOUND no such checkpoint, FAILED_PRECONDITION not PENDING
//     or another generation's, ALREADY_EXISTS different content). A failed
//     commit is not an error: the answer shows ABORTED and why.
//   CommitCheckpoint (admin): INVALID_ARGUMENT job_id empty; NOT_FOUND no
//     job or checkpoint; FAILED_PRECONDITION ranks missing (now ABORTED) or
//     already ABORTED; DATA_LOSS the commit's checks failed (now ABORTED).
//   AbortCheckpoint (the admin token, or the member token of the fence's
//     incarnation with a fence): INVALID_ARGUMENT
//     job_id empty, a member or job token without a fence, or
//     fence.worker.job_id differing from job_id; CheckFence's errors;
//     NOT_FOUND no job or checkpoint; FAILED_PRECONDITION COMMITTED.
//   ListCheckpoints (worker): INVALID_ARGUMENT job_id empty, or a bad
//     page_token; NOT_FOUND no job. Marked checkpoints carry
//     unusable_reason.
//   GetManifest (worker): INVALID_ARGUMENT job_id empty; NOT_FOUND no job,
//     no such checkpoint, nothing committed (empty id), or a tensor not in
//     it. unusable_reason is the mark's reason, if any.
//
// Thread-safety: thread-safe.
#ifndef SHARDLINE_SERVER_RPC_CHECKPOINT_SERVICE_H_
#define SHARDLINE_SERVER_RPC_CHECKPOINT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "server/checkpoint_flow.h"
#include "server/coordinator.h"
#include "server/rpc/call.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server::rpc {

class CheckpointServiceImpl final : public v1::CheckpointService::Service {
 public:
  // Not owned; all must outlive the service.
  CheckpointServiceImpl(CallRunner* calls, Coordinator* coordinator, CheckpointFlow* checkpoints);

  grpc::Status BeginCheckpoint(grpc::ServerContext* ctx, const v1::BeginCheckpointRequest* req,
                               v1::BeginCheckpointResponse* resp) override;
  grpc::Status ReportShard(grpc::ServerContext* ctx, const v1::ReportShardRequest* req,
                           v1::ReportShardResponse* resp) override;
  grpc::Status CommitCheckpoint(grpc::ServerContext* ctx, const v1::CommitCheckpointRequest* req,
                                v1::CheckpointSummary* resp) override;
  grpc::Status AbortCheckpoint(grpc::ServerContext* ctx, const v1::AbortCheckpointRequest* req,
                               v1::CheckpointSummary* resp) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx, const v1::ListCheckpointsRequest* req,
                               v1::ListCheckpointsResponse* resp) override;
  grpc::Status GetManifest(grpc::ServerContext* ctx, const v1::GetManifestRequest* req,
                           v1::Manifest* resp) override;

 private:
  CallRunner* const calls_;
  Coordinator* const coordinator_;  // AbortCheckpoint's fence
  CheckpointFlow* const checkpoints_;
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_CHECKPOINT_SERVICE_H_

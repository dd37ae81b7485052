// JobService of proto/shardline/v1/coordinator.proto over the Coordinator:
// each method checks the request's limits (server/limits.h), authenticates,
// checks the request's ids, calls the component and packs its answer.
// Every method but WatchJob is on gRPC's sync API: its body runs on a
// sync-server thread (server/rpc/call.h); WatchJob is on the callback API
// and holds no thread while it streams (server/rpc/watch_stream.h).
//
// Errors per method. Every method may also answer with the codes of
// coordinator.proto "Errors" that any RPC may return: UNAUTHENTICATED /
// PERMISSION_DENIED (authentication, first), UNAVAILABLE (shutting down or
// the state store), RESOURCE_EXHAUSTED (message over kMaxMessageBytes,
// gRPC's own check). "Admin" methods need the admin token; "worker" ones
// (reads) the admin token, the job's worker token or one of its member
// tokens.
//   CreateJob (admin): INVALID_ARGUMENT: the spec (spec::ResolveJobSpec's
//     message names the field), a spec.checkpoint.directory the coordinator
//     cannot create (CheckpointFlow::CreateJob), or a malformed job_id;
//     ALREADY_EXISTS: job_id exists with another spec; RESOURCE_EXHAUSTED:
//     max_jobs unfinished jobs (Coordinator::CreateJob). Without an admin
//     token configured the answer's worker_token is empty.
//   GetJob (worker): INVALID_ARGUMENT: job_id empty; NOT_FOUND: no job.
//   ListJobs (admin): INVALID_ARGUMENT: a malformed page_token or one from
//     a call with other phases (Coordinator::ListJobs).
//   CancelJob (admin): INVALID_ARGUMENT: job_id empty, or reason over 1024
//     bytes or with control characters; NOT_FOUND; FAILED_PRECONDITION: the
//     job is COMPLETED or FAILED. The job's rendezvous state is dropped and
//     its pending checkpoint aborted (CheckpointFlow::AbortPendingCheckpoint).
//   ListMembers (worker): INVALID_ARGUMENT: job_id empty; NOT_FOUND.
//   DrainWorker (admin): INVALID_ARGUMENT: job_id or worker_id empty,
//     reason over 1024 bytes or with control characters; NOT_FOUND: no job
//     or worker; FAILED_PRECONDITION: see Coordinator::DrainWorker. A
//     generation the drain ended is passed on (CoordinatorServer::PassOn).
//   GetPlan (worker): INVALID_ARGUMENT: job_id empty; NOT_FOUND;
//     FAILED_PRECONDITION: no generation formed yet.
//   GetShardOwner (worker): INVALID_ARGUMENT: job_id empty, parameter empty
//     or element outside the tensor; NOT_FOUND: no job or parameter;
//     FAILED_PRECONDITION: no generation formed yet.
//   WhatIf (worker): what losing some workers would do, changing nothing
//     (Coordinator::WhatIf). INVALID_ARGUMENT: job_id empty,
//     lose_worker_ids empty, over kMaxWhatIfWorkers or naming a worker
//     twice; NOT_FOUND: no job, or a worker that never joined it;
//     FAILED_PRECONDITION: the job is finished, external, or has no formed
//     generation.
//   WatchJob (worker): replay, then every event as the job's event log
//     wakes the stream (no polling); ends OK after the PhaseChanged to a
//     terminal phase (at once for a job already terminal, after its
//     replay). INVALID_ARGUMENT: job_id empty; NOT_FOUND; OUT_OF_RANGE: an
//     after_sequence outside [oldest retained - 1, newest];
//     RESOURCE_EXHAUSTED: events the watcher had not received were dropped
//     from the coordinator's retention (reconnect with after_sequence = the
//     last received), or kMaxWatchersPerJob / kMaxWatchers watchers are
//     open already; CANCELLED: the watcher went away; UNAVAILABLE: the
//     server is shutting down. See server/rpc/watch_stream.h.
//
// Thread-safety: thread-safe (gRPC calls the methods concurrently).
#ifndef SHARDLINE_SERVER_RPC_JOB_SERVICE_H_
#define SHARDLINE_SERVER_RPC_JOB_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/checkpoint_flow.h"
#include "server/coordinator.h"
#include "server/rendezvous.h"
#include "server/rpc/call.h"
#include "server/rpc/watch_stream.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server::rpc {

class JobServiceImpl final
    : public v1::JobService::WithCallbackMethod_WatchJob<v1::JobService::Service> {
 public:
  // Not owned; all must outlive the service. `pass_on`: see
  // CheckpointFlow::PassOnFn.
  JobServiceImpl(CallRunner* calls, Coordinator* coordinator, Rendezvous* rendezvous,
                 CheckpointFlow* checkpoints, CheckpointFlow::PassOnFn pass_on,
                 WatchStreams* watches);

  grpc::Status CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* req,
                         v1::CreateJobResponse* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::Job* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::Job* resp) override;
  grpc::Status ListMembers(grpc::ServerContext* ctx, const v1::ListMembersRequest* req,
                           v1::ListMembersResponse* resp) override;
  grpc::Status DrainWorker(grpc::ServerContext* ctx, const v1::DrainWorkerRequest* req,
                           v1::Member* resp) override;
  grpc::Status GetPlan(grpc::ServerContext* ctx, const v1::GetPlanRequest* req,
                       v1::Plan* resp) override;
  grpc::Status GetShardOwner(grpc::ServerContext* ctx, const v1::GetShardOwnerRequest* req,
                             v1::GetShardOwnerResponse* resp) override;
  grpc::Status WhatIf(grpc::ServerContext* ctx, const v1::WhatIfRequest* req,
                      v1::WhatIfResponse* resp) override;
  // On the callback API: server/rpc/watch_stream.h.
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchJobRequest* req) override;

 private:
  CallRunner* const calls_;
  Coordinator* const coordinator_;
  Rendezvous* const rendezvous_;
  CheckpointFlow* const checkpoints_;
  const CheckpointFlow::PassOnFn pass_on_;
  WatchStreams* const watches_;
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_JOB_SERVICE_H_

// WorkerService of proto/shardline/v1/coordinator.proto over the
// Coordinator, the CheckpointFlow (ReportError's restore fallback) and the
// Session streams.
//
// Where each method runs (server/rpc/call.h):
//   ReportError, LeaveJob, CompleteJob: sync API, on a sync-server thread.
//   JoinJob: callback API; the body runs on the HandlerPool (it never
//     waits), so that 100k workers joining at once do not exhaust the sync
//     server's threads (RESOURCE_EXHAUSTED "Server Threadpool Exhausted").
//   GetAssignment: callback API; the body runs on the HandlerPool. With
//     wait it holds no thread while it waits: the Coordinator calls its
//     waker (Coordinator::PollAssignment) when the member's answer may have
//     changed, a gRPC alarm ends it at its deadline, and a cancelled call
//     or EndAssignmentWaits (shutdown) ends it at once. (A sync-server
//     thread per waiting worker meant 4096 threads at 4096 workers.)
//   Heartbeat: callback API; the body runs on the HandlerPool (it never
//     waits).
//   Session: callback API; the stream holds no thread
//     (server/rpc/session_stream.h).
//
// Errors per method, besides the codes of coordinator.proto "Errors" that
// any RPC may return (UNAUTHENTICATED / PERMISSION_DENIED first,
// UNAVAILABLE while shutting down or without the state store,
// RESOURCE_EXHAUSTED for an oversized message). JoinJob needs the admin
// token, the job's worker token or the joining incarnation's member token;
// every other method the admin token or the member token of the identity it
// names (PERMISSION_DENIED otherwise, CallRunner::AuthorizeMember). Each
// answers INVALID_ARGUMENT
// "<field> must be non-empty" for an empty job id (worker.job_id or
// fence.worker.job_id); fenced methods then answer Coordinator::CheckFence's
// errors (INVALID_ARGUMENT incomplete fence, NOT_FOUND, FAILED_PRECONDITION
// job finished, ABORTED stale generation or replaced incarnation).
//   JoinJob: Coordinator::JoinJob's (INVALID_ARGUMENT bad worker_id,
//     incarnation, device or backend; NOT_FOUND; FAILED_PRECONDITION job
//     finished or another backend; RESOURCE_EXHAUSTED too many workers;
//     UNAVAILABLE not recorded). Counted in metrics (CountJoin).
//   Session: see server/rpc/session_stream.h.
//   GetAssignment: INVALID_ARGUMENT: timeout malformed, negative or over
//     kMaxAssignmentTimeout; FAILED_PRECONDITION: not formed and wait false;
//     DEADLINE_EXCEEDED: not formed by the earlier of the timeout (default
//     kDefaultAssignmentTimeout) and the gRPC deadline; ABORTED: the
//     generation ended while waiting; CANCELLED: the caller cancelled.
//   Heartbeat: Coordinator::Heartbeat's (INVALID_ARGUMENT state or step).
//     Counted in metrics (CountHeartbeat).
//   ReportError: Coordinator::ReportError's (INVALID_ARGUMENT code not a
//     failure or peer_rank not a rank; FAILED_PRECONDITION the caller holds
//     no rank). A DATA_LOSS naming the restore point falls back to an older
//     checkpoint (CheckpointFlow::ReportError). Ended generations are passed
//     on.
//   LeaveJob: Coordinator::LeaveJob's (NOT_FOUND; ABORTED a replaced
//     incarnation). Ended generations are passed on.
//   CompleteJob: Coordinator::CompleteJob's (INVALID_ARGUMENT reason;
//     NOT_FOUND; FAILED_PRECONDITION a GPT job, or FAILED / CANCELLED;
//     ABORTED the caller is LOST, LEFT or replaced). The completed
//     generation is passed on (its blocked rendezvous calls end ABORTED).
//
// Thread-safety: thread-safe.
#ifndef SHARDLINE_SERVER_RPC_WORKER_SERVICE_H_
#define SHARDLINE_SERVER_RPC_WORKER_SERVICE_H_

#include <map>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "server/checkpoint_flow.h"
#include "server/coordinator.h"
#include "server/rpc/call.h"
#include "server/rpc/session_stream.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server::rpc {

class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Session<
          v1::WorkerService::WithCallbackMethod_Heartbeat<
              v1::WorkerService::WithCallbackMethod_GetAssignment<
                  v1::WorkerService::WithCallbackMethod_JoinJob<v1::WorkerService::Service>>>> {
 public:
  // Not owned; all must outlive the service. `pass_on`: see
  // CheckpointFlow::PassOnFn.
  WorkerServiceImpl(CallRunner* calls, Coordinator* coordinator, CheckpointFlow* checkpoints,
                    SessionStreams* sessions, CheckpointFlow::PassOnFn pass_on);

  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const v1::JoinJobRequest* req,
                                    v1::JoinJobResponse* resp) override;
  grpc::ServerWriteReactor<v1::SessionMessage>* Session(grpc::CallbackServerContext* ctx,
                                                        const v1::SessionRequest* req) override;
  grpc::ServerUnaryReactor* GetAssignment(grpc::CallbackServerContext* ctx,
                                          const v1::GetAssignmentRequest* req,
                                          v1::Assignment* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::Status ReportError(grpc::ServerContext* ctx, const v1::ReportErrorRequest* req,
                           v1::ReportErrorResponse* resp) override;
  grpc::Status LeaveJob(grpc::ServerContext* ctx, const v1::LeaveJobRequest* req,
                        v1::LeaveJobResponse* resp) override;
  grpc::Status CompleteJob(grpc::ServerContext* ctx, const v1::CompleteJobRequest* req,
                           v1::Job* resp) override;

  // Ends every waiting GetAssignment with UNAVAILABLE (the server is
  // shutting down; CallRunner::BeginShutdown first). Returns at once; the
  // calls finish on the HandlerPool.
  void EndAssignmentWaits() ABSL_LOCKS_EXCLUDED(waits_mu_);

  class AssignmentWait;  // one waiting GetAssignment (worker_service.cc)

 private:
  friend class AssignmentWait;
  CallRunner* const calls_;
  Coordinator* const coordinator_;
  CheckpointFlow* const checkpoints_;
  SessionStreams* const sessions_;
  const CheckpointFlow::PassOnFn pass_on_;
  // The waiting GetAssignment calls, for EndAssignmentWaits.
  absl::Mutex waits_mu_;
  std::map<AssignmentWait*, std::weak_ptr<AssignmentWait>> waits_ ABSL_GUARDED_BY(waits_mu_);
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_WORKER_SERVICE_H_

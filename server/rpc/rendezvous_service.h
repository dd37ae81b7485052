// RendezvousService of proto/shardline/v1/coordinator.proto over the
// Rendezvous (server/rendezvous.h). Every call is fenced: the fence is
// checked by the Coordinator (CallRunner::AuthorizeFence), then the
// Rendezvous gets the fence's job_id and generation.
//
// Where each method runs (server/rpc/call.h):
//   KvSet, KvAdd, KvCompareAndSet, KvDelete, and KvGet without wait:
//     callback API (they never wait), CallRunner::RunFenced: on the gRPC
//     thread that received the call when the coordinator's lock is free at
//     once, else on the HandlerPool. An operator's KvGet (no fence): on the
//     HandlerPool.
//   KvGet with wait, KvWait, Barrier: callback API, and no thread while
//     they wait (Rendezvous::AwaitKey, AwaitKeys, BarrierArrive; their
//     checks and start as RunFenced's), so any number of callers may wait at once
//     (the Rendezvous charges each waiting KvGet/KvWait to its
//     generation's budget of waiting calls); not sliced: a call whose deadline passes, or whose caller
//     cancels, is withdrawn (an alarm at the earlier of the request's
//     timeout and the gRPC deadline); ended by Rendezvous::DropJob at
//     shutdown.
//   KvNumKeys: sync API; never waits.
//
// Errors per method, besides the codes of coordinator.proto "Errors" that
// any RPC may return (UNAUTHENTICATED / PERMISSION_DENIED first,
// UNAVAILABLE while shutting down, RESOURCE_EXHAUSTED for an oversized
// message). Every fenced call answers INVALID_ARGUMENT
// "fence.worker.job_id must be non-empty", then Coordinator::CheckFence's
// errors (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ABORTED), then
// the Rendezvous's (its "Errors common to every method": INVALID_ARGUMENT
// scope too long; ABORTED the generation ended, also while waiting).
//   KvSet: INVALID_ARGUMENT key or value; RESOURCE_EXHAUSTED scope or
//     generation full (Rendezvous::Set).
//   KvGet with a fence: INVALID_ARGUMENT key, or timeout malformed,
//     negative or over kMaxWaitTimeout; DEADLINE_EXCEEDED wait and the key
//     was not set by the earlier of the timeout (default
//     kDefaultWaitTimeout) and the gRPC deadline; CANCELLED the caller
//     cancelled while waiting (it is withdrawn); RESOURCE_EXHAUSTED (wait)
//     the waiting call would pass kMaxWaitingBytesPerGeneration
//     (Rendezvous::Get).
//   KvGet without a fence (an operator's read, admin token): INVALID_ARGUMENT
//     job_id empty, wait set, or a generation that does not exist yet;
//     NOT_FOUND no job; FAILED_PRECONDITION the generation is over (its keys
//     were dropped); then Rendezvous::Get's.
//   KvAdd: Rendezvous::Add's (INVALID_ARGUMENT key; FAILED_PRECONDITION not
//     an int64 counter; OUT_OF_RANGE overflow; RESOURCE_EXHAUSTED).
//   KvCompareAndSet: Rendezvous::CompareAndSet's (INVALID_ARGUMENT;
//     RESOURCE_EXHAUSTED).
//   KvWait: INVALID_ARGUMENT timeout as for KvGet, or keys (Rendezvous::Wait);
//     DEADLINE_EXCEEDED some keys still missing; CANCELLED the caller
//     cancelled while waiting; RESOURCE_EXHAUSTED the waiting call would
//     pass kMaxWaitingBytesPerGeneration (Rendezvous::Wait).
//   KvDelete: INVALID_ARGUMENT key (Rendezvous::Delete).
//   KvNumKeys: the common errors only (Rendezvous::NumKeys).
//   Barrier: INVALID_ARGUMENT timeout as for KvGet, name or participants;
//     FAILED_PRECONDITION participants differs from earlier arrivals;
//     DEADLINE_EXCEEDED too few arrived in time (Rendezvous::Barrier);
//     CANCELLED the caller cancelled while waiting (it is withdrawn).
//
// Thread-safety: thread-safe.
#ifndef SHARDLINE_SERVER_RPC_RENDEZVOUS_SERVICE_H_
#define SHARDLINE_SERVER_RPC_RENDEZVOUS_SERVICE_H_

#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/coordinator.h"
#include "server/rendezvous.h"
#include "server/rpc/call.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server::rpc {

class RendezvousServiceImpl final
    : public v1::RendezvousService::WithCallbackMethod_KvSet<
          v1::RendezvousService::WithCallbackMethod_KvGet<
              v1::RendezvousService::WithCallbackMethod_KvAdd<
                  v1::RendezvousService::WithCallbackMethod_KvCompareAndSet<
                      v1::RendezvousService::WithCallbackMethod_KvWait<
                          v1::RendezvousService::WithCallbackMethod_KvDelete<
                              v1::RendezvousService::WithCallbackMethod_Barrier<
                                  v1::RendezvousService::Service>>>>>>> {
 public:
  // Not owned; all must outlive the service.
  RendezvousServiceImpl(CallRunner* calls, Coordinator* coordinator, Rendezvous* rendezvous);

  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* ctx, const v1::KvSetRequest* req,
                                  v1::KvSetResponse* resp) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* req,
                                  v1::KvGetResponse* resp) override;
  grpc::ServerUnaryReactor* KvAdd(grpc::CallbackServerContext* ctx, const v1::KvAddRequest* req,
                                  v1::KvAddResponse* resp) override;
  grpc::ServerUnaryReactor* KvCompareAndSet(grpc::CallbackServerContext* ctx,
                                            const v1::KvCompareAndSetRequest* req,
                                            v1::KvCompareAndSetResponse* resp) override;
  grpc::ServerUnaryReactor* KvWait(grpc::CallbackServerContext* ctx, const v1::KvWaitRequest* req,
                                   v1::KvWaitResponse* resp) override;
  grpc::ServerUnaryReactor* KvDelete(grpc::CallbackServerContext* ctx,
                                     const v1::KvDeleteRequest* req,
                                     v1::KvDeleteResponse* resp) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;

  grpc::Status KvNumKeys(grpc::ServerContext* ctx, const v1::KvNumKeysRequest* req,
                         v1::KvNumKeysResponse* resp) override;

 private:
  // KvGet without a fence: an operator's read-only look (admin token), which
  // proves nobody's liveness and never waits.
  absl::Status OperatorRead(const grpc::ServerContextBase& ctx, const v1::KvGetRequest& req,
                            v1::KvGetResponse* resp);

  CallRunner* const calls_;
  Coordinator* const coordinator_;
  Rendezvous* const rendezvous_;
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_RENDEZVOUS_SERVICE_H_

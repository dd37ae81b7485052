// WorkerService.Session (proto/shardline/v1/coordinator.proto): the
// coordinator's push stream to one worker incarnation, on gRPC's callback
// API, so that an open stream holds no thread.
//
//   SessionStreams sessions(&calls, &coordinator, pass_on);
//   // WorkerServiceImpl::Session:
//   return sessions.Start(ctx, *req);
//   // CoordinatorServer::Shutdown:
//   sessions.EndAll();
//
// How a stream runs: Start authenticates and opens the session
// (Coordinator::OpenSession) with a waker; each queued message wakes a
// HandlerPool thread (server/rpc/call.h), which pulls it
// (Coordinator::NextSessionMessage, no wait) and starts the write, one write
// in flight per stream. gRPC's completion callbacks (a write done, a cancel)
// are posted to the pool too, since they may take the coordinator's lock;
// only OnDone runs on gRPC's thread (it takes no coordinator lock).
//
// How a stream ends:
//   OK           after a STOP directive was written, or once the member has
//                LEFT.
//   UNAVAILABLE  at once when the server shuts down (EndAll; nobody is
//                declared lost: the worker reconnects to the next
//                coordinator and carries on in the same generation); and
//                "the session stream broke" after a cancelled stream (the
//                client went away, noticed when gRPC reports it, not
//                polled) or a failed write: CloseSession then declares the
//                worker LOST at once and its generation's end is passed on.
//   ABORTED      Coordinator::NextSessionMessage's answer when the session
//                was replaced (a second Session of the same incarnation),
//                closed, or the member is gone (unless it LEFT: OK).
//   Before the stream opens: the codes of coordinator.proto Errors
//                (UNAVAILABLE while shutting down, UNAUTHENTICATED,
//                PERMISSION_DENIED), INVALID_ARGUMENT "worker.job_id must be
//                non-empty", and Coordinator::OpenSession's errors
//                (NOT_FOUND: no such job or worker; ABORTED: the
//                incarnation was replaced or is LOST/LEFT).
// Every stream is counted as "WorkerService/Session" in metrics when it is
// done.
//
// Lock order: a stream's own mutex, then the coordinator's lock; the
// coordinator's lock is never held while taking a stream's mutex (the waker
// only posts to the pool).
//
// Thread-safety: SessionStreams is thread-safe; it must outlive every
// stream it started (the gRPC server's Wait() returns after the last one is
// done).
#ifndef SHARDLINE_SERVER_RPC_SESSION_STREAM_H_
#define SHARDLINE_SERVER_RPC_SESSION_STREAM_H_

#include <map>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/checkpoint_flow.h"
#include "server/coordinator.h"
#include "server/rpc/call.h"
#include "shardline/v1/session.pb.h"

namespace shardline::server::rpc {

class SessionStream;   // session_stream.cc
class SessionReactor;  // session_stream.cc

class SessionStreams {
 public:
  // Not owned; all must outlive this. `pass_on` receives the generations a
  // broken stream ended (CoordinatorServer::PassOn).
  SessionStreams(CallRunner* calls, Coordinator* coordinator, CheckpointFlow::PassOnFn pass_on);
  SessionStreams(const SessionStreams&) = delete;
  SessionStreams& operator=(const SessionStreams&) = delete;

  // The Session RPC's handler (gRPC's callback thread): returns the reactor
  // that streams `request.worker()`'s session; see the file comment.
  grpc::ServerWriteReactor<v1::SessionMessage>* Start(grpc::CallbackServerContext* ctx,
                                                      const v1::SessionRequest& request);

  // Shutdown: every open stream ends with UNAVAILABLE, without
  // CloseSession. Call after CallRunner::BeginShutdown.
  void EndAll() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class SessionStream;
  friend class SessionReactor;

  // Whether the member `w` has LEFT (so its Session ends with OK).
  bool HasLeft(const v1::WorkerIdentity& w) const;

  CallRunner* const calls_;
  Coordinator* const coordinator_;
  const CheckpointFlow::PassOnFn pass_on_;
  absl::Mutex mu_;
  std::map<SessionStream*, std::weak_ptr<SessionStream>> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_SESSION_STREAM_H_

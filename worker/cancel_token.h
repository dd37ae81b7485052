// CancelToken: "this generation is over" for the calls that belong to it.
// Cancel() makes every call registered with the token (a gRPC ClientContext)
// end at once with CANCELLED, and every later check see cancelled().
//
//   std::shared_ptr<CancelToken> token = agent.GenerationToken(generation);
//   auto store = std::make_shared<CoordinatorStore>(channel, connection, fence, "dp/0", token);
//   ... the agent learns the generation ended: token->Cancel(reason) ...
//   store->Wait(...) returns Aborted within milliseconds.
//
// A WorkerAgent cancels the token of its generation the moment it learns the
// generation ended (RESTART_AT_GENERATION, an ABORTED answer, its session
// declared lost, STOP, shutdown), so a communicator build blocked in the
// rendezvous does not wait for its connect timeout even when the
// coordinator's answer cannot reach it.
//
// Thread-safety: thread-safe. TryCancel runs under the token's mutex (it
// only flags the call in gRPC and never calls back into the token), so a
// context cannot be destroyed while it is being cancelled.
#ifndef SHARDLINE_WORKER_CANCEL_TOKEN_H_
#define SHARDLINE_WORKER_CANCEL_TOKEN_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::worker {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Cancels (idempotent; the first reason is kept).
  void Cancel(std::string reason) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    reason_ = std::move(reason);
    for (grpc::ClientContext* ctx : contexts_) ctx->TryCancel();
  }
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  std::string reason() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return reason_;
  }
  // Sleeps up to `d`; true (early) when cancelled.
  bool WaitForCancel(absl::Duration d) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&cancelled_), d);
  }
  // `ctx` is cancelled by Cancel() until Unregister. False (nothing
  // registered) when already cancelled: do not start the call.
  bool Register(grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return false;
    contexts_.insert(ctx);
    return true;
  }
  void Unregister(grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(ctx);
  }

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_CANCEL_TOKEN_H_

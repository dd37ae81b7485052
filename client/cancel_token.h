// CancelToken: "these calls are no longer wanted" for a group of calls to
// the coordinator, e.g. every rendezvous call of one generation. Cancel()
// ends every call registered with the token at once (a gRPC call with
// CANCELLED, a fake's blocked call likewise) and makes every later call see
// cancelled() before it starts.
//
//   std::shared_ptr<CancelToken> token = agent.GenerationToken(generation);
//   auto store = std::make_shared<CoordinatorStore>(rendezvous, clock, fence, "dp/0", token);
//   ... the agent learns the generation ended: token->Cancel(reason) ...
//   store->Wait(...) returns Aborted within milliseconds.
//
// A WorkerAgent cancels the token of its generation the moment it learns the
// generation ended (RESTART_AT_GENERATION, an ABORTED answer, its session
// declared lost, STOP, shutdown), so a communicator build blocked in the
// rendezvous does not wait for its connect timeout even when the
// coordinator's answer cannot reach it.
//
// Thread-safety: thread-safe. The callbacks registered by calls run under
// the token's mutex (so a call cannot end and free what its callback
// touches while it runs): they must not call into the token, must not
// block, and may only take locks that are never held while calling into the
// token.
#ifndef SHARDLINE_CLIENT_CANCEL_TOKEN_H_
#define SHARDLINE_CLIENT_CANCEL_TOKEN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardline::client {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Cancels (idempotent; the first reason is kept) and runs every registered
  // callback once.
  void Cancel(std::string reason) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    reason_ = std::move(reason);
    for (auto& [id, on_cancel] : callbacks_) on_cancel();
    callbacks_.clear();
  }
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  std::string reason() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return reason_;
  }
  // Waits on `clock` up to `d`; true (early) when cancelled.
  bool WaitForCancel(const Clock& clock, absl::Duration d) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return clock.AwaitWithTimeout(mu_, absl::Condition(&cancelled_), d);
  }

  // Runs `on_cancel` from Cancel() until Unregister(id) with the returned
  // id. Returns 0, registering nothing, when already cancelled: do not
  // start the call.
  uint64_t Register(std::function<void()> on_cancel) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return 0;
    const uint64_t id = ++last_id_;
    callbacks_.emplace(id, std::move(on_cancel));
    return id;
  }
  // After Unregister returns, the callback is not running and never runs.
  void Unregister(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    callbacks_.erase(id);
  }

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  uint64_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_CANCEL_TOKEN_H_

// CoordinatorStore: a Store (worker/comm/store.h) backed by the coordinator's
// RendezvousService, so communicator groups bootstrap through the control
// plane of their generation.
//
//   auto store = std::make_shared<CoordinatorStore>(agent.rendezvous(), agent.clock(),
//                                                   agent.fence(), "dp/0");
//   auto backend = CreateGlooBackend(store, group_rank, group_size, {});
//
// Every call carries the fence given at construction (one store belongs to
// one generation) and `scope` (the ProcessGroup name, e.g. "tp/0"), so keys
// of different groups and generations never meet. When the generation ends
// the coordinator drops its keys and every call, blocked or not, fails with
// Aborted: abort the group and re-join.
//
// Cancellation: with a CancelToken (e.g. WorkerAgent::GenerationToken),
// every call, blocked or not, fails with Aborted as soon as the token is
// cancelled, without waiting for the coordinator's answer.
//
// Retries: UNAVAILABLE is retried with jittered backoff (`backoff`, default
// 100 ms doubling to 2 s, common/backoff.h) within the call's timeout (Get,
// Wait) or kRetryWindow (Set, Check), measured on `clock`; Add is not
// idempotent on the coordinator and is never retried (Unavailable is
// returned, see store.h). A wait longer than the coordinator's longest
// (rendezvous.proto kMaxWaitTimeout, 1 h) is asked for in slices.
//
// Thread-safety: thread-safe (the clients are; the object is immutable).
#ifndef SHARDLINE_WORKER_COORDINATOR_STORE_H_
#define SHARDLINE_WORKER_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/rendezvous_client.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "worker/comm/store.h"

namespace shardline::worker {

class CoordinatorStore : public Store {
 public:
  // How long Set/Check keep retrying UNAVAILABLE.
  static constexpr absl::Duration kRetryWindow = absl::Seconds(30);

  // `rendezvous` makes the calls (token and deadlines are its business);
  // `clock` (not owned, must outlive the store) measures timeouts and
  // backoff; `cancel` (may be null): see the file comment.
  CoordinatorStore(std::shared_ptr<client::RendezvousClient> rendezvous, const Clock* clock,
                   shardline::v1::Fence fence, std::string scope,
                   std::shared_ptr<client::CancelToken> cancel = nullptr,
                   BackoffOptions backoff = BackoffOptions());

  // Store. Errors map from the coordinator: ABORTED -> Aborted (generation
  // ended; also when the token is cancelled); DEADLINE_EXCEEDED ->
  // DeadlineExceeded naming scope and key;
  // KvAdd's FAILED_PRECONDITION (not an integer) -> InvalidArgument;
  // UNAVAILABLE after retries -> Unavailable; the rest keep their code
  // (INVALID_ARGUMENT for keys or values over the limits of rendezvous.proto).
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // Not part of Store: whether `key` is set, without blocking.
  absl::StatusOr<bool> Check(const std::string& key);

  const std::string& scope() const { return scope_; }
  uint64_t generation() const { return fence_.generation(); }

 private:
  // Runs `attempt(slice)` until it answers something other than
  // UNAVAILABLE or `deadline` passes (see the file comment); `slice` is the
  // time left, capped at kMaxWaitTimeout.
  absl::Status RetryUntil(absl::Time deadline,
                          absl::FunctionRef<absl::Status(absl::Duration slice)> attempt) const;
  // A client's error as the store's: Aborted once the token is cancelled.
  absl::Status ToStatus(const absl::Status& s) const;
  absl::Status CancelledStatus() const;

  const std::shared_ptr<client::RendezvousClient> rendezvous_;
  const Clock* const clock_;
  const shardline::v1::Fence fence_;
  const std::string scope_;
  const std::shared_ptr<client::CancelToken> cancel_;
  const BackoffOptions backoff_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COORDINATOR_STORE_H_

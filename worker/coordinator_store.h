// CoordinatorStore: a Store (worker/comm/store.h) backed by the coordinator's
// RendezvousService, so communicator groups bootstrap through the control
// plane of their generation.
//
//   auto store = std::make_shared<CoordinatorStore>(agent.channel(), agent.connection(),
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
// Retries: UNAVAILABLE is retried with backoff (100 ms doubling to 2 s)
// within the call's timeout (Get, Wait) or kRetryWindow (Set, Check); Add is
// not idempotent on the coordinator and is never retried (Unavailable is
// returned, see store.h).
//
// Thread-safety: thread-safe (gRPC stubs are; the object is immutable).
#ifndef SHARDLINE_WORKER_COORDINATOR_STORE_H_
#define SHARDLINE_WORKER_COORDINATOR_STORE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "worker/cancel_token.h"
#include "worker/comm/store.h"

namespace shardline::worker {

class CoordinatorStore : public Store {
 public:
  // How long Set/Check keep retrying UNAVAILABLE.
  static constexpr absl::Duration kRetryWindow = absl::Seconds(30);

  // `connection` gives the token and the deadline of each short call.
  // `cancel` (may be null): see the file comment.
  CoordinatorStore(std::shared_ptr<grpc::Channel> channel, client::ConnectionOptions connection,
                   shardline::v1::Fence fence, std::string scope,
                   std::shared_ptr<CancelToken> cancel = nullptr);

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
  void Prepare(grpc::ClientContext* ctx, absl::Duration deadline) const;
  absl::Status ToStatus(const grpc::Status& s, absl::string_view rpc) const;
  // Runs `call` (one RPC on `ctx`) registered with cancel_.
  template <typename Call>
  grpc::Status Guarded(grpc::ClientContext* ctx, Call call) const;
  absl::Status CancelledStatus() const;

  const client::ConnectionOptions connection_;
  const shardline::v1::Fence fence_;
  const std::string scope_;
  const std::unique_ptr<shardline::v1::RendezvousService::Stub> stub_;
  const std::shared_ptr<CancelToken> cancel_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COORDINATOR_STORE_H_

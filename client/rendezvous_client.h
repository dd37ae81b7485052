// RendezvousClient: the key-value store and barriers of a generation
// (RendezvousService in proto/shardline/v1/coordinator.proto; limits in
// rendezvous.proto), as an interface (fake in
// testing/fake_rendezvous_client.h) and its gRPC implementation.
//
//   GrpcRendezvousClient rendezvous(channel, options);
//   absl::StatusOr<v1::KvGetResponse> got = rendezvous.KvGet(request, token.get());
//
// Every call is scoped by (fence.worker.job_id, fence.generation, scope); a
// call without a fence (KvGet only) is an operator's read-only look and
// needs the admin token.
//
// Cancellation: each call takes a CancelToken (may be null). When it is
// cancelled, the call ends at once with CANCELLED (a blocked wait too), and
// a call started on a cancelled token returns CANCELLED without sending.
//
// Errors: every method returns the coordinator's status code; the gRPC
// implementation's messages are client::FromGrpcStatus's. The codes below
// are those particular to each call; any call may also return UNAVAILABLE
// (retry with backoff), DEADLINE_EXCEEDED (no answer within its deadline),
// UNAUTHENTICATED / PERMISSION_DENIED, NOT_FOUND (no such job, or the
// worker never joined), INVALID_ARGUMENT (fence incomplete, scope or key
// empty or over its limit: names it), ABORTED (stale fence: the generation
// is over; also ends every wait blocked in it) and FAILED_PRECONDITION (the
// job is finished).
//
// Retries: KvSet, KvGet, KvWait, KvDelete, KvNumKeys and Barrier are safe to repeat;
// KvAdd and KvCompareAndSet are not. The gRPC implementation retries only
// between coordinator replicas, within the call's deadline
// (client/grpc_call.h: a follower's leader hint for every call, an ambiguous
// failure only for the safe ones); with one address it makes one attempt.
//
// Deadlines: --timeout, except the calls that wait (KvGet with `wait`,
// KvWait, Barrier): request.timeout + kWaitDeadlineSlack.
//
// Thread-safety: implementations are thread-safe.
#ifndef SHARDLINE_CLIENT_RENDEZVOUS_CLIENT_H_
#define SHARDLINE_CLIENT_RENDEZVOUS_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/cancel_token.h"
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

class RendezvousClient {
 public:
  virtual ~RendezvousClient() = default;

  // Sets scope/key to value (overwrites). Errors: RESOURCE_EXHAUSTED (a new
  // key over kMaxKeysPerScope or kMaxBytesPerGeneration).
  virtual absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request,
                                                  CancelToken* cancel) = 0;
  // Reads scope/key (found, value); with `wait`, waits up to
  // request.timeout for it to be set. Errors: DEADLINE_EXCEEDED (waited and
  // not set in time; the message names scope and key).
  virtual absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request,
                                                  CancelToken* cancel) = 0;
  // Adds delta to the int64 counter at scope/key; returns the new value.
  // Errors: FAILED_PRECONDITION (the key holds text that is not a decimal
  // int64); OUT_OF_RANGE (overflow); RESOURCE_EXHAUSTED (as KvSet).
  virtual absl::StatusOr<v1::KvAddResponse> KvAdd(const v1::KvAddRequest& request,
                                                  CancelToken* cancel) = 0;
  // Stores `desired` if the key holds `expected` (or is missing when
  // `expected` is unset); returns the value after the call and whether it
  // swapped. Errors: RESOURCE_EXHAUSTED (as KvSet).
  virtual absl::StatusOr<v1::KvCompareAndSetResponse> KvCompareAndSet(
      const v1::KvCompareAndSetRequest& request, CancelToken* cancel) = 0;
  // Waits up to request.timeout until every key of request.keys exists.
  // Errors: DEADLINE_EXCEEDED (some key still missing: the message names
  // them); INVALID_ARGUMENT also for no keys or too many.
  virtual absl::StatusOr<v1::KvWaitResponse> KvWait(const v1::KvWaitRequest& request,
                                                    CancelToken* cancel) = 0;
  // Deletes scope/key; a missing key is not an error.
  virtual absl::StatusOr<v1::KvDeleteResponse> KvDelete(const v1::KvDeleteRequest& request,
                                                        CancelToken* cancel) = 0;
  // Counts the keys set in (fence.generation, scope), counters included
  // (torch's Store.num_keys). Deadline: --timeout.
  virtual absl::StatusOr<v1::KvNumKeysResponse> KvNumKeys(const v1::KvNumKeysRequest& request,
                                                          CancelToken* cancel) = 0;
  // Waits up to request.timeout until `participants` distinct workers have
  // arrived at barrier (scope, name). Errors: FAILED_PRECONDITION also when
  // participants differs from earlier arrivals; DEADLINE_EXCEEDED (fewer
  // arrived: the message gives arrived / expected).
  virtual absl::StatusOr<v1::BarrierResponse> Barrier(const v1::BarrierRequest& request,
                                                      CancelToken* cancel) = 0;
};

// RendezvousClient over gRPC: every call carries options.token and its
// deadline (client::Prepare); errors are client::FromGrpcStatus's.
class GrpcRendezvousClient final : public RendezvousClient {
 public:
  // One channel (one coordinator, or the first replica of options.address).
  GrpcRendezvousClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options);
  // Every call to the leader of `channels` (client/coordinator_channels.h).
  GrpcRendezvousClient(std::shared_ptr<CoordinatorChannels> channels, ConnectionOptions options);
  ~GrpcRendezvousClient() override;

  absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request,
                                          CancelToken* cancel) override;
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request,
                                          CancelToken* cancel) override;
  absl::StatusOr<v1::KvAddResponse> KvAdd(const v1::KvAddRequest& request,
                                          CancelToken* cancel) override;
  absl::StatusOr<v1::KvCompareAndSetResponse> KvCompareAndSet(
      const v1::KvCompareAndSetRequest& request, CancelToken* cancel) override;
  absl::StatusOr<v1::KvWaitResponse> KvWait(const v1::KvWaitRequest& request,
                                            CancelToken* cancel) override;
  absl::StatusOr<v1::KvDeleteResponse> KvDelete(const v1::KvDeleteRequest& request,
                                                CancelToken* cancel) override;
  absl::StatusOr<v1::KvNumKeysResponse> KvNumKeys(const v1::KvNumKeysRequest& request,
                                                  CancelToken* cancel) override;
  absl::StatusOr<v1::BarrierResponse> Barrier(const v1::BarrierRequest& request,
                                              CancelToken* cancel) override;

 private:
  const ConnectionOptions options_;
  const std::unique_ptr<internal::ReplicaStubs<v1::RendezvousService>> stubs_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_RENDEZVOUS_CLIENT_H_

// The one path of a unary call in the gRPC clients of this library
// (job_client, worker_client, rendezvous_client, checkpoint_client,
// coordinator_service_client): Prepare (token + deadline), optional
// cancellation, the choice of replica and the retries between replicas
// (CallAttempts), FromGrpcStatus. Internal to //client.
//
// How a call moves between coordinator replicas (coordinator.proto
// "Replicas" and "Retries"); one deadline covers every attempt:
//   * UNAVAILABLE with the leader's address in the trailing metadata
//     (kLeaderMetadataKey): nothing was done; the call goes again at once to
//     that address, every RPC alike; after kMaxImmediateHops such hops in a
//     row, after a backoff.
//   * UNAVAILABLE without it, with several replicas known: the next replica
//     becomes the guess (for the next call as well), and this call goes
//     there again only when that is safe: the request was never sent (the
//     connection could not be made), a follower said "not the leader"
//     (nothing done), or the RPC is idempotent (Retry::kIdempotent). Each
//     replica once, then a backoff (kRetryInitial doubling to kRetryMax)
//     before each further round, while the deadline allows.
//   * With several replicas, an attempt first waits up to kConnectWait for
//     a channel that is still connecting (a host that does not answer), and
//     moves on when it does not connect.
//   * DEADLINE_EXCEEDED with several replicas known: the call ends, and the
//     next replica becomes the guess for the next call (the replica held
//     the call without answering: paused or cut off).
//   * CANCELLED that this client did not ask for (its CancelToken, if any,
//     is not cancelled): the coordinator ended the call without an answer,
//     as a leader stepping down does with the calls still open after its
//     shutdown grace. It is UNAVAILABLE without a hint (the call may have
//     been done; ServerEnded) and moves on as above.
//   * With one replica and no hint: one attempt, as before replicas existed.
//   * Anything else ends the call.
#ifndef SHARDLINE_CLIENT_GRPC_CALL_H_
#define SHARDLINE_CLIENT_GRPC_CALL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/connection.h"
#include "client/coordinator_channels.h"
#include "common/backoff.h"
#include "google/protobuf/duration.pb.h"
#include "grpcpp/grpcpp.h"

namespace shardline::client::internal {

inline constexpr int kMaxImmediateHops = 3;
inline constexpr absl::Duration kRetryInitial = absl::Milliseconds(50);
inline constexpr absl::Duration kRetryMax = absl::Milliseconds(500);
inline constexpr absl::Duration kConnectWait = absl::Seconds(1);

// Whether an RPC may be sent again after an ambiguous failure (the request
// may have been done): coordinator.proto "Retries".
enum class Retry { kIdempotent, kNotIdempotent };
// Who serves the RPC: the leader only, or every replica (CoordinatorService).
enum class Serves { kLeader, kAnyReplica };

// What a failed status says about where to go (pure; tested directly).
struct Outcome {
  // The follower's leader address ("" when none came).
  std::string leader_hint;
  // Nothing was done: a "not the leader" answer, or the request was never
  // sent (the connection could not be made).
  bool nothing_done = false;
};
Outcome Classify(const grpc::Status& status, const grpc::ClientContext* context);

// `status`, except that a CANCELLED this client did not cause (`cancel`,
// which may be null, is not cancelled) becomes UNAVAILABLE saying that the
// coordinator ended the call without an answer (pure; tested directly).
grpc::Status ServerEnded(const grpc::Status& status, const CancelToken* cancel);

// The attempts of one call: where the next goes, whether there is one.
// Used by one thread.
class CallAttempts {
 public:
  // `cancel` may be null; a backoff wait ends early when it is cancelled.
  CallAttempts(CoordinatorChannels& channels, Retry retry, Serves serves, absl::Time deadline,
               CancelToken* cancel);

  // Where the next attempt goes.
  const CoordinatorChannels::Replica& replica() const { return replica_; }
  absl::Time deadline() const { return deadline_; }

  // Before an attempt: with several replicas, waits up to kConnectWait
  // (and the deadline) while replica()'s channel is connecting. OK when it
  // connected or failed (the attempt then fails fast); else the status to
  // treat as the attempt's (UNAVAILABLE, never sent).
  grpc::Status AwaitConnectable() const;

  // After a failed attempt (`context` may be null): updates the shared
  // leader guess and says whether to try again (replica() then says where;
  // any backoff has been waited). False: return Error(status, ...).
  bool Again(const grpc::Status& status, const grpc::ClientContext* context);
  // Like Again, for a failure that must not be retried (a stream that had
  // delivered messages): updates the shared leader guess only.
  void Observe(const grpc::Status& status, const grpc::ClientContext* context);
  // After a successful attempt.
  void Succeeded();

  // FromGrpcStatus(last) for `rpc`, naming the replica of the last attempt
  // and, for UNAVAILABLE and DEADLINE_EXCEEDED after several, every replica
  // tried. CANCELLED when `cancel` ended a backoff wait.
  absl::Status Error(const grpc::Status& last, const ConnectionOptions& options,
                     absl::string_view rpc) const;

 private:
  // The next replica in a round over every replica, without touching the
  // shared guess (Serves::kAnyReplica) or moving it on (kLeader).
  CoordinatorChannels::Replica Next(bool move_shared);
  // Waits the next backoff delay; false when it would pass the deadline or
  // the call was cancelled.
  bool Wait();
  void Tried(const CoordinatorChannels::Replica& r);

  CoordinatorChannels& channels_;
  const Retry retry_;
  const Serves serves_;
  const absl::Time deadline_;
  CancelToken* const cancel_;
  CoordinatorChannels::Replica replica_;
  Backoff backoff_;
  bool cancelled_ = false;          // `cancel` ended a backoff wait
  int hops_ = 0;                    // hint hops in a row without a wait
  std::vector<size_t> round_;       // replicas tried since the last wait
  std::vector<std::string> tried_;  // addresses tried, in order, once each
  // The last failure a replica answered (or gRPC reported), and where.
  std::optional<grpc::Status> last_answer_;
  std::string last_answer_address_;
};

// One stub of `Service` per replica, made on first use (a stub registers
// its methods on its channel, so one per channel, not one per call).
// Thread-safe.
template <typename Service>
class ReplicaStubs {
 public:
  explicit ReplicaStubs(std::shared_ptr<CoordinatorChannels> channels)
      : channels_(std::move(channels)) {}

  CoordinatorChannels& channels() const { return *channels_; }

  typename Service::Stub* For(const CoordinatorChannels::Replica& replica)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stubs_.size() <= replica.index) stubs_.resize(replica.index + 1);
    if (stubs_[replica.index] == nullptr) stubs_[replica.index] = Service::NewStub(replica.channel);
    return stubs_[replica.index].get();
  }

 private:
  const std::shared_ptr<CoordinatorChannels> channels_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<typename Service::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// Runs `call(stub, &context, &response)` on the leader (or, for
// Serves::kAnyReplica, any replica) with a context prepared for `options`
// and one deadline `timeout` from now, cancelled when `cancel` (may be
// null) is, moving between replicas as the file comment says. Errors:
// FromGrpcStatus's for `rpc` (CallAttempts::Error); CANCELLED without
// calling when `cancel` is already cancelled.
template <typename Response, typename Service, typename Call>
absl::StatusOr<Response> UnaryCall(ReplicaStubs<Service>& stubs, const ConnectionOptions& options,
                                   absl::string_view rpc, absl::Duration timeout,
                                   CancelToken* cancel, Retry retry, Call call,
                                   Serves serves = Serves::kLeader) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  CallAttempts attempts(stubs.channels(), retry, serves, deadline, cancel);
  while (true) {
    if (grpc::Status unconnected = attempts.AwaitConnectable(); !unconnected.ok()) {
      if (attempts.Again(unconnected, nullptr)) continue;
      return attempts.Error(unconnected, options, rpc);
    }
    grpc::ClientContext context;
    Prepare(&context, options, deadline);
    uint64_t registration = 0;
    if (cancel != nullptr) {
      registration = cancel->Register([&context] { context.TryCancel(); });
      if (registration == 0) {
        return absl::CancelledError(absl::StrCat(rpc, " was cancelled: ", cancel->reason()));
      }
    }
    Response response;
    const grpc::Status status =
        ServerEnded(call(stubs.For(attempts.replica()), &context, &response), cancel);
    if (cancel != nullptr) cancel->Unregister(registration);
    if (status.ok()) {
      attempts.Succeeded();
      return response;
    }
    if (!attempts.Again(status, &context)) return attempts.Error(status, options, rpc);
  }
}

// The deadline of a call that may wait `wait` on the coordinator.
inline absl::Duration WaitingTimeout(const ConnectionOptions& options, bool waits,
                                     const google::protobuf::Duration& wait) {
  if (!waits) return options.timeout;
  return absl::Seconds(wait.seconds()) + absl::Nanoseconds(wait.nanos()) + kWaitDeadlineSlack;
}

}  // namespace shardline::client::internal

#endif  // SHARDLINE_CLIENT_GRPC_CALL_H_

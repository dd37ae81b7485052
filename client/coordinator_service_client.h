// CoordinatorServiceClient: the coordinator's own status (CoordinatorService
// in proto/shardline/v1/coordinator.proto, served by every replica, leader
// or follower), as an interface and its gRPC implementation. shardctl
// status uses it.
//
//   GrpcCoordinatorServiceClient status(channels, options);
//   absl::StatusOr<v1::CoordinatorStatus> s = status.GetStatus({});
//
// Errors: the coordinator's status code; the gRPC implementation's messages
// are client::FromGrpcStatus's: UNAVAILABLE (no replica answered; names
// them), DEADLINE_EXCEEDED (no answer within --timeout), UNAUTHENTICATED /
// PERMISSION_DENIED (GetStatus needs the admin token), UNIMPLEMENTED (a
// coordinator older than this client).
//
// Retries: GetStatus is a read; the gRPC implementation asks the replicas
// in turn (the believed leader first) until one answers, within --timeout.
//
// Thread-safety: implementations are thread-safe.
#ifndef SHARDLINE_CLIENT_COORDINATOR_SERVICE_CLIENT_H_
#define SHARDLINE_CLIENT_COORDINATOR_SERVICE_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
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

class CoordinatorServiceClient {
 public:
  virtual ~CoordinatorServiceClient() = default;

  // The answering replica's view: every replica, which leads and since
  // when, the state backend and each etcd member's health. Admin only.
  virtual absl::StatusOr<v1::CoordinatorStatus> GetStatus(const v1::GetStatusRequest& request) = 0;
};

// CoordinatorServiceClient over gRPC: the first replica of `channels` that
// answers (the believed leader first; the guess is not changed by this
// client), with options.token and --timeout over all attempts.
class GrpcCoordinatorServiceClient final : public CoordinatorServiceClient {
 public:
  GrpcCoordinatorServiceClient(std::shared_ptr<CoordinatorChannels> channels,
                               ConnectionOptions options);
  ~GrpcCoordinatorServiceClient() override;

  absl::StatusOr<v1::CoordinatorStatus> GetStatus(const v1::GetStatusRequest& request) override;

 private:
  const ConnectionOptions options_;
  const std::unique_ptr<internal::ReplicaStubs<v1::CoordinatorService>> stubs_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_COORDINATOR_SERVICE_CLIENT_H_

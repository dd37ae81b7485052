#include "client/coordinator_service_client.h"

#include <utility>

#include "client/grpc_call.h"

namespace shardline::client {

GrpcCoordinatorServiceClient::GrpcCoordinatorServiceClient(
    std::shared_ptr<CoordinatorChannels> channels, ConnectionOptions options)
    : options_(std::move(options)),
      stubs_(
          std::make_unique<internal::ReplicaStubs<v1::CoordinatorService>>(std::move(channels))) {}

GrpcCoordinatorServiceClient::~GrpcCoordinatorServiceClient() = default;

absl::StatusOr<v1::CoordinatorStatus> GrpcCoordinatorServiceClient::GetStatus(
    const v1::GetStatusRequest& request) {
  return internal::UnaryCall<v1::CoordinatorStatus>(
      *stubs_, options_, "GetStatus", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->GetStatus(context, request, response);
      },
      internal::Serves::kAnyReplica);
}

}  // namespace shardline::client

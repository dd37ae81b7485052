#include "client/checkpoint_client.h"

#include <algorithm>
#include <utility>

#include "client/grpc_call.h"

namespace shardline::client {
namespace {

// The options with the deadline every call gets, so that a
// DEADLINE_EXCEEDED message names the deadline that passed.
ConnectionOptions WithMinTimeout(ConnectionOptions options, absl::Duration min_timeout) {
  options.timeout = std::max(options.timeout, min_timeout);
  return options;
}

}  // namespace

GrpcCheckpointClient::GrpcCheckpointClient(std::shared_ptr<grpc::Channel> channel,
                                           ConnectionOptions options, absl::Duration min_timeout)
    : GrpcCheckpointClient(CoordinatorChannels::ForChannel(std::move(channel), options), options,
                           min_timeout) {}

GrpcCheckpointClient::GrpcCheckpointClient(std::shared_ptr<CoordinatorChannels> channels,
                                           ConnectionOptions options, absl::Duration min_timeout)
    : options_(WithMinTimeout(std::move(options), min_timeout)),
      stubs_(std::make_unique<internal::ReplicaStubs<v1::CheckpointService>>(std::move(channels))) {
}

GrpcCheckpointClient::~GrpcCheckpointClient() = default;

absl::StatusOr<v1::BeginCheckpointResponse> GrpcCheckpointClient::BeginCheckpoint(
    const v1::BeginCheckpointRequest& request) {
  return internal::UnaryCall<v1::BeginCheckpointResponse>(
      *stubs_, options_, "BeginCheckpoint", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->BeginCheckpoint(context, request, response);
      });
}

absl::StatusOr<v1::ReportShardResponse> GrpcCheckpointClient::ReportShard(
    const v1::ReportShardRequest& request) {
  return internal::UnaryCall<v1::ReportShardResponse>(
      *stubs_, options_, "ReportShard", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->ReportShard(context, request, response);
      });
}

absl::StatusOr<v1::CheckpointSummary> GrpcCheckpointClient::CommitCheckpoint(
    const v1::CommitCheckpointRequest& request) {
  return internal::UnaryCall<v1::CheckpointSummary>(
      *stubs_, options_, "CommitCheckpoint", options_.timeout, nullptr,
      internal::Retry::kIdempotent, [&](auto* stub, auto* context, auto* response) {
        return stub->CommitCheckpoint(context, request, response);
      });
}

absl::StatusOr<v1::CheckpointSummary> GrpcCheckpointClient::AbortCheckpoint(
    const v1::AbortCheckpointRequest& request) {
  return internal::UnaryCall<v1::CheckpointSummary>(
      *stubs_, options_, "AbortCheckpoint", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->AbortCheckpoint(context, request, response);
      });
}

absl::StatusOr<v1::ListCheckpointsResponse> GrpcCheckpointClient::ListCheckpoints(
    const v1::ListCheckpointsRequest& request) {
  return internal::UnaryCall<v1::ListCheckpointsResponse>(
      *stubs_, options_, "ListCheckpoints", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->ListCheckpoints(context, request, response);
      });
}

absl::StatusOr<v1::Manifest> GrpcCheckpointClient::GetManifest(
    const v1::GetManifestRequest& request) {
  return internal::UnaryCall<v1::Manifest>(*stubs_, options_, "GetManifest", options_.timeout,
                                           nullptr, internal::Retry::kIdempotent,
                                           [&](auto* stub, auto* context, auto* response) {
                                             return stub->GetManifest(context, request, response);
                                           });
}

}  // namespace shardline::client

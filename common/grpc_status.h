// absl::Status <-> grpc::Status, the one mapping of the project: the codes
// are the same canonical numbers (1:1); the message is kept.
//
//   return ToGrpcStatus(coordinator.GetJob(id).status());   // a handler
//   absl::Status s = FromGrpcStatus(stub->GetJob(&ctx, req, &resp));  // a caller
//
// Thread-safe (pure functions).
#ifndef SHARDLINE_COMMON_GRPC_STATUS_H_
#define SHARDLINE_COMMON_GRPC_STATUS_H_

#include <cstddef>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace shardline {

// The longest status message a handler returns (bytes). gRPC sends the
// message percent-encoded in trailing metadata and a client refuses
// metadata over 8 KiB ("received initial metadata size exceeds limit"),
// which would hide the field the message names.
inline constexpr size_t kMaxStatusMessageBytes = 2048;

// The message is kept up to kMaxStatusMessageBytes: a longer one keeps its
// start, which names the field, cut on a UTF-8 boundary, plus
// "... (message truncated, N bytes)".
grpc::Status ToGrpcStatus(const absl::Status& status);

// Trailing metadata of a coordinator replica's UNAVAILABLE "not the
// leader" answer: the leader's HOST:PORT (proto/shardline/v1/
// coordinator.proto "Replicas"). gRPC metadata keys are lower case.
inline constexpr char kLeaderMetadataKey[] = "shardline-leader";

// The code and message as they came. Callers that can say more about a
// transport failure (which address, TLS or not) add it: see
// client/connection.h's FromGrpcStatus.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace shardline

#endif  // SHARDLINE_COMMON_GRPC_STATUS_H_

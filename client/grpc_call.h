// The one path of a unary call in the gRPC clients of this library
// (job_client, worker_client, rendezvous_client, checkpoint_client):
// Prepare (token + deadline), optional cancellation, FromGrpcStatus.
// Internal to //client.
#ifndef SHARDLINE_CLIENT_GRPC_CALL_H_
#define SHARDLINE_CLIENT_GRPC_CALL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/connection.h"
#include "grpcpp/grpcpp.h"

namespace shardline::client::internal {

// Runs `call(&context, &response)` with a context prepared for `options`
// and `timeout`, cancelled when `cancel` (may be null) is. Errors:
// FromGrpcStatus's for `rpc`; CANCELLED without calling when `cancel` is
// already cancelled.
template <typename Response, typename Call>
absl::StatusOr<Response> UnaryCall(const ConnectionOptions& options, absl::string_view rpc,
                                   absl::Duration timeout, CancelToken* cancel, Call call) {
  grpc::ClientContext context;
  Prepare(&context, options, timeout);
  uint64_t registration = 0;
  if (cancel != nullptr) {
    registration = cancel->Register([&context] { context.TryCancel(); });
    if (registration == 0) {
      return absl::CancelledError(absl::StrCat(rpc, " was cancelled: ", cancel->reason()));
    }
  }
  Response response;
  const grpc::Status status = call(&context, &response);
  if (cancel != nullptr) cancel->Unregister(registration);
  if (!status.ok()) return FromGrpcStatus(status, options, rpc);
  return response;
}

// The deadline of a call that may wait `wait` on the coordinator.
inline absl::Duration WaitingTimeout(const ConnectionOptions& options, bool waits,
                                     const google::protobuf::Duration& wait) {
  if (!waits) return options.timeout;
  return absl::Seconds(wait.seconds()) + absl::Nanoseconds(wait.nanos()) + kWaitDeadlineSlack;
}

}  // namespace shardline::client::internal

#endif  // SHARDLINE_CLIENT_GRPC_CALL_H_

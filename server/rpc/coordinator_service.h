// CoordinatorService (proto/shardline/v1/coordinator.proto): GetStatus,
// served by every coordinator process — the single coordinator's
// CoordinatorServer, and each replica's server whether it leads or follows
// (server/replica.h) — so it needs neither the Coordinator nor a
// CallRunner: it checks the admin token itself.
//
// Methods (sync API):
//   GetStatus: what `status` returns. Errors: UNAUTHENTICATED (no or a
//     wrong token while authentication is on), RESOURCE_EXHAUSTED (too many
//     failed authentications from the caller's host; server/auth.h
//     FailureLimiter), PERMISSION_DENIED (a job or member token: admin
//     only).
//
// Thread-safety: thread-safe; `status` is called from gRPC's threads, one
// call at a time or several at once.
#ifndef SHARDLINE_SERVER_RPC_COORDINATOR_SERVICE_H_
#define SHARDLINE_SERVER_RPC_COORDINATOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "server/auth.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server::rpc {

class CoordinatorServiceImpl final : public v1::CoordinatorService::Service {
 public:
  using StatusFn = std::function<v1::CoordinatorStatus()>;
  // `admin_token` empty: authentication off (as ServerOptions::admin_token).
  CoordinatorServiceImpl(const std::string& admin_token, StatusFn status);

  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* request,
                         v1::CoordinatorStatus* response) override;

 private:
  RealClock clock_;  // paces the Authenticator's FailureLimiter
  Authenticator auth_;
  const StatusFn status_;
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_COORDINATOR_SERVICE_H_

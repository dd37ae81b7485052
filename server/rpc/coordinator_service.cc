#include "server/rpc/coordinator_service.h"

#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/grpc_status.h"

namespace shardline::server::rpc {

CoordinatorServiceImpl::CoordinatorServiceImpl(const std::string& admin_token, StatusFn status)
    : auth_(admin_token, &clock_), status_(std::move(status)) {}

grpc::Status CoordinatorServiceImpl::GetStatus(grpc::ServerContext* ctx,
                                               const v1::GetStatusRequest* /*request*/,
                                               v1::CoordinatorStatus* response) {
  std::vector<absl::string_view> values;
  const auto range = ctx->client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    values.emplace_back(it->second.data(), it->second.size());
  }
  absl::StatusOr<Principal> who =
      auth_.Authorize(values, Access::kAdminOnly, /*job_id=*/"", PeerHost(ctx->peer()));
  if (!who.ok()) return ToGrpcStatus(who.status());
  if (!who->is_admin()) {
    return ToGrpcStatus(absl::PermissionDeniedError(
        "GetStatus needs the admin token (a job's or member's token is not enough)"));
  }
  *response = status_();
  return grpc::Status::OK;
}

}  // namespace shardline::server::rpc

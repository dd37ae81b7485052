#include "server/rpc/checkpoint_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/limits.h"

namespace shardline::server::rpc {

CheckpointServiceImpl::CheckpointServiceImpl(CallRunner* calls, Coordinator* coordinator,
                                             CheckpointFlow* checkpoints)
    : calls_(calls), coordinator_(coordinator), checkpoints_(checkpoints) {}

grpc::Status CheckpointServiceImpl::BeginCheckpoint(grpc::ServerContext* ctx,
                                                    const v1::BeginCheckpointRequest* req,
                                                    v1::BeginCheckpointResponse* resp) {
  return calls_->Run("CheckpointService/BeginCheckpoint", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    absl::StatusOr<v1::BeginCheckpointResponse> r = checkpoints_->Begin(*fw, req->step());
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status CheckpointServiceImpl::ReportShard(grpc::ServerContext* ctx,
                                                const v1::ReportShardRequest* req,
                                                v1::ReportShardResponse* resp) {
  return calls_->Run("CheckpointService/ReportShard", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    absl::StatusOr<v1::CheckpointSummary> r = checkpoints_->ReportShard(*fw, *req);
    if (!r.ok()) return r.status();
    *resp->mutable_checkpoint() = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status CheckpointServiceImpl::CommitCheckpoint(grpc::ServerContext* ctx,
                                                     const v1::CommitCheckpointRequest* req,
                                                     v1::CheckpointSummary* resp) {
  return calls_->Run("CheckpointService/CommitCheckpoint", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
      return p.status();
    }
    absl::StatusOr<v1::CheckpointSummary> r =
        checkpoints_->Commit(req->job_id(), req->checkpoint_id());
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status CheckpointServiceImpl::AbortCheckpoint(grpc::ServerContext* ctx,
                                                    const v1::AbortCheckpointRequest* req,
                                                    v1::CheckpointSummary* resp) {
  return calls_->Run("CheckpointService/AbortCheckpoint", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<Principal> who = calls_->Authorize(*ctx, Access::kJobRead, req->job_id());
    if (!who.ok()) return who.status();
    if (absl::Status st = RequireJobId(req->job_id(), "job_id"); !st.ok()) return st;
    if (!who->is_admin() && !req->has_fence()) {
      return absl::InvalidArgumentError(
          "fence is required when aborting with a member token (only the admin aborts without)");
    }
    if (!who->is_admin()) {
      // Acts: the member token of the fence's incarnation.
      if (auto p = calls_->Authorize(*ctx, Access::kMember, req->fence().worker().job_id(),
                                     &req->fence().worker());
          !p.ok()) {
        return p.status();
      }
    }
    if (req->has_fence()) {
      if (req->fence().worker().job_id() != req->job_id()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fence.worker.job_id='", req->fence().worker().job_id(), "' differs from job_id='",
            req->job_id(), "'"));
      }
      absl::StatusOr<FencedWorker> fw = coordinator_->CheckFence(req->fence());
      if (!fw.ok()) return fw.status();
    }
    absl::StatusOr<v1::CheckpointSummary> r =
        checkpoints_->Abort(req->job_id(), req->checkpoint_id(), req->reason());
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status CheckpointServiceImpl::ListCheckpoints(grpc::ServerContext* ctx,
                                                    const v1::ListCheckpointsRequest* req,
                                                    v1::ListCheckpointsResponse* resp) {
  return calls_->Run("CheckpointService/ListCheckpoints", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kJobRead, req->job_id()); !p.ok()) {
      return p.status();
    }
    absl::StatusOr<v1::ListCheckpointsResponse> r = checkpoints_->List(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status CheckpointServiceImpl::GetManifest(grpc::ServerContext* ctx,
                                                const v1::GetManifestRequest* req,
                                                v1::Manifest* resp) {
  return calls_->Run("CheckpointService/GetManifest", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kJobRead, req->job_id()); !p.ok()) {
      return p.status();
    }
    absl::StatusOr<v1::Manifest> r = checkpoints_->GetManifest(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

}  // namespace shardline::server::rpc

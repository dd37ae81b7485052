#include "server/rpc/job_service.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "server/limits.h"

namespace shardline::server::rpc {
namespace {

// A read of one job's state with the admin token, the job's worker token or
// one of its member tokens.
template <typename Request, typename Response, typename Fn>
grpc::Status Read(CallRunner* calls, const char* method, const grpc::ServerContext& ctx,
                  const Request& req, const std::string& job_id, Response* resp, Fn fn) {
  return calls->Run(method, [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(req); !st.ok()) return st;
    if (absl::Status st = calls->AuthorizeRead(ctx, job_id, "job_id"); !st.ok()) return st;
    absl::StatusOr<Response> r = fn();
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

}  // namespace

JobServiceImpl::JobServiceImpl(CallRunner* calls, Coordinator* coordinator, Rendezvous* rendezvous,
                               CheckpointFlow* checkpoints, CheckpointFlow::PassOnFn pass_on,
                               WatchStreams* watches)
    : calls_(calls),
      coordinator_(coordinator),
      rendezvous_(rendezvous),
      checkpoints_(checkpoints),
      pass_on_(std::move(pass_on)),
      watches_(watches) {}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* req,
                                       v1::CreateJobResponse* resp) {
  return calls_->Run("JobService/CreateJob", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
      return p.status();
    }
    absl::StatusOr<v1::CreateJobResponse> r = checkpoints_->CreateJob(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    if (!calls_->auth_enabled()) resp->clear_worker_token();
    LogLine(absl::StrCat("job created job=", resp->job().job_id(),
                     " generation=", resp->job().generation(),
                     " phase=", v1::JobPhase_Name(resp->job().phase())));
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                    v1::Job* resp) {
  return Read(calls_, "JobService/GetJob", *ctx, *req, req->job_id(), resp,
              [&] { return coordinator_->GetJob(req->job_id()); });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  return calls_->Run("JobService/ListJobs", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kAdminOnly, ""); !p.ok()) return p.status();
    absl::StatusOr<v1::ListJobsResponse> r = coordinator_->ListJobs(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                       v1::Job* resp) {
  return calls_->Run("JobService/CancelJob", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
      return p.status();
    }
    if (absl::Status st = RequireJobId(req->job_id(), "job_id"); !st.ok()) return st;
    absl::StatusOr<v1::Job> r = coordinator_->CancelJob(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    const std::string reason =
        req->reason().empty() ? std::string("job cancelled") : req->reason();
    LogLine(absl::StrCat("job cancelled job=", req->job_id(), " generation=", resp->generation(),
                     " reason=\"", reason, "\""));
    rendezvous_->DropJob(req->job_id());
    checkpoints_->AbortPendingCheckpoint(req->job_id(), reason);
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::ListMembers(grpc::ServerContext* ctx,
                                         const v1::ListMembersRequest* req,
                                         v1::ListMembersResponse* resp) {
  return Read(calls_, "JobService/ListMembers", *ctx, *req, req->job_id(), resp,
              [&] { return coordinator_->ListMembers(req->job_id()); });
}

grpc::Status JobServiceImpl::DrainWorker(grpc::ServerContext* ctx,
                                         const v1::DrainWorkerRequest* req, v1::Member* resp) {
  return calls_->Run("JobService/DrainWorker", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    if (auto p = calls_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
      return p.status();
    }
    if (absl::Status st = RequireJobId(req->job_id(), "job_id"); !st.ok()) return st;
    if (req->worker_id().empty()) {
      return absl::InvalidArgumentError("worker_id is empty; name the worker to drain");
    }
    std::vector<GenerationEnded> ended;
    absl::StatusOr<v1::Member> r = coordinator_->DrainWorker(
        req->job_id(), req->worker_id(), req->reason(), req->force(), &ended);
    pass_on_(ended);
    if (!r.ok()) return r.status();
    LogLine(absl::StrCat("worker drain job=", req->job_id(), " worker=", req->worker_id(),
                     " state=", v1::MemberState_Name(r->state()), " reason=\"", req->reason(),
                     "\""));
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::GetPlan(grpc::ServerContext* ctx, const v1::GetPlanRequest* req,
                                     v1::Plan* resp) {
  return Read(calls_, "JobService/GetPlan", *ctx, *req, req->job_id(), resp,
              [&] { return coordinator_->GetPlan(req->job_id()); });
}

grpc::Status JobServiceImpl::GetShardOwner(grpc::ServerContext* ctx,
                                           const v1::GetShardOwnerRequest* req,
                                           v1::GetShardOwnerResponse* resp) {
  return Read(calls_, "JobService/GetShardOwner", *ctx, *req, req->job_id(), resp,
              [&] { return coordinator_->GetShardOwner(*req); });
}

grpc::Status JobServiceImpl::WhatIf(grpc::ServerContext* ctx, const v1::WhatIfRequest* req,
                                    v1::WhatIfResponse* resp) {
  return Read(calls_, "JobService/WhatIf", *ctx, *req, req->job_id(), resp,
              [&] { return coordinator_->WhatIf(*req); });
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                 const v1::WatchJobRequest* req) {
  return watches_->Start(ctx, *req);
}

}  // namespace shardline::server::rpc

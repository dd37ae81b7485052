#include "server/rpc/worker_service.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "server/limits.h"

namespace shardline::server::rpc {

WorkerServiceImpl::WorkerServiceImpl(CallRunner* calls, Coordinator* coordinator,
                                     CheckpointFlow* checkpoints, SessionStreams* sessions,
                                     CheckpointFlow::PassOnFn pass_on)
    : calls_(calls),
      coordinator_(coordinator),
      checkpoints_(checkpoints),
      sessions_(sessions),
      pass_on_(std::move(pass_on)) {}

grpc::Status WorkerServiceImpl::JoinJob(grpc::ServerContext* ctx, const v1::JoinJobRequest* req,
                                        v1::JoinJobResponse* resp) {
  return calls_->Run("WorkerService/JoinJob", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    const v1::WorkerIdentity& w = req->worker();
    absl::StatusOr<JoinedBy> by = calls_->AuthorizeJoin(*ctx, w);
    if (!by.ok()) return by.status();
    absl::StatusOr<v1::JoinJobResponse> r = coordinator_->JoinJob(*req, *by);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    if (calls_->metrics() != nullptr) calls_->metrics()->CountJoin();
    LogLine(absl::StrCat("worker joined ", Who(w), " generation=", resp->generation(),
                         " state=", v1::MemberState_Name(resp->state())));
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::SessionMessage>* WorkerServiceImpl::Session(
    grpc::CallbackServerContext* ctx, const v1::SessionRequest* req) {
  return sessions_->Start(ctx, *req);
}

grpc::Status WorkerServiceImpl::GetAssignment(grpc::ServerContext* ctx,
                                              const v1::GetAssignmentRequest* req,
                                              v1::Assignment* resp) {
  return calls_->Run("WorkerService/GetAssignment", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    const v1::Fence& fence = req->fence();
    if (absl::Status st = calls_->AuthorizeMember(*ctx, fence.worker(), "fence.worker.job_id");
        !st.ok()) {
      return st;
    }
    absl::StatusOr<std::optional<absl::Duration>> timeout =
        ParseTimeout(req->has_timeout(), req->timeout(), kMaxAssignmentTimeout, "timeout");
    if (!timeout.ok()) return timeout.status();
    absl::StatusOr<v1::Assignment> r;
    if (!req->wait()) {
      r = coordinator_->GetAssignment(fence, false, absl::Now());
    } else {
      const absl::Time deadline = WaitDeadline(*ctx, *timeout, kDefaultAssignmentTimeout);
      r = calls_->SlicedWait<v1::Assignment>(
          ctx, deadline, [&](absl::Duration, absl::Time slice_end) {
            return coordinator_->GetAssignment(fence, true, slice_end);
          });
    }
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  return calls_->RunPooled(ctx, "WorkerService/Heartbeat", [=]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    const v1::Fence& fence = req->fence();
    if (absl::Status st = calls_->AuthorizeMember(*ctx, fence.worker(), "fence.worker.job_id");
        !st.ok()) {
      return st;
    }
    absl::StatusOr<v1::HeartbeatResponse> r = coordinator_->Heartbeat(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    if (calls_->metrics() != nullptr) calls_->metrics()->CountHeartbeat();
    return absl::OkStatus();
  });
}

grpc::Status WorkerServiceImpl::ReportError(grpc::ServerContext* ctx,
                                            const v1::ReportErrorRequest* req,
                                            v1::ReportErrorResponse* resp) {
  return calls_->Run("WorkerService/ReportError", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    const v1::Fence& fence = req->fence();
    if (absl::Status st = calls_->AuthorizeMember(*ctx, fence.worker(), "fence.worker.job_id");
        !st.ok()) {
      return st;
    }
    absl::StatusOr<v1::ReportErrorResponse> r = checkpoints_->ReportError(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::Status WorkerServiceImpl::LeaveJob(grpc::ServerContext* ctx, const v1::LeaveJobRequest* req,
                                         v1::LeaveJobResponse* resp) {
  return calls_->Run("WorkerService/LeaveJob", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    const v1::Fence& fence = req->fence();
    if (absl::Status st = calls_->AuthorizeMember(*ctx, fence.worker(), "fence.worker.job_id");
        !st.ok()) {
      return st;
    }
    std::vector<GenerationEnded> ended;
    absl::Status st = coordinator_->LeaveJob(*req, &ended);
    if (st.ok()) {
      LogLine(absl::StrCat("worker left ", Who(fence.worker()),
                           " generation=", fence.generation(), " reason=\"", req->reason(),
                           "\""));
    }
    pass_on_(ended);
    return st;
  });
}

grpc::Status WorkerServiceImpl::CompleteJob(grpc::ServerContext* ctx,
                                            const v1::CompleteJobRequest* req, v1::Job* resp) {
  return calls_->Run("WorkerService/CompleteJob", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    const v1::Fence& fence = req->fence();
    if (absl::Status st = calls_->AuthorizeMember(*ctx, fence.worker(), "fence.worker.job_id");
        !st.ok()) {
      return st;
    }
    std::vector<GenerationEnded> ended;
    absl::StatusOr<v1::Job> r = coordinator_->CompleteJob(*req, &ended);
    if (r.ok()) {
      LogLine(absl::StrCat("job completed by ", Who(fence.worker()), " reason=\"", req->reason(),
                           "\""));
    }
    pass_on_(ended);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

}  // namespace shardline::server::rpc

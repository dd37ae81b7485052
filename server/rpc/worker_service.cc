#include "server/rpc/worker_service.h"

#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

grpc::ServerUnaryReactor* WorkerServiceImpl::JoinJob(grpc::CallbackServerContext* ctx,
                                                     const v1::JoinJobRequest* req,
                                                     v1::JoinJobResponse* resp) {
  return calls_->RunPooled(ctx, "WorkerService/JoinJob", [=]() -> absl::Status {
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

// One GetAssignment with wait. Shared by its reactor (which owns it until
// OnDone), the Coordinator's waker and the deadline alarm (both hold weak
// references), so that a late waker or alarm finds it finished, never a
// deleted reactor. Every step that takes the Coordinator's lock runs on the
// HandlerPool; the waker (called with that lock held) only posts a poll.
// Lock order: mu_, then the Coordinator's lock.
class WorkerServiceImpl::AssignmentWait
    : public std::enable_shared_from_this<WorkerServiceImpl::AssignmentWait> {
 public:
  AssignmentWait(WorkerServiceImpl* service, grpc::CallbackServerContext* ctx,
                 const v1::GetAssignmentRequest* req, v1::Assignment* resp,
                 grpc::ServerUnaryReactor* reactor)
      : service_(service), ctx_(ctx), req_(req), resp_(resp), reactor_(reactor) {}

  // On the pool: checks the request, then the first poll.
  void Start() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    absl::Status st = service_->calls_->Admit();
    if (st.ok()) st = CheckRequestLimits(*req_);
    if (st.ok()) {
      st = service_->calls_->AuthorizeMember(*ctx_, req_->fence().worker(),
                                             "fence.worker.job_id");
    }
    absl::StatusOr<std::optional<absl::Duration>> timeout =
        ParseTimeout(req_->has_timeout(), req_->timeout(), kMaxAssignmentTimeout, "timeout");
    if (st.ok() && !timeout.ok()) st = timeout.status();
    if (!st.ok()) return FinishLocked(std::move(st));
    deadline_ = WaitDeadline(*ctx_, *timeout, kDefaultAssignmentTimeout);
    {
      absl::MutexLock waits(&service_->waits_mu_);
      service_->waits_.emplace(this, weak_from_this());
    }
    registered_ = true;
    PollLocked();
    if (finished_) return;
    // Holds no strong reference: the wait may be gone when it fires.
    alarm_.Set(absl::ToChronoTime(deadline_),
               [weak = weak_from_this(), pool = service_->calls_->pool()](bool fired) {
                 if (!fired) return;  // cancelled: the call finished
                 PostEnd(*pool, weak, absl::DeadlineExceededError(""));
               });
  }

  // The Coordinator's waker (its lock held): queues one poll.
  void Wake() {
    if (poll_queued_.exchange(true)) return;
    std::weak_ptr<AssignmentWait> weak = weak_from_this();
    service_->calls_->pool()->Post([weak] {
      if (auto self = weak.lock()) {
        self->poll_queued_.store(false);
        absl::MutexLock lock(&self->mu_);
        if (!self->finished_) self->PollLocked();
      }
    });
  }

  // Ends the wait with `status` (DeadlineExceeded: at the deadline, after a
  // last poll). Callable from any thread; the work runs on the pool.
  void End(absl::Status status) {
    PostEnd(*service_->calls_->pool(), weak_from_this(), std::move(status));
  }
  // The caller cancelled (OwningReactor).
  void Cancel() { End(absl::CancelledError("the caller cancelled")); }

 private:
  static void PostEnd(HandlerPool& pool, std::weak_ptr<AssignmentWait> weak,
                      absl::Status status) {
    pool.Post([weak = std::move(weak), status = std::move(status)]() mutable {
      auto self = weak.lock();
      if (self == nullptr) return;
      absl::MutexLock lock(&self->mu_);
      if (self->finished_) return;
      if (absl::IsDeadlineExceeded(status)) {
        self->PollLocked();
        if (self->finished_) return;
        status = absl::DeadlineExceededError(absl::StrCat(
            "generation ", self->req_->fence().generation(),
            " did not form before the deadline (waited ",
            absl::FormatDuration(absl::Trunc(absl::Now() - self->start_, absl::Milliseconds(1))),
            ")"));
      }
      self->FinishLocked(std::move(status));
    });
  }

  void PollLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::weak_ptr<AssignmentWait> weak = weak_from_this();
    absl::StatusOr<std::optional<v1::Assignment>> r = service_->coordinator_->PollAssignment(
        req_->fence(),
        [weak] {
          if (auto self = weak.lock()) self->Wake();
        },
        &waker_id_);
    if (!r.ok()) return FinishLocked(r.status());
    if (!r->has_value()) return;  // woken again when it may have changed
    *resp_ = **std::move(r);
    FinishLocked(absl::OkStatus());
  }

  void FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    if (waker_id_ != 0) {
      service_->coordinator_->RemoveAssignmentWaker(req_->fence().worker(), waker_id_);
      waker_id_ = 0;
    }
    if (registered_) {
      absl::MutexLock waits(&service_->waits_mu_);
      service_->waits_.erase(this);
    }
    grpc::Status out =
        service_->calls_->Conclude("WorkerService/GetAssignment", start_, std::move(status));
    // Last touch of the call: the reactor may be gone right after.
    reactor_->Finish(out);
  }

  WorkerServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  const v1::GetAssignmentRequest* const req_;
  v1::Assignment* const resp_;
  grpc::ServerUnaryReactor* const reactor_;
  const absl::Time start_ = absl::Now();
  std::atomic<bool> poll_queued_{false};
  grpc::Alarm alarm_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;  // in service_->waits_
  uint64_t waker_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerUnaryReactor* WorkerServiceImpl::GetAssignment(grpc::CallbackServerContext* ctx,
                                                           const v1::GetAssignmentRequest* req,
                                                           v1::Assignment* resp) {
  if (!req->wait()) {
    return calls_->RunPooled(ctx, "WorkerService/GetAssignment", [=]() -> absl::Status {
      if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
      const v1::Fence& fence = req->fence();
      if (absl::Status st =
              calls_->AuthorizeMember(*ctx, fence.worker(), "fence.worker.job_id");
          !st.ok()) {
        return st;
      }
      absl::StatusOr<std::optional<absl::Duration>> timeout =
          ParseTimeout(req->has_timeout(), req->timeout(), kMaxAssignmentTimeout, "timeout");
      if (!timeout.ok()) return timeout.status();
      absl::StatusOr<v1::Assignment> r = coordinator_->GetAssignment(fence, false, absl::Now());
      if (!r.ok()) return r.status();
      *resp = *std::move(r);
      return absl::OkStatus();
    });
  }
  auto* reactor = new OwningReactor<AssignmentWait>();
  auto wait = std::make_shared<AssignmentWait>(this, ctx, req, resp, reactor);
  reactor->Own(wait);
  calls_->pool()->Post([wait] { wait->Start(); });
  return reactor;
}

void WorkerServiceImpl::EndAssignmentWaits() {
  std::vector<std::shared_ptr<AssignmentWait>> open;
  {
    absl::MutexLock lock(&waits_mu_);
    for (auto& [raw, weak] : waits_) {
      if (auto w = weak.lock()) open.push_back(std::move(w));
    }
  }
  for (auto& w : open) {
    w->End(absl::UnavailableError("the coordinator is shutting down; retry with backoff"));
  }
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  auto answer = [this, resp](absl::StatusOr<v1::HeartbeatResponse> r) -> absl::Status {
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    if (calls_->metrics() != nullptr) calls_->metrics()->CountHeartbeat();
    return absl::OkStatus();
  };
  // On the gRPC thread when the coordinator's lock is free, except a DONE
  // heartbeat: it may complete the job, which writes every member to the
  // state store (slow work: on the pool).
  return calls_->RunInlineOrPooled(
      ctx, "WorkerService/Heartbeat",
      [this, ctx, req, answer]() -> std::optional<absl::Status> {
        if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
        if (absl::Status st =
                calls_->AuthorizeMember(*ctx, req->fence().worker(), "fence.worker.job_id");
            !st.ok()) {
          return st;
        }
        if (req->state() == v1::WORKER_STATE_DONE) return std::nullopt;
        std::optional<absl::StatusOr<v1::HeartbeatResponse>> r = coordinator_->TryHeartbeat(*req);
        if (!r.has_value()) return std::nullopt;
        return answer(*std::move(r));
      },
      [this, req, answer]() -> absl::Status {  // limits and token checked above
        return answer(coordinator_->Heartbeat(*req));
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

#include "server/rpc/job_service.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace shardline::server::rpc {
namespace {

// A read of one job's state with the admin token, the job's worker token or
// one of its member tokens.
template <typename Response, typename Fn>
grpc::Status Read(CallRunner* calls, const char* method, const grpc::ServerContext& ctx,
                  const std::string& job_id, Response* resp, Fn fn) {
  return calls->Run(method, [&]() -> absl::Status {
    if (absl::Status st = calls->AuthorizeRead(ctx, job_id, "job_id"); !st.ok()) return st;
    absl::StatusOr<Response> r = fn();
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

}  // namespace

JobServiceImpl::JobServiceImpl(CallRunner* calls, Coordinator* coordinator,
                               Rendezvous* rendezvous, CheckpointFlow* checkpoints,
                               CheckpointFlow::PassOnFn pass_on, absl::Duration poll_interval)
    : calls_(calls),
      coordinator_(coordinator),
      rendezvous_(rendezvous),
      checkpoints_(checkpoints),
      pass_on_(std::move(pass_on)),
      poll_interval_(poll_interval) {}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* req,
                                       v1::CreateJobResponse* resp) {
  return calls_->Run("JobService/CreateJob", [&]() -> absl::Status {
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
  return Read(calls_, "JobService/GetJob", *ctx, req->job_id(), resp,
              [&] { return coordinator_->GetJob(req->job_id()); });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  return calls_->Run("JobService/ListJobs", [&]() -> absl::Status {
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
  return Read(calls_, "JobService/ListMembers", *ctx, req->job_id(), resp,
              [&] { return coordinator_->ListMembers(req->job_id()); });
}

grpc::Status JobServiceImpl::DrainWorker(grpc::ServerContext* ctx,
                                         const v1::DrainWorkerRequest* req, v1::Member* resp) {
  return calls_->Run("JobService/DrainWorker", [&]() -> absl::Status {
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
  return Read(calls_, "JobService/GetPlan", *ctx, req->job_id(), resp,
              [&] { return coordinator_->GetPlan(req->job_id()); });
}

grpc::Status JobServiceImpl::GetShardOwner(grpc::ServerContext* ctx,
                                           const v1::GetShardOwnerRequest* req,
                                           v1::GetShardOwnerResponse* resp) {
  return Read(calls_, "JobService/GetShardOwner", *ctx, req->job_id(), resp,
              [&] { return coordinator_->GetShardOwner(*req); });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return calls_->Run("JobService/WatchJob", [&]() -> absl::Status {
    if (absl::Status st = calls_->AuthorizeRead(*ctx, req->job_id(), "job_id"); !st.ok()) {
      return st;
    }
    return Watch(ctx, *req, writer);
  });
}

absl::Status JobServiceImpl::Watch(grpc::ServerContext* ctx, const v1::WatchJobRequest& req,
                                   grpc::ServerWriter<v1::JobEvent>* writer) {
  Coordinator& c = *coordinator_;
  const std::string& job_id = req.job_id();
  absl::StatusOr<v1::Job> job = c.GetJob(job_id);
  if (!job.ok()) return job.status();
  const bool terminal_at_start = IsTerminal(job->phase());
  // Everything retained, without waiting.
  absl::StatusOr<std::vector<v1::JobEvent>> retained =
      c.WaitEvents(job_id, std::nullopt, absl::InfinitePast());
  if (!retained.ok()) return retained.status();
  const uint64_t oldest = retained->empty() ? 0 : retained->front().sequence();
  const uint64_t newest = retained->empty() ? 0 : retained->back().sequence();
  const uint64_t lowest_resume = oldest == 0 ? 0 : oldest - 1;
  uint64_t last = newest;
  if (req.has_after_sequence()) {
    last = req.after_sequence();
    if (last < lowest_resume || last > newest) {
      return absl::OutOfRangeError(absl::StrCat(
          "after_sequence=", last, " is outside the retained range [", lowest_resume, ", ",
          newest, "]; resume from within it, or leave after_sequence unset for live events"));
    }
  }
  // Writes `events` with sequence > last; `done` once the stream is over.
  bool done = false;
  auto send = [&](const std::vector<v1::JobEvent>& events, bool live) -> absl::Status {
    for (const v1::JobEvent& e : events) {
      if (e.sequence() <= last) continue;
      if (live && e.sequence() > last + 1) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the watcher fell behind: events ", last + 1, "..", e.sequence() - 1,
            " are no longer retained; reconnect with after_sequence=", last));
      }
      if (!writer->Write(e)) return absl::CancelledError("the watcher went away");
      last = e.sequence();
      if (e.has_phase_changed() && IsTerminal(e.phase_changed().new_phase())) {
        done = true;
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status st = send(*retained, /*live=*/false); !st.ok() || done) return st;
  if (terminal_at_start) return absl::OkStatus();
  for (int round = 1;; ++round) {
    if (calls_->shutting_down()) {
      return absl::UnavailableError("the coordinator is shutting down");
    }
    if (ctx->IsCancelled()) return absl::CancelledError("the watcher cancelled");
    absl::StatusOr<std::vector<v1::JobEvent>> events =
        c.WaitEvents(job_id, last, absl::Now() + poll_interval_);
    if (!events.ok()) return events.status();
    if (absl::Status st = send(*events, /*live=*/true); !st.ok() || done) return st;
    if (events->empty() && round % 10 == 0) {
      // A terminal phase whose event we already passed (race at start).
      absl::StatusOr<v1::Job> now = c.GetJob(job_id);
      if (!now.ok()) return now.status();
      if (IsTerminal(now->phase())) return absl::OkStatus();
    }
  }
}

}  // namespace shardline::server::rpc

#include "client/job_client.h"

#include <utility>

#include "absl/time/clock.h"
#include "client/grpc_call.h"

namespace shardline::client {

GrpcJobClient::GrpcJobClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options)
    : GrpcJobClient(CoordinatorChannels::ForChannel(std::move(channel), options), options) {}

GrpcJobClient::GrpcJobClient(std::shared_ptr<CoordinatorChannels> channels,
                             ConnectionOptions options)
    : options_(std::move(options)),
      stubs_(std::make_unique<internal::ReplicaStubs<v1::JobService>>(std::move(channels))) {}

GrpcJobClient::~GrpcJobClient() = default;

absl::StatusOr<v1::CreateJobResponse> GrpcJobClient::CreateJob(
    const v1::CreateJobRequest& request) {
  return internal::UnaryCall<v1::CreateJobResponse>(
      *stubs_, options_, "CreateJob", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->CreateJob(context, request, response);
      });
}

absl::StatusOr<v1::Job> GrpcJobClient::GetJob(const v1::GetJobRequest& request) {
  return internal::UnaryCall<v1::Job>(*stubs_, options_, "GetJob", options_.timeout, nullptr,
                                      internal::Retry::kIdempotent,
                                      [&](auto* stub, auto* context, auto* response) {
                                        return stub->GetJob(context, request, response);
                                      });
}

absl::StatusOr<v1::ListJobsResponse> GrpcJobClient::ListJobs(const v1::ListJobsRequest& request) {
  return internal::UnaryCall<v1::ListJobsResponse>(
      *stubs_, options_, "ListJobs", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->ListJobs(context, request, response);
      });
}

absl::StatusOr<v1::Job> GrpcJobClient::CancelJob(const v1::CancelJobRequest& request) {
  return internal::UnaryCall<v1::Job>(*stubs_, options_, "CancelJob", options_.timeout, nullptr,
                                      internal::Retry::kIdempotent,
                                      [&](auto* stub, auto* context, auto* response) {
                                        return stub->CancelJob(context, request, response);
                                      });
}

absl::StatusOr<v1::ListMembersResponse> GrpcJobClient::ListMembers(
    const v1::ListMembersRequest& request) {
  return internal::UnaryCall<v1::ListMembersResponse>(
      *stubs_, options_, "ListMembers", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->ListMembers(context, request, response);
      });
}

absl::StatusOr<v1::Member> GrpcJobClient::DrainWorker(const v1::DrainWorkerRequest& request) {
  return internal::UnaryCall<v1::Member>(*stubs_, options_, "DrainWorker", options_.timeout,
                                         nullptr, internal::Retry::kNotIdempotent,
                                         [&](auto* stub, auto* context, auto* response) {
                                           return stub->DrainWorker(context, request, response);
                                         });
}

absl::StatusOr<v1::Plan> GrpcJobClient::GetPlan(const v1::GetPlanRequest& request) {
  return internal::UnaryCall<v1::Plan>(*stubs_, options_, "GetPlan", options_.timeout, nullptr,
                                       internal::Retry::kIdempotent,
                                       [&](auto* stub, auto* context, auto* response) {
                                         return stub->GetPlan(context, request, response);
                                       });
}

absl::StatusOr<v1::GetShardOwnerResponse> GrpcJobClient::GetShardOwner(
    const v1::GetShardOwnerRequest& request) {
  return internal::UnaryCall<v1::GetShardOwnerResponse>(
      *stubs_, options_, "GetShardOwner", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->GetShardOwner(context, request, response);
      });
}

absl::StatusOr<v1::WhatIfResponse> GrpcJobClient::WhatIf(const v1::WhatIfRequest& request) {
  return internal::UnaryCall<v1::WhatIfResponse>(
      *stubs_, options_, "WhatIf", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->WhatIf(context, request, response);
      });
}

absl::Status GrpcJobClient::WatchJob(const v1::WatchJobRequest& request,
                                     const std::function<bool(const v1::JobEvent&)>& on_event) {
  // The stream opens on the leader; while it has delivered nothing it is
  // opened again where a follower points (or, with several replicas, on the
  // next one), within --timeout. Once events came, a break is the caller's
  // to resume (after_sequence), on the leader as the next call finds it.
  internal::CallAttempts attempts(stubs_->channels(), internal::Retry::kIdempotent,
                                  internal::Serves::kLeader, absl::Now() + options_.timeout,
                                  nullptr);
  while (true) {
    if (grpc::Status unconnected = attempts.AwaitConnectable(); !unconnected.ok()) {
      if (attempts.Again(unconnected, nullptr)) continue;
      return attempts.Error(unconnected, options_, "WatchJob");
    }
    grpc::ClientContext context;
    Prepare(&context, options_, absl::InfiniteFuture());
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
        stubs_->For(attempts.replica())->WatchJob(&context, request);
    v1::JobEvent event;
    bool stopped = false;
    bool delivered = false;
    while (reader->Read(&event)) {
      delivered = true;
      if (!on_event(event)) {
        stopped = true;
        context.TryCancel();
        break;
      }
    }
    const grpc::Status status = reader->Finish();
    if (stopped) return absl::OkStatus();
    if (status.ok()) {
      attempts.Succeeded();
      return absl::OkStatus();
    }
    if (delivered) {
      attempts.Observe(status, &context);
    } else if (attempts.Again(status, &context)) {
      continue;
    }
    return attempts.Error(status, options_, "WatchJob");
  }
}

}  // namespace shardline::client

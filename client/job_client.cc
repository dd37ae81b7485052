#include "client/job_client.h"

#include <utility>

#include "client/grpc_call.h"

namespace shardline::client {

GrpcJobClient::GrpcJobClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options)
    : options_(std::move(options)), stub_(v1::JobService::NewStub(std::move(channel))) {}

absl::StatusOr<v1::CreateJobResponse> GrpcJobClient::CreateJob(
    const v1::CreateJobRequest& request) {
  return internal::UnaryCall<v1::CreateJobResponse>(
      options_, "CreateJob", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->CreateJob(context, request, response); });
}

absl::StatusOr<v1::Job> GrpcJobClient::GetJob(const v1::GetJobRequest& request) {
  return internal::UnaryCall<v1::Job>(
      options_, "GetJob", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->GetJob(context, request, response); });
}

absl::StatusOr<v1::ListJobsResponse> GrpcJobClient::ListJobs(const v1::ListJobsRequest& request) {
  return internal::UnaryCall<v1::ListJobsResponse>(
      options_, "ListJobs", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->ListJobs(context, request, response); });
}

absl::StatusOr<v1::Job> GrpcJobClient::CancelJob(const v1::CancelJobRequest& request) {
  return internal::UnaryCall<v1::Job>(
      options_, "CancelJob", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->CancelJob(context, request, response); });
}

absl::StatusOr<v1::ListMembersResponse> GrpcJobClient::ListMembers(
    const v1::ListMembersRequest& request) {
  return internal::UnaryCall<v1::ListMembersResponse>(
      options_, "ListMembers", options_.timeout, nullptr, [&](auto* context, auto* response) {
        return stub_->ListMembers(context, request, response);
      });
}

absl::StatusOr<v1::Member> GrpcJobClient::DrainWorker(const v1::DrainWorkerRequest& request) {
  return internal::UnaryCall<v1::Member>(
      options_, "DrainWorker", options_.timeout, nullptr, [&](auto* context, auto* response) {
        return stub_->DrainWorker(context, request, response);
      });
}

absl::StatusOr<v1::Plan> GrpcJobClient::GetPlan(const v1::GetPlanRequest& request) {
  return internal::UnaryCall<v1::Plan>(
      options_, "GetPlan", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->GetPlan(context, request, response); });
}

absl::StatusOr<v1::GetShardOwnerResponse> GrpcJobClient::GetShardOwner(
    const v1::GetShardOwnerRequest& request) {
  return internal::UnaryCall<v1::GetShardOwnerResponse>(
      options_, "GetShardOwner", options_.timeout, nullptr, [&](auto* context, auto* response) {
        return stub_->GetShardOwner(context, request, response);
      });
}

absl::Status GrpcJobClient::WatchJob(const v1::WatchJobRequest& request,
                                     const std::function<bool(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext context;
  Prepare(&context, options_, absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  v1::JobEvent event;
  bool stopped = false;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      stopped = true;
      context.TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (stopped) return absl::OkStatus();
  return FromGrpcStatus(status, options_, "WatchJob");
}

}  // namespace shardline::client

#include "client/worker_client.h"

#include <utility>

#include "client/grpc_call.h"

namespace shardline::client {
namespace {

// A Session call: the context exists from the start so Cancel works before
// the call does; the call starts at the first Read.
class GrpcSessionStream final : public SessionStream {
 public:
  GrpcSessionStream(v1::WorkerService::Stub* stub, const ConnectionOptions& options,
                    v1::SessionRequest request)
      : stub_(stub), options_(options), request_(std::move(request)) {
    Prepare(&context_, options_, absl::InfiniteDuration());
  }

  bool Read(v1::SessionMessage* message) override {
    if (reader_ == nullptr) reader_ = stub_->Session(&context_, request_);
    return reader_->Read(message);
  }

  absl::Status Finish() override {
    if (reader_ == nullptr) reader_ = stub_->Session(&context_, request_);
    return FromGrpcStatus(reader_->Finish(), options_, "Session");
  }

  // grpc::ClientContext::TryCancel is thread-safe, and before the call
  // starts it makes the call end CANCELLED as soon as it does.
  void Cancel() override { context_.TryCancel(); }

 private:
  v1::WorkerService::Stub* const stub_;
  const ConnectionOptions options_;
  const v1::SessionRequest request_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::SessionMessage>> reader_;
};

}  // namespace

GrpcWorkerClient::GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel,
                                   ConnectionOptions options)
    : options_(WithMemberCredential(std::move(options))),
      stub_(v1::WorkerService::NewStub(std::move(channel))) {}

ConnectionOptions GrpcWorkerClient::WithMemberCredential(ConnectionOptions options) {
  if (options.member_credential == nullptr) {
    options.member_credential = std::make_shared<MemberCredential>();
  }
  return options;
}

absl::StatusOr<v1::JoinJobResponse> GrpcWorkerClient::JoinJob(const v1::JoinJobRequest& request) {
  // The first join goes with the job token, a re-join with the member token
  // (Prepare picks whichever the credential holds).
  absl::StatusOr<v1::JoinJobResponse> joined = internal::UnaryCall<v1::JoinJobResponse>(
      options_, "JoinJob", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->JoinJob(context, request, response); });
  if (joined.ok() && !joined->member_token().empty()) {
    options_.member_credential->Set(joined->member_token());
  }
  return joined;
}

std::unique_ptr<SessionStream> GrpcWorkerClient::Session(const v1::SessionRequest& request) {
  return std::make_unique<GrpcSessionStream>(stub_.get(), options_, request);
}

absl::StatusOr<v1::HeartbeatResponse> GrpcWorkerClient::Heartbeat(
    const v1::HeartbeatRequest& request, absl::Duration timeout) {
  return internal::UnaryCall<v1::HeartbeatResponse>(
      options_, "Heartbeat", timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->Heartbeat(context, request, response); });
}

absl::StatusOr<v1::Assignment> GrpcWorkerClient::GetAssignment(
    const v1::GetAssignmentRequest& request) {
  const absl::Duration timeout =
      internal::WaitingTimeout(options_, request.wait(), request.timeout());
  return internal::UnaryCall<v1::Assignment>(
      options_, "GetAssignment", timeout, nullptr, [&](auto* context, auto* response) {
        return stub_->GetAssignment(context, request, response);
      });
}

absl::StatusOr<v1::ReportErrorResponse> GrpcWorkerClient::ReportError(
    const v1::ReportErrorRequest& request) {
  return internal::UnaryCall<v1::ReportErrorResponse>(
      options_, "ReportError", options_.timeout, nullptr, [&](auto* context, auto* response) {
        return stub_->ReportError(context, request, response);
      });
}

absl::StatusOr<v1::LeaveJobResponse> GrpcWorkerClient::LeaveJob(
    const v1::LeaveJobRequest& request) {
  return internal::UnaryCall<v1::LeaveJobResponse>(
      options_, "LeaveJob", options_.timeout, nullptr,
      [&](auto* context, auto* response) { return stub_->LeaveJob(context, request, response); });
}

}  // namespace shardline::client

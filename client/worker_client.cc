#include "client/worker_client.h"

#include <utility>

#include "absl/time/clock.h"
#include "client/grpc_call.h"

namespace shardline::client {
namespace {

// A Session call: the context exists from the start so Cancel works before
// the call does; the call starts at the first Read, on the replica that
// led when the stream was made. How it ended updates the leader guess (a
// follower's hint, or the next replica), so the caller's next stream goes
// to the new leader.
class GrpcSessionStream final : public SessionStream {
 public:
  GrpcSessionStream(internal::ReplicaStubs<v1::WorkerService>* stubs,
                    const ConnectionOptions& options, v1::SessionRequest request)
      : stubs_(stubs),
        options_(options),
        request_(std::move(request)),
        attempts_(stubs->channels(), internal::Retry::kIdempotent, internal::Serves::kLeader,
                  absl::Now() + options.timeout, nullptr) {
    Prepare(&context_, options_, absl::InfiniteDuration());
  }

  bool Read(v1::SessionMessage* message) override {
    Start();
    return reader_->Read(message);
  }

  absl::Status Finish() override {
    Start();
    const grpc::Status status = reader_->Finish();
    if (status.ok()) return absl::OkStatus();
    attempts_.Observe(status, &context_);
    return attempts_.Error(status, options_, "Session");
  }

  // grpc::ClientContext::TryCancel is thread-safe, and before the call
  // starts it makes the call end CANCELLED as soon as it does.
  void Cancel() override { context_.TryCancel(); }

 private:
  void Start() {
    if (reader_ == nullptr) {
      reader_ = stubs_->For(attempts_.replica())->Session(&context_, request_);
    }
  }

  internal::ReplicaStubs<v1::WorkerService>* const stubs_;
  const ConnectionOptions options_;
  const v1::SessionRequest request_;
  internal::CallAttempts attempts_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::SessionMessage>> reader_;
};

}  // namespace

GrpcWorkerClient::GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel,
                                   ConnectionOptions options)
    : GrpcWorkerClient(CoordinatorChannels::ForChannel(std::move(channel), options), options) {}

GrpcWorkerClient::GrpcWorkerClient(std::shared_ptr<CoordinatorChannels> channels,
                                   ConnectionOptions options)
    : options_(WithMemberCredential(std::move(options))),
      stubs_(std::make_unique<internal::ReplicaStubs<v1::WorkerService>>(std::move(channels))) {}

GrpcWorkerClient::~GrpcWorkerClient() = default;

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
      *stubs_, options_, "JoinJob", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->JoinJob(context, request, response);
      });
  if (joined.ok() && !joined->member_token().empty()) {
    options_.member_credential->Set(joined->member_token());
  }
  return joined;
}

std::unique_ptr<SessionStream> GrpcWorkerClient::Session(const v1::SessionRequest& request) {
  return std::make_unique<GrpcSessionStream>(stubs_.get(), options_, request);
}

absl::StatusOr<v1::HeartbeatResponse> GrpcWorkerClient::Heartbeat(
    const v1::HeartbeatRequest& request, absl::Duration timeout) {
  return internal::UnaryCall<v1::HeartbeatResponse>(
      *stubs_, options_, "Heartbeat", timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->Heartbeat(context, request, response);
      });
}

WorkerClient::Reconnect GrpcWorkerClient::AwaitConnection(absl::Duration timeout) {
  const absl::Time start = absl::Now();
  grpc::Channel& channel = *stubs_->channels().Leader().channel;
  if (channel.GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return {};
  const grpc_connectivity_state state =
      WatchChannel(channel, start + timeout,
                   [](grpc_connectivity_state s) { return s == GRPC_CHANNEL_READY; });
  return {state == GRPC_CHANNEL_READY, absl::Now() - start};
}

absl::StatusOr<v1::Assignment> GrpcWorkerClient::GetAssignment(
    const v1::GetAssignmentRequest& request) {
  const absl::Duration timeout =
      internal::WaitingTimeout(options_, request.wait(), request.timeout());
  return internal::UnaryCall<v1::Assignment>(
      *stubs_, options_, "GetAssignment", timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->GetAssignment(context, request, response);
      });
}

absl::StatusOr<v1::ReportErrorResponse> GrpcWorkerClient::ReportError(
    const v1::ReportErrorRequest& request) {
  return internal::UnaryCall<v1::ReportErrorResponse>(
      *stubs_, options_, "ReportError", options_.timeout, nullptr, internal::Retry::kNotIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->ReportError(context, request, response);
      });
}

absl::StatusOr<v1::LeaveJobResponse> GrpcWorkerClient::LeaveJob(
    const v1::LeaveJobRequest& request) {
  return internal::UnaryCall<v1::LeaveJobResponse>(
      *stubs_, options_, "LeaveJob", options_.timeout, nullptr, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->LeaveJob(context, request, response);
      });
}

absl::StatusOr<v1::Job> GrpcWorkerClient::CompleteJob(const v1::CompleteJobRequest& request) {
  return internal::UnaryCall<v1::Job>(*stubs_, options_, "CompleteJob", options_.timeout, nullptr,
                                      internal::Retry::kIdempotent,
                                      [&](auto* stub, auto* context, auto* response) {
                                        return stub->CompleteJob(context, request, response);
                                      });
}

}  // namespace shardline::client

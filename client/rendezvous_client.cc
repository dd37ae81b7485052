#include "client/rendezvous_client.h"

#include <utility>

#include "client/grpc_call.h"

namespace shardline::client {

GrpcRendezvousClient::GrpcRendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                           ConnectionOptions options)
    : options_(std::move(options)), stub_(v1::RendezvousService::NewStub(std::move(channel))) {}

absl::StatusOr<v1::KvSetResponse> GrpcRendezvousClient::KvSet(const v1::KvSetRequest& request,
                                                              CancelToken* cancel) {
  return internal::UnaryCall<v1::KvSetResponse>(
      options_, "KvSet", options_.timeout, cancel,
      [&](auto* context, auto* response) { return stub_->KvSet(context, request, response); });
}

absl::StatusOr<v1::KvGetResponse> GrpcRendezvousClient::KvGet(const v1::KvGetRequest& request,
                                                              CancelToken* cancel) {
  return internal::UnaryCall<v1::KvGetResponse>(
      options_, "KvGet", internal::WaitingTimeout(options_, request.wait(), request.timeout()),
      cancel,
      [&](auto* context, auto* response) { return stub_->KvGet(context, request, response); });
}

absl::StatusOr<v1::KvAddResponse> GrpcRendezvousClient::KvAdd(const v1::KvAddRequest& request,
                                                              CancelToken* cancel) {
  return internal::UnaryCall<v1::KvAddResponse>(
      options_, "KvAdd", options_.timeout, cancel,
      [&](auto* context, auto* response) { return stub_->KvAdd(context, request, response); });
}

absl::StatusOr<v1::KvCompareAndSetResponse> GrpcRendezvousClient::KvCompareAndSet(
    const v1::KvCompareAndSetRequest& request, CancelToken* cancel) {
  return internal::UnaryCall<v1::KvCompareAndSetResponse>(
      options_, "KvCompareAndSet", options_.timeout, cancel, [&](auto* context, auto* response) {
        return stub_->KvCompareAndSet(context, request, response);
      });
}

absl::StatusOr<v1::KvWaitResponse> GrpcRendezvousClient::KvWait(const v1::KvWaitRequest& request,
                                                                CancelToken* cancel) {
  return internal::UnaryCall<v1::KvWaitResponse>(
      options_, "KvWait", internal::WaitingTimeout(options_, true, request.timeout()), cancel,
      [&](auto* context, auto* response) { return stub_->KvWait(context, request, response); });
}

absl::StatusOr<v1::KvDeleteResponse> GrpcRendezvousClient::KvDelete(
    const v1::KvDeleteRequest& request, CancelToken* cancel) {
  return internal::UnaryCall<v1::KvDeleteResponse>(
      options_, "KvDelete", options_.timeout, cancel,
      [&](auto* context, auto* response) { return stub_->KvDelete(context, request, response); });
}

absl::StatusOr<v1::BarrierResponse> GrpcRendezvousClient::Barrier(
    const v1::BarrierRequest& request, CancelToken* cancel) {
  return internal::UnaryCall<v1::BarrierResponse>(
      options_, "Barrier", internal::WaitingTimeout(options_, true, request.timeout()), cancel,
      [&](auto* context, auto* response) { return stub_->Barrier(context, request, response); });
}

}  // namespace shardline::client

#include "client/rendezvous_client.h"

#include <utility>

#include "client/grpc_call.h"

namespace shardline::client {

GrpcRendezvousClient::GrpcRendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                           ConnectionOptions options)
    : GrpcRendezvousClient(CoordinatorChannels::ForChannel(std::move(channel), options), options) {}

GrpcRendezvousClient::GrpcRendezvousClient(std::shared_ptr<CoordinatorChannels> channels,
                                           ConnectionOptions options)
    : options_(std::move(options)),
      stubs_(std::make_unique<internal::ReplicaStubs<v1::RendezvousService>>(std::move(channels))) {
}

GrpcRendezvousClient::~GrpcRendezvousClient() = default;

absl::StatusOr<v1::KvSetResponse> GrpcRendezvousClient::KvSet(const v1::KvSetRequest& request,
                                                              CancelToken* cancel) {
  return internal::UnaryCall<v1::KvSetResponse>(*stubs_, options_, "KvSet", options_.timeout,
                                                cancel, internal::Retry::kIdempotent,
                                                [&](auto* stub, auto* context, auto* response) {
                                                  return stub->KvSet(context, request, response);
                                                });
}

absl::StatusOr<v1::KvGetResponse> GrpcRendezvousClient::KvGet(const v1::KvGetRequest& request,
                                                              CancelToken* cancel) {
  return internal::UnaryCall<v1::KvGetResponse>(
      *stubs_, options_, "KvGet",
      internal::WaitingTimeout(options_, request.wait(), request.timeout()), cancel,
      internal::Retry::kIdempotent, [&](auto* stub, auto* context, auto* response) {
        return stub->KvGet(context, request, response);
      });
}

absl::StatusOr<v1::KvAddResponse> GrpcRendezvousClient::KvAdd(const v1::KvAddRequest& request,
                                                              CancelToken* cancel) {
  return internal::UnaryCall<v1::KvAddResponse>(*stubs_, options_, "KvAdd", options_.timeout,
                                                cancel, internal::Retry::kNotIdempotent,
                                                [&](auto* stub, auto* context, auto* response) {
                                                  return stub->KvAdd(context, request, response);
                                                });
}

absl::StatusOr<v1::KvCompareAndSetResponse> GrpcRendezvousClient::KvCompareAndSet(
    const v1::KvCompareAndSetRequest& request, CancelToken* cancel) {
  return internal::UnaryCall<v1::KvCompareAndSetResponse>(
      *stubs_, options_, "KvCompareAndSet", options_.timeout, cancel,
      internal::Retry::kNotIdempotent, [&](auto* stub, auto* context, auto* response) {
        return stub->KvCompareAndSet(context, request, response);
      });
}

absl::StatusOr<v1::KvWaitResponse> GrpcRendezvousClient::KvWait(const v1::KvWaitRequest& request,
                                                                CancelToken* cancel) {
  return internal::UnaryCall<v1::KvWaitResponse>(
      *stubs_, options_, "KvWait", internal::WaitingTimeout(options_, true, request.timeout()),
      cancel, internal::Retry::kIdempotent, [&](auto* stub, auto* context, auto* response) {
        return stub->KvWait(context, request, response);
      });
}

absl::StatusOr<v1::KvDeleteResponse> GrpcRendezvousClient::KvDelete(
    const v1::KvDeleteRequest& request, CancelToken* cancel) {
  return internal::UnaryCall<v1::KvDeleteResponse>(
      *stubs_, options_, "KvDelete", options_.timeout, cancel, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->KvDelete(context, request, response);
      });
}

absl::StatusOr<v1::KvNumKeysResponse> GrpcRendezvousClient::KvNumKeys(
    const v1::KvNumKeysRequest& request, CancelToken* cancel) {
  return internal::UnaryCall<v1::KvNumKeysResponse>(
      *stubs_, options_, "KvNumKeys", options_.timeout, cancel, internal::Retry::kIdempotent,
      [&](auto* stub, auto* context, auto* response) {
        return stub->KvNumKeys(context, request, response);
      });
}

absl::StatusOr<v1::BarrierResponse> GrpcRendezvousClient::Barrier(const v1::BarrierRequest& request,
                                                                  CancelToken* cancel) {
  return internal::UnaryCall<v1::BarrierResponse>(
      *stubs_, options_, "Barrier", internal::WaitingTimeout(options_, true, request.timeout()),
      cancel, internal::Retry::kIdempotent, [&](auto* stub, auto* context, auto* response) {
        return stub->Barrier(context, request, response);
      });
}

}  // namespace shardline::client

#include "client/coordinator_client.h"

#include <utility>

namespace shardline::client {

CoordinatorClients GrpcCoordinatorClients(std::shared_ptr<CoordinatorChannels> channels,
                                          const ConnectionOptions& shared,
                                          absl::Duration checkpoint_timeout) {
  // One member credential for all: a worker's calls switch to its member
  // token together once JoinJob returned it.
  ConnectionOptions options = shared;
  if (options.member_credential == nullptr) {
    options.member_credential = std::make_shared<MemberCredential>();
  }
  CoordinatorClients clients;
  clients.jobs = std::make_shared<GrpcJobClient>(channels, options);
  clients.workers = std::make_shared<GrpcWorkerClient>(channels, options);
  clients.rendezvous = std::make_shared<GrpcRendezvousClient>(channels, options);
  clients.checkpoints =
      std::make_shared<GrpcCheckpointClient>(channels, options, checkpoint_timeout);
  clients.coordinator =
      std::make_shared<GrpcCoordinatorServiceClient>(std::move(channels), options);
  return clients;
}

CoordinatorClients GrpcCoordinatorClients(std::shared_ptr<grpc::Channel> channel,
                                          const ConnectionOptions& options,
                                          absl::Duration checkpoint_timeout) {
  return GrpcCoordinatorClients(CoordinatorChannels::ForChannel(std::move(channel), options),
                                options, checkpoint_timeout);
}

absl::StatusOr<CoordinatorClients> ConnectCoordinator(const ConnectionOptions& options,
                                                      absl::Duration checkpoint_timeout) {
  absl::StatusOr<std::shared_ptr<CoordinatorChannels>> channels =
      CoordinatorChannels::Create(options);
  if (!channels.ok()) return channels.status();
  return GrpcCoordinatorClients(*std::move(channels), options, checkpoint_timeout);
}

}  // namespace shardline::client

#include "client/coordinator_client.h"

#include <utility>

namespace shardline::client {

CoordinatorClients GrpcCoordinatorClients(std::shared_ptr<grpc::Channel> channel,
                                          const ConnectionOptions& options,
                                          absl::Duration checkpoint_timeout) {
  CoordinatorClients clients;
  clients.jobs = std::make_shared<GrpcJobClient>(channel, options);
  clients.workers = std::make_shared<GrpcWorkerClient>(channel, options);
  clients.rendezvous = std::make_shared<GrpcRendezvousClient>(channel, options);
  clients.checkpoints =
      std::make_shared<GrpcCheckpointClient>(std::move(channel), options, checkpoint_timeout);
  return clients;
}

absl::StatusOr<CoordinatorClients> ConnectCoordinator(const ConnectionOptions& options,
                                                      absl::Duration checkpoint_timeout) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeCoordinatorChannel(options);
  if (!channel.ok()) return channel.status();
  return GrpcCoordinatorClients(*std::move(channel), options, checkpoint_timeout);
}

}  // namespace shardline::client

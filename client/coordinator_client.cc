#include "client/coordinator_client.h"

#include <utility>

namespace shardline::client {

CoordinatorClients GrpcCoordinatorClients(std::shared_ptr<grpc::Channel> channel,
                                          const ConnectionOptions& shared,
                                          absl::Duration checkpoint_timeout) {
  // One member credential for all four: a worker's calls switch to its
  // member token together once JoinJob returned it.
  ConnectionOptions options = shared;
  if (options.member_credential == nullptr) {
    options.member_credential = std::make_shared<MemberCredential>();
  }
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

// The coordinator client library in one include: connection options and
// flags (connection.h), the replicas' channels (coordinator_channels.h) and
// one client per service (job_client.h, worker_client.h,
// rendezvous_client.h, checkpoint_client.h, coordinator_service_client.h),
// bundled over one CoordinatorChannels.
//
//   absl::StatusOr<CoordinatorClients> clients = ConnectCoordinator(options);
//   absl::StatusOr<v1::Job> job = clients->jobs->GetJob(request);
//
// Thread-safety: the clients are thread-safe.
#ifndef SHARDLINE_CLIENT_COORDINATOR_CLIENT_H_
#define SHARDLINE_CLIENT_COORDINATOR_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "client/connection.h"
#include "client/coordinator_channels.h"
#include "client/coordinator_service_client.h"
#include "client/job_client.h"
#include "client/rendezvous_client.h"
#include "client/worker_client.h"
#include "grpcpp/grpcpp.h"

namespace shardline::client {

// One client per service of one coordinator. A user that needs only some
// leaves the others null (tests with fakes).
struct CoordinatorClients {
  std::shared_ptr<JobClient> jobs;
  std::shared_ptr<WorkerClient> workers;
  std::shared_ptr<RendezvousClient> rendezvous;
  std::shared_ptr<CheckpointClient> checkpoints;
  // CoordinatorService (every replica serves it).
  std::shared_ptr<CoordinatorServiceClient> coordinator;
};

// The gRPC implementations of all five over `channels` (one leader guess for
// all: a hint one client follows moves the others too);
// `checkpoint_timeout` is GrpcCheckpointClient's min_timeout. They share
// one options.member_credential (made when null): once the worker client's
// JoinJob got a member token, every call of the bundle carries it. One
// bundle per worker incarnation.
CoordinatorClients GrpcCoordinatorClients(std::shared_ptr<CoordinatorChannels> channels,
                                          const ConnectionOptions& options,
                                          absl::Duration checkpoint_timeout = absl::ZeroDuration());
// The same over one channel (CoordinatorChannels::ForChannel).
CoordinatorClients GrpcCoordinatorClients(std::shared_ptr<grpc::Channel> channel,
                                          const ConnectionOptions& options,
                                          absl::Duration checkpoint_timeout = absl::ZeroDuration());

// Opens a channel per replica address of options.address
// (CoordinatorChannels::Create: lazily, nothing is sent until the first
// call, so an unreachable coordinator shows up as the first call's
// UNAVAILABLE) and returns GrpcCoordinatorClients over them. Errors:
// InvalidArgument naming the flag when the address list is refused or a
// TLS file cannot be read.
absl::StatusOr<CoordinatorClients> ConnectCoordinator(
    const ConnectionOptions& options, absl::Duration checkpoint_timeout = absl::ZeroDuration());

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_COORDINATOR_CLIENT_H_

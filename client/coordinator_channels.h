// The one home of "which coordinator replica is the leader" for a client:
// one channel per replica address and the index of the one this client
// believes leads (proto/shardline/v1/coordinator.proto "Replicas").
//
//   absl::StatusOr<std::shared_ptr<CoordinatorChannels>> channels =
//       CoordinatorChannels::Create(options);        // --coordinator A,B,C
//   GrpcJobClient jobs(*channels, options);          // every call to the leader
//
// Every gRPC client of this library (job_client.h, worker_client.h,
// rendezvous_client.h, checkpoint_client.h, coordinator_service_client.h)
// sends each call to Leader(), and reports what came back
// (client/grpc_call.h): a follower's UNAVAILABLE with the leader's address
// in the trailing metadata kLeaderMetadataKey (common/grpc_status.h) makes
// that address the leader (FollowHint); an UNAVAILABLE without it (refused,
// a follower that knows no leader, the leader went away) makes the next
// address the guess (MoveOn); a success confirms it (Succeeded). The
// clients of one GrpcCoordinatorClients bundle share one CoordinatorChannels,
// so one worker's calls all move together.
//
// A leader address that is not in the list (a replica advertising another
// name for itself) gets a channel of its own with the same TLS settings, up
// to kMaxLearnedAddresses of them; beyond that such hints are ignored.
//
// With one address and no hint this is one channel, as before replicas
// existed.
//
// Thread-safety: thread-safe. Replica values are copies; their channels
// live as long as any copy.
#ifndef SHARDLINE_CLIENT_COORDINATOR_CHANNELS_H_
#define SHARDLINE_CLIENT_COORDINATOR_CHANNELS_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "grpcpp/grpcpp.h"

namespace shardline::client {

// Leader addresses learned from hints beyond the configured list.
inline constexpr size_t kMaxLearnedAddresses = 16;

class CoordinatorChannels {
 public:
  // One replica: its position (configured addresses first, in the order
  // given, then learned ones), address and channel.
  struct Replica {
    size_t index = 0;
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
  };

  // A lazy channel (nothing is sent before the first call) to every address
  // of options.address (ParseCoordinatorAddresses), the first one the
  // leader guess. InvalidArgument: the list is refused
  // (ParseCoordinatorAddresses, naming options.address_source), or a TLS
  // file (MakeCoordinatorCredentials).
  static absl::StatusOr<std::shared_ptr<CoordinatorChannels>> Create(
      const ConnectionOptions& options);

  // Over a channel the caller made (tests, harnesses): `channel` is the
  // first address of options.address (the list's others, and learned
  // addresses, get channels with the options' TLS settings; when those
  // cannot be read, only `channel` is used and hints elsewhere are
  // ignored). An unparsable options.address names the one channel as is.
  static std::shared_ptr<CoordinatorChannels> ForChannel(std::shared_ptr<grpc::Channel> channel,
                                                         const ConnectionOptions& options);

  CoordinatorChannels(const CoordinatorChannels&) = delete;
  CoordinatorChannels& operator=(const CoordinatorChannels&) = delete;

  // The replica this client believes leads.
  Replica Leader() const ABSL_LOCKS_EXCLUDED(mu_);
  // Replica `index` (< size()).
  Replica At(size_t index) const ABSL_LOCKS_EXCLUDED(mu_);
  // Configured and learned replicas; grows only by FollowHint.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // The configured addresses, in the order given.
  const std::vector<std::string>& configured() const { return configured_; }

  // A follower named `address` as the leader: it becomes the guess and is
  // returned (a channel is made when it is not known yet). nullopt, nothing
  // changed: `address` is not HOST:PORT, or kMaxLearnedAddresses are
  // learned already, or no credentials for a new channel.
  std::optional<Replica> FollowHint(absl::string_view address) ABSL_LOCKS_EXCLUDED(mu_);
  // Replica `index` failed without naming a leader: when it is still the
  // guess, the next one (by index, wrapping) becomes it. Returns the guess
  // after the call.
  Replica MoveOn(size_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // Replica `index` served a leader-only call: it is the guess.
  void Succeeded(size_t index) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CoordinatorChannels(std::vector<std::string> configured,
                      std::shared_ptr<grpc::ChannelCredentials> credentials);

  const std::vector<std::string> configured_;
  // Null when the TLS files could not be read (ForChannel): no new channels.
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable absl::Mutex mu_;
  std::vector<Replica> replicas_ ABSL_GUARDED_BY(mu_);
  size_t leader_ ABSL_GUARDED_BY(mu_) = 0;
};

// Watches `channel`, asking it to connect, until `done(state)` holds or
// `deadline` passes; returns the last state seen. gRPC notices a finished
// connect only while something polls the channel, and this wait polls
// (common/grpc_backup_poll.h). Thread-safe.
grpc_connectivity_state WatchChannel(grpc::Channel& channel, absl::Time deadline,
                                     absl::FunctionRef<bool(grpc_connectivity_state)> done);

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_COORDINATOR_CHANNELS_H_

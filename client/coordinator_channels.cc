#include "client/coordinator_channels.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"

namespace shardline::client {

CoordinatorChannels::CoordinatorChannels(std::vector<std::string> configured,
                                         std::shared_ptr<grpc::ChannelCredentials> credentials)
    : configured_(std::move(configured)), credentials_(std::move(credentials)) {}

absl::StatusOr<std::shared_ptr<CoordinatorChannels>> CoordinatorChannels::Create(
    const ConnectionOptions& options) {
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseCoordinatorAddresses(options.address, options.address_source);
  if (!addresses.ok()) return addresses.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeCoordinatorCredentials(options);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<CoordinatorChannels> out(
      new CoordinatorChannels(*std::move(addresses), *std::move(credentials)));
  absl::MutexLock lock(&out->mu_);
  for (const std::string& address : out->configured_) {
    out->replicas_.push_back(
        {out->replicas_.size(), address, MakeCoordinatorChannel(address, out->credentials_, out->configured_.size() > 1)});
  }
  return out;
}

std::shared_ptr<CoordinatorChannels> CoordinatorChannels::ForChannel(
    std::shared_ptr<grpc::Channel> channel, const ConnectionOptions& options) {
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseCoordinatorAddresses(options.address, options.address_source);
  if (!addresses.ok()) addresses = std::vector<std::string>{options.address};
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeCoordinatorCredentials(options);
  std::shared_ptr<CoordinatorChannels> out(new CoordinatorChannels(
      *std::move(addresses), credentials.ok() ? *std::move(credentials) : nullptr));
  absl::MutexLock lock(&out->mu_);
  out->replicas_.push_back({0, out->configured_[0], std::move(channel)});
  if (out->credentials_ != nullptr) {
    for (size_t i = 1; i < out->configured_.size(); ++i) {
      out->replicas_.push_back(
          {i, out->configured_[i], MakeCoordinatorChannel(out->configured_[i], out->credentials_, true)});
    }
  }
  return out;
}

CoordinatorChannels::Replica CoordinatorChannels::Leader() const {
  absl::MutexLock lock(&mu_);
  return replicas_[leader_];
}

CoordinatorChannels::Replica CoordinatorChannels::At(size_t index) const {
  absl::MutexLock lock(&mu_);
  return replicas_[index];
}

size_t CoordinatorChannels::size() const {
  absl::MutexLock lock(&mu_);
  return replicas_.size();
}

std::optional<CoordinatorChannels::Replica> CoordinatorChannels::FollowHint(
    absl::string_view hint) {
  const std::string address(absl::StripAsciiWhitespace(hint));
  // One HOST:PORT, as a flag would take it (no list).
  absl::StatusOr<std::vector<std::string>> parsed =
      ParseCoordinatorAddresses(address, "the leader hint");
  if (!parsed.ok() || parsed->size() != 1) return std::nullopt;
  absl::MutexLock lock(&mu_);
  for (const Replica& r : replicas_) {
    if (r.address == address) {
      leader_ = r.index;
      return r;
    }
  }
  if (credentials_ == nullptr || replicas_.size() >= configured_.size() + kMaxLearnedAddresses) {
    return std::nullopt;
  }
  replicas_.push_back({replicas_.size(), address, MakeCoordinatorChannel(address, credentials_, true)});
  leader_ = replicas_.back().index;
  return replicas_.back();
}

CoordinatorChannels::Replica CoordinatorChannels::MoveOn(size_t index) {
  absl::MutexLock lock(&mu_);
  if (leader_ == index) leader_ = (index + 1) % replicas_.size();
  return replicas_[leader_];
}

void CoordinatorChannels::Succeeded(size_t index) {
  absl::MutexLock lock(&mu_);
  if (index < replicas_.size()) leader_ = index;
}

grpc_connectivity_state WatchChannel(grpc::Channel& channel, absl::Time deadline,
                                     absl::FunctionRef<bool(grpc_connectivity_state)> done) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (!done(state) && absl::Now() < deadline) {
    // Returns when the state changes (polling the connect meanwhile) or at
    // the deadline; try_to_connect starts the next attempt after a backoff.
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) break;
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return state;
}

}  // namespace shardline::client

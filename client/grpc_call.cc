#include "client/grpc_call.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/grpc_status.h"

namespace shardline::client::internal {
namespace {

BackoffOptions RetryBackoff() {
  BackoffOptions o;
  o.initial = kRetryInitial;
  o.max = kRetryMax;
  o.multiplier = 2.0;
  o.jitter = 0.5;
  return o;
}

// gRPC's messages for a call that failed before its request left: no
// connection could be made (the pick failed), or the name did not resolve.
bool NeverSent(const std::string& lower) {
  return absl::StrContains(lower, "failed to connect to all addresses") ||
         absl::StrContains(lower, "connection refused") ||
         absl::StrContains(lower, "dns resolution failed") ||
         absl::StrContains(lower, "empty address list") ||
         absl::StrContains(lower, "no connection within");
}

constexpr char kUnconnected[] = "connection timed out (no connection within ";

bool IsUnconnected(const grpc::Status& status) {
  return absl::StartsWith(status.error_message(), kUnconnected);
}

}  // namespace

Outcome Classify(const grpc::Status& status, const grpc::ClientContext* context) {
  Outcome out;
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return out;
  if (context != nullptr) {
    const auto& trailing = context->GetServerTrailingMetadata();
    if (auto it = trailing.find(kLeaderMetadataKey); it != trailing.end()) {
      out.leader_hint = std::string(
          absl::StripAsciiWhitespace(absl::string_view(it->second.data(), it->second.size())));
    }
  }
  const std::string lower = absl::AsciiStrToLower(status.error_message());
  out.nothing_done =
      !out.leader_hint.empty() || absl::StartsWith(lower, "not the leader") || NeverSent(lower);
  return out;
}

grpc::Status ServerEnded(const grpc::Status& status, const CancelToken* cancel) {
  if (status.error_code() != grpc::StatusCode::CANCELLED) return status;
  if (cancel != nullptr && cancel->cancelled()) return status;
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("the coordinator ended the call without an answer (CANCELLED: ",
                   status.error_message(),
                   "), as a replica that stops serving does; the call may have been done"));
}

CallAttempts::CallAttempts(CoordinatorChannels& channels, Retry retry, Serves serves,
                           absl::Time deadline, CancelToken* cancel)
    : channels_(channels),
      retry_(retry),
      serves_(serves),
      deadline_(deadline),
      cancel_(cancel),
      replica_(channels.Leader()),
      backoff_(RetryBackoff()) {
  round_.push_back(replica_.index);
}

grpc::Status CallAttempts::AwaitConnectable() const {
  if (channels_.size() <= 1) return grpc::Status::OK;
  auto connecting = [](grpc_connectivity_state s) {
    return s == GRPC_CHANNEL_IDLE || s == GRPC_CHANNEL_CONNECTING;
  };
  const grpc_connectivity_state state =
      WatchChannel(*replica_.channel, std::min(deadline_, absl::Now() + kConnectWait),
                   [&](grpc_connectivity_state s) { return !connecting(s); });
  if (connecting(state)) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(kUnconnected, absl::FormatDuration(kConnectWait), ")"));
  }
  return grpc::Status::OK;
}

void CallAttempts::Tried(const CoordinatorChannels::Replica& r) {
  if (std::find(tried_.begin(), tried_.end(), r.address) == tried_.end()) {
    tried_.push_back(r.address);
  }
}

bool CallAttempts::Wait() {
  const absl::Duration delay = backoff_.Next();
  if (absl::Now() + delay >= deadline_) return false;
  if (cancel_ != nullptr) {
    static const RealClock kClock;
    if (cancel_->WaitForCancel(kClock, delay)) {
      cancelled_ = true;
      return false;
    }
  } else {
    absl::SleepFor(delay);
  }
  hops_ = 0;
  round_.clear();
  return true;
}

CoordinatorChannels::Replica CallAttempts::Next(bool move_shared) {
  if (move_shared) return channels_.MoveOn(replica_.index);
  return channels_.At((replica_.index + 1) % channels_.size());
}

bool CallAttempts::Again(const grpc::Status& status, const grpc::ClientContext* context) {
  Tried(replica_);
  if (!IsUnconnected(status)) {
    last_answer_ = status;
    last_answer_address_ = replica_.address;
  }
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && serves_ == Serves::kLeader &&
      channels_.size() > 1) {
    // The replica held the call for its whole deadline (paused, cut off):
    // the next call tries the next one.
    channels_.MoveOn(replica_.index);
    return false;
  }
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const Outcome outcome = Classify(status, context);
  if (serves_ == Serves::kLeader && !outcome.leader_hint.empty()) {
    if (std::optional<CoordinatorChannels::Replica> leader =
            channels_.FollowHint(outcome.leader_hint)) {
      if (hops_ >= kMaxImmediateHops) {
        if (!Wait()) return false;
      } else {
        ++hops_;
      }
      replica_ = *std::move(leader);
      return absl::Now() < deadline_;
    }
  }
  const CoordinatorChannels::Replica next = Next(serves_ == Serves::kLeader);
  // One replica: one attempt, as before replicas existed.
  if (channels_.size() <= 1) return false;
  const bool safe =
      serves_ == Serves::kAnyReplica || retry_ == Retry::kIdempotent || outcome.nothing_done;
  if (!safe) return false;
  if (std::find(round_.begin(), round_.end(), next.index) != round_.end()) {
    if (!Wait()) return false;
  }
  round_.push_back(next.index);
  replica_ = next;
  return absl::Now() < deadline_;
}

void CallAttempts::Observe(const grpc::Status& status, const grpc::ClientContext* context) {
  Tried(replica_);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && serves_ == Serves::kLeader &&
      channels_.size() > 1) {
    channels_.MoveOn(replica_.index);
    return;
  }
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE || serves_ != Serves::kLeader) return;
  const Outcome outcome = Classify(status, context);
  if (!outcome.leader_hint.empty() && channels_.FollowHint(outcome.leader_hint).has_value()) {
    return;
  }
  channels_.MoveOn(replica_.index);
}

void CallAttempts::Succeeded() {
  if (serves_ == Serves::kLeader) channels_.Succeeded(replica_.index);
}

absl::Status CallAttempts::Error(const grpc::Status& last, const ConnectionOptions& options,
                                 absl::string_view rpc) const {
  if (cancelled_ && cancel_ != nullptr) {
    return absl::CancelledError(absl::StrCat(rpc, " was cancelled: ", cancel_->reason()));
  }
  ConnectionOptions shown = options;
  shown.address = replica_.address;
  // A replica that did not connect before the deadline says less than what
  // an earlier attempt got (refused, "not the leader: ...").
  const bool earlier = IsUnconnected(last) && last_answer_.has_value();
  if (earlier) shown.address = last_answer_address_;
  const absl::Status s = FromGrpcStatus(earlier ? *last_answer_ : last, shown, rpc);
  // Which replicas were tried matters when none could serve the call.
  if (tried_.size() <= 1 || (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s))) return s;
  return absl::Status(
      s.code(), absl::StrCat(s.message(), " (replicas tried: ", absl::StrJoin(tried_, ", "), ")"));
}

}  // namespace shardline::client::internal

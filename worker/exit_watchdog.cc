#include "worker/exit_watchdog.h"

#include <utility>

namespace shardline::worker {

ExitWatchdog::ExitWatchdog(absl::Duration grace, std::function<void(absl::Duration)> on_expiry)
    : grace_(grace), on_expiry_(std::move(on_expiry)), thread_([this] { Loop(); }) {}

ExitWatchdog::~ExitWatchdog() {
  Disarm();
  thread_.join();
}

void ExitWatchdog::Arm() {
  absl::MutexLock lock(&mu_);
  armed_ = true;
}

void ExitWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  disarmed_ = true;
}

void ExitWatchdog::Loop() {
  {
    absl::MutexLock lock(&mu_);
    auto armed_or_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return armed_ || disarmed_;
    };
    mu_.Await(absl::Condition(&armed_or_done));
    if (disarmed_) return;
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return disarmed_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&done), grace_)) return;
  }
  if (on_expiry_) on_expiry_(grace_);
}

}  // namespace shardline::worker

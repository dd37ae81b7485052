#include "common/backoff.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardline {
namespace {

BackoffOptions Clamped(BackoffOptions o) {
  o.initial = std::max(o.initial, absl::Nanoseconds(1));
  o.max = std::max(o.max, o.initial);
  if (!(o.multiplier >= 1.0)) o.multiplier = 1.0;  // also NaN
  if (!(o.jitter >= 0.0)) o.jitter = 0.0;
  o.jitter = std::min(o.jitter, 1.0);
  return o;
}

uint64_t Seed(uint64_t seed) {
  if (seed != 0) return seed;
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

absl::Status ValidateBackoffOptions(const BackoffOptions& o) {
  if (o.initial <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff initial=", absl::FormatDuration(o.initial), " must be a positive duration"));
  }
  if (o.max < o.initial) {
    return absl::InvalidArgumentError(absl::StrCat("backoff max=", absl::FormatDuration(o.max),
                                                   " must be at least initial=",
                                                   absl::FormatDuration(o.initial)));
  }
  if (!(o.multiplier >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff multiplier=", o.multiplier, " must be at least 1"));
  }
  if (!(o.jitter >= 0.0 && o.jitter <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff jitter=", o.jitter, " must be in [0, 1]"));
  }
  return absl::OkStatus();
}

Backoff::Backoff(const BackoffOptions& options)
    : options_(Clamped(options)), base_(options_.initial), rng_(Seed(options.seed)) {}

absl::Duration Backoff::Next() {
  const absl::Duration base = base_;
  // Grow in floating point so a large multiplier saturates at max instead
  // of overflowing.
  const double next = absl::ToDoubleNanoseconds(base_) * options_.multiplier;
  base_ = next >= absl::ToDoubleNanoseconds(options_.max) ? options_.max
                                                          : absl::Nanoseconds(next);
  if (options_.jitter == 0.0) return base;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double factor = 1.0 - options_.jitter * unit(rng_);
  return absl::Nanoseconds(std::llround(absl::ToDoubleNanoseconds(base) * factor));
}

void Backoff::Reset() { base_ = options_.initial; }

absl::Status Retry(const Clock& clock, Backoff& backoff, absl::Time deadline,
                   absl::FunctionRef<bool(const absl::Status&)> retryable,
                   absl::FunctionRef<absl::Status()> attempt) {
  return Retry(clock, backoff, deadline, retryable, attempt, [&clock](absl::Duration d) {
    clock.SleepFor(d);
    return absl::OkStatus();
  });
}

absl::Status Retry(const Clock& clock, Backoff& backoff, absl::Time deadline,
                   absl::FunctionRef<bool(const absl::Status&)> retryable,
                   absl::FunctionRef<absl::Status()> attempt,
                   absl::FunctionRef<absl::Status(absl::Duration)> wait) {
  while (true) {
    absl::Status status = attempt();
    if (status.ok() || !retryable(status)) return status;
    const absl::Duration delay = backoff.Next();
    if (clock.Now() + delay > deadline) return status;
    if (absl::Status waited = wait(delay); !waited.ok()) return waited;
  }
}

}  // namespace shardline

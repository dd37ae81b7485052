// Jittered exponential backoff, and the one retry loop built on it.
//
//   Backoff backoff(BackoffOptions{});            // 100 ms doubling to 2 s, jitter 0.5
//   absl::Status s = Retry(clock, backoff, clock.Now() + absl::Seconds(30),
//                          [](const absl::Status& s) { return absl::IsUnavailable(s); },
//                          [&] { return client.KvSet(request, nullptr).status(); });
//
// Delays: the n-th delay (n = 0, 1, ...) is drawn uniformly from
// [(1 - jitter) * b, b] with b = min(initial * multiplier^n, max), so it
// never exceeds `max`, and processes that failed together (every worker of a
// job when its coordinator restarts) retry spread over that window instead
// of in lockstep. The random numbers come from a seedable generator: a fixed
// seed gives the same delays every run (tests), seed 0 a fresh random seed
// per Backoff (production).
//
// Thread-safety: a Backoff belongs to one retry loop (not thread-safe);
// Retry is as thread-safe as its callbacks.
#ifndef SHARDLINE_COMMON_BACKOFF_H_
#define SHARDLINE_COMMON_BACKOFF_H_

#include <cstdint>
#include <random>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardline {

struct BackoffOptions {
  // The first delay (before jitter); > 0.
  absl::Duration initial = absl::Milliseconds(100);
  // The longest delay; >= initial.
  absl::Duration max = absl::Seconds(2);
  // Growth per retry; >= 1.
  double multiplier = 2.0;
  // Fraction of each delay that is random, in [0, 1]: 0 gives exactly
  // initial, initial * multiplier, ...; 1 anything from 0 to that.
  double jitter = 0.5;
  // 0: seeded from std::random_device; anything else: that seed.
  uint64_t seed = 0;
};

// InvalidArgument naming the field when `options` breaks a rule above.
absl::Status ValidateBackoffOptions(const BackoffOptions& options);

class Backoff {
 public:
  // Out-of-range options are clamped into range (initial to at least 1 ns,
  // max to at least initial, multiplier to at least 1, jitter into [0, 1]);
  // ValidateBackoffOptions reports them.
  explicit Backoff(const BackoffOptions& options);

  // The delay to wait before the next attempt; grows the next one.
  absl::Duration Next();
  // After a success: the next delay is `initial` (jittered) again.
  void Reset();

  const BackoffOptions& options() const { return options_; }

 private:
  BackoffOptions options_;
  absl::Duration base_;  // the next delay before jitter
  std::mt19937_64 rng_;
};

// Calls `attempt` until it returns a status `retryable` rejects (OK never
// retries), then returns that status. Between attempts it waits
// backoff.Next() through `wait` (default: clock.SleepFor); when the next
// delay would end after `deadline` it returns the last attempt's status
// instead of waiting; a non-OK status from `wait` (e.g. Cancelled: the
// caller is shutting down) ends the loop with that status. `attempt` runs
// at least once, whatever `deadline`.
absl::Status Retry(const Clock& clock, Backoff& backoff, absl::Time deadline,
                   absl::FunctionRef<bool(const absl::Status&)> retryable,
                   absl::FunctionRef<absl::Status()> attempt);
absl::Status Retry(const Clock& clock, Backoff& backoff, absl::Time deadline,
                   absl::FunctionRef<bool(const absl::Status&)> retryable,
                   absl::FunctionRef<absl::Status()> attempt,
                   absl::FunctionRef<absl::Status(absl::Duration)> wait);

}  // namespace shardline

#endif  // SHARDLINE_COMMON_BACKOFF_H_

// Time as a seam, so tests drive timeouts, retries and intervals with a fake
// clock instead of sleeping.
//
//   RealClock clock;            // production
//   FakeClock fake(absl::FromUnixSeconds(1000));
//   fake.Advance(absl::Seconds(5));
//
// Waits: code that waits for "a condition, or a point in time" calls
// AwaitWithDeadline instead of absl::Mutex::AwaitWithDeadline, and sleeps
// with SleepFor, so that under a FakeClock the time part passes only when a
// test calls Advance:
//
//   absl::MutexLock lock(&mu_);
//   clock_->AwaitWithTimeout(mu_, absl::Condition(&stopping_), backoff);
//
// (The coordinator's own blocking waits still sleep in real time and compare
// against Now(); tests that advance a FakeClock poke those components, e.g.
// Tick().)
//
// Thread-safe.
#ifndef SHARDLINE_COMMON_CLOCK_H_
#define SHARDLINE_COMMON_CLOCK_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardline {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // With `mu` held: waits until `condition` holds or Now() reaches
  // `deadline`, releasing `mu` while it waits (like
  // absl::Mutex::AwaitWithDeadline, whose rules `condition` follows: a
  // function of state guarded by `mu`). Returns whether `condition` holds;
  // `mu` is held again on return. A deadline already passed (or
  // absl::InfinitePast()) only evaluates `condition`; absl::InfiniteFuture()
  // waits for `condition` alone.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // AwaitWithDeadline(mu, condition, Now() + timeout).
  bool AwaitWithTimeout(absl::Mutex& mu, const absl::Condition& condition,
                        absl::Duration timeout) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Blocks until Now() >= deadline (`d` from now). No-op for a non-positive
  // duration.
  void SleepUntil(absl::Time deadline) const;
  void SleepFor(absl::Duration d) const;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

// A clock that moves only when told. AwaitWithDeadline's time part passes
// when Advance reaches the deadline (the waiting thread wakes at once);
// its condition part works as with a real clock. For tests that must know
// a thread is waiting before they advance, Waiters / AwaitWaiters tell.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu)
      ABSL_LOCKS_EXCLUDED(mu_, waiters_mu_);

  // Moves time forward by `d` (>= 0; a negative `d` is ignored) and wakes
  // the waits whose deadline it reached.
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_, waiters_mu_);

  // The deadlines of the threads waiting on this clock now (in
  // AwaitWithDeadline or SleepFor with a deadline not yet reached),
  // earliest first; absl::InfiniteFuture() for a wait on a condition alone.
  std::vector<absl::Time> Waiters() const ABSL_LOCKS_EXCLUDED(waiters_mu_);
  // Blocks, in real time and for at most `real_timeout`, until at least `n`
  // threads wait on this clock; false when they did not within it (a test
  // failure, not a way to pace a test).
  bool AwaitWaiters(int n, absl::Duration real_timeout = absl::Seconds(60)) const
      ABSL_LOCKS_EXCLUDED(waiters_mu_);
  // Blocks likewise until a thread waits on this clock until exactly
  // `deadline` (identifies one waiter among several).
  bool AwaitWaiterAt(absl::Time deadline, absl::Duration real_timeout = absl::Seconds(60)) const
      ABSL_LOCKS_EXCLUDED(waiters_mu_);

 private:
  struct Waiter;

  // Lock order: a waiter's mutex, then waiters_mu_, then mu_ (a waiter's
  // condition reads Now()). Advance holds waiters_mu_ while it tries the
  // waiters' mutexes, never blocking on them.
  mutable absl::Mutex waiters_mu_;
  mutable std::vector<const Waiter*> waiters_ ABSL_GUARDED_BY(waiters_mu_);
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(waiters_mu_);
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline

#endif  // SHARDLINE_COMMON_CLOCK_H_

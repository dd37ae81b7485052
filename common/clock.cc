#include "common/clock.h"

#include <algorithm>

namespace shardline {
namespace {

// How often a FakeClock wait re-checks its deadline in real time, in case an
// Advance found the waiter's mutex held at the moment it tried to wake it.
// Only bounds how late such a wake-up can be; what the wait returns never
// depends on it.
constexpr absl::Duration kFakeRecheck = absl::Milliseconds(10);

}  // namespace

bool Clock::AwaitWithTimeout(absl::Mutex& mu, const absl::Condition& condition,
                             absl::Duration timeout) const {
  return AwaitWithDeadline(mu, condition, Now() + timeout);
}

void Clock::SleepUntil(absl::Time deadline) const {
  static constexpr bool kNever = false;
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  AwaitWithDeadline(mu, absl::Condition(&kNever), deadline);
}

void Clock::SleepFor(absl::Duration d) const {
  if (d <= absl::ZeroDuration()) return;
  SleepUntil(Now() + d);
}

bool RealClock::AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                                  absl::Time deadline) const {
  return mu.AwaitWithDeadline(condition, deadline);
}

struct FakeClock::Waiter {
  const FakeClock* clock;
  const absl::Condition* condition;
  absl::Time deadline;
  absl::Mutex* mu;

  bool Done() const { return condition->Eval() || clock->Now() >= deadline; }
};

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                                  absl::Time deadline) const {
  if (condition.Eval()) return true;
  if (Now() >= deadline) return false;
  const Waiter waiter{this, &condition, deadline, &mu};
  {
    absl::MutexLock lock(&waiters_mu_);
    waiters_.push_back(&waiter);
  }
  if (deadline == absl::InfiniteFuture()) {
    mu.Await(condition);
  } else {
    // Advance wakes the wait by releasing `mu` (absl::Mutex re-evaluates the
    // conditions waiting on a mutex when it is released).
    while (!mu.AwaitWithTimeout(absl::Condition(&waiter, &Waiter::Done), kFakeRecheck)) {
    }
  }
  {
    absl::MutexLock lock(&waiters_mu_);
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &waiter));
  }
  return condition.Eval();
}

void FakeClock::Advance(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  absl::MutexLock lock(&waiters_mu_);
  for (const Waiter* w : waiters_) {
    // A mutex held right now is released by its holder, which re-evaluates
    // the waiting conditions just the same.
    if (w->mu->TryLock()) w->mu->Unlock();
  }
}

std::vector<absl::Time> FakeClock::Waiters() const {
  std::vector<absl::Time> out;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (const Waiter* w : waiters_) out.push_back(w->deadline);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool FakeClock::AwaitWaiters(int n, absl::Duration real_timeout) const {
  absl::MutexLock lock(&waiters_mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(waiters_mu_) {
    return static_cast<int>(waiters_.size()) >= n;
  };
  return waiters_mu_.AwaitWithTimeout(absl::Condition(&enough), real_timeout);
}

bool FakeClock::AwaitWaiterAt(absl::Time deadline, absl::Duration real_timeout) const {
  absl::MutexLock lock(&waiters_mu_);
  auto present = [this, deadline]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(waiters_mu_) {
    return std::any_of(waiters_.begin(), waiters_.end(),
                       [deadline](const Waiter* w) { return w->deadline == deadline; });
  };
  return waiters_mu_.AwaitWithTimeout(absl::Condition(&present), real_timeout);
}

}  // namespace shardline

// Time for the coordinator: a seam so tests drive timeouts with a fake clock.
//
//   RealClock clock;            // production
//   FakeClock fake(absl::FromUnixSeconds(1000));
//   fake.Advance(absl::Seconds(5));
//
// Thread-safe.
#ifndef SHARDLINE_COMMON_CLOCK_H_
#define SHARDLINE_COMMON_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardline {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told. Blocking waits in the coordinator use
// real time for their deadlines' sleeping but compare against Now(), so tests
// that advance a FakeClock must also poke the component (e.g. Tick()).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline

#endif  // SHARDLINE_COMMON_CLOCK_H_

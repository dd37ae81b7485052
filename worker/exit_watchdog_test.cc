// ExitWatchdog: expires only when armed and not disarmed within its grace.
#include "worker/exit_watchdog.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

TEST(ExitWatchdogTest, ArmedAndNotDisarmedItExpiresWithItsGrace) {
  absl::Notification expired;
  absl::Duration told;
  ExitWatchdog watchdog(absl::Milliseconds(20), [&](absl::Duration grace) {
    told = grace;
    expired.Notify();
  });
  watchdog.Arm();
  ASSERT_TRUE(expired.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(told, absl::Milliseconds(20));
}

TEST(ExitWatchdogTest, DisarmedInTimeItNeverExpires) {
  std::atomic<int> expiries{0};
  {
    ExitWatchdog watchdog(absl::Hours(1), [&](absl::Duration) { ++expiries; });
    watchdog.Arm();
    watchdog.Arm();  // idempotent
    watchdog.Disarm();
  }  // the destructor joins its thread: it has ended without expiring
  EXPECT_EQ(expiries.load(), 0);
}

TEST(ExitWatchdogTest, NeverArmedItNeverExpires) {
  std::atomic<int> expiries{0};
  {
    ExitWatchdog watchdog(absl::ZeroDuration(), [&](absl::Duration) { ++expiries; });
  }
  EXPECT_EQ(expiries.load(), 0);
  {
    // Disarmed first: a later Arm (a STOP after the main loop returned)
    // does not start a countdown.
    ExitWatchdog watchdog(absl::ZeroDuration(), [&](absl::Duration) { ++expiries; });
    watchdog.Disarm();
    watchdog.Arm();
  }
  EXPECT_EQ(expiries.load(), 0);
}

}  // namespace
}  // namespace shardline::worker

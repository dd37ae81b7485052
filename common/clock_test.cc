#include "common/clock.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline {
namespace {

using ::testing::ElementsAre;

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock(kStart);
  EXPECT_EQ(clock.Now(), kStart);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), kStart + absl::Seconds(3));
  clock.Advance(-absl::Seconds(1));  // ignored
  EXPECT_EQ(clock.Now(), kStart + absl::Seconds(3));
}

TEST(FakeClockTest, AdvanceEndsAWaitExactlyAtItsDeadline) {
  FakeClock clock(kStart);
  absl::Mutex mu;
  bool never = false;
  bool result = true;
  absl::Time returned_at;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithTimeout(mu, absl::Condition(&never), absl::Seconds(5));
    returned_at = clock.Now();
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_THAT(clock.Waiters(), ElementsAre(kStart + absl::Seconds(5)));
  clock.Advance(absl::Seconds(4));
  // Not yet: the waiter stays registered until its deadline.
  EXPECT_THAT(clock.Waiters(), ElementsAre(kStart + absl::Seconds(5)));
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_FALSE(result);
  EXPECT_EQ(returned_at, kStart + absl::Seconds(5));
  EXPECT_TRUE(clock.Waiters().empty());
}

TEST(FakeClockTest, ConditionEndsAWaitWithoutTimePassing) {
  FakeClock clock(kStart);
  absl::Mutex mu;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithTimeout(mu, absl::Condition(&ready), absl::Hours(1));
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(clock.Now(), kStart);
}

TEST(FakeClockTest, InfiniteDeadlineWaitsForTheConditionAlone) {
  FakeClock clock(kStart);
  absl::Mutex mu;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(mu, absl::Condition(&ready), absl::InfiniteFuture());
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_THAT(clock.Waiters(), ElementsAre(absl::InfiniteFuture()));
  clock.Advance(absl::Hours(1000));
  EXPECT_EQ(clock.Waiters().size(), 1u);
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(result);
}

TEST(FakeClockTest, PassedDeadlineOnlyEvaluatesTheCondition) {
  FakeClock clock(kStart);
  absl::Mutex mu;
  bool value = false;
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(clock.AwaitWithDeadline(mu, absl::Condition(&value), kStart));
  EXPECT_FALSE(clock.AwaitWithTimeout(mu, absl::Condition(&value), -absl::Seconds(1)));
  value = true;
  EXPECT_TRUE(clock.AwaitWithDeadline(mu, absl::Condition(&value), absl::InfinitePast()));
  EXPECT_TRUE(clock.Waiters().empty());
}

TEST(FakeClockTest, SleepsEndInDeadlineOrder) {
  FakeClock clock(kStart);
  absl::Mutex mu;
  std::vector<int> order;
  std::vector<std::thread> sleepers;
  for (int seconds : {3, 1, 2}) {
    sleepers.emplace_back([&, seconds] {
      clock.SleepFor(absl::Seconds(seconds));
      absl::MutexLock lock(&mu);
      order.push_back(seconds);
    });
  }
  ASSERT_TRUE(clock.AwaitWaiters(3));
  EXPECT_THAT(clock.Waiters(), ElementsAre(kStart + absl::Seconds(1), kStart + absl::Seconds(2),
                                           kStart + absl::Seconds(3)));
  for (int i = 1; i <= 3; ++i) {
    clock.Advance(absl::Seconds(1));
    // The sleeper of i seconds is done once it has recorded itself.
    absl::MutexLock lock(&mu);
    auto recorded = [&] { return static_cast<int>(order.size()) == i; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&recorded), absl::Seconds(60)));
  }
  for (std::thread& t : sleepers) t.join();
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
}

TEST(FakeClockTest, AwaitWaitersGivesUpInRealTime) {
  FakeClock clock(kStart);
  EXPECT_FALSE(clock.AwaitWaiters(1, absl::Milliseconds(10)));
  EXPECT_TRUE(clock.AwaitWaiters(0, absl::Milliseconds(10)));
  EXPECT_FALSE(clock.AwaitWaiterAt(kStart, absl::Milliseconds(10)));
}

TEST(FakeClockTest, AwaitWaiterAtFindsTheWaiterOfADeadline) {
  FakeClock clock(kStart);
  std::thread short_sleep([&] { clock.SleepFor(absl::Seconds(1)); });
  std::thread long_sleep([&] { clock.SleepFor(absl::Seconds(7)); });
  ASSERT_TRUE(clock.AwaitWaiterAt(kStart + absl::Seconds(7)));
  ASSERT_TRUE(clock.AwaitWaiterAt(kStart + absl::Seconds(1)));
  clock.Advance(absl::Seconds(1));
  short_sleep.join();
  EXPECT_THAT(clock.Waiters(), ElementsAre(kStart + absl::Seconds(7)));
  clock.Advance(absl::Seconds(6));
  long_sleep.join();
  EXPECT_TRUE(clock.Waiters().empty());
}

TEST(RealClockTest, WaitsInRealTime) {
  RealClock clock;
  absl::Mutex mu;
  bool never = false;
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(clock.AwaitWithTimeout(mu, absl::Condition(&never), absl::Milliseconds(20)));
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  clock.SleepFor(absl::Milliseconds(5));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(25));
}

}  // namespace
}  // namespace shardline

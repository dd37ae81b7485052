#include "client/cancel_token.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::client {
namespace {

using ::testing::ElementsAre;

TEST(CancelTokenTest, CancelRunsRegisteredCallbacksOnceAndKeepsTheFirstReason) {
  CancelToken token;
  std::vector<int> ran;
  const uint64_t a = token.Register([&] { ran.push_back(1); });
  const uint64_t b = token.Register([&] { ran.push_back(2); });
  const uint64_t c = token.Register([&] { ran.push_back(3); });
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, a);
  token.Unregister(b);
  EXPECT_FALSE(token.cancelled());
  token.Cancel("generation 1 is over");
  token.Cancel("again");
  std::sort(ran.begin(), ran.end());
  EXPECT_THAT(ran, ElementsAre(1, 3));
  EXPECT_TRUE(token.cancelled());
  EXPECT_EQ(token.reason(), "generation 1 is over");
  token.Unregister(a);  // harmless after the fact
  token.Unregister(c);
}

TEST(CancelTokenTest, RegisterOnACancelledTokenRegistersNothing) {
  CancelToken token;
  token.Cancel("over");
  bool ran = false;
  EXPECT_EQ(token.Register([&] { ran = true; }), 0u);
  token.Cancel("later");
  EXPECT_FALSE(ran);
}

TEST(CancelTokenTest, WaitForCancelWaitsOnTheClock) {
  FakeClock clock;
  CancelToken token;
  bool timed_out_result = true;
  std::thread waiter([&] { timed_out_result = token.WaitForCancel(clock, absl::Seconds(2)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_THAT(clock.Waiters(), ElementsAre(clock.Now() + absl::Seconds(2)));
  clock.Advance(absl::Seconds(2));
  waiter.join();
  EXPECT_FALSE(timed_out_result);

  bool cancelled_result = false;
  std::thread cancelled_waiter(
      [&] { cancelled_result = token.WaitForCancel(clock, absl::Hours(1)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  token.Cancel("stop");
  cancelled_waiter.join();
  EXPECT_TRUE(cancelled_result);
  EXPECT_TRUE(token.WaitForCancel(clock, absl::ZeroDuration()));
}

}  // namespace
}  // namespace shardline::client

#include "common/backoff.h"

#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

std::vector<absl::Duration> Delays(Backoff& backoff, int n) {
  std::vector<absl::Duration> out;
  for (int i = 0; i < n; ++i) out.push_back(backoff.Next());
  return out;
}

TEST(BackoffTest, WithoutJitterDelaysDoubleUpToMax) {
  BackoffOptions o;
  o.jitter = 0;
  Backoff backoff(o);
  EXPECT_THAT(Delays(backoff, 8),
              ElementsAre(Ms(100), Ms(200), Ms(400), Ms(800), Ms(1600), Ms(2000), Ms(2000),
                          Ms(2000)));
}

TEST(BackoffTest, OtherMultiplierAndMax) {
  BackoffOptions o;
  o.initial = Ms(100);
  o.max = Ms(500);
  o.multiplier = 1.5;
  o.jitter = 0;
  Backoff backoff(o);
  EXPECT_THAT(Delays(backoff, 6), ElementsAre(Ms(100), Ms(150), Ms(225), absl::Microseconds(337500),
                                              Ms(500), Ms(500)));
}

TEST(BackoffTest, ResetStartsOverAtInitial) {
  BackoffOptions o;
  o.jitter = 0;
  Backoff backoff(o);
  EXPECT_THAT(Delays(backoff, 3), ElementsAre(Ms(100), Ms(200), Ms(400)));
  backoff.Reset();
  EXPECT_THAT(Delays(backoff, 2), ElementsAre(Ms(100), Ms(200)));
}

// Every delay lies in [(1 - jitter) * base, base]; a seed fixes the delays.
TEST(BackoffTest, JitteredDelaysStayInTheirWindowAndFollowTheSeed) {
  BackoffOptions o;
  o.jitter = 0.5;
  o.seed = 42;
  Backoff a(o), b(o);
  const std::vector<absl::Duration> delays = Delays(a, 50);
  EXPECT_EQ(delays, Delays(b, 50));
  const std::vector<absl::Duration> bases = {Ms(100), Ms(200), Ms(400), Ms(800), Ms(1600)};
  int below_base = 0;
  for (size_t i = 0; i < delays.size(); ++i) {
    const absl::Duration base = i < bases.size() ? bases[i] : Ms(2000);
    EXPECT_GE(delays[i], base / 2) << "delay " << i;
    EXPECT_LE(delays[i], base) << "delay " << i;
    if (delays[i] < base) ++below_base;
  }
  // 50 uniform draws all landing exactly on the top of their window would
  // mean no jitter at all.
  EXPECT_GT(below_base, 40);

  // Another seed spreads the same retries differently: workers that failed
  // together do not retry in lockstep.
  BackoffOptions other = o;
  other.seed = 43;
  Backoff c(other);
  EXPECT_NE(delays, Delays(c, 50));
}

TEST(BackoffTest, SeedZeroDrawsAFreshSeed) {
  BackoffOptions o;  // seed 0, jitter 0.5
  Backoff a(o), b(o);
  // Two random 64-bit seeds giving the same 20 delays: never in practice.
  EXPECT_NE(Delays(a, 20), Delays(b, 20));
}

TEST(BackoffTest, FullJitterReachesDownToZero) {
  BackoffOptions o;
  o.jitter = 1;
  o.seed = 7;
  Backoff backoff(o);
  for (absl::Duration d : Delays(backoff, 100)) {
    EXPECT_GE(d, absl::ZeroDuration());
    EXPECT_LE(d, Ms(2000));
  }
}

TEST(BackoffTest, ValidateNamesTheField) {
  EXPECT_TRUE(ValidateBackoffOptions(BackoffOptions{}).ok());
  BackoffOptions o;
  o.initial = absl::ZeroDuration();
  EXPECT_THAT(ValidateBackoffOptions(o).message(), HasSubstr("initial=0"));
  o = BackoffOptions{};
  o.max = Ms(50);
  EXPECT_THAT(ValidateBackoffOptions(o).message(), HasSubstr("max=50ms must be at least initial"));
  o = BackoffOptions{};
  o.multiplier = 0.5;
  EXPECT_THAT(ValidateBackoffOptions(o).message(), HasSubstr("multiplier=0.5"));
  o = BackoffOptions{};
  o.jitter = 1.5;
  absl::Status s = ValidateBackoffOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("jitter=1.5 must be in [0, 1]"));
}

TEST(BackoffTest, OutOfRangeOptionsAreClamped) {
  BackoffOptions o;
  o.initial = Ms(300);
  o.max = Ms(100);       // -> 300 ms
  o.multiplier = 0.1;    // -> 1
  o.jitter = -3;         // -> 0
  Backoff backoff(o);
  EXPECT_THAT(Delays(backoff, 3), ElementsAre(Ms(300), Ms(300), Ms(300)));
}

// Retry on a FakeClock: attempts happen exactly one jittered delay apart.
TEST(RetryTest, RetriesAfterEachDelayUntilSuccess) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  BackoffOptions o;
  o.seed = 1234;
  Backoff expected(o);
  const std::vector<absl::Duration> delays = Delays(expected, 3);

  absl::Mutex mu;
  std::vector<absl::Time> attempts;
  absl::Status result;
  std::thread retrier([&] {
    Backoff backoff(o);
    result = Retry(
        clock, backoff, start + absl::Minutes(1),
        [](const absl::Status& s) { return absl::IsUnavailable(s); },
        [&] {
          absl::MutexLock lock(&mu);
          attempts.push_back(clock.Now());
          return attempts.size() <= 3 ? absl::UnavailableError("restarting") : absl::OkStatus();
        });
  });
  absl::Time t = start;
  for (absl::Duration d : delays) {
    t += d;
    // The retry waits out exactly the next delay (and nothing else waits).
    ASSERT_TRUE(clock.AwaitWaiterAt(t));
    EXPECT_THAT(clock.Waiters(), ElementsAre(t));
    clock.Advance(d);
  }
  retrier.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_THAT(attempts, ElementsAre(start, start + delays[0], start + delays[0] + delays[1],
                                    start + delays[0] + delays[1] + delays[2]));
}

TEST(RetryTest, GivesUpWhenTheNextDelayWouldPassTheDeadline) {
  FakeClock clock;
  BackoffOptions o;
  o.jitter = 0;  // 100, 200, 400 ms: the third would end at 700 ms > 500 ms
  Backoff backoff(o);
  int attempts = 0;
  absl::Status result;
  std::thread retrier([&] {
    result = Retry(
        clock, backoff, clock.Now() + Ms(500), [](const absl::Status&) { return true; },
        [&] {
          ++attempts;
          return absl::UnavailableError(absl::StrCat("attempt ", attempts));
        });
  });
  const absl::Time start = clock.Now();
  ASSERT_TRUE(clock.AwaitWaiterAt(start + Ms(100)));
  clock.Advance(Ms(100));
  ASSERT_TRUE(clock.AwaitWaiterAt(start + Ms(300)));
  clock.Advance(Ms(200));
  retrier.join();
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(result.message(), "attempt 3");
}

TEST(RetryTest, NonRetryableStatusEndsAtOnce) {
  FakeClock clock;
  Backoff backoff(BackoffOptions{});
  int attempts = 0;
  absl::Status result = Retry(
      clock, backoff, absl::InfiniteFuture(),
      [](const absl::Status& s) { return absl::IsUnavailable(s); },
      [&] {
        ++attempts;
        return absl::NotFoundError("no job");
      });
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(result, absl::NotFoundError("no job"));
}

TEST(RetryTest, AttemptsOnceEvenPastTheDeadline) {
  FakeClock clock;
  Backoff backoff(BackoffOptions{});
  int attempts = 0;
  absl::Status result = Retry(
      clock, backoff, absl::InfinitePast(), [](const absl::Status&) { return true; },
      [&] {
        ++attempts;
        return absl::UnavailableError("down");
      });
  EXPECT_EQ(attempts, 1);
  EXPECT_TRUE(absl::IsUnavailable(result));
}

TEST(RetryTest, AFailedWaitEndsTheLoopWithItsStatus) {
  FakeClock clock;
  BackoffOptions o;
  o.jitter = 0;
  Backoff backoff(o);
  std::vector<absl::Duration> waits;
  int attempts = 0;
  absl::Status result = Retry(
      clock, backoff, absl::InfiniteFuture(), [](const absl::Status&) { return true; },
      [&] {
        ++attempts;
        return absl::UnavailableError("down");
      },
      [&](absl::Duration d) {
        waits.push_back(d);
        return waits.size() < 2 ? absl::OkStatus() : absl::CancelledError("shutting down");
      });
  EXPECT_EQ(attempts, 2);
  EXPECT_THAT(waits, ElementsAre(Ms(100), Ms(200)));
  EXPECT_EQ(result, absl::CancelledError("shutting down"));
}

}  // namespace
}  // namespace shardline

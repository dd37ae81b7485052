#include "server/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/clock.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

constexpr char kJob[] = "job-1";

class RendezvousTest : public ::testing::Test {
 protected:
  // Blocks (real time, bounded) until `n` calls of (job, generation) are blocked.
  void AwaitWaiters(uint64_t generation, int64_t n, absl::string_view job = kJob) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (rv_.GetUsage(job, generation).waiters != n) {
      ASSERT_LT(absl::Now(), give_up)
          << "expected " << n << " waiters, have " << rv_.GetUsage(job, generation).waiters;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  FakeClock clock_;
  Rendezvous rv_{&clock_};
};

std::optional<std::string> GetNow(Rendezvous& rv, uint64_t generation, absl::string_view scope,
                                  absl::string_view key) {
  absl::StatusOr<std::optional<std::string>> got =
      rv.Get(kJob, generation, scope, key, /*wait=*/false);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : std::nullopt;
}

// ---------------------------------------------------------------------------
// Set / Get / Delete.

TEST_F(RendezvousTest, SetGetOverwrite) {
  EXPECT_EQ(GetNow(rv_, 1, "", "addr"), std::nullopt);
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "addr", "10.0.0.1:29500").ok());
  EXPECT_EQ(GetNow(rv_, 1, "", "addr"), "10.0.0.1:29500");
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "addr", "10.0.0.2:29501").ok());
  EXPECT_EQ(GetNow(rv_, 1, "", "addr"), "10.0.0.2:29501");
  // Empty values and binary bytes are values like any other.
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "empty", "").ok());
  EXPECT_EQ(GetNow(rv_, 1, "", "empty"), "");
  const std::string binary("\0\x01\xff\n", 4);
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "bin", binary).ok());
  EXPECT_EQ(GetNow(rv_, 1, "", "bin"), binary);

  Rendezvous::Usage usage = rv_.GetUsage(kJob, 1);
  EXPECT_EQ(usage.keys, 3);
  EXPECT_EQ(usage.scopes, 1);
  // Every entry is charged its bookkeeping too (kKeyOverheadBytes), and the
  // scope "" its own (kScopeOverheadBytes).
  EXPECT_EQ(usage.bytes,
            (4 + 14) + (5 + 0) + (3 + 4) + 3 * kKeyOverheadBytes + 0 + kScopeOverheadBytes);
}

TEST_F(RendezvousTest, GetWithWaitIsUnblockedByLaterSetFromAnotherThread) {
  absl::StatusOr<std::optional<std::string>> got;
  absl::Duration waited;
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    got = rv_.Get(kJob, 1, "tp/0", "ncclUniqueId", /*wait=*/true, absl::Seconds(5));
    waited = absl::Now() - start;
  });
  AwaitWaiters(1, 1);
  absl::SleepFor(absl::Milliseconds(30));
  ASSERT_TRUE(rv_.Set(kJob, 1, "tp/0", "ncclUniqueId", "id-bytes").ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "id-bytes");
  EXPECT_GE(waited, absl::Milliseconds(30));
  EXPECT_LT(waited, absl::Seconds(2));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 0);
}

TEST_F(RendezvousTest, GetWithWaitReturnsPresentKeyAtOnce) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k", "v").ok());
  absl::StatusOr<std::optional<std::string>> got =
      rv_.Get(kJob, 1, "", "k", /*wait=*/true, absl::ZeroDuration());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST_F(RendezvousTest, GetWithWaitTimesOutWithDeadlineExceeded) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<std::string>> got =
      rv_.Get(kJob, 7, "dp/1", "never", /*wait=*/true, absl::Milliseconds(100));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("\"never\""));
  EXPECT_THAT(got.status().message(), HasSubstr("\"dp/1\""));
  EXPECT_THAT(got.status().message(), HasSubstr("generation 7"));
  EXPECT_THAT(got.status().message(), HasSubstr("100ms"));
  EXPECT_GE(waited, absl::Milliseconds(100));
  EXPECT_LT(waited, absl::Seconds(2));
  // Nothing is left behind by a timed-out waiter.
  Rendezvous::Usage usage = rv_.GetUsage(kJob, 7);
  EXPECT_EQ(usage.waiters, 0);
  EXPECT_EQ(usage.keys, 0);

  // Zero timeout: check once.
  got = rv_.Get(kJob, 7, "", "never", /*wait=*/true, absl::ZeroDuration());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousTest, RpcDeadlineEndsTheWaitWhenEarlierThanTimeout) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<std::string>> got =
      rv_.Get(kJob, 1, "", "k", /*wait=*/true, absl::Seconds(60),
              /*rpc_deadline=*/absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("RPC deadline"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(RendezvousTest, AdvancingTheFakeClockDoesNotEndAWaitButStampsWrites) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "a", "1").ok());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).last_write, clock_.Now());
  absl::StatusOr<std::optional<std::string>> got;
  std::thread waiter([&] { got = rv_.Get(kJob, 1, "", "b", /*wait=*/true, absl::Seconds(5)); });
  AwaitWaiters(1, 1);
  clock_.Advance(absl::Hours(2));  // way past the timeout in fake time
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 1);  // still waiting
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "b", "2").ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "2");
  EXPECT_EQ(rv_.GetUsage(kJob, 1).last_write, clock_.Now());
}

TEST_F(RendezvousTest, DeleteReportsWhetherTheKeyExistedAndFreesItsBytes) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "s", "k", "value").ok());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 6 + kKeyOverheadBytes + 1 + kScopeOverheadBytes);
  absl::StatusOr<bool> deleted = rv_.Delete(kJob, 1, "s", "k");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  EXPECT_EQ(GetNow(rv_, 1, "s", "k"), std::nullopt);
  deleted = rv_.Delete(kJob, 1, "s", "k");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(*deleted);
  deleted = rv_.Delete(kJob, 1, "other-scope", "k");
  ASSERT_TRUE(deleted.ok());
  EXPECT_FALSE(*deleted);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 0);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).keys, 0);
}

// ---------------------------------------------------------------------------
// Isolation.

TEST_F(RendezvousTest, ScopesAreIsolated) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "tp/0", "ncclUniqueId", "group-tp0").ok());
  ASSERT_TRUE(rv_.Set(kJob, 1, "tp/1", "ncclUniqueId", "group-tp1").ok());
  EXPECT_EQ(GetNow(rv_, 1, "tp/0", "ncclUniqueId"), "group-tp0");
  EXPECT_EQ(GetNow(rv_, 1, "tp/1", "ncclUniqueId"), "group-tp1");
  EXPECT_EQ(GetNow(rv_, 1, "", "ncclUniqueId"), std::nullopt);
  EXPECT_EQ(GetNow(rv_, 1, "dp/0", "ncclUniqueId"), std::nullopt);
  // A barrier of the same name in another scope is another barrier.
  ASSERT_TRUE(rv_.Barrier(kJob, 1, "tp/0", "b", "w0", 1).ok());
  EXPECT_EQ(rv_.Barrier(kJob, 1, "tp/1", "b", "w0", 2, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousTest, GenerationsAndJobsAreIsolated) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k", "g1").ok());
  ASSERT_TRUE(rv_.Set(kJob, 2, "", "k", "g2").ok());
  ASSERT_TRUE(rv_.Set("job-2", 1, "", "k", "other-job").ok());
  EXPECT_EQ(GetNow(rv_, 1, "", "k"), "g1");
  EXPECT_EQ(GetNow(rv_, 2, "", "k"), "g2");
  EXPECT_EQ(GetNow(rv_, 3, "", "k"), std::nullopt);
  absl::StatusOr<std::optional<std::string>> other = rv_.Get("job-2", 1, "", "k", false);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, "other-job");
  // A waiter on generation 2 is not woken by a set in generation 1.
  absl::StatusOr<std::optional<std::string>> got =
      rv_.Get(kJob, 2, "", "only-in-1", /*wait=*/true, absl::Milliseconds(50));
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "only-in-1", "x").ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// ---------------------------------------------------------------------------
// EndGeneration / DropJob.

TEST_F(RendezvousTest, EndGenerationAbortsBlockedCallsPromptlyAndLaterCalls) {
  ASSERT_TRUE(rv_.Set(kJob, 3, "", "kept-until-end", "v").ok());
  ASSERT_TRUE(rv_.Set(kJob, 4, "", "newer", "v4").ok());
  constexpr int kBlocked = 4;
  std::vector<absl::Status> results(kBlocked);
  std::vector<absl::Duration> waited(kBlocked);
  std::vector<std::thread> threads;
  auto run = [&](int i, auto fn) {
    threads.emplace_back([&, i, fn] {
      const absl::Time start = absl::Now();
      results[i] = fn();
      waited[i] = absl::Now() - start;
    });
  };
  run(0, [&] { return rv_.Get(kJob, 3, "tp/0", "id", true, absl::Seconds(10)).status(); });
  run(1, [&] { return rv_.Wait(kJob, 3, "", {"kept-until-end", "a", "b"}, absl::Seconds(10)); });
  run(2, [&] { return rv_.Barrier(kJob, 3, "", "init", "w0", 2, absl::Seconds(10)).status(); });
  // Generation 2 is older and ends too.
  run(3, [&] { return rv_.Get(kJob, 2, "", "id", true, absl::Seconds(10)).status(); });
  AwaitWaiters(3, 3);
  AwaitWaiters(2, 1);

  rv_.EndGeneration(kJob, 3);
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kBlocked; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(results[i].code(), absl::StatusCode::kAborted) << results[i];
    EXPECT_THAT(results[i].message(), HasSubstr("ended"));
    EXPECT_THAT(results[i].message(), HasSubstr("re-join"));
    EXPECT_LT(waited[i], absl::Seconds(2));
  }
  EXPECT_THAT(results[0].message(), HasSubstr("generation 3"));
  EXPECT_THAT(results[3].message(), HasSubstr("generation 2"));

  // Later calls for generation 3 (and older) are ABORTED; nothing is recreated.
  for (uint64_t g : {uint64_t{1}, uint64_t{3}}) {
    SCOPED_TRACE(g);
    EXPECT_EQ(rv_.Set(kJob, g, "", "k", "v").code(), absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.Get(kJob, g, "", "kept-until-end", false).status().code(),
              absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.Add(kJob, g, "", "c", 1).status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.CompareAndSet(kJob, g, "", "k", std::nullopt, "v").status().code(),
              absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.Wait(kJob, g, "", {"k"}, absl::Milliseconds(10)).code(),
              absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.Delete(kJob, g, "", "k").status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.Barrier(kJob, g, "", "b", "w0", 1).status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(rv_.GetUsage(kJob, g).keys, 0);
  }
  // The newer generation keeps its keys and works.
  EXPECT_EQ(GetNow(rv_, 4, "", "newer"), "v4");
  EXPECT_TRUE(rv_.Set(kJob, 4, "", "k", "v").ok());
  // Idempotent, and ending an older generation again changes nothing.
  rv_.EndGeneration(kJob, 3);
  rv_.EndGeneration(kJob, 1);
  EXPECT_EQ(GetNow(rv_, 4, "", "newer"), "v4");
}

TEST_F(RendezvousTest, DropJobAbortsEveryGenerationPresentAndFuture) {
  ASSERT_TRUE(rv_.Set(kJob, 5, "", "k", "v").ok());
  ASSERT_TRUE(rv_.Set("other-job", 5, "", "k", "v").ok());
  absl::Status blocked;
  std::thread waiter(
      [&] { blocked = rv_.Barrier(kJob, 6, "", "init", "w1", 4, absl::Seconds(10)).status(); });
  AwaitWaiters(6, 1);
  rv_.DropJob(kJob);
  waiter.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(blocked.message(), HasSubstr("dropped"));
  for (uint64_t g : {uint64_t{5}, uint64_t{6}, uint64_t{100}}) {
    EXPECT_EQ(rv_.Set(kJob, g, "", "k", "v").code(), absl::StatusCode::kAborted);
  }
  absl::StatusOr<std::optional<std::string>> other = rv_.Get("other-job", 5, "", "k", false);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, "v");
}

// ---------------------------------------------------------------------------
// Add.

TEST_F(RendezvousTest, AddCountsFromZeroAndStoresDecimalText) {
  absl::StatusOr<int64_t> v = rv_.Add(kJob, 1, "", "count", 3);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 3);
  EXPECT_EQ(GetNow(rv_, 1, "", "count"), "3");
  v = rv_.Add(kJob, 1, "", "count", -10);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, -7);
  EXPECT_EQ(GetNow(rv_, 1, "", "count"), "-7");
  v = rv_.Add(kJob, 1, "", "count", 0);  // 0 reads
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, -7);
  // A value set as decimal text is a counter too.
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "preset", "41").ok());
  v = rv_.Add(kJob, 1, "", "preset", 1);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  // Add(0) on a missing key stores "0".
  v = rv_.Add(kJob, 1, "", "fresh", 0);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 0);
  EXPECT_EQ(GetNow(rv_, 1, "", "fresh"), "0");
}

TEST_F(RendezvousTest, AddOnNonNumberIsFailedPrecondition) {
  for (const std::string& bad : {std::string("abc"), std::string(""), std::string("+3"),
                                 std::string(" 3"), std::string("3 "), std::string("-"),
                                 std::string("1.5"), std::string("9223372036854775808")}) {
    SCOPED_TRACE(bad);
    ASSERT_TRUE(rv_.Set(kJob, 1, "", "c", bad).ok());
    absl::StatusOr<int64_t> v = rv_.Add(kJob, 1, "", "c", 1);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(v.status().message(), HasSubstr("\"c\""));
    EXPECT_EQ(GetNow(rv_, 1, "", "c"), bad);  // unchanged
  }
}

TEST_F(RendezvousTest, AddOverflowIsOutOfRangeAndLeavesCounterUnchanged) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  const int64_t min = std::numeric_limits<int64_t>::min();
  ASSERT_TRUE(rv_.Add(kJob, 1, "", "c", max).ok());
  absl::StatusOr<int64_t> v = rv_.Add(kJob, 1, "", "c", 1);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(v.status().message(), HasSubstr("overflows int64"));
  EXPECT_EQ(GetNow(rv_, 1, "", "c"), absl::StrCat(max));

  ASSERT_TRUE(rv_.Add(kJob, 1, "", "d", min).ok());
  EXPECT_EQ(GetNow(rv_, 1, "", "d"), "-9223372036854775808");
  v = rv_.Add(kJob, 1, "", "d", -1);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kOutOfRange);
  v = rv_.Add(kJob, 1, "", "d", max);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, -1);
}

TEST_F(RendezvousTest, AddFromSixteenThreadsSumsExactly) {
  constexpr int kThreads = 16;
  constexpr int kAddsPerThread = 500;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::vector<int64_t> seen_max(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        absl::StatusOr<int64_t> v = rv_.Add(kJob, 1, "dp/0", "step", t + 1);
        if (!v.ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const int64_t expected = int64_t{kAddsPerThread} * kThreads * (kThreads + 1) / 2;
  EXPECT_EQ(GetNow(rv_, 1, "dp/0", "step"), absl::StrCat(expected));
}

// ---------------------------------------------------------------------------
// CompareAndSet.

TEST_F(RendezvousTest, CompareAndSetSemantics) {
  // Create if absent.
  absl::StatusOr<Rendezvous::CasResult> r = rv_.CompareAndSet(kJob, 1, "", "k", std::nullopt, "a");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->current, "a");
  // Create again: the key exists, no swap, current value returned.
  r = rv_.CompareAndSet(kJob, 1, "", "k", std::nullopt, "b");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, "a");
  // Matching expected swaps.
  r = rv_.CompareAndSet(kJob, 1, "", "k", "a", "b");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->current, "b");
  EXPECT_EQ(GetNow(rv_, 1, "", "k"), "b");
  // Mismatch: no swap, current returned.
  r = rv_.CompareAndSet(kJob, 1, "", "k", "a", "c");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, "b");
  // Expected on a missing key: no swap, current unset, key still missing.
  r = rv_.CompareAndSet(kJob, 1, "", "missing", "x", "y");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->current, std::nullopt);
  EXPECT_EQ(GetNow(rv_, 1, "", "missing"), std::nullopt);
  // Empty expected is a value, not "missing".
  r = rv_.CompareAndSet(kJob, 1, "", "missing", "", "y");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->swapped);
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "empty", "").ok());
  r = rv_.CompareAndSet(kJob, 1, "", "empty", "", "now-set");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->swapped);
}

TEST_F(RendezvousTest, CompareAndSetCreateWakesWaiters) {
  absl::StatusOr<std::optional<std::string>> got;
  std::thread waiter([&] { got = rv_.Get(kJob, 1, "", "leader", true, absl::Seconds(5)); });
  AwaitWaiters(1, 1);
  ASSERT_TRUE(rv_.CompareAndSet(kJob, 1, "", "leader", std::nullopt, "w3").ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "w3");
}

TEST_F(RendezvousTest, CompareAndSetRaceOfSixteenThreadsHasExactlyOneWinner) {
  constexpr int kThreads = 16;
  for (int round = 0; round < 20; ++round) {
    const std::string key = absl::StrCat("leader/", round);
    std::vector<absl::StatusOr<Rendezvous::CasResult>> results(kThreads,
                                                               absl::UnknownError("not run"));
    absl::Notification go;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        go.WaitForNotification();
        results[t] = rv_.CompareAndSet(kJob, 1, "", key, std::nullopt, absl::StrCat("w", t));
      });
    }
    go.Notify();
    for (std::thread& t : threads) t.join();
    int winners = 0;
    std::optional<std::string> stored = GetNow(rv_, 1, "", key);
    ASSERT_TRUE(stored.has_value());
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(results[t].ok()) << results[t].status();
      if (results[t]->swapped) {
        ++winners;
        EXPECT_EQ(*stored, absl::StrCat("w", t));
      }
      EXPECT_EQ(results[t]->current, stored);  // losers see the winner's value
    }
    EXPECT_EQ(winners, 1) << "round " << round;
  }
}

// ---------------------------------------------------------------------------
// Wait.

TEST_F(RendezvousTest, WaitReturnsOnceEveryKeyExists) {
  absl::Status result = absl::UnknownError("not run");
  std::thread waiter([&] {
    result = rv_.Wait(kJob, 1, "gloo", {"rank/0", "rank/1", "rank/2", "rank/1"}, absl::Seconds(5));
  });
  ASSERT_TRUE(rv_.Set(kJob, 1, "gloo", "rank/2", "addr2").ok());
  AwaitWaiters(1, 1);
  ASSERT_TRUE(rv_.Set(kJob, 1, "gloo", "rank/0", "addr0").ok());
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 1);  // rank/1 still missing
  ASSERT_TRUE(rv_.Set(kJob, 1, "gloo", "rank/1", "addr1").ok());
  waiter.join();
  EXPECT_TRUE(result.ok()) << result;
  // All present: returns at once, even with a zero timeout.
  EXPECT_TRUE(rv_.Wait(kJob, 1, "gloo", {"rank/0", "rank/1"}, absl::ZeroDuration()).ok());
}

TEST_F(RendezvousTest, WaitWantsAllKeysAtOnceAfterADelete) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "a", "1").ok());
  absl::Status result = absl::UnknownError("not run");
  std::thread waiter([&] { result = rv_.Wait(kJob, 1, "", {"a", "b"}, absl::Seconds(5)); });
  AwaitWaiters(1, 1);  // registered on "b"
  ASSERT_TRUE(rv_.Delete(kJob, 1, "", "a").ok());
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "b", "2").ok());
  AwaitWaiters(1, 1);  // back to waiting, now for "a"
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "a", "1").ok());
  waiter.join();
  EXPECT_TRUE(result.ok()) << result;
}

TEST_F(RendezvousTest, WaitTimeoutNamesTheFirstSixteenMissingKeys) {
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back(absl::StrCat("key", i));
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "key0", "x").ok());
  absl::Status s = rv_.Wait(kJob, 1, "", keys, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("19 of 20 keys"));
  EXPECT_THAT(s.message(), HasSubstr("\"key1\""));
  EXPECT_THAT(s.message(), HasSubstr("\"key16\""));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("\"key0\"")));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("\"key17\"")));
  EXPECT_THAT(s.message(), HasSubstr("..."));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 0);
}

TEST_F(RendezvousTest, ManyWaitersOnDistinctKeysAllWake) {
  constexpr int kWaiters = 64;
  std::vector<absl::StatusOr<std::optional<std::string>>> got(kWaiters,
                                                              absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back(
        [&, i] { got[i] = rv_.Get(kJob, 1, "", absl::StrCat("k", i), true, absl::Seconds(5)); });
  }
  AwaitWaiters(1, kWaiters);
  for (int i = kWaiters - 1; i >= 0; --i) {
    ASSERT_TRUE(rv_.Set(kJob, 1, "", absl::StrCat("k", i), absl::StrCat("v", i)).ok());
    // Setting k_i wakes only the waiter for k_i.
    AwaitWaiters(1, i);
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], absl::StrCat("v", i));
  }
}

// ---------------------------------------------------------------------------
// Barrier.

TEST_F(RendezvousTest, BarrierReleasesAllParticipantsWithDistinctPositions) {
  constexpr int kRanks = 8;
  std::vector<absl::StatusOr<uint32_t>> got(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      got[r] = rv_.Barrier(kJob, 1, "", "ckpt/step-10", absl::StrCat("node", r, ":cuda:0"), kRanks,
                           absl::Seconds(5));
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<uint32_t> positions;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    positions.push_back(*got[r]);
  }
  EXPECT_THAT(positions, UnorderedElementsAreArray({0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u}));
  // Stays open: a repeated arrival returns its position at once.
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<uint32_t> again =
        rv_.Barrier(kJob, 1, "", "ckpt/step-10", absl::StrCat("node", r, ":cuda:0"), kRanks,
                    absl::ZeroDuration());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, positions[r]);
  }
  // A single participant opens at once.
  absl::StatusOr<uint32_t> solo = rv_.Barrier(kJob, 1, "", "solo", "w0", 1);
  ASSERT_TRUE(solo.ok());
  EXPECT_EQ(*solo, 0u);
}

TEST_F(RendezvousTest, BarrierCountsARetryingParticipantOnce) {
  std::vector<absl::StatusOr<uint32_t>> got(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = rv_.Barrier(kJob, 1, "", "b", "w0", 3, absl::Seconds(5)); });
  AwaitWaiters(1, 1);
  // w0 retries (its first RPC is still blocked on the server).
  threads.emplace_back([&] { got[1] = rv_.Barrier(kJob, 1, "", "b", "w0", 3, absl::Seconds(5)); });
  threads.emplace_back([&] { got[2] = rv_.Barrier(kJob, 1, "", "b", "w1", 3, absl::Seconds(5)); });
  AwaitWaiters(1, 3);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 3);  // 2 distinct of 3: still closed
  absl::StatusOr<uint32_t> last = rv_.Barrier(kJob, 1, "", "b", "w2", 3, absl::Seconds(5));
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, 2u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(got[i].ok()) << got[i].status();
  EXPECT_EQ(*got[0], 0u);
  EXPECT_EQ(*got[1], 0u);  // the retry gets the same position
  EXPECT_EQ(*got[2], 1u);
}

TEST_F(RendezvousTest, BarrierRejectsTooManyParticipantsAndMismatchedCounts) {
  ASSERT_TRUE(rv_.Barrier(kJob, 1, "", "pair", "w0", 2, absl::ZeroDuration()).status().code() ==
              absl::StatusCode::kDeadlineExceeded);
  // Timed out with zero timeout: w0 was withdrawn. Two others open it.
  std::thread t([&] { ASSERT_TRUE(rv_.Barrier(kJob, 1, "", "pair", "w1", 2).ok()); });
  ASSERT_TRUE(rv_.Barrier(kJob, 1, "", "pair", "w2", 2).ok());
  t.join();
  // A third distinct participant of a 2-participant barrier.
  absl::StatusOr<uint32_t> extra = rv_.Barrier(kJob, 1, "", "pair", "w0", 2);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(extra.status().message(), HasSubstr("\"w0\" is not one of them"));
  EXPECT_THAT(extra.status().message(), HasSubstr("participants = 2"));
  // A different participant count.
  absl::StatusOr<uint32_t> mismatch = rv_.Barrier(kJob, 1, "", "pair", "w1", 3);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("participants = 2"));
  EXPECT_THAT(mismatch.status().message(), HasSubstr("participants = 3"));
}

TEST_F(RendezvousTest, BarrierTimeoutReportsArrivalsAndWithdrawsTheCaller) {
  absl::StatusOr<uint32_t> first = absl::UnknownError("not run");
  std::thread w0([&] { first = rv_.Barrier(kJob, 1, "", "init", "w0", 4, absl::Seconds(5)); });
  AwaitWaiters(1, 1);
  const absl::Time start = absl::Now();
  absl::StatusOr<uint32_t> timed_out =
      rv_.Barrier(kJob, 1, "", "init", "w1", 4, absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.status().message(), HasSubstr("barrier \"init\""));
  EXPECT_THAT(timed_out.status().message(), HasSubstr("2 of 4 participants had arrived"));
  EXPECT_THAT(timed_out.status().message(), HasSubstr("withdrawn"));

  // w1 no longer counts: w2 and w3 alone leave the barrier closed ...
  std::vector<absl::StatusOr<uint32_t>> got(2, absl::UnknownError("not run"));
  std::thread w2([&] { got[0] = rv_.Barrier(kJob, 1, "", "init", "w2", 4, absl::Seconds(5)); });
  std::thread w3([&] { got[1] = rv_.Barrier(kJob, 1, "", "init", "w3", 4, absl::Seconds(5)); });
  AwaitWaiters(1, 3);
  // ... until w1 arrives again.
  absl::StatusOr<uint32_t> again = rv_.Barrier(kJob, 1, "", "init", "w1", 4, absl::Seconds(5));
  w0.join();
  w2.join();
  w3.join();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 0u);
  EXPECT_EQ(*again, 3u);
  ASSERT_TRUE(got[0].ok());
  ASSERT_TRUE(got[1].ok());
  EXPECT_THAT((std::vector<uint32_t>{*got[0], *got[1]}), UnorderedElementsAreArray({1u, 2u}));
}

TEST_F(RendezvousTest, BarrierArriveHoldsNoThreadAndAnswersEachWaiterOnce) {
  // Three arrivals wait without a thread; the fourth opens the barrier,
  // which answers each waiting arrival exactly once, with its position.
  std::vector<std::vector<absl::StatusOr<uint32_t>>> answers(3);
  std::vector<Rendezvous::BarrierArrival> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.push_back(rv_.BarrierArrive(
        kJob, 1, "", "init", absl::StrCat("w", i), 4, absl::Seconds(5), absl::InfiniteFuture(),
        [&answers, i](absl::StatusOr<uint32_t> a) { answers[i].push_back(std::move(a)); }));
    ASSERT_FALSE(waiting.back().answer.has_value());
    EXPECT_NE(waiting.back().wait_id, 0u);
  }
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 3);
  for (const auto& a : answers) EXPECT_TRUE(a.empty());
  Rendezvous::BarrierArrival last =
      rv_.BarrierArrive(kJob, 1, "", "init", "w3", 4, absl::Seconds(5), absl::InfiniteFuture(),
                        [](absl::StatusOr<uint32_t>) { ADD_FAILURE() << "answered at once"; });
  ASSERT_TRUE(last.answer.has_value());
  ASSERT_TRUE(last.answer->ok()) << last.answer->status();
  EXPECT_EQ(**last.answer, 3u);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 0);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(answers[i].size(), 1u) << i;
    ASSERT_TRUE(answers[i][0].ok()) << answers[i][0].status();
    EXPECT_EQ(*answers[i][0], i);
    // Answered: a withdrawal changes nothing.
    EXPECT_FALSE(rv_.Withdraw(waiting[i].wait_id).has_value());
  }
  // A late arrival of a counted participant is answered at once.
  Rendezvous::BarrierArrival again = rv_.BarrierArrive(
      kJob, 1, "", "init", "w1", 4, absl::Seconds(5), absl::InfiniteFuture(),
      [](absl::StatusOr<uint32_t>) {});
  ASSERT_TRUE(again.answer.has_value());
  EXPECT_EQ(**again.answer, 1u);
}

TEST_F(RendezvousTest, BarrierWaitWithdrawnBeforeItsAnswerIsNeverAnswered) {
  int answered = 0;
  auto count = [&answered](absl::StatusOr<uint32_t>) { ++answered; };
  const absl::Time before = absl::Now();
  Rendezvous::BarrierArrival a = rv_.BarrierArrive(kJob, 1, "", "init", "w0", 2,
                                                   absl::Milliseconds(50), absl::InfiniteFuture(),
                                                   count);
  ASSERT_FALSE(a.answer.has_value());
  // The deadline the caller keeps: now + the timeout (real time).
  EXPECT_GE(a.deadline, before + absl::Milliseconds(50));
  EXPECT_LE(a.deadline, absl::Now() + absl::Milliseconds(50));
  std::optional<absl::Status> late = rv_.Withdraw(a.wait_id);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late->message(), HasSubstr("barrier \"init\""));
  EXPECT_THAT(late->message(), HasSubstr("did not open within the timeout of 50ms"));
  EXPECT_THAT(late->message(), HasSubstr("1 of 2 participants had arrived"));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 0);
  EXPECT_FALSE(rv_.Withdraw(a.wait_id).has_value());  // once

  // A cancelled wait is withdrawn too, and says so.
  Rendezvous::BarrierArrival b = rv_.BarrierArrive(
      kJob, 1, "", "init", "w1", 2, absl::Seconds(5), absl::InfiniteFuture(), count);
  ASSERT_FALSE(b.answer.has_value());
  std::optional<absl::Status> cancelled = rv_.Withdraw(b.wait_id, /*cancelled=*/true);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(cancelled->message(), HasSubstr("the caller cancelled while waiting"));
  EXPECT_THAT(cancelled->message(), HasSubstr("withdrawn"));

  // Both were withdrawn: two new arrivals are the first and second, and
  // neither withdrawn wait is ever answered.
  Rendezvous::BarrierArrival c = rv_.BarrierArrive(
      kJob, 1, "", "init", "w2", 2, absl::Seconds(5), absl::InfiniteFuture(), count);
  ASSERT_FALSE(c.answer.has_value());
  Rendezvous::BarrierArrival d = rv_.BarrierArrive(
      kJob, 1, "", "init", "w3", 2, absl::Seconds(5), absl::InfiniteFuture(),
      [](absl::StatusOr<uint32_t>) {});
  ASSERT_TRUE(d.answer.has_value());
  EXPECT_EQ(**d.answer, 1u);
  EXPECT_EQ(answered, 1);  // c's
}

TEST_F(RendezvousTest, BarrierWaitOfAnEndedGenerationIsAnsweredAborted) {
  std::vector<absl::StatusOr<uint32_t>> answers;
  Rendezvous::BarrierArrival a = rv_.BarrierArrive(
      kJob, 1, "", "init", "w0", 2, absl::Seconds(5), absl::InfiniteFuture(),
      [&answers](absl::StatusOr<uint32_t> r) { answers.push_back(std::move(r)); });
  ASSERT_FALSE(a.answer.has_value());
  rv_.EndGeneration(kJob, 1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(answers[0].status().message(), HasSubstr("ended while this call waited"));
  EXPECT_FALSE(rv_.Withdraw(a.wait_id).has_value());
}

TEST_F(RendezvousTest, AwaitKeyHoldsNoThreadAndIsAnsweredByTheWriteThatSetsIt) {
  // Known at once: the key is set.
  ASSERT_TRUE(rv_.Set(kJob, 1, "tp/0", "id", "early").ok());
  Rendezvous::KeyArrival now = rv_.AwaitKey(
      kJob, 1, "tp/0", "id", absl::Seconds(5), absl::InfiniteFuture(),
      [](absl::StatusOr<Rendezvous::KeyAnswer>) { ADD_FAILURE() << "answered twice"; });
  ASSERT_TRUE(now.answer.has_value());
  ASSERT_TRUE(now.answer->ok()) << now.answer->status();
  EXPECT_EQ(**now.answer, std::optional<std::string>("early"));

  // Three calls wait for a missing key; the Set answers each exactly once,
  // with the value, and refunds what they were charged.
  const int64_t bytes_before = rv_.GetUsage(kJob, 1).bytes;
  std::vector<std::vector<absl::StatusOr<Rendezvous::KeyAnswer>>> answers(3);
  std::vector<Rendezvous::KeyArrival> waiting;
  for (int i = 0; i < 3; ++i) {
    waiting.push_back(rv_.AwaitKey(kJob, 1, "tp/0", "late", absl::Seconds(5),
                                   absl::InfiniteFuture(),
                                   [&answers, i](absl::StatusOr<Rendezvous::KeyAnswer> a) {
                                     answers[i].push_back(std::move(a));
                                   }));
    ASSERT_FALSE(waiting.back().answer.has_value());
    EXPECT_NE(waiting.back().wait_id, 0u);
  }
  Rendezvous::Usage usage = rv_.GetUsage(kJob, 1);
  EXPECT_EQ(usage.waiters, 3);
  // Charged to the waiting calls' own budget, not to the data's.
  EXPECT_EQ(usage.waiting_bytes,
            3 * (kKeyWaitOverheadBytes + kWaitedKeyOverheadBytes + 4));  // "late"
  EXPECT_EQ(usage.bytes, bytes_before);
  ASSERT_TRUE(rv_.Set(kJob, 1, "tp/0", "late", "v").ok());
  usage = rv_.GetUsage(kJob, 1);
  EXPECT_EQ(usage.waiters, 0);
  EXPECT_EQ(usage.waiting_bytes, 0);
  // Only the new key's own charge remains.
  EXPECT_EQ(usage.bytes - bytes_before, 4 + 1 + kKeyOverheadBytes);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(answers[i].size(), 1u) << i;
    ASSERT_TRUE(answers[i][0].ok()) << answers[i][0].status();
    EXPECT_EQ(*answers[i][0], std::optional<std::string>("v"));
    EXPECT_FALSE(rv_.Withdraw(waiting[i].wait_id).has_value());  // already answered
  }
}

TEST_F(RendezvousTest, AwaitKeysIsAnsweredOnlyWhenEveryKeyIsSetAtOnce) {
  int answered = 0;
  absl::StatusOr<Rendezvous::KeyAnswer> got = absl::UnknownError("not answered");
  Rendezvous::KeyArrival a = rv_.AwaitKeys(
      kJob, 1, "", {"a", "b", "a", "c"}, absl::Seconds(5), absl::InfiniteFuture(),
      [&](absl::StatusOr<Rendezvous::KeyAnswer> r) {
        ++answered;
        got = std::move(r);
      });
  ASSERT_FALSE(a.answer.has_value());
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "a", "1").ok());
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "c", "3").ok());
  EXPECT_EQ(answered, 0);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 1);
  // "a" is deleted before the last key comes: the final pass sees it
  // missing, so the call keeps waiting, now for "a".
  ASSERT_TRUE(rv_.Delete(kJob, 1, "", "a").ok());
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "b", "2").ok());
  EXPECT_EQ(answered, 0);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 1);
  ASSERT_TRUE(rv_.Add(kJob, 1, "", "a", 5).ok());
  EXPECT_EQ(answered, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::nullopt);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 0);
  EXPECT_FALSE(rv_.Withdraw(a.wait_id).has_value());
}

TEST_F(RendezvousTest, KeyWaitsWithdrawnSayWhatIsMissingAndAreNeverAnswered) {
  int answered = 0;
  auto count = [&answered](absl::StatusOr<Rendezvous::KeyAnswer>) { ++answered; };
  Rendezvous::KeyArrival get = rv_.AwaitKey(kJob, 1, "dp/1", "addr", absl::Milliseconds(40),
                                            absl::InfiniteFuture(), count);
  ASSERT_FALSE(get.answer.has_value());
  std::optional<absl::Status> late = rv_.Withdraw(get.wait_id);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late->message(), HasSubstr("key \"addr\" in scope \"dp/1\""));
  EXPECT_THAT(late->message(), HasSubstr("was not set within the timeout of 40ms"));
  EXPECT_FALSE(rv_.Withdraw(get.wait_id).has_value());  // once

  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k1", "x").ok());
  Rendezvous::KeyArrival wait = rv_.AwaitKeys(kJob, 1, "", {"k0", "k1", "k2"}, absl::Seconds(5),
                                              absl::InfiniteFuture(), count);
  ASSERT_FALSE(wait.answer.has_value());
  std::optional<absl::Status> cancelled = rv_.Withdraw(wait.wait_id, /*cancelled=*/true);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(cancelled->message(), HasSubstr("the caller cancelled while waiting for 2 of 3 keys"));
  EXPECT_THAT(cancelled->message(), HasSubstr("missing: \"k0\", \"k2\""));
  // Withdrawn: neither is answered by the keys that come later, and
  // nothing of theirs is left charged.
  ASSERT_TRUE(rv_.Set(kJob, 1, "dp/1", "addr", "h:1").ok());
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k0", "x").ok());
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k2", "x").ok());
  EXPECT_EQ(answered, 0);
  Rendezvous::Usage usage = rv_.GetUsage(kJob, 1);
  EXPECT_EQ(usage.waiters, 0);
  const int64_t scopes = (4 /*"dp/1"*/ + kScopeOverheadBytes) + (0 /*""*/ + kScopeOverheadBytes);
  const int64_t addr = 4 + 3 + kKeyOverheadBytes;          // addr = h:1
  const int64_t k012 = 3 * (2 + 1 + kKeyOverheadBytes);    // k0, k1, k2 = x
  EXPECT_EQ(usage.bytes, scopes + addr + k012);
}

TEST_F(RendezvousTest, KeyWaitOfAnEndedGenerationIsAnsweredAborted) {
  std::vector<absl::StatusOr<Rendezvous::KeyAnswer>> answers;
  auto keep = [&answers](absl::StatusOr<Rendezvous::KeyAnswer> r) {
    answers.push_back(std::move(r));
  };
  Rendezvous::KeyArrival a =
      rv_.AwaitKey(kJob, 1, "s", "k", absl::Seconds(5), absl::InfiniteFuture(), keep);
  Rendezvous::KeyArrival b =
      rv_.AwaitKeys(kJob, 1, "t", {"x", "y"}, absl::Seconds(5), absl::InfiniteFuture(), keep);
  ASSERT_FALSE(a.answer.has_value());
  ASSERT_FALSE(b.answer.has_value());
  rv_.EndGeneration(kJob, 1);
  ASSERT_EQ(answers.size(), 2u);
  for (const auto& r : answers) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
    EXPECT_THAT(r.status().message(), HasSubstr("ended while this call waited"));
  }
  EXPECT_FALSE(rv_.Withdraw(a.wait_id).has_value());
  EXPECT_FALSE(rv_.Withdraw(b.wait_id).has_value());
  // After the end: answered at once, Aborted.
  Rendezvous::KeyArrival c =
      rv_.AwaitKey(kJob, 1, "s", "k", absl::Seconds(5), absl::InfiniteFuture(), keep);
  ASSERT_TRUE(c.answer.has_value());
  EXPECT_EQ(c.answer->status().code(), absl::StatusCode::kAborted);
}

TEST_F(RendezvousTest, WaitingKeyCallsHaveABudgetOfTheirOwnAndNeverKeepOutTheirWrites) {
  // A KvWait of the most keys of the longest names: each such call is
  // charged ~65536 * (512 + 64) bytes = ~36 MiB, so the 256 MiB budget of
  // waiting calls holds 7 of them; the 8th is refused, naming the limit,
  // and waits for nothing.
  std::vector<std::string> keys;
  for (size_t i = 0; i < kMaxKeysPerRequest; ++i) {
    std::string k = absl::StrCat("k", i, "-");
    k.resize(kMaxKeyBytes, 'x');
    keys.push_back(std::move(k));
  }
  const int64_t per_call =
      kKeyWaitOverheadBytes +
      static_cast<int64_t>(kMaxKeysPerRequest) * (kWaitedKeyOverheadBytes + kMaxKeyBytes);
  const int fits = static_cast<int>(kMaxWaitingBytesPerGeneration / per_call);
  ASSERT_EQ(fits, 7);
  std::vector<absl::StatusOr<Rendezvous::KeyAnswer>> answers;
  auto keep = [&answers](absl::StatusOr<Rendezvous::KeyAnswer> r) {
    answers.push_back(std::move(r));
  };
  std::vector<uint64_t> ids;
  for (int i = 0; i < fits; ++i) {
    Rendezvous::KeyArrival a =
        rv_.AwaitKeys(kJob, 1, "", keys, absl::Seconds(60), absl::InfiniteFuture(), keep);
    ASSERT_FALSE(a.answer.has_value()) << i << ": " << a.answer->status();
    ids.push_back(a.wait_id);
  }
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiting_bytes, fits * per_call);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 0);
  Rendezvous::KeyArrival over =
      rv_.AwaitKeys(kJob, 1, "", keys, absl::Seconds(5), absl::InfiniteFuture(), keep);
  ASSERT_TRUE(over.answer.has_value());
  EXPECT_EQ(over.answer->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.answer->status().message(), HasSubstr("kMaxWaitingBytesPerGeneration"));
  EXPECT_THAT(over.answer->status().message(), HasSubstr("waiting for 65536 keys"));
  // One-key Gets fill the rest (~4 MiB: a few thousand), then are refused
  // too, without advice about fewer keys.
  const int64_t one_key = kKeyWaitOverheadBytes + kWaitedKeyOverheadBytes + kMaxKeyBytes;
  const int64_t room = kMaxWaitingBytesPerGeneration - fits * per_call;
  std::vector<uint64_t> gets;
  std::optional<absl::Status> refused;
  for (int64_t i = 0; i <= room / one_key && !refused.has_value(); ++i) {
    std::string key = absl::StrCat("g", i, "-");
    key.resize(kMaxKeyBytes, 'y');
    Rendezvous::KeyArrival g =
        rv_.AwaitKey(kJob, 1, "s", key, absl::Seconds(60), absl::InfiniteFuture(), keep);
    if (g.answer.has_value()) {
      refused = g.answer->status();
    } else {
      gets.push_back(g.wait_id);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(gets.size()), room / one_key);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused->message(), HasSubstr("Retry once fewer calls wait"));
  EXPECT_THAT(refused->message(), ::testing::Not(HasSubstr("fewer keys")));
  for (uint64_t id : gets) ASSERT_TRUE(rv_.Withdraw(id).has_value());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, fits);
  EXPECT_TRUE(answers.empty());

  // The writes that answer them still fit: the data budget is untouched.
  for (const std::string& k : keys) ASSERT_TRUE(rv_.Set(kJob, 1, "", k, "v").ok()) << k;
  ASSERT_EQ(answers.size(), static_cast<size_t>(fits));
  for (const auto& r : answers) EXPECT_TRUE(r.ok()) << r.status();
  Rendezvous::Usage usage = rv_.GetUsage(kJob, 1);
  EXPECT_EQ(usage.waiters, 0);
  EXPECT_EQ(usage.waiting_bytes, 0);
  EXPECT_EQ(usage.bytes, kScopeOverheadBytes +
                             static_cast<int64_t>(kMaxKeysPerRequest) *
                                 (kMaxKeyBytes + 1 + kKeyOverheadBytes));
  for (uint64_t id : ids) EXPECT_FALSE(rv_.Withdraw(id).has_value());

  // Withdrawn waits give their budget back.
  std::vector<std::string> more = keys;
  for (std::string& k : more) k[0] = 'm';
  ids.clear();
  for (int i = 0; i < fits; ++i) {
    Rendezvous::KeyArrival a =
        rv_.AwaitKeys(kJob, 1, "", more, absl::Seconds(60), absl::InfiniteFuture(), keep);
    ASSERT_FALSE(a.answer.has_value());
    ids.push_back(a.wait_id);
  }
  for (uint64_t id : ids) {
    std::optional<absl::Status> st = rv_.Withdraw(id, /*cancelled=*/true);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->code(), absl::StatusCode::kCancelled);
    EXPECT_THAT(st->message(), HasSubstr("65536 of 65536 keys"));
  }
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiting_bytes, 0);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).waiters, 0);
}

// ---------------------------------------------------------------------------
// Limits and argument checks.

void ExpectInvalid(const absl::Status& s, absl::string_view field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(std::string(field))) << s;
}

TEST_F(RendezvousTest, SizeLimitsAreInvalidArgumentNamingTheField) {
  const std::string scope_max(kMaxScopeBytes, 's');
  const std::string key_max(kMaxKeyBytes, 'k');
  const std::string value_max(kMaxValueBytes, 'v');
  EXPECT_TRUE(rv_.Set(kJob, 1, scope_max, key_max, value_max).ok());
  EXPECT_EQ(GetNow(rv_, 1, scope_max, key_max)->size(), kMaxValueBytes);

  ExpectInvalid(rv_.Set(kJob, 1, scope_max + "s", "k", "v"), "scope is 257 bytes");
  ExpectInvalid(rv_.Set(kJob, 1, "", "", "v"), "key is empty");
  ExpectInvalid(rv_.Set(kJob, 1, "", key_max + "k", "v"), "key is 513 bytes");
  ExpectInvalid(rv_.Set(kJob, 1, "", "k", value_max + "v"), "value is 1048577 bytes");
  ExpectInvalid(rv_.Set("", 1, "", "k", "v"), "job_id");
  ExpectInvalid(rv_.Get(kJob, 1, "", "", false).status(), "key is empty");
  ExpectInvalid(rv_.Add(kJob, 1, "", key_max + "k", 1).status(), "key is 513");
  ExpectInvalid(rv_.Delete(kJob, 1, scope_max + "s", "k").status(), "scope");
  ExpectInvalid(rv_.CompareAndSet(kJob, 1, "", "k", std::nullopt, value_max + "v").status(),
                "desired is 1048577 bytes");
  ExpectInvalid(rv_.CompareAndSet(kJob, 1, "", "k", value_max + "v", "").status(),
                "expected is 1048577 bytes");
  ExpectInvalid(rv_.Barrier(kJob, 1, "", "", "w0", 1).status(), "name is empty");
  ExpectInvalid(rv_.Barrier(kJob, 1, "", key_max + "n", "w0", 1).status(), "name is 513");
  EXPECT_EQ(rv_.GetUsage(kJob, 1).keys, 1);  // nothing stored by the failures
}

TEST_F(RendezvousTest, WaitKeyCountAndKeysAreChecked) {
  ExpectInvalid(rv_.Wait(kJob, 1, "", {}, absl::Seconds(1)), "keys has 0 entries");
  std::vector<std::string> too_many(kMaxKeysPerRequest + 1, "k");
  ExpectInvalid(rv_.Wait(kJob, 1, "", too_many, absl::Seconds(1)), "keys has 65537 entries");
  ExpectInvalid(rv_.Wait(kJob, 1, "", {"a", "b", ""}, absl::Seconds(1)), "keys[2] is empty");
  ExpectInvalid(rv_.Wait(kJob, 1, "", {"a", std::string(kMaxKeyBytes + 1, 'x')}),
                "keys[1] is 513 bytes");
  // Exactly kMaxKeysPerRequest keys (all the same, present) is fine.
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k", "v").ok());
  std::vector<std::string> max_keys(kMaxKeysPerRequest, "k");
  EXPECT_TRUE(rv_.Wait(kJob, 1, "", max_keys, absl::ZeroDuration()).ok());
}

TEST_F(RendezvousTest, TimeoutAndParticipantsAreChecked) {
  ExpectInvalid(rv_.Get(kJob, 1, "", "k", true, absl::Seconds(3601)).status(), "timeout is 1h1s");
  ExpectInvalid(rv_.Get(kJob, 1, "", "k", true, absl::Milliseconds(-1)).status(), "timeout");
  ExpectInvalid(rv_.Wait(kJob, 1, "", {"k"}, absl::Hours(2)), "timeout");
  ExpectInvalid(rv_.Barrier(kJob, 1, "", "b", "w0", 1, absl::Hours(2)).status(), "timeout");
  ExpectInvalid(rv_.Barrier(kJob, 1, "", "b", "w0", 0).status(), "participants is 0");
  ExpectInvalid(rv_.Barrier(kJob, 1, "", "b", "w0", kMaxBarrierParticipants + 1).status(),
                "participants is 65537");
  ExpectInvalid(rv_.Barrier(kJob, 1, "", "b", "", 1).status(), "participant_id");
  // The maximum timeout itself is valid.
  ASSERT_TRUE(rv_.Set(kJob, 1, "", "k", "v").ok());
  EXPECT_TRUE(rv_.Get(kJob, 1, "", "k", true, kMaxWaitTimeout).ok());
  EXPECT_TRUE(rv_.Barrier(kJob, 1, "", "b", "w0", kMaxBarrierParticipants, absl::ZeroDuration())
                  .status()
                  .code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousTest, KeysPerScopeLimitIsResourceExhausted) {
  for (size_t i = 0; i < kMaxKeysPerScope; ++i) {
    ASSERT_TRUE(rv_.Set(kJob, 1, "full", absl::StrCat(i), "").ok()) << i;
  }
  absl::Status s = rv_.Set(kJob, 1, "full", "one-more", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("kMaxKeysPerScope"));
  EXPECT_THAT(s.message(), HasSubstr("\"full\""));
  EXPECT_EQ(rv_.Add(kJob, 1, "full", "counter", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rv_.CompareAndSet(kJob, 1, "full", "c", std::nullopt, "x").status().code(),
            absl::StatusCode::kResourceExhausted);
  // Overwriting an existing key, and other scopes, still work.
  EXPECT_TRUE(rv_.Set(kJob, 1, "full", "7", "overwritten").ok());
  EXPECT_TRUE(rv_.Set(kJob, 1, "other", "one-more", "").ok());
  // Deleting frees a slot.
  ASSERT_TRUE(rv_.Delete(kJob, 1, "full", "0").ok());
  EXPECT_TRUE(rv_.Set(kJob, 1, "full", "one-more", "").ok());
}

TEST_F(RendezvousTest, BytesPerGenerationLimitIsResourceExhausted) {
  const std::string mib(kMaxValueBytes, 'x');
  // 255 values of 1 MiB across two scopes (keys are 2..4 bytes).
  for (int i = 0; i < 255; ++i) {
    ASSERT_TRUE(rv_.Set(kJob, 1, i % 2 ? "a" : "b", absl::StrCat(i), mib).ok()) << i;
  }
  const int64_t used = rv_.GetUsage(kJob, 1).bytes;
  EXPECT_GT(used, 255 * int64_t{kMaxValueBytes});
  absl::Status s = rv_.Set(kJob, 1, "c", "256th", mib);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("kMaxBytesPerGeneration"));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, used);  // unchanged
  // Growing an existing value past the budget fails too; fitting exactly works.
  // The first key of scope "c" is charged the scope ("c" and
  // kScopeOverheadBytes), its key "k" and kKeyOverheadBytes as well.
  const int64_t room =
      kMaxBytesPerGeneration - used - (1 + kScopeOverheadBytes) - (1 + kKeyOverheadBytes);
  EXPECT_EQ(rv_.Set(kJob, 1, "c", "k", std::string(room + 1, 'y')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(rv_.Set(kJob, 1, "c", "k", std::string(room, 'y')).ok());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, kMaxBytesPerGeneration);
  EXPECT_EQ(rv_.Set(kJob, 1, "c", "k", std::string(room + 1, 'y')).code(),
            absl::StatusCode::kResourceExhausted);
  // Another generation has its own budget.
  EXPECT_TRUE(rv_.Set(kJob, 2, "c", "256th", mib).ok());
  // Delete, or the end of the generation, frees the budget: key "1" freed
  // 1 + 1 MiB + kKeyOverheadBytes; "256th" needs 5 + value + the same.
  ASSERT_TRUE(rv_.Delete(kJob, 1, "a", "1").ok());
  EXPECT_EQ(rv_.Set(kJob, 1, "c", "256th", std::string(kMaxValueBytes - 3, 'z')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(rv_.Set(kJob, 1, "c", "256th", std::string(kMaxValueBytes - 4, 'z')).ok());
  rv_.EndGeneration(kJob, 1);
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 0);
}

// Issue 14: KvSet(scope=<248 unique bytes>, key="k", value="") 659k times
// cost 288 MB while 659 KB were counted. Now each such entry is charged
// what it costs, and the scopes of a generation are capped: the flood is
// refused at kMaxScopesPerGeneration scopes, each charged its name, its
// bookkeeping and its one key.
TEST_F(RendezvousTest, ScopeFloodIsRefusedAtTheScopeLimit) {
  auto scope = [](size_t i) {
    return absl::StrCat(std::string(240, 's'), absl::Dec(i, absl::kZeroPad8));
  };
  ASSERT_EQ(scope(0).size(), 248u);
  const int64_t per_entry = 248 + kScopeOverheadBytes + 1 + kKeyOverheadBytes;
  size_t accepted = 0;
  absl::Status refused;
  for (size_t i = 0; i < 659000; ++i) {
    refused = rv_.Set(kJob, 1, scope(i), "k", "");
    if (!refused.ok()) break;
    ++accepted;
  }
  EXPECT_EQ(accepted, kMaxScopesPerGeneration);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("kMaxScopesPerGeneration = 262144"));
  Rendezvous::Usage usage = rv_.GetUsage(kJob, 1);
  EXPECT_EQ(usage.scopes, static_cast<int64_t>(kMaxScopesPerGeneration));
  EXPECT_EQ(usage.keys, static_cast<int64_t>(kMaxScopesPerGeneration));
  EXPECT_EQ(usage.bytes, static_cast<int64_t>(kMaxScopesPerGeneration) * per_entry);
  EXPECT_LE(usage.bytes, kMaxBytesPerGeneration);
  // Existing scopes still take keys; a scope emptied by KvDelete frees its slot.
  EXPECT_TRUE(rv_.Set(kJob, 1, scope(7), "k2", "v").ok());
  ASSERT_TRUE(rv_.Delete(kJob, 1, scope(3), "k").ok());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).scopes, static_cast<int64_t>(kMaxScopesPerGeneration) - 1);
  EXPECT_TRUE(rv_.Set(kJob, 1, "fresh", "k", "").ok());
  rv_.EndGeneration(kJob, 1);
  EXPECT_EQ(rv_.GetJobUsage(kJob).bytes, 0);
  EXPECT_EQ(rv_.GetJobUsage(kJob).scopes, 0);
}

// Long keys fill the byte budget; the count at which it refuses follows
// from the charges (key + value + kKeyOverheadBytes, plus each scope's).
TEST_F(RendezvousTest, ByteBudgetChargesKeyBookkeeping) {
  const std::string key_base(kMaxKeyBytes - 8, 'k');
  const int64_t per_key = static_cast<int64_t>(kMaxKeyBytes) + kKeyOverheadBytes;
  const int64_t per_scope = 2 + kScopeOverheadBytes;  // scopes "s0".."s9"
  // Keys fill scopes of kMaxKeysPerScope, one after the other.
  int64_t expected = 0;
  int64_t charged = 0;
  for (;;) {
    const int64_t cost = per_key + (expected % kMaxKeysPerScope == 0 ? per_scope : 0);
    if (charged + cost > kMaxBytesPerGeneration) break;
    charged += cost;
    ++expected;
  }
  int64_t accepted = 0;
  absl::Status refused;
  for (;;) {
    const std::string scope = absl::StrCat("s", accepted / kMaxKeysPerScope);
    refused =
        rv_.Set(kJob, 1, scope, absl::StrCat(key_base, absl::Dec(accepted, absl::kZeroPad8)), "");
    if (!refused.ok()) break;
    ++accepted;
  }
  EXPECT_EQ(accepted, expected);
  EXPECT_LT(accepted, kMaxBytesPerGeneration / static_cast<int64_t>(kMaxKeyBytes));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("kMaxBytesPerGeneration"));
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, charged);
}

TEST_F(RendezvousTest, BarriersAndArrivalsAreCharged) {
  EXPECT_EQ(rv_.Barrier(kJob, 1, "s", "b", "w0", 2, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // The barrier stays (single-use, same participant count later); the
  // arrival that timed out is withdrawn and no longer charged.
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 1 + kScopeOverheadBytes + 1 + kBarrierOverheadBytes);
  ASSERT_TRUE(rv_.Barrier(kJob, 1, "s", "one", "w0", 1, absl::ZeroDuration()).ok());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 1 + kScopeOverheadBytes + 1 + kBarrierOverheadBytes + 3 +
                                             kBarrierOverheadBytes + 2 + kArrivalOverheadBytes);
  // A full budget refuses new barriers, naming the limit.
  const std::string mib(kMaxValueBytes, 'x');
  int i = 0;
  while (rv_.Set(kJob, 1, "fill", absl::StrCat(i), mib).ok()) ++i;
  const int64_t room = kMaxBytesPerGeneration - rv_.GetUsage(kJob, 1).bytes - 4 - kKeyOverheadBytes;
  ASSERT_TRUE(rv_.Set(kJob, 1, "fill", "last", std::string(room, 'y')).ok());
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, kMaxBytesPerGeneration);
  absl::StatusOr<uint32_t> b = rv_.Barrier(kJob, 1, "s", "late", "w0", 1, absl::ZeroDuration());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_THAT(b.status().message(), HasSubstr("kMaxBytesPerGeneration"));
  rv_.EndGeneration(kJob, 1);
  EXPECT_EQ(rv_.GetJobUsage(kJob).bytes, 0);
}

// An ended generation's entries are freed: on re-form (EndGeneration), on
// the job's end (DropJob), and for a deleted job even the record
// (ForgetJob).
TEST_F(RendezvousTest, EndedGenerationsAndJobsFreeTheirEntries) {
  ASSERT_TRUE(rv_.Set(kJob, 1, "tp/0", "id", "x").ok());
  ASSERT_TRUE(rv_.Set(kJob, 2, "tp/0", "id", "y").ok());
  ASSERT_TRUE(rv_.Set("job-2", 1, "", "k", "v").ok());
  EXPECT_EQ(rv_.GetJobUsage(kJob).keys, 2);
  EXPECT_EQ(rv_.GetJobUsage(kJob).bytes, rv_.GetUsage(kJob, 1).bytes + rv_.GetUsage(kJob, 2).bytes);
  EXPECT_THAT(rv_.JobsHoldingState(),
              UnorderedElementsAreArray({std::string(kJob), std::string("job-2")}));
  rv_.EndGeneration(kJob, 1);  // re-formed
  EXPECT_EQ(rv_.GetUsage(kJob, 1).bytes, 0);
  EXPECT_EQ(rv_.GetJobUsage(kJob).keys, 1);
  rv_.DropJob(kJob);  // finished
  EXPECT_EQ(rv_.GetJobUsage(kJob).bytes, 0);
  EXPECT_EQ(rv_.GetJobUsage(kJob).keys, 0);
  EXPECT_EQ(rv_.GetJobUsage(kJob).scopes, 0);
  EXPECT_THAT(rv_.JobsHoldingState(), UnorderedElementsAreArray({std::string("job-2")}));
  EXPECT_EQ(rv_.Set(kJob, 3, "", "k", "v").code(), absl::StatusCode::kAborted);
  rv_.ForgetJob("job-2");  // deleted
  EXPECT_EQ(rv_.GetJobUsage("job-2").bytes, 0);
  EXPECT_TRUE(rv_.JobsHoldingState().empty());
}

// ---------------------------------------------------------------------------
// The NCCL bootstrap pattern: in each tp group rank 0 creates the unique id
// and publishes it; the other ranks wait for it; then all meet at a barrier.

TEST_F(RendezvousTest, NcclBootstrapPattern) {
  constexpr int kGroups = 2;
  constexpr int kRanksPerGroup = 8;
  std::vector<std::string> ids(kGroups * kRanksPerGroup);
  std::vector<absl::Status> status(kGroups * kRanksPerGroup);
  std::vector<std::thread> ranks;
  for (int g = 0; g < kGroups; ++g) {
    const std::string scope = absl::StrCat("tp/", g);
    for (int r = 0; r < kRanksPerGroup; ++r) {
      const int slot = g * kRanksPerGroup + r;
      ranks.emplace_back([&, scope, g, r, slot] {
        if (r == 0) {
          absl::SleepFor(absl::Milliseconds(20));  // the others get there first
          std::string id(128, '\0');
          for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>((i * 31 + g) & 0xff);
          status[slot] = rv_.Set(kJob, 9, scope, "ncclUniqueId", id);
          ids[slot] = id;
        } else {
          absl::StatusOr<std::optional<std::string>> got =
              rv_.Get(kJob, 9, scope, "ncclUniqueId", /*wait=*/true, absl::Seconds(5));
          status[slot] = got.status();
          if (got.ok() && got->has_value()) ids[slot] = **got;
        }
        if (!status[slot].ok()) return;
        status[slot] = rv_.Barrier(kJob, 9, scope, "comm-init", absl::StrCat("host", r),
                                   kRanksPerGroup, absl::Seconds(5))
                           .status();
      });
    }
  }
  for (std::thread& t : ranks) t.join();
  for (int g = 0; g < kGroups; ++g) {
    for (int r = 0; r < kRanksPerGroup; ++r) {
      const int slot = g * kRanksPerGroup + r;
      ASSERT_TRUE(status[slot].ok()) << "group " << g << " rank " << r << ": " << status[slot];
      EXPECT_EQ(ids[slot], ids[g * kRanksPerGroup]) << "group " << g << " rank " << r;
      EXPECT_EQ(ids[slot].size(), 128u);
    }
  }
  EXPECT_NE(ids[0], ids[kRanksPerGroup]);  // each group its own id
  EXPECT_EQ(rv_.GetUsage(kJob, 9).waiters, 0);
}

}  // namespace
}  // namespace shardline::server

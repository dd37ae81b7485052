// Backend::Progress of the Gloo backend: sequences counted at issue and equal
// on every rank, the running collective with its elapsed time growing while
// a peer has not issued it, the latest completed one with its duration, and
// the oldest send / recv in flight with its peer. Ranks as threads over real
// loopback TCP.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

using ::shardline::worker::testing::RunRanks;
using ::shardline::worker::testing::TestOptions;

// Polls `b.Progress()` until pred holds or 20 s pass; returns the last one.
template <typename Pred>
BackendProgress PollProgress(const Backend& b, Pred pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  BackendProgress p = b.Progress();
  while (!pred(p) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
    p = b.Progress();
  }
  return p;
}

TEST(GlooProgressTest, NothingIssuedYet) {
  RunRanks(2, [&](int, Backend& b) {
    const BackendProgress p = b.Progress();
    EXPECT_EQ(p.collective.operation, "");
    EXPECT_EQ(p.collective.sequence, 0u);
    EXPECT_FALSE(p.collective.in_flight);
    EXPECT_FALSE(p.p2p.has_value());
  });
}

TEST(GlooProgressTest, SequencesEqualOnEveryRankAfterNOps) {
  for (int n : {1, 2, 3}) {
    std::vector<BackendProgress> seen(n);
    RunRanks(n, [&](int r, Backend& b) {
      std::vector<float> data(64, 1.0f), gathered(64 * n);
      for (int i = 0; i < 5; ++i)
        SL_EXPECT_OK_WORK(b.AllReduce(data.data(), 64, DType::kFloat32, ReduceOp::kSum));
      SL_EXPECT_OK_WORK(b.Barrier());
      SL_EXPECT_OK_WORK(b.Broadcast(data.data(), 64, DType::kFloat32, 0));
      // 16-bit, so dtype is recorded too.
      std::vector<uint16_t> half(16, 0x3c00);
      SL_EXPECT_OK_WORK(b.AllGather(half.data(), 16, gathered.data(), DType::kFloat16));
      seen[r] = b.Progress();
    });
    for (int r = 0; r < n; ++r) {
      const OpProgress& c = seen[r].collective;
      EXPECT_EQ(c.sequence, 8u) << "n=" << n << " rank " << r;
      EXPECT_EQ(c.operation, "all_gather");
      EXPECT_EQ(c.count, 16u);
      EXPECT_EQ(c.dtype, DType::kFloat16);
      EXPECT_FALSE(c.in_flight);
      EXPECT_GE(c.elapsed, absl::ZeroDuration());
      EXPECT_EQ(c.peer, -1);
      EXPECT_FALSE(seen[r].p2p.has_value());
    }
  }
}

// Invalid arguments are not issued, so they do not count.
TEST(GlooProgressTest, InvalidArgumentsAreNotCounted) {
  RunRanks(2, [&](int, Backend& b) {
    float x = 0;
    EXPECT_FALSE(b.Broadcast(&x, 1, DType::kFloat32, 7)->Wait(absl::Seconds(5)).ok());
    SL_EXPECT_OK_WORK(b.Barrier());
    EXPECT_EQ(b.Progress().collective.sequence, 1u);
    EXPECT_EQ(b.Progress().collective.operation, "barrier");
  });
}

TEST(GlooProgressTest, InFlightWhileThePeerHasNotIssued) {
  absl::Notification observed;
  RunRanks(2, [&](int r, Backend& b) {
    std::vector<float> data(1000, 1.0f);
    SL_EXPECT_OK_WORK(b.Barrier());
    if (r == 1) {
      // Issue only once rank 0 has seen its all_reduce wait.
      ASSERT_TRUE(observed.WaitForNotificationWithTimeout(absl::Seconds(30)));
      SL_EXPECT_OK_WORK(b.AllReduce(data.data(), 1000, DType::kFloat32, ReduceOp::kSum));
      return;
    }
    auto work = b.AllReduce(data.data(), 1000, DType::kFloat32, ReduceOp::kSum);
    BackendProgress p = PollProgress(b, [](const BackendProgress& p) {
      return p.collective.in_flight && p.collective.operation == "all_reduce";
    });
    EXPECT_TRUE(p.collective.in_flight);
    EXPECT_EQ(p.collective.operation, "all_reduce");
    EXPECT_EQ(p.collective.sequence, 2u);
    EXPECT_EQ(p.collective.count, 1000u);
    const absl::Duration first = p.collective.elapsed;
    // Elapsed grows while the peer stays out.
    p = PollProgress(b, [&](const BackendProgress& p) {
      return p.collective.elapsed >= first + absl::Milliseconds(100);
    });
    EXPECT_TRUE(p.collective.in_flight);
    EXPECT_GE(p.collective.elapsed, first + absl::Milliseconds(100));
    const absl::Duration waited = p.collective.elapsed;
    observed.Notify();
    SL_EXPECT_OK_WORK(work);
    // Completed: the same op, no longer in flight, with its whole duration.
    p = b.Progress();
    EXPECT_FALSE(p.collective.in_flight);
    EXPECT_EQ(p.collective.sequence, 2u);
    EXPECT_EQ(p.collective.operation, "all_reduce");
    EXPECT_GE(p.collective.elapsed, waited);
  });
}

TEST(GlooProgressTest, P2PInFlightNamesThePeer) {
  absl::Notification observed;
  RunRanks(3, [&](int r, Backend& b) {
    std::vector<float> data(7, 1.0f);
    if (r == 2) {
      ASSERT_TRUE(observed.WaitForNotificationWithTimeout(absl::Seconds(30)));
      SL_EXPECT_OK_WORK(b.Send(data.data(), 7, DType::kFloat32, 0, 5));
      return;
    }
    if (r == 1) return;
    auto recv = b.Recv(data.data(), 7, DType::kFloat32, 2, 5);
    BackendProgress p = b.Progress();
    ASSERT_TRUE(p.p2p.has_value());
    EXPECT_EQ(p.p2p->operation, "recv");
    EXPECT_EQ(p.p2p->peer, 2);
    EXPECT_EQ(p.p2p->count, 7u);
    EXPECT_EQ(p.p2p->sequence, 1u);
    EXPECT_TRUE(p.p2p->in_flight);
    const absl::Duration first = p.p2p->elapsed;
    p = PollProgress(b, [&](const BackendProgress& p) {
      return p.p2p.has_value() && p.p2p->elapsed >= first + absl::Milliseconds(50);
    });
    ASSERT_TRUE(p.p2p.has_value());
    EXPECT_GE(p.p2p->elapsed, first + absl::Milliseconds(50));
    EXPECT_EQ(p.collective.operation, "");  // p2p is not a collective
    observed.Notify();
    SL_EXPECT_OK_WORK(recv);
    p = PollProgress(b, [](const BackendProgress& p) { return !p.p2p.has_value(); });
    EXPECT_FALSE(p.p2p.has_value());
  });
}

// A collective that times out never completed: it stays in flight, its
// elapsed growing, so that the rank's reports keep saying what it is stuck
// on while it waits for the coordinator (a peer frozen whole). A call
// refused for bad arguments is done at once and changes nothing.
TEST(GlooProgressTest, ATimedOutCollectiveStaysInFlight) {
  absl::Notification timed_out;
  RunRanks(2, [&](int r, Backend& b) {
    std::vector<float> data(1000, 1.0f);
    SL_EXPECT_OK_WORK(b.Barrier());
    if (r == 1) {  // never issues the all_reduce
      ASSERT_TRUE(timed_out.WaitForNotificationWithTimeout(absl::Seconds(30)));
      return;
    }
    const absl::Status refused = b.AllReduce(nullptr, 10, DType::kFloat32, ReduceOp::kSum)->Wait();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_FALSE(b.Progress().collective.in_flight);
    const absl::Status s =
        b.AllReduce(data.data(), 1000, DType::kFloat32, ReduceOp::kSum)->Wait(absl::Seconds(30));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    BackendProgress p = b.Progress();
    EXPECT_TRUE(p.collective.in_flight);
    EXPECT_EQ(p.collective.operation, "all_reduce");
    EXPECT_EQ(p.collective.sequence, 2u);
    EXPECT_GE(p.collective.elapsed, absl::Milliseconds(300));
    const absl::Duration first = p.collective.elapsed;
    absl::SleepFor(absl::Milliseconds(50));
    p = b.Progress();
    EXPECT_TRUE(p.collective.in_flight);
    EXPECT_GE(p.collective.elapsed, first + absl::Milliseconds(50));
    timed_out.Notify();
  }, TestOptions(absl::Milliseconds(300)));
}

}  // namespace
}  // namespace shardline::worker

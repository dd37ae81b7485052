// A member's session outbox: queueing, the bound on a slow stream, wakers,
// replacing and ending sessions, waits. No clock is read: deadlines are
// absl::InfinitePast() (do not wait) or absl::InfiniteFuture() (woken).
#include "server/session_outbox.h"

#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

v1::SessionMessage Opened(uint64_t generation) {
  v1::SessionMessage m;
  m.mutable_opened()->set_generation(generation);
  return m;
}

class SessionOutboxTest : public ::testing::Test {
 protected:
  SessionWaker Counter(int* count) {
    return [count] { ++*count; };
  }

  SessionOutbox outbox_;
  absl::Mutex mu_;  // stands in for the Coordinator's lock
};

TEST_F(SessionOutboxTest, WithoutASessionMessagesAreDropped) {
  EXPECT_FALSE(outbox_.is_open());
  outbox_.Push(Opened(1));
  EXPECT_EQ(outbox_.queued(), 0u);
  EXPECT_FALSE(outbox_.Pop().has_value());
  outbox_.End();  // nothing to end
  EXPECT_FALSE(outbox_.is_open());
}

TEST_F(SessionOutboxTest, PushQueuesInOrderAndWakesTheStream) {
  int wakes = 0;
  outbox_.Open(7, Counter(&wakes));
  EXPECT_TRUE(outbox_.is_open());
  EXPECT_TRUE(outbox_.IsCurrent(7));
  EXPECT_FALSE(outbox_.IsCurrent(8));
  EXPECT_EQ(wakes, 0);
  outbox_.Push(Opened(1));
  outbox_.Push(Opened(2));
  EXPECT_EQ(wakes, 2);
  EXPECT_EQ(outbox_.queued(), 2u);
  std::optional<v1::SessionMessage> first = outbox_.Pop();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->opened().generation(), 1u);
  std::optional<v1::SessionMessage> second = outbox_.Pop();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->opened().generation(), 2u);
  EXPECT_FALSE(outbox_.Pop().has_value());
  EXPECT_EQ(wakes, 2);  // taking messages wakes no one
}

TEST_F(SessionOutboxTest, AStuckStreamLosesTheOldest) {
  outbox_.Open(1, nullptr);
  for (uint64_t g = 1; g <= SessionOutbox::kMaxQueued + 2; ++g) outbox_.Push(Opened(g));
  EXPECT_EQ(outbox_.queued(), 256u);
  std::optional<v1::SessionMessage> oldest = outbox_.Pop();
  ASSERT_TRUE(oldest.has_value());
  EXPECT_EQ(oldest->opened().generation(), 3u);
}

TEST_F(SessionOutboxTest, OpeningANewSessionEndsTheOldOne) {
  int old_wakes = 0, new_wakes = 0;
  outbox_.Open(1, Counter(&old_wakes));
  outbox_.Push(Opened(1));
  EXPECT_EQ(old_wakes, 1);
  outbox_.Open(2, Counter(&new_wakes));
  EXPECT_EQ(old_wakes, 2);  // woken once more: its session ended
  EXPECT_EQ(new_wakes, 0);
  EXPECT_FALSE(outbox_.IsCurrent(1));
  EXPECT_TRUE(outbox_.IsCurrent(2));
  EXPECT_EQ(outbox_.queued(), 0u);  // the old session's messages are gone
  outbox_.Push(Opened(5));
  EXPECT_EQ(old_wakes, 2);  // the old waker was dropped
  EXPECT_EQ(new_wakes, 1);
}

TEST_F(SessionOutboxTest, EndWakesOnceAndDropsTheWaker) {
  int wakes = 0;
  outbox_.Open(3, Counter(&wakes));
  outbox_.Push(Opened(1));
  outbox_.End();
  EXPECT_EQ(wakes, 2);
  EXPECT_FALSE(outbox_.is_open());
  EXPECT_FALSE(outbox_.IsCurrent(3));
  EXPECT_EQ(outbox_.queued(), 0u);
  outbox_.End();
  outbox_.Push(Opened(2));
  outbox_.Wake();
  EXPECT_EQ(wakes, 2);
}

TEST_F(SessionOutboxTest, WaitReturnsAtOnceWhenReadyOrAtAPastDeadline) {
  absl::MutexLock lock(&mu_);
  outbox_.Open(4, nullptr);
  outbox_.Wait(&mu_, 4, absl::InfinitePast());  // nothing queued: does not wait
  EXPECT_EQ(outbox_.queued(), 0u);
  outbox_.Push(Opened(1));
  outbox_.Wait(&mu_, 4, absl::InfiniteFuture());  // something queued
  EXPECT_EQ(outbox_.queued(), 1u);
  outbox_.Wait(&mu_, 3, absl::InfiniteFuture());  // not the open session
  outbox_.End();
  outbox_.Wait(&mu_, 4, absl::InfiniteFuture());  // ended
  EXPECT_FALSE(outbox_.is_open());
}

TEST_F(SessionOutboxTest, PushAndEndWakeAWaitingStream) {
  outbox_.Open(9, nullptr);
  for (bool end : {false, true}) {
    bool waiting = false;
    std::optional<v1::SessionMessage> got;
    bool still_current = false;
    std::thread stream([&] {
      absl::MutexLock lock(&mu_);
      waiting = true;
      outbox_.Wait(&mu_, 9, absl::InfiniteFuture());
      still_current = outbox_.IsCurrent(9);
      got = outbox_.Pop();
    });
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&waiting));  // the stream waits (mu_ released)
      if (end) {
        outbox_.End();
      } else {
        outbox_.Push(Opened(11));
      }
    }
    stream.join();
    if (end) {
      EXPECT_FALSE(still_current);
      EXPECT_FALSE(got.has_value());
    } else {
      EXPECT_TRUE(still_current);
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(got->opened().generation(), 11u);
    }
  }
}

}  // namespace
}  // namespace shardline::server

// The event log: stamping, retention, durability and replay after a
// restart, waits; times from a fake clock, the store in memory.
#include "server/event_log.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/state_store.h"

namespace shardline::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A store whose writes fail (reads answer nothing).
class FailingStore final : public StateStore {
 public:
  absl::Status Write(const std::vector<Mutation>&) override {
    ++writes;
    return absl::UnavailableError("disk full");
  }
  absl::StatusOr<std::vector<Record>> Scan(absl::string_view) const override {
    return std::vector<Record>{};
  }
  int writes = 0;
};

v1::JobEvent Progress(uint64_t step) {
  v1::JobEvent e;
  e.mutable_step_progress()->set_step(step);
  return e;
}

std::vector<uint64_t> Sequences(const std::vector<v1::JobEvent>& events) {
  std::vector<uint64_t> out;
  for (const v1::JobEvent& e : events) out.push_back(e.sequence());
  return out;
}

std::vector<std::string> Keys(const StateStore& store) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<Record>> records = store.Scan(EventLog::kStoreKind);
  EXPECT_TRUE(records.ok()) << records.status();
  if (records.ok()) {
    for (const Record& r : *records) out.push_back(r.key);
  }
  return out;
}

class EventLogTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  std::unique_ptr<StateStore> store_ = NewMemoryStore();
  absl::Mutex mu_;  // stands in for the Coordinator's lock
};

TEST_F(EventLogTest, KeysSortByJobThenSequence) {
  EXPECT_EQ(EventLog::Key("job-1", 42), "job-1/00000000000000000042");
  EXPECT_EQ(EventLog::Key("j", 18446744073709551615u), "j/18446744073709551615");
  EXPECT_LT(EventLog::Key("j", 9), EventLog::Key("j", 10));
}

TEST_F(EventLogTest, AppendStampsWritesAndKeeps) {
  EventLog log(store_.get(), /*max_events=*/10);
  EXPECT_EQ(log.next_sequence(), 1u);
  EXPECT_EQ(log.Append("job", /*generation=*/1, clock_.Now(), Progress(5)), 1u);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(log.Append("job", /*generation=*/3, clock_.Now(), Progress(6)), 2u);
  EXPECT_EQ(log.next_sequence(), 3u);
  EXPECT_EQ(log.size(), 2u);

  const std::vector<v1::JobEvent> all = log.After(0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].sequence(), 1u);
  EXPECT_EQ(all[0].job_id(), "job");
  EXPECT_EQ(all[0].generation(), 1u);
  EXPECT_EQ(all[0].step_progress().step(), 5u);
  EXPECT_EQ(google::protobuf::util::TimeUtil::TimestampToSeconds(all[0].time()),
            absl::ToUnixSeconds(clock_.Now()) - 2);
  EXPECT_EQ(all[1].sequence(), 2u);
  EXPECT_EQ(all[1].generation(), 3u);
  EXPECT_EQ(google::protobuf::util::TimeUtil::TimestampToSeconds(all[1].time()),
            absl::ToUnixSeconds(clock_.Now()));
  EXPECT_THAT(Sequences(log.After(1)), ElementsAre(2u));
  EXPECT_THAT(log.After(2), IsEmpty());

  // Durable, under the event's key, as it was stamped.
  absl::StatusOr<std::vector<Record>> stored = store_->Scan(EventLog::kStoreKind);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 2u);
  EXPECT_EQ((*stored)[1].key, "job/00000000000000000002");
  v1::JobEvent parsed;
  ASSERT_TRUE(parsed.ParseFromString((*stored)[1].value));
  EXPECT_EQ(parsed.SerializeAsString(), all[1].SerializeAsString());
}

TEST_F(EventLogTest, KeepsTheNewestMaxEventsInMemoryAndInTheStore) {
  EventLog log(store_.get(), /*max_events=*/3);
  for (uint64_t step = 1; step <= 5; ++step) log.Append("job", 1, clock_.Now(), Progress(step));
  EXPECT_EQ(log.size(), 3u);
  EXPECT_THAT(Sequences(log.After(0)), ElementsAre(3u, 4u, 5u));
  EXPECT_THAT(Keys(*store_), ElementsAre(EventLog::Key("job", 3), EventLog::Key("job", 4),
                                         EventLog::Key("job", 5)));
}

TEST_F(EventLogTest, RestoreContinuesTheSequenceWithoutGapsOrRepeats) {
  {
    EventLog log(store_.get(), /*max_events=*/3);
    for (uint64_t step = 1; step <= 5; ++step) log.Append("job", 1, clock_.Now(), Progress(step));
  }
  // A restarted coordinator reads the log back in key order.
  EventLog restored(store_.get(), /*max_events=*/3);
  absl::StatusOr<std::vector<Record>> stored = store_->Scan(EventLog::kStoreKind);
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (const Record& r : *stored) {
    v1::JobEvent e;
    ASSERT_TRUE(e.ParseFromString(r.value));
    restored.Restore(std::move(e));
  }
  EXPECT_EQ(restored.next_sequence(), 6u);
  EXPECT_THAT(Sequences(restored.After(0)), ElementsAre(3u, 4u, 5u));
  // Restoring writes nothing; the next event is 6 and pushes 3 out.
  EXPECT_EQ(restored.Append("job", 2, clock_.Now(), Progress(6)), 6u);
  EXPECT_THAT(Sequences(restored.After(0)), ElementsAre(4u, 5u, 6u));
  EXPECT_THAT(Keys(*store_), ElementsAre(EventLog::Key("job", 4), EventLog::Key("job", 5),
                                         EventLog::Key("job", 6)));
}

TEST_F(EventLogTest, RestoreKeepsOnlyTheNewestWhenTheStoreHoldsMore) {
  // A store written with a larger retention, read with a smaller one.
  EventLog restored(store_.get(), /*max_events=*/2);
  for (uint64_t s = 1; s <= 4; ++s) {
    v1::JobEvent e = Progress(s);
    e.set_sequence(s);
    restored.Restore(std::move(e));
  }
  EXPECT_EQ(restored.size(), 2u);
  EXPECT_EQ(restored.next_sequence(), 5u);
  EXPECT_THAT(Sequences(restored.After(0)), ElementsAre(3u, 4u));
}

TEST_F(EventLogTest, AFailedWriteKeepsTheEventInMemory) {
  FailingStore failing;
  EventLog log(&failing, /*max_events=*/10);
  EXPECT_EQ(log.Append("job", 1, clock_.Now(), Progress(1)), 1u);
  EXPECT_EQ(log.Append("job", 1, clock_.Now(), Progress(2)), 2u);
  EXPECT_EQ(failing.writes, 2);
  EXPECT_THAT(Sequences(log.After(0)), ElementsAre(1u, 2u));
}

TEST_F(EventLogTest, WaitAfterAnswersAtOnceOrAtAPastDeadline) {
  EventLog log(store_.get(), /*max_events=*/10);
  absl::MutexLock lock(&mu_);
  // Nothing yet: a past deadline does not wait.
  EXPECT_THAT(log.WaitAfter(&mu_, 0, absl::InfinitePast()), IsEmpty());
  log.Append("job", 1, clock_.Now(), Progress(1));
  log.Append("job", 1, clock_.Now(), Progress(2));
  // Already there: no wait even with no deadline.
  EXPECT_THAT(Sequences(log.WaitAfter(&mu_, 0, absl::InfiniteFuture())), ElementsAre(1u, 2u));
  EXPECT_THAT(Sequences(log.WaitAfter(&mu_, 1, absl::InfiniteFuture())), ElementsAre(2u));
  EXPECT_THAT(log.WaitAfter(&mu_, 2, absl::InfinitePast()), IsEmpty());
}

TEST_F(EventLogTest, AppendWakesAWaiter) {
  EventLog log(store_.get(), /*max_events=*/10);
  std::vector<v1::JobEvent> seen;
  bool waiting = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu_);
    waiting = true;
    seen = log.WaitAfter(&mu_, 0, absl::InfiniteFuture());
  });
  {
    absl::MutexLock lock(&mu_);
    // Append only once the waiter waits (it releases mu_ in WaitAfter).
    mu_.Await(absl::Condition(&waiting));
    log.Append("job", 1, clock_.Now(), Progress(7));
  }
  waiter.join();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].step_progress().step(), 7u);
}

}  // namespace
}  // namespace shardline::server

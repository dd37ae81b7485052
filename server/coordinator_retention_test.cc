// Finished-job retention (issue 14 defect 12: finished jobs were never
// pruned, so their jobs, members, events, tokens and checkpoint rows grew
// without bound). On a FakeClock.
#include <optional>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "server/event_log.h"
#include "server/state_store.h"
#include "testing/job_specs.h"

namespace shardline::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class RetentionTest : public ::testing::Test {
 protected:
  RetentionTest() : store_(NewMemoryStore()) {
    options_.finished_job_retention = absl::Hours(1);
    options_.max_finished_jobs = 2;
    Restart();
  }

  void Restart() {
    coordinator_ = std::make_unique<Coordinator>(&clock_, store_.get(), options_);
    ASSERT_TRUE(coordinator_->Recover().ok());
  }

  void Create(const std::string& id) {
    v1::CreateJobRequest r;
    r.set_job_id(id);
    *r.mutable_spec() = fixtures::SmallSpec(2, 2, 12);
    ASSERT_TRUE(coordinator_->CreateJob(r).ok());
  }

  void JoinOne(const std::string& job_id) {
    v1::JoinJobRequest r;
    r.mutable_worker()->set_job_id(job_id);
    r.mutable_worker()->set_worker_id("w");
    r.mutable_worker()->set_incarnation(7);
    r.set_host("h");
    r.set_device("cpu");
    ASSERT_TRUE(coordinator_->JoinJob(r).ok());
  }

  void Cancel(const std::string& id) {
    v1::CancelJobRequest r;
    r.set_job_id(id);
    r.set_reason("done with it");
    ASSERT_TRUE(coordinator_->CancelJob(r).ok());
  }

  // The jobs (by id) that have any record of `kind` in the store.
  std::set<std::string> JobsWithRecords(const std::string& kind) {
    std::set<std::string> out;
    absl::StatusOr<std::vector<Record>> records = store_->Scan(kind);
    EXPECT_TRUE(records.ok());
    for (const Record& r : *records) out.insert(r.key.substr(0, r.key.find('/')));
    return out;
  }

  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST(RetentionDefaultsTest, SevenDaysAndAThousandJobs) {
  const CoordinatorOptions defaults;
  EXPECT_EQ(defaults.finished_job_retention, absl::Hours(7 * 24));
  EXPECT_EQ(defaults.max_finished_jobs, 1000);
}

TEST_F(RetentionTest, FinishedJobsArePrunedByCountThenByAge) {
  for (const char* id : {"a", "b", "c", "d"}) Create(id);
  JoinOne("a");
  Cancel("a");
  clock_.Advance(absl::Minutes(1));
  Cancel("b");
  clock_.Advance(absl::Minutes(1));
  Cancel("c");  // d stays PENDING
  ASSERT_EQ(JobsWithRecords("member"), std::set<std::string>({"a"}));
  ASSERT_EQ(JobsWithRecords(EventLog::kStoreKind), std::set<std::string>({"a", "b", "c", "d"}));

  // Three finished, two kept: the oldest goes.
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), ElementsAre("a"));
  ASSERT_TRUE(coordinator_->PruneJob("a").ok());
  EXPECT_EQ(coordinator_->GetJob("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->ListMembers("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->WorkerTokenHash("a").status().code(), absl::StatusCode::kNotFound);
  // The record kinds of server/coordinator_records.h.
  for (const char* kind : {"job", "token_sha256", "member", "member_token", EventLog::kStoreKind}) {
    EXPECT_EQ(JobsWithRecords(kind).count("a"), 0u) << kind;
  }
  EXPECT_EQ(JobsWithRecords("job"), std::set<std::string>({"b", "c", "d"}));
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), IsEmpty());

  // Unfinished and unknown jobs are not pruned.
  absl::Status s = coordinator_->PruneJob("d");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("only finished jobs are pruned"));
  EXPECT_EQ(coordinator_->PruneJob("a").code(), absl::StatusCode::kNotFound);

  // Over an hour after they finished, b and c are too old (oldest first);
  // d is PENDING, whatever its age.
  clock_.Advance(absl::Minutes(59));  // b finished exactly an hour ago: kept
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), IsEmpty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), ElementsAre("b"));
  clock_.Advance(absl::Minutes(1));
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), ElementsAre("b", "c"));
  ASSERT_TRUE(coordinator_->PruneJob("b").ok());

  // Durable: a restarted coordinator does not bring them back.
  Restart();
  EXPECT_EQ(coordinator_->GetJob("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->GetJob("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(coordinator_->GetJob("c").ok());
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), ElementsAre("c"));
  // A pruned id can be created again, as a new job.
  Create("a");
  EXPECT_EQ(coordinator_->GetJob("a")->phase(), v1::JOB_PHASE_PENDING);
}

// A blocked call holds pointers into the job's record with the lock
// released: the job is not freed under it, only after it returned.
TEST_F(RetentionTest, AJobACallWaitsOnIsPrunedOnlyAfterTheCallReturns) {
  Create("a");
  const uint64_t last = coordinator_->WaitEvents("a", std::nullopt, absl::Now())->back().sequence();
  std::vector<v1::JobEvent> seen;
  std::thread watcher([&] {
    absl::StatusOr<std::vector<v1::JobEvent>> events =
        coordinator_->WaitEvents("a", last, absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(events.ok()) << events.status();
    seen = *events;
  });
  // Until the watcher is inside its wait (a structural fact, polled; no
  // timing is asserted).
  absl::Status s;
  for (int i = 0; i < 3000; ++i) {
    s = coordinator_->PruneJob("a");
    if (absl::StrContains(s.message(), "1 calls waiting")) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_THAT(s.message(), HasSubstr("has 1 calls waiting on it")) << s;
  Cancel("a");  // finished now, and the watcher is woken by the event
  watcher.join();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].has_phase_changed());
  ASSERT_TRUE(coordinator_->PruneJob("a").ok());
  EXPECT_EQ(coordinator_->WaitEvents("a", last, absl::Now()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RetentionTest, ZeroMeansNoLimit) {
  options_.finished_job_retention = absl::ZeroDuration();
  options_.max_finished_jobs = 0;
  Restart();
  for (const char* id : {"a", "b", "c"}) {
    Create(id);
    Cancel(id);
  }
  clock_.Advance(absl::Hours(24 * 365));
  EXPECT_THAT(coordinator_->FinishedJobsToPrune(), IsEmpty());
}

TEST(CheckpointRegistryForgetJobTest, DropsEveryRecordOfTheJobOnly) {
  FakeClock clock;
  std::unique_ptr<StateStore> store = NewMemoryStore();
  absl::StatusOr<std::unique_ptr<CheckpointRegistry>> registry =
      CheckpointRegistry::Create(store.get(), &clock);
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_TRUE((*registry)->MarkUnusable("a", "ckpt-1", "bad shard").ok());
  ASSERT_TRUE((*registry)->MarkUnusable("b", "ckpt-1", "bad shard").ok());
  ASSERT_TRUE((*registry)->ForgetJob("a").ok());
  EXPECT_THAT((*registry)->UnusableCheckpoints("a"), IsEmpty());
  EXPECT_EQ((*registry)->UnusableCheckpoints("b").size(), 1u);
  absl::StatusOr<std::vector<Record>> marks = store->Scan(std::string(kCheckpointUnusableKind));
  ASSERT_TRUE(marks.ok());
  ASSERT_EQ(marks->size(), 1u);
  EXPECT_TRUE(absl::StartsWith((*marks)[0].key, "b")) << (*marks)[0].key;
  EXPECT_TRUE((*registry)->ForgetJob("never-seen").ok());
  // A new registry on the store sees the same.
  registry = CheckpointRegistry::Create(store.get(), &clock);
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_THAT((*registry)->UnusableCheckpoints("a"), IsEmpty());
}

}  // namespace
}  // namespace shardline::server

// RankProgressTracker: activities, COLLECTIVE while the training thread
// waits inside train::Collectives (the thread-local observer), step timing
// per generation.
#include "worker/rank_progress.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/train/model.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

// A Work that completes when the test says so and tells when it is waited on.
class GatedWork : public Work {
 public:
  bool IsCompleted() override { return done_.HasBeenNotified(); }
  absl::Status Wait(absl::Duration timeout) override {
    if (!waiting_.HasBeenNotified()) waiting_.Notify();
    if (!done_.WaitForNotificationWithTimeout(timeout)) return absl::DeadlineExceededError("t");
    return absl::OkStatus();
  }
  absl::Notification waiting_;
  absl::Notification done_;
};

// A two-rank backend whose all_reduce returns the test's GatedWork.
class GatedBackend : public Backend {
 public:
  explicit GatedBackend(std::shared_ptr<GatedWork> work) : work_(std::move(work)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::shared_ptr<Work> AllReduce(void*, size_t, DType, ReduceOp) override { return work_; }
  std::shared_ptr<Work> AllGather(const void*, size_t, void*, DType) override { return work_; }
  std::shared_ptr<Work> ReduceScatter(const void*, void*, const std::vector<size_t>&, DType,
                                      ReduceOp) override {
    return work_;
  }
  std::shared_ptr<Work> AllToAll(const void*, const std::vector<size_t>&, void*,
                                 const std::vector<size_t>&, DType) override {
    return work_;
  }
  std::shared_ptr<Work> Broadcast(void*, size_t, DType, int) override { return work_; }
  std::shared_ptr<Work> Send(const void*, size_t, DType, int, uint32_t) override { return work_; }
  std::shared_ptr<Work> Recv(void*, size_t, DType, int, uint32_t) override { return work_; }
  std::shared_ptr<Work> Barrier() override { return work_; }
  void Abort() override {}

 private:
  std::shared_ptr<GatedWork> work_;
};

TEST(RankProgressTest, ActivityIsTheTrainingThreadsUnlessItWaitsInACollective) {
  RankProgressTracker p;
  EXPECT_EQ(p.activity(), v1::ACTIVITY_IDLE);
  p.SetActivity(v1::ACTIVITY_COMPUTE);
  EXPECT_EQ(p.activity(), v1::ACTIVITY_COMPUTE);
  p.WaitBegins();
  EXPECT_EQ(p.activity(), v1::ACTIVITY_COLLECTIVE);
  p.WaitEnds();
  EXPECT_EQ(p.activity(), v1::ACTIVITY_COMPUTE);
  p.SetActivity(v1::ACTIVITY_CHECKPOINT);
  EXPECT_EQ(p.activity(), v1::ACTIVITY_CHECKPOINT);
  // COLLECTIVE is only the waits'; UNSPECIFIED is IDLE.
  p.SetActivity(v1::ACTIVITY_COLLECTIVE);
  EXPECT_EQ(p.activity(), v1::ACTIVITY_IDLE);
  p.SetActivity(v1::ACTIVITY_UNSPECIFIED);
  EXPECT_EQ(p.activity(), v1::ACTIVITY_IDLE);
}

TEST(RankProgressTest, AWaitInsideCollectivesOfTheObservedThreadSaysCollective) {
  RankProgressTracker p;
  p.SetActivity(v1::ACTIVITY_COMPUTE);
  auto work = std::make_shared<GatedWork>();
  GatedBackend backend(work);
  absl::Status waited;
  std::thread training([&] {
    train::ScopedCommWaitObserver observe(&p);
    absl::Duration comm_time;
    train::Collectives dp(&backend, &comm_time);
    float x[4] = {1, 2, 3, 4};
    waited = dp.AllReduce(x, 4, ReduceOp::kSum);
  });
  ASSERT_TRUE(work->waiting_.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // The training thread is inside Wait now (and stays there until done_).
  EXPECT_EQ(p.activity(), v1::ACTIVITY_COLLECTIVE);
  v1::RankProgress report;
  p.Fill(0, &report);
  EXPECT_EQ(report.activity(), v1::ACTIVITY_COLLECTIVE);
  work->done_.Notify();
  training.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(p.activity(), v1::ACTIVITY_COMPUTE);
}

TEST(RankProgressTest, WaitsOfAnotherThreadAreNotObserved) {
  RankProgressTracker p;
  p.SetActivity(v1::ACTIVITY_COMPUTE);
  auto work = std::make_shared<GatedWork>();
  GatedBackend backend(work);
  train::ScopedCommWaitObserver observe(&p);  // this thread's, not the other's
  std::thread other([&] {
    train::Collectives dp(&backend, nullptr);
    float x = 1;
    dp.AllReduce(&x, 1, ReduceOp::kSum).IgnoreError();
  });
  ASSERT_TRUE(work->waiting_.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(p.activity(), v1::ACTIVITY_COMPUTE);
  work->done_.Notify();
  other.join();
}

// Counts the waits it is told of.
struct CountingObserver : train::CommWaitObserver {
  int begins = 0, ends = 0;
  void WaitBegins() override { ++begins; }
  void WaitEnds() override { ++ends; }
};

TEST(RankProgressTest, EveryWaitIsToldOnceAndTheScopeRestoresThePreviousObserver) {
  auto work = std::make_shared<GatedWork>();
  work->done_.Notify();
  GatedBackend backend(work);
  train::Collectives dp(&backend, nullptr);
  float x = 1;
  CountingObserver outer, inner;
  train::ScopedCommWaitObserver a(&outer);
  {
    train::ScopedCommWaitObserver b(&inner);
    ASSERT_TRUE(dp.AllReduce(&x, 1, ReduceOp::kSum).ok());
    ASSERT_TRUE(dp.Wait(backend.Barrier()).ok());
  }
  EXPECT_EQ(inner.begins, 2);
  EXPECT_EQ(inner.ends, 2);
  EXPECT_EQ(outer.begins, 0);
  ASSERT_TRUE(dp.AllReduce(&x, 1, ReduceOp::kSum).ok());
  EXPECT_EQ(outer.begins, 1);
  EXPECT_EQ(outer.ends, 1);
  EXPECT_EQ(inner.begins, 2);
}

TEST(RankProgressTest, StepTimingIsReportedForItsGenerationOnly) {
  RankProgressTracker p;
  p.BeginGeneration(3);
  v1::RankProgress none;
  p.Fill(3, &none);
  EXPECT_EQ(none.step(), 0u);
  EXPECT_FALSE(none.has_step_time());
  p.StepDone(101, absl::Milliseconds(1500), absl::Milliseconds(1250));
  v1::RankProgress r;
  p.Fill(3, &r);
  EXPECT_EQ(r.step(), 101u);
  EXPECT_EQ(r.step_time().seconds(), 1);
  EXPECT_EQ(r.step_time().nanos(), 500000000);
  EXPECT_EQ(r.compute_time().seconds(), 1);
  EXPECT_EQ(r.compute_time().nanos(), 250000000);
  // Another generation's heartbeat knows no step of it.
  v1::RankProgress other;
  p.Fill(4, &other);
  EXPECT_EQ(other.step(), 0u);
  EXPECT_FALSE(other.has_compute_time());
  // A new generation starts with none.
  p.BeginGeneration(4);
  v1::RankProgress fresh;
  p.Fill(4, &fresh);
  EXPECT_EQ(fresh.step(), 0u);
}

TEST(RankProgressTest, NegativeDurationsAreWrittenAsZero) {
  google::protobuf::Duration d;
  DurationToProto(absl::Milliseconds(-5), &d);
  EXPECT_EQ(d.seconds(), 0);
  EXPECT_EQ(d.nanos(), 0);
  DurationToProto(absl::Seconds(2) + absl::Nanoseconds(7), &d);
  EXPECT_EQ(d.seconds(), 2);
  EXPECT_EQ(d.nanos(), 7);
}

}  // namespace
}  // namespace shardline::worker

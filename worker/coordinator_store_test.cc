// CoordinatorStore against a real in-process coordinator.
#include "worker/coordinator_store.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent.h"
#include "testing/worker_harness.h"

namespace shardline::worker {
namespace {

using testing::CoordinatorHarness;
using ::testing::HasSubstr;
using testing::SmallSpec;

class CoordinatorStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_.CreateJob("job", SmallSpec(2, 2, 2));
    for (int i = 0; i < 2; ++i) {
      WorkerAgentOptions o;
      o.connection.address = h_.address();
      o.connection.timeout = absl::Seconds(5);
      o.job_id = "job";
      o.worker_id = absl::StrCat("w", i);
      o.host = "localhost";
      agents_.push_back(std::make_unique<WorkerAgent>(h_.Channel(), o));
      ASSERT_TRUE(agents_.back()->Connect().ok());
    }
    std::vector<std::thread> threads;
    for (auto& a : agents_) {
      threads.emplace_back([&a] { ASSERT_TRUE(a->WaitForAssignment(absl::Seconds(10)).ok()); });
    }
    for (auto& t : threads) t.join();
  }

  std::shared_ptr<CoordinatorStore> StoreOf(int i, const std::string& scope) {
    return std::make_shared<CoordinatorStore>(agents_[i]->channel(), agents_[i]->connection(),
                                              agents_[i]->fence(), scope);
  }

  CoordinatorHarness h_;
  std::vector<std::unique_ptr<WorkerAgent>> agents_;
};

TEST_F(CoordinatorStoreTest, SetGetAddWaitAcrossWorkers) {
  auto a = StoreOf(0, "dp/0");
  auto b = StoreOf(1, "dp/0");
  EXPECT_EQ(a->generation(), 1u);
  ASSERT_TRUE(a->Set("rank0", "addr0").ok());
  absl::StatusOr<std::string> v = b->Get("rank0", absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "addr0");

  // A Get that blocks until the other worker sets the key.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(b->Set("late", "x").ok());
  });
  v = a->Get("late", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "x");

  EXPECT_EQ(*a->Add("n", 2), 2);
  EXPECT_EQ(*b->Add("n", 3), 5);
  EXPECT_EQ(a->Add("rank0", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a->Wait({"rank0", "late", "n"}, absl::Seconds(5)).ok());
  EXPECT_TRUE(*a->Check("rank0"));
  EXPECT_FALSE(*a->Check("missing"));
}

TEST_F(CoordinatorStoreTest, ScopesAreSeparate) {
  ASSERT_TRUE(StoreOf(0, "tp/0")->Set("k", "tp").ok());
  EXPECT_FALSE(*StoreOf(1, "dp/0")->Check("k"));
  EXPECT_EQ(*StoreOf(1, "tp/0")->Get("k", absl::Seconds(1)), "tp");
}

TEST_F(CoordinatorStoreTest, TimeoutNamesTheKey) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = StoreOf(0, "dp/0")->Get("never", absl::Milliseconds(300));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("never"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::Status w = StoreOf(0, "dp/0")->Wait({"never"}, absl::Milliseconds(300));
  EXPECT_EQ(w.code(), absl::StatusCode::kDeadlineExceeded) << w;
}

// The generation ends while a Get waits: it returns Aborted, and so does
// every later call with the old fence.
TEST_F(CoordinatorStoreTest, GenerationEndAbortsBlockedAndLaterCalls) {
  auto a = StoreOf(0, "dp/0");
  absl::StatusOr<std::string> v;
  std::thread waiter([&] { v = a->Get("never", absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(
      agents_[1]
          ->ReportError(absl::StatusCode::kInternal, "gloo error", "all_reduce dp/0", std::nullopt)
          .ok());
  waiter.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kAborted) << v.status();
  EXPECT_EQ(a->Set("k", "v").code(), absl::StatusCode::kAborted);
}

// A cancelled token (the agent learned the generation is over) ends a
// blocked wait at once, although the coordinator's generation is still live,
// and every later call fails the same way without reaching the coordinator.
TEST_F(CoordinatorStoreTest, CancelledTokenAbortsBlockedAndLaterCalls) {
  auto token = std::make_shared<CancelToken>();
  auto a = std::make_shared<CoordinatorStore>(agents_[0]->channel(), agents_[0]->connection(),
                                              agents_[0]->fence(), "dp/0", token);
  absl::Status w;
  absl::Time returned;
  std::thread waiter([&] {
    w = a->Wait({"never"}, absl::Seconds(20));
    returned = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time cancelled = absl::Now();
  token->Cancel("RESTART_AT_GENERATION 2");
  waiter.join();
  EXPECT_EQ(w.code(), absl::StatusCode::kAborted) << w;
  EXPECT_THAT(w.message(), HasSubstr("RESTART_AT_GENERATION 2"));
  EXPECT_LT(returned - cancelled, absl::Seconds(1));
  EXPECT_EQ(a->Set("k", "v").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Get("k", absl::Seconds(5)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Add("n", 1).status().code(), absl::StatusCode::kAborted);
  // Nothing reached the coordinator: the generation's store is untouched.
  EXPECT_FALSE(*StoreOf(1, "dp/0")->Check("k"));
}

}  // namespace
}  // namespace shardline::worker

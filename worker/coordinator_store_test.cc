// CoordinatorStore on a FakeRendezvousClient (testing/fake_rendezvous_client.h)
// and a FakeClock: timeouts, retries and their jittered delays at exact fake
// times. worker/communicators_test.cc runs stores against the real
// in-process coordinator.
#include "worker/coordinator_store.h"

#include <climits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_rendezvous_client.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;
using client::testing::FakeRendezvousClient;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CoordinatorStoreTest : public ::testing::Test {
 protected:
  CoordinatorStoreTest()
      : rendezvous_(std::make_shared<FakeRendezvousClient>(&clock_)), t0_(clock_.Now()) {
    backoff_.seed = 9;
  }

  v1::Fence Fence(const std::string& worker_id, uint64_t generation = 1) const {
    v1::Fence f;
    f.mutable_worker()->set_job_id("job");
    f.mutable_worker()->set_worker_id(worker_id);
    f.mutable_worker()->set_incarnation(5);
    f.set_generation(generation);
    return f;
  }

  std::shared_ptr<CoordinatorStore> StoreOf(
      const std::string& worker_id, const std::string& scope,
      std::shared_ptr<client::CancelToken> cancel = nullptr) {
    return std::make_shared<CoordinatorStore>(rendezvous_, &clock_, Fence(worker_id), scope,
                                              std::move(cancel), backoff_);
  }

  std::vector<absl::Duration> Delays(int n) const {
    Backoff backoff(backoff_);
    std::vector<absl::Duration> out;
    for (int i = 0; i < n; ++i) out.push_back(backoff.Next());
    return out;
  }

  FakeClock clock_;
  std::shared_ptr<FakeRendezvousClient> rendezvous_;
  const absl::Time t0_;
  BackoffOptions backoff_;
};

TEST_F(CoordinatorStoreTest, SetGetAddWaitAcrossWorkers) {
  auto a = StoreOf("w0", "dp/0");
  auto b = StoreOf("w1", "dp/0");
  EXPECT_EQ(a->generation(), 1u);
  EXPECT_EQ(a->scope(), "dp/0");
  ASSERT_TRUE(a->Set("rank0", "addr0").ok());
  absl::StatusOr<std::string> v = b->Get("rank0", absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "addr0");

  // A Get that blocks until the other worker sets the key.
  std::thread getter([&] { v = a->Get("late", absl::Seconds(5)); });
  ASSERT_TRUE(rendezvous_->AwaitBlocked(1));
  EXPECT_TRUE(b->Set("late", "x").ok());
  getter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "x");
  EXPECT_EQ(clock_.Now(), t0_);  // no time had to pass

  EXPECT_EQ(*a->Add("n", 2), 2);
  EXPECT_EQ(*b->Add("n", 3), 5);
  EXPECT_TRUE(a->Wait({"rank0", "late", "n"}, absl::Seconds(5)).ok());
  EXPECT_TRUE(*a->Check("rank0"));
  EXPECT_FALSE(*a->Check("missing"));

  // What went to the coordinator: the scope, and each wait's timeout.
  std::vector<std::string> rpcs;
  for (const FakeRendezvousClient::Call& c : rendezvous_->calls()) {
    rpcs.push_back(c.rpc);
    EXPECT_EQ(c.scope, "dp/0");
  }
  EXPECT_THAT(rpcs, ElementsAre("KvSet", "KvGet", "KvGet", "KvSet", "KvAdd", "KvAdd", "KvWait",
                                "KvGet", "KvGet"));
  EXPECT_EQ(rendezvous_->calls()[1].timeout, absl::Seconds(5));
  EXPECT_EQ(rendezvous_->calls()[7].timeout, absl::ZeroDuration());  // Check does not wait
}

TEST_F(CoordinatorStoreTest, AddOfTextThatIsNotANumberIsInvalidArgument) {
  auto a = StoreOf("w0", "dp/0");
  ASSERT_TRUE(a->Set("rank0", "addr0").ok());
  const absl::StatusOr<int64_t> added = a->Add("rank0", 1);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument) << added.status();
  EXPECT_THAT(added.status().message(), HasSubstr("rank0"));
}

TEST_F(CoordinatorStoreTest, ScopesAreSeparate) {
  ASSERT_TRUE(StoreOf("w0", "tp/0")->Set("k", "tp").ok());
  EXPECT_FALSE(*StoreOf("w1", "dp/0")->Check("k"));
  EXPECT_EQ(*StoreOf("w1", "tp/0")->Get("k", absl::Seconds(1)), "tp");
}

TEST_F(CoordinatorStoreTest, TimeoutNamesTheKeyAndEndsExactlyAtIt) {
  auto a = StoreOf("w0", "dp/0");
  absl::StatusOr<std::string> v;
  std::thread getter([&] { v = a->Get("never", absl::Milliseconds(300)); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Milliseconds(300)));
  clock_.Advance(absl::Milliseconds(300));
  getter.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_EQ(v.status().message(),
            "key 'never' of scope 'dp/0' (generation 1) was not set within 300ms");

  absl::Status w;
  std::thread waiter([&] { w = a->Wait({"never", "also"}, absl::Milliseconds(300)); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Milliseconds(600)));
  clock_.Advance(absl::Milliseconds(300));
  waiter.join();
  EXPECT_EQ(w.code(), absl::StatusCode::kDeadlineExceeded) << w;
  EXPECT_EQ(w.message(), "scope 'dp/0' (generation 1): keys not set within 300ms: never, also");
}

// A wait longer than the coordinator's longest (1 h) is asked for in slices.
TEST_F(CoordinatorStoreTest, LongWaitsAreAskedForInOneHourSlices) {
  auto a = StoreOf("w0", "dp/0");
  absl::StatusOr<std::string> v;
  std::thread getter([&] { v = a->Get("k", absl::Minutes(90)); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Hours(1)));
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + absl::Minutes(90)));
  clock_.Advance(absl::Minutes(30));
  getter.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("was not set within 1h30m"));
  std::vector<absl::Duration> asked;
  for (const FakeRendezvousClient::Call& c : rendezvous_->calls()) asked.push_back(c.timeout);
  EXPECT_THAT(asked, ElementsAre(absl::Hours(1), absl::Minutes(30)));
}

// The generation ends while a Get waits: it returns Aborted, and so does
// every later call with the old fence.
TEST_F(CoordinatorStoreTest, GenerationEndAbortsBlockedAndLaterCalls) {
  auto a = StoreOf("w0", "dp/0");
  absl::StatusOr<std::string> v;
  std::thread getter([&] { v = a->Get("never", absl::Seconds(20)); });
  ASSERT_TRUE(rendezvous_->AwaitBlocked(1));
  rendezvous_->EndGeneration("w1 reported a gloo error");
  getter.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kAborted) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("w1 reported a gloo error"));
  EXPECT_EQ(a->Set("k", "v").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Add("n", 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(clock_.Now(), t0_);
}

// A cancelled token (the agent learned the generation is over) ends a
// blocked wait at once, although the coordinator's generation is still live,
// and every later call fails the same way without reaching the coordinator.
TEST_F(CoordinatorStoreTest, CancelledTokenAbortsBlockedAndLaterCalls) {
  auto token = std::make_shared<client::CancelToken>();
  auto a = StoreOf("w0", "dp/0", token);
  absl::Status w;
  std::thread waiter([&] { w = a->Wait({"never"}, absl::Seconds(20)); });
  ASSERT_TRUE(rendezvous_->AwaitBlocked(1));
  token->Cancel("RESTART_AT_GENERATION 2");
  waiter.join();
  EXPECT_EQ(w.code(), absl::StatusCode::kAborted) << w;
  EXPECT_EQ(w.message(),
            "generation 1 is over (scope 'dp/0'): RESTART_AT_GENERATION 2; abort the group and "
            "re-join");
  EXPECT_EQ(clock_.Now(), t0_);  // not at the wait's timeout
  const int calls = static_cast<int>(rendezvous_->calls().size());
  EXPECT_EQ(a->Set("k", "v").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Get("k", absl::Seconds(5)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Add("n", 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Check("k").status().code(), absl::StatusCode::kAborted);
  // Nothing reached the coordinator: the generation's store is untouched.
  EXPECT_EQ(static_cast<int>(rendezvous_->calls().size()), calls);
  EXPECT_FALSE(*StoreOf("w1", "dp/0")->Check("k"));
}

TEST_F(CoordinatorStoreTest, UnavailableIsRetriedWithJitteredBackoff) {
  rendezvous_->FailNext("KvSet", absl::UnavailableError("the coordinator is starting"), 2);
  auto a = StoreOf("w0", "dp/0");
  absl::Status set;
  std::thread setter([&] { set = a->Set("k", "v"); });
  const std::vector<absl::Duration> d = Delays(2);
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d[0]));
  clock_.Advance(d[0]);
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + d[0] + d[1]));
  clock_.Advance(d[1]);
  setter.join();
  EXPECT_TRUE(set.ok()) << set;
  EXPECT_THAT(rendezvous_->CallTimes("KvSet"), ElementsAre(t0_, t0_ + d[0], t0_ + d[0] + d[1]));
  EXPECT_EQ(*StoreOf("w1", "dp/0")->Get("k", absl::Seconds(1)), "v");
}

TEST_F(CoordinatorStoreTest, SetGivesUpAtTheEndOfItsRetryWindow) {
  rendezvous_->FailNext("KvSet", absl::UnavailableError("down"), INT_MAX);
  auto a = StoreOf("w0", "dp/0");
  absl::Status set;
  std::thread setter([&] { set = a->Set("k", "v"); });
  std::vector<absl::Time> expected = {t0_};
  absl::Duration elapsed;
  for (absl::Duration d : Delays(100)) {
    if (elapsed + d > CoordinatorStore::kRetryWindow) break;
    elapsed += d;
    expected.push_back(t0_ + elapsed);
    ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + elapsed));
    clock_.Advance(d);
  }
  setter.join();
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_EQ(rendezvous_->CallTimes("KvSet"), expected);
  EXPECT_LE(expected.back(), t0_ + CoordinatorStore::kRetryWindow);
  EXPECT_GT(expected.size(), 15u);  // 100 ms doubling to 2 s fills 30 s with many tries
}

TEST_F(CoordinatorStoreTest, AddIsNeverRetried) {
  rendezvous_->FailNext("KvAdd", absl::UnavailableError("down"));
  const absl::StatusOr<int64_t> added = StoreOf("w0", "dp/0")->Add("n", 1);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rendezvous_->CallCount("KvAdd"), 1);
  EXPECT_TRUE(clock_.Waiters().empty());
}

// Cancelling the token ends a retry that is waiting out its backoff delay.
TEST_F(CoordinatorStoreTest, CancelledTokenEndsARetryDuringItsBackoff) {
  rendezvous_->FailNext("KvSet", absl::UnavailableError("down"), INT_MAX);
  auto token = std::make_shared<client::CancelToken>();
  auto a = StoreOf("w0", "dp/0", token);
  absl::Status set;
  std::thread setter([&] { set = a->Set("k", "v"); });
  ASSERT_TRUE(clock_.AwaitWaiterAt(t0_ + Delays(1)[0]));
  token->Cancel("generation 1 ended");
  setter.join();
  EXPECT_EQ(set.code(), absl::StatusCode::kAborted) << set;
  EXPECT_THAT(set.message(), HasSubstr("generation 1 ended"));
  EXPECT_EQ(rendezvous_->CallCount("KvSet"), 1);
}

TEST_F(CoordinatorStoreTest, WaitForNoKeysAsksNothing) {
  EXPECT_TRUE(StoreOf("w0", "dp/0")->Wait({}, absl::Seconds(1)).ok());
  EXPECT_TRUE(rendezvous_->calls().empty());
}

}  // namespace
}  // namespace shardline::worker

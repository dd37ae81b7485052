// Communicators against a real in-process coordinator (gRPC on 127.0.0.1:0),
// agents on threads: a build blocked in the rendezvous on a peer that never
// comes returns Aborted within ~1 s of the generation ending, however the
// end is learned (the coordinator's answer, or the agent's token), not at
// the connect timeout.
#include "worker/communicators.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cancel_token.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent.h"
#include "worker/comm/backend.h"
#include "worker/coordinator_store.h"
#include "testing/worker_harness.h"

namespace shardline::worker {
namespace {

using testing::CoordinatorHarness;
using testing::SmallSpec;

class CommunicatorsTest : public ::testing::Test {
 protected:
  // Two agents of a world of 2, both assigned generation 1.
  void SetUp() override {
    h_.CreateJob("job", SmallSpec(2, 2, 2));
    for (int i = 0; i < 2; ++i) {
      WorkerAgentOptions o;
      o.connection.address = h_.address();
      o.connection.timeout = absl::Seconds(5);
      o.job_id = "job";
      o.worker_id = absl::StrCat("w", i);
      o.host = "localhost";
      agents_.push_back(std::make_unique<WorkerAgent>(o, h_.Clients(), &clock_));
      ASSERT_TRUE(agents_.back()->Connect().ok());
    }
    assignments_.resize(2);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([this, i] {
        absl::StatusOr<v1::Assignment> a = agents_[i]->WaitForAssignment(absl::Seconds(10));
        ASSERT_TRUE(a.ok()) << a.status();
        assignments_[i] = *a;
      });
    }
    for (auto& t : threads) t.join();
  }

  // Builds worker 0's communicators on a thread (its peer, worker 1, never
  // builds) with `cancel` (default: worker 0's agent's token, as the daemon
  // does), ends the generation with `end` after 500 ms, and returns how long
  // Build took to return after that.
  absl::Duration BuildThenEnd(const std::function<void()>& end, absl::Status* status,
                              std::shared_ptr<client::CancelToken> cancel = nullptr) {
    if (cancel == nullptr) cancel = agents_[0]->GenerationToken(assignments_[0].generation());
    GlooOptions gloo;
    gloo.interface_address = "127.0.0.1";
    gloo.connect_timeout = absl::Seconds(30);
    gloo.timeout = absl::Seconds(30);
    absl::Time returned;
    std::thread builder([&] {
      absl::StatusOr<std::unique_ptr<Communicators>> c = Communicators::Build(
          assignments_[0], agents_[0]->rendezvous(), &clock_, agents_[0]->fence(),
          gloo, cancel);
      returned = absl::Now();
      *status = c.status();
    });
    absl::SleepFor(absl::Milliseconds(500));
    const absl::Time ended = absl::Now();
    end();
    builder.join();
    return returned - ended;
  }

  RealClock clock_;
  CoordinatorHarness h_;
  std::vector<std::unique_ptr<WorkerAgent>> agents_;
  std::vector<v1::Assignment> assignments_;
};

// The agents join with compact_groups, so their assignments carry groups in
// the compact form; both build them and pass Check (barriers and a dp
// all-reduce over the expanded ranks).
TEST_F(CommunicatorsTest, CompactAssignmentsBuildAndPassTheCheck) {
  int compact = 0;
  for (const v1::ProcessGroup& pg : assignments_[0].groups())
    compact += pg.ranks_size() == 0 && pg.size() > 0;
  EXPECT_GT(compact, 0) << assignments_[0].DebugString();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      GlooOptions gloo;
      gloo.interface_address = "127.0.0.1";
      gloo.connect_timeout = absl::Seconds(30);
      gloo.timeout = absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<Communicators>> c =
          Communicators::Build(assignments_[i], agents_[i]->rendezvous(), &clock_,
                               agents_[i]->fence(), gloo, nullptr);
      status[i] = c.ok() ? (*c)->Check(absl::Seconds(30)) : c.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(status[i].ok()) << "worker " << i << ": " << status[i];
}

// With NCCL (the fake plugin's loopback communicators, one fake GPU per
// worker: the BUILD rule sets SHARDLINE_FAKE_LOOPBACK_DEVICES), every group
// is an NCCL communicator bootstrapped through the coordinator's rendezvous,
// and Check's all_reduce goes through a float in device memory.
TEST_F(CommunicatorsTest, NcclGroupsBuildAndPassTheCheck) {
  std::vector<absl::Status> status(2);
  std::vector<bool> device_memory(2, false);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      GlooOptions timeouts;
      timeouts.connect_timeout = absl::Seconds(30);
      timeouts.timeout = absl::Seconds(30);
      NcclOptions nccl;
      nccl.plugin_path = "worker/gpu/libshardline_gpu_fake.so";
      nccl.device = i;
      absl::StatusOr<std::unique_ptr<Communicators>> c =
          Communicators::Build(assignments_[i], agents_[i]->rendezvous(), &clock_,
                               agents_[i]->fence(), timeouts, nullptr, nccl);
      if (!c.ok()) {
        status[i] = c.status();
        return;
      }
      device_memory[i] = !(*c)->groups().empty();
      for (const Communicators::Group& g : (*c)->groups())
        device_memory[i] = device_memory[i] && g.backend->device_memory();
      status[i] = (*c)->Check(absl::Seconds(30));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(status[i].ok()) << "worker " << i << ": " << status[i];
    EXPECT_TRUE(device_memory[i]) << "worker " << i << ": not every group is NCCL";
  }
}

// The peer reports an error: the coordinator ends generation 1.
TEST_F(CommunicatorsTest, BuildReturnsAbortedWhenAPeerReportsAnError) {
  absl::Status status;
  const absl::Duration took = BuildThenEnd(
      [&] {
        ASSERT_TRUE(agents_[1]
                        ->ReportError(absl::StatusCode::kUnavailable, "cannot bind",
                                      "build communicators", std::nullopt)
                        .ok());
      },
      &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(took, absl::Seconds(2)) << status;
}

// The peer's process dies (its stream breaks).
TEST_F(CommunicatorsTest, BuildReturnsAbortedWhenThePeerDies) {
  absl::Status status;
  const absl::Duration took = BuildThenEnd([&] { agents_[1].reset(); }, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(took, absl::Seconds(2)) << status;
}

// The builder's own agent learns that the generation is over.
TEST_F(CommunicatorsTest, BuildReturnsAbortedWhenItsAgentLearnsTheGenerationEnded) {
  absl::Status status;
  const absl::Duration took = BuildThenEnd(
      [&] {
        // A ReportError of the builder's own agent ends generation 1 for it.
        ASSERT_TRUE(agents_[0]
                        ->ReportError(absl::StatusCode::kInternal, "trainer failed", "step",
                                      std::nullopt)
                        .ok());
      },
      &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(took, absl::Seconds(2)) << status;
}

// A store that publishes (Set) and then fails every read with Aborted: the
// peer's own build ended right after it published its address.
class PublishThenAbortStore : public Store {
 public:
  explicit PublishThenAbortStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string&, absl::Duration) override {
    return absl::AbortedError("peer's generation ended");
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_->Add(key, delta);
  }
  absl::Status Wait(const std::vector<std::string>&, absl::Duration) override {
    return absl::AbortedError("peer's generation ended");
  }

 private:
  std::shared_ptr<Store> base_;
};

// The peer published its rendezvous key and then gave up (its own build
// was aborted): worker 0 must still end when the generation does.
TEST_F(CommunicatorsTest, BuildReturnsAbortedWhenThePeerVanishedAfterPublishing) {
  std::string scope;
  for (const v1::ProcessGroup& pg : assignments_[1].groups()) {
    if (pg.kind() == v1::GROUP_KIND_DP) scope = pg.name();
  }
  ASSERT_FALSE(scope.empty());
  v1::Fence f = agents_[1]->fence();
  auto store = std::make_shared<PublishThenAbortStore>(std::make_shared<CoordinatorStore>(
      agents_[1]->rendezvous(), &clock_, f, scope));
  GlooOptions gloo;
  gloo.interface_address = "127.0.0.1";
  gloo.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Backend>> peer =
      CreateGlooBackend(store, static_cast<int>(assignments_[1].rank()), 2, gloo);
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kAborted) << peer.status();
  absl::Status status;
  const absl::Duration took = BuildThenEnd(
      [&] {
        ASSERT_TRUE(agents_[1]
                        ->ReportError(absl::StatusCode::kAborted, "build aborted",
                                      "build communicators", std::nullopt)
                        .ok());
      },
      &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(took, absl::Seconds(2)) << status;
}

// The agent knows the generation is over but the coordinator's answer does
// not come (here: the coordinator's generation is still live): the token
// alone ends the wait, long before connect_timeout (30 s).
TEST_F(CommunicatorsTest, CancelledTokenEndsABuildBlockedOnALiveGeneration) {
  auto token = std::make_shared<client::CancelToken>();
  absl::Status status;
  const absl::Duration took =
      BuildThenEnd([&] { token->Cancel("told to restart at generation 2"); }, &status, token);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("told to restart at generation 2"));
  EXPECT_LT(took, absl::Seconds(2)) << status;
}

// The agent cancels its generation's token as soon as it learns the
// generation ended, and hands out cancelled tokens for generations that are
// not its live one.
TEST_F(CommunicatorsTest, AgentCancelsItsGenerationTokenWhenTheGenerationEnds) {
  std::shared_ptr<client::CancelToken> token = agents_[0]->GenerationToken(1);
  EXPECT_FALSE(token->cancelled());
  EXPECT_TRUE(agents_[0]->GenerationToken(7)->cancelled());
  ASSERT_TRUE(agents_[1]
                  ->ReportError(absl::StatusCode::kUnavailable, "cannot bind",
                                "build communicators", std::nullopt)
                  .ok());
  EXPECT_TRUE(token->WaitForCancel(clock_, absl::Seconds(5)));
  EXPECT_TRUE(agents_[0]->GenerationToken(1)->cancelled());
  // A build for the ended generation returns at once.
  const absl::Time start = absl::Now();
  GlooOptions gloo;
  gloo.interface_address = "127.0.0.1";
  gloo.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Communicators>> c = Communicators::Build(
      assignments_[0], agents_[0]->rendezvous(), &clock_, agents_[0]->fence(), gloo,
      agents_[0]->GenerationToken(1));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted) << c.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The re-joined generation gets a fresh, live token.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (agents_[0]->generation() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(agents_[0]->GenerationToken(agents_[0]->generation())->cancelled());
}

}  // namespace
}  // namespace shardline::worker

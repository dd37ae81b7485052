// End-to-end: shardctl's views of a job whose first generation has formed,
// against the real shardline-coordinator binary. Starts the coordinator
// (--listen 127.0.0.1:0 --state memory), creates the demo job with `shardctl
// job create deploy/jobs/shakespeare.yaml`, joins 5 simulated workers (the
// spec's max_workers: world 4 = pp 2 x dp 2 and one spare), has one of them
// set a rendezvous key, then runs members, topology, owner, kv get, job get
// and watch and checks real values in their output.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/grpc_test_util.h"
#include "testing/coordinator_process.h"

namespace shardline {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using e2e::Runfile;

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

Result Shardctl(const std::string& address, const std::string& args) {
  const std::string command = absl::StrCat(Runfile("client/shardctl/shardctl"), " ", args,
                                           " --coordinator ", address, " 2>&1");
  const e2e::CommandResult run = e2e::RunCommand(command);
  Result r;
  r.rc = run.rc;
  r.out = run.output;
  return r;
}

TEST(ShardctlFormedJobTest, ViewsOfARunningJob) {
  e2e::CoordinatorProcess coordinator;
  ASSERT_FALSE(coordinator.address().empty()) << "no 'listening on' line from the coordinator";
  const std::string& address = coordinator.address();

  Result r = Shardctl(address, "job create deploy/jobs/shakespeare.yaml --id shakespeare");
  ASSERT_EQ(r.rc, 0) << r.out;

  std::vector<std::unique_ptr<server::testing::SimWorker>> workers;
  for (int i = 0; i < 5; ++i) {
    workers.push_back(std::make_unique<server::testing::SimWorker>(
        server::testing::MakeChannel(address), "shakespeare", absl::StrCat("w", i), 100 + i));
  }
  std::vector<absl::StatusOr<v1::Assignment>> assignments(5, absl::UnknownError("unset"));
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 5; ++i) {
      threads.emplace_back([&, i] {
        grpc::Status joined = workers[i]->Join();
        if (!joined.ok()) {
          assignments[i] = absl::UnknownError(joined.error_message());
          return;
        }
        grpc::Status opened = workers[i]->OpenSession();
        if (!opened.ok()) {
          assignments[i] = absl::UnknownError(opened.error_message());
          return;
        }
        workers[i]->StartHeartbeats(absl::Milliseconds(500));
        assignments[i] = workers[i]->GetAssignment(/*wait=*/true, absl::Seconds(20));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  int ranked = -1, spares = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(assignments[i].ok()) << "w" << i << ": " << assignments[i].status();
    if (assignments[i]->spare()) {
      ++spares;
    } else if (ranked < 0) {
      ranked = i;
    }
  }
  ASSERT_EQ(spares, 1);
  ASSERT_GE(ranked, 0);
  const uint64_t generation = assignments[ranked]->generation();

  // A worker publishes its address in the dp/0 scope, as a bootstrap would.
  {
    v1::KvSetRequest set;
    workers[ranked]->set_generation(generation);
    *set.mutable_fence() = workers[ranked]->fence();
    set.set_scope("dp/0");
    set.set_key("addr");
    set.set_value("10.0.0.1:29500");
    v1::KvSetResponse response;
    grpc::ClientContext ctx;
    server::testing::Prepare(&ctx, "");
    grpc::Status s = workers[ranked]->Rendezvous()->KvSet(&ctx, set, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  r = Shardctl(address, "job get shakespeare");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("Phase:            RUNNING"),
                           HasSubstr("World:            4 = tp 1 x pp 2 x dp 2; 1 spare")));

  r = Shardctl(address, "members shakespeare");
  EXPECT_EQ(r.rc, 0) << r.out;
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u) << r.out;  // title, header, 5 workers
  int active = 0, spare = 0;
  for (const std::string& line : lines) {
    active += absl::StrContains(line, " ACTIVE ");
    spare += absl::StrContains(line, " SPARE ");
  }
  EXPECT_EQ(active, 4) << r.out;
  EXPECT_EQ(spare, 1) << r.out;

  r = Shardctl(address, "topology shakespeare");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr(absl::StrCat("Job shakespeare, generation ", generation,
                                                  ": world 4 = tp 1 x pp 2 x dp 2; vpp 1, ZeRO "
                                                  "stage 2, 1f1b")),
                           HasSubstr("4 micro-batches of 3 per dp rank per step"),
                           HasSubstr("      0      0  0-1     embedding\n"),
                           HasSubstr("      1      1  2-3     head\n"),
                           HasSubstr(" pp/0 "), HasSubstr(" dp/0 ")));

  r = Shardctl(address, "topology shakespeare --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json plan = nlohmann::json::parse(r.out);
  EXPECT_EQ(plan["world_size"], 4);
  EXPECT_EQ(plan["parallel"]["zero_stage"], 2);
  EXPECT_EQ(plan["gradient_accumulation_steps"], 4);

  r = Shardctl(address, "owner shakespeare layers.2.mlp.fc1.weight --element 1000");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("layers.2.mlp.fc1.weight: shape [512, 128]"),
                           HasSubstr("ZeRO stage 2"), HasSubstr("optimizer_state")));
  r = Shardctl(address, "owner shakespeare layers.9.nothing");
  EXPECT_EQ(r.rc, 2) << r.out;

  r = Shardctl(address, absl::StrCat("kv get shakespeare --generation ", generation,
                                     " --scope dp/0 addr"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("Value:       14 bytes, text"), HasSubstr("\n10.0.0.1:29500\n")));
  r = Shardctl(address, absl::StrCat("kv get shakespeare --generation ", generation,
                                     " --scope dp/0 nothing"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Value:       not set"));

  r = Shardctl(address, "watch shakespeare --after 0 --count 8");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("worker_joined w0"), HasSubstr("generation_formed initial: world 4 (dp 2)")));

  r = Shardctl(address, "job cancel shakespeare --reason done");
  EXPECT_EQ(r.rc, 0) << r.out;
  for (auto& w : workers) w->StopHeartbeats();
}

}  // namespace
}  // namespace shardline

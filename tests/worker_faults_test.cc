// shardline-worker's --inject-fault (a test facility) with real processes:
// bad specs exit 2 naming the flag; a rank whose training thread stalls
// keeps heartbeating, and once it is told to STOP it exits 1 within a few
// seconds although that thread never returns (worker/exit_watchdog.h), while
// its peer, stuck in a collective with it, stops cleanly.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/job_specs.h"
#include "testing/process_harness.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

TEST(WorkerFaultsTest, ABadFaultSpecIsExitTwoNamingTheFlag) {
  const std::string dir = TempDir();
  const std::string worker = Runfile("worker/shardline-worker");
  {
    Child c(worker, {"--job", "j", "--inject-fault", "stall_at_step=0"}, dir + "/zero.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(
        c.Log(), "--inject-fault: 'stall_at_step=0' needs a whole step number N in 1.."))
        << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "collective_count_mismatch_at_step=N")) << c.Log();
  }
  {
    Child c(worker, {"--job", "j", "--inject-fault", "slow_compute=2", "--inject-fault", "boom=1"},
            dir + "/kind.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "'boom=1' names no fault kind")) << c.Log();
  }
  {
    Child c(worker, {"--help"}, dir + "/help.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 0);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--inject-fault VALUE")) << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "TEST FACILITY")) << c.Log();
  }
}

TEST(WorkerFaultsTest, AStalledRankExitsOneSoonAfterStopWhileItsPeerStopsCleanly) {
  const std::string dir = TempDir();
  std::unique_ptr<Child> coordinator_process;
  const std::string address =
      StartMemoryCoordinator(&coordinator_process, dir + "/coordinator.log");
  ASSERT_FALSE(address.empty()) << coordinator_process->Log();
  Child& coordinator = *coordinator_process;
  auto jobs =
      v1::JobService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  {
    v1::JobSpec spec = fixtures::SmallSpec(2, 2, /*global_batch=*/4, absl::Seconds(10));
    spec.mutable_data()->set_dataset_path(Runfile("data/tinyshakespeare.txt"));
    spec.mutable_data()->set_validation_fraction(0.1);
    spec.mutable_training()->set_train_steps(1000000);
    // Far beyond the test: the peer waits in its collective until STOP.
    spec.mutable_elastic()->mutable_collective_timeout()->set_seconds(300);
    v1::CreateJobRequest req;
    req.set_job_id("stall");
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = {"--coordinator", address, "--job", "stall", "--worker-id",
                                     absl::StrCat("w", i)};
    if (i == 1) args.insert(args.end(), {"--inject-fault", "stall_at_step=3"});
    workers.push_back(std::make_unique<Child>(Runfile("worker/shardline-worker"), args,
                                              absl::StrCat(dir, "/worker", i, ".log")));
  }
  ASSERT_TRUE(workers[1]->WaitFor("TEST FACILITY: the training thread stalls before step 3",
                                  absl::Seconds(60)))
      << workers[1]->Log() << "\ncoordinator:\n"
      << coordinator.Log();
  EXPECT_TRUE(absl::StrContains(workers[1]->Log(), "TEST FACILITY: injecting faults: "
                                                   "stall_at_step=3"))
      << workers[1]->Log();

  // The stalled rank still heartbeats: it stays ACTIVE (its session and
  // heartbeats alive) while its peer waits for it.
  {
    v1::ListMembersRequest req;
    req.set_job_id("stall");
    v1::ListMembersResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ASSERT_TRUE(jobs->ListMembers(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.members_size(), 2);
    for (const v1::Member& m : resp.members()) {
      EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE) << m.DebugString();
    }
  }

  {
    v1::CancelJobRequest req;
    req.set_job_id("stall");
    req.set_reason("test done");
    v1::Job job;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->CancelJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // The peer's collective is aborted by STOP: it leaves and exits 0. The
  // stalled rank cannot: after the grace it says so and exits 1.
  EXPECT_EQ(workers[0]->WaitExit(absl::Seconds(30)), 0) << workers[0]->Log();
  EXPECT_EQ(workers[1]->WaitExit(absl::Seconds(30)), 1) << workers[1]->Log();
  EXPECT_TRUE(absl::StrContains(workers[1]->Log(),
                                "training thread did not return within 5s after STOP: exiting"))
      << workers[1]->Log();
  EXPECT_FALSE(absl::StrContains(workers[1]->Log(), "leaving job")) << workers[1]->Log();
}

}  // namespace
}  // namespace shardline::worker

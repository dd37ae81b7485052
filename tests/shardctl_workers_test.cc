// End-to-end: what `shardctl job get`, `members` and `drain` say while
// workers join, wait for the last call, run and are drained, against the
// real shardline-coordinator binary with simulated workers
// (testing/grpc_test_util.h). The job: min_workers 2, max_workers 3, a global
// batch of 4 (dp 2 divides it, dp 3 does not: three workers form a world of
// 2 and a spare), last call 30 s, a checkpoint directory (so draining a rank
// waits for a checkpoint).
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/grpc_test_util.h"
#include "testing/coordinator_process.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using server::testing::Prepare;
using server::testing::SimWorker;

struct Result {
  int rc = -1;
  std::string out;  // stdout
  std::string all;  // stdout, then stderr
};

// Runs shardctl once (drain is not idempotent), stderr into a file.
Result Shardctl(const std::string& address, const std::string& args) {
  const std::string err_path = ::testing::TempDir() + "/shardctl.err";
  const e2e::CommandResult run = e2e::RunCommand(absl::StrCat(
      e2e::Runfile("client/shardctl/shardctl"), " ", args, " --coordinator ", address, " 2>", err_path));
  std::ifstream err(err_path);
  Result r;
  r.rc = run.rc;
  r.out = run.output;
  r.all = r.out + std::string(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  return r;
}

// The fields of `worker`'s row of `shardctl members` output.
std::vector<std::string> MemberRow(const std::string& table, const std::string& worker) {
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!fields.empty() && fields[0] == worker) return fields;
  }
  return {};
}

TEST(ShardctlWorkersTest, FormationDrainAndMembers) {
  e2e::CoordinatorProcess coordinator;
  ASSERT_FALSE(coordinator.address().empty()) << "no 'listening on' line from the coordinator";
  const std::string& address = coordinator.address();
  auto channel = server::testing::MakeChannel(address);
  auto jobs = v1::JobService::NewStub(channel);
  {
    v1::CreateJobRequest req;
    req.set_job_id("elastic");
    *req.mutable_spec() = server::testing::SmallSpec(/*min_workers=*/2, /*max_workers=*/3,
                                                     /*global_batch=*/4);
    req.mutable_spec()->mutable_elastic()->mutable_last_call()->set_seconds(30);
    req.mutable_spec()->mutable_checkpoint()->set_directory(::testing::TempDir() + "/ckpt");
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->CreateJob(&ctx, req, &resp).ok());
  }
  std::vector<std::unique_ptr<SimWorker>> w;
  for (int i = 0; i < 3; ++i) {
    w.push_back(std::make_unique<SimWorker>(channel, "elastic", absl::StrCat("w", i), 10 + i));
  }
  auto join = [&](int i) {
    ASSERT_TRUE(w[i]->Join().ok());
    ASSERT_TRUE(w[i]->OpenSession().ok());
  };

  // One worker: below min_workers.
  join(0);
  Result r = Shardctl(address, "job get elastic");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, AllOf(HasSubstr("Phase:            PENDING (waiting for workers)\n"),
                           HasSubstr("World:            not formed yet; waiting for workers: 1 "
                                     "joined, needs at least 2 (min_workers)\n")));

  // Two: the job could form; the last call waits 30 s from the second join
  // for a third.
  join(1);
  absl::Time second_join;
  {
    v1::ListMembersRequest req;
    req.set_job_id("elastic");
    v1::ListMembersResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->ListMembers(&ctx, req, &resp).ok());
    for (const v1::Member& m : resp.members()) {
      if (m.worker_id() == "w1") {
        second_join = absl::FromUnixSeconds(m.join_time().seconds()) +
                      absl::Nanoseconds(m.join_time().nanos());
      }
    }
  }
  r = Shardctl(address, "job get elastic");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(
                         "World:            not formed yet; waiting for workers: 2 of 3 joined "
                         "(max_workers), last call until ",
                         absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", second_join + absl::Seconds(30),
                                          absl::UTCTimeZone()),
                         ", then it forms with those joined\n")));

  // The third (max_workers) forms it at once: world 2 (w0, w1), w2 a spare.
  join(2);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::Assignment> a = w[i]->GetAssignment(/*wait=*/true, absl::Seconds(15));
    ASSERT_TRUE(a.ok()) << "w" << i << ": " << a.status();
    v1::HeartbeatResponse hb;
    ASSERT_TRUE(w[i]->Heartbeat(&hb).ok()) << "w" << i;  // reports TRAINING
    w[i]->StartHeartbeats(absl::Milliseconds(200));
  }
  r = Shardctl(address, "job get elastic");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, HasSubstr("World:            2 = tp 1 x pp 1 x dp 2; 1 spare\n"));
  r = Shardctl(address, "members elastic");
  ASSERT_EQ(r.rc, 0) << r.all;
  // WORKER STATE, then ACTIVITY, COLLECTIVE and STRAGGLER: these workers
  // send no progress report.
  EXPECT_THAT(MemberRow(r.out, "w2"), ::testing::ElementsAre("w2", "12", "SPARE", "-", "1", "0",
                                                             "TRAINING", "-", "-", "-", "host-w2",
                                                             "cpu", ::testing::_));

  // Draining the spare: it leaves at once. Its last report (TRAINING) no
  // longer describes it.
  r = Shardctl(address, "drain elastic w2 --reason 'kernel upgrade'");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_EQ(r.out, "w2: left the job (drained: kernel upgrade)\n");
  r = Shardctl(address, "members elastic");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(MemberRow(r.out, "w2"),
              ::testing::ElementsAre("w2", "12", "LEFT", "-", "1", "0", "-", "-", "-", "-",
                                     "host-w2", "cpu", ::testing::_, "drained:", "kernel",
                                     "upgrade"));
  EXPECT_THAT(MemberRow(r.out, "w0"),
              ::testing::ElementsAre("w0", "10", "ACTIVE", "0", "1", "0", "TRAINING", "-", "-",
                                     "-", "host-w0", "cpu", ::testing::_));

  // Draining a rank waits for a checkpoint; the reason is said once.
  r = Shardctl(address, "drain elastic w1 --reason 'disk swap'");
  EXPECT_EQ(r.rc, 1) << r.all;  // one worker would stay, below min_workers
  EXPECT_THAT(r.all, HasSubstr("shardctl drain elastic w1 --force"));
  r = Shardctl(address, "drain elastic w1 --reason 'disk swap' --force");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_EQ(r.out, "w1: draining (disk swap); leaves after the next checkpoint commits\n");
  r = Shardctl(address, "members elastic");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, HasSubstr("draining (disk swap): leaves after the next checkpoint commits"));
  const std::vector<std::string> w1_row = MemberRow(r.out, "w1");
  ASSERT_GE(w1_row.size(), 7u) << r.out;
  EXPECT_EQ(w1_row[2], "ACTIVE");  // still a rank until the checkpoint commits
  EXPECT_EQ(w1_row[6], "TRAINING");
  for (auto& worker : w) worker->StopHeartbeats();
}

}  // namespace
}  // namespace shardline

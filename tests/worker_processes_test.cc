// End to end: a real shardline-coordinator process and three real
// shardline-worker processes form a world of 3 and build their Gloo
// communicators through the coordinator's rendezvous store; one worker is
// SIGKILLed; the two survivors are told to restart, re-join in place and
// rebuild their communicators at generation 2 (world 2). Cancelling the job
// stops them (exit 0).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/job_specs.h"
#include "testing/process_harness.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

// fixtures::SmallSpec's model on the real corpus: global_batch 6 is dp 3
// with three workers, dp 2 with two.
v1::JobSpec Spec() {
  v1::JobSpec spec = fixtures::SmallSpec(/*min_workers=*/2, /*max_workers=*/3,
                                         /*global_batch=*/6, absl::Seconds(10));
  spec.set_name("worker-processes");
  spec.mutable_data()->set_dataset_path(Runfile("data/tinyshakespeare.txt"));
  spec.mutable_data()->set_validation_fraction(0.1);
  // Long enough that the job still trains when a worker is killed.
  spec.mutable_training()->set_train_steps(1000000);
  spec.mutable_training()->set_learning_rate(1e-3);
  spec.mutable_elastic()->mutable_collective_timeout()->set_seconds(20);
  return spec;
}

TEST(WorkerProcessesTest, SurvivorsRebuildCommunicatorsAfterSigkill) {
  const std::string dir = TempDir();
  std::unique_ptr<Child> coordinator_process;
  const std::string address =
      StartMemoryCoordinator(&coordinator_process, dir + "/coordinator.log");
  ASSERT_FALSE(address.empty()) << coordinator_process->Log();
  Child& coordinator = *coordinator_process;

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  {
    v1::CreateJobRequest req;
    req.set_job_id("e2e");
    *req.mutable_spec() = Spec();
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<Child>(
        Runfile("worker/shardline-worker"),
        std::vector<std::string>{"--coordinator", address, "--job", "e2e", "--worker-id",
                                 absl::StrCat("w", i), "--device", "cpu", "--backend", "gloo",
                                 "--metrics-port", i == 0 ? "0" : "-1"},
        absl::StrCat(dir, "/worker", i, ".log")));
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(workers[i]->WaitFor("world 3: communicators ready", absl::Seconds(30)))
        << "worker " << i << ":\n"
        << workers[i]->Log() << "\ncoordinator:\n"
        << coordinator.Log();
    EXPECT_TRUE(absl::StrContains(workers[i]->Log(), "generation 1 rank "));
  }

  // Communicators ready and the trainer running: every member says TRAINING.
  {
    std::map<std::string, v1::WorkerState> states;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    do {
      v1::ListMembersRequest req;
      req.set_job_id("e2e");
      v1::ListMembersResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      grpc::Status s = jobs->ListMembers(&ctx, req, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      states.clear();
      for (const v1::Member& m : resp.members()) states[m.worker_id()] = m.worker_state();
      bool all_ready = states.size() == 3;
      for (const auto& [id, st] : states) all_ready = all_ready && st == v1::WORKER_STATE_TRAINING;
      if (all_ready) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    ASSERT_EQ(states.size(), 3u);
    for (const auto& [id, st] : states) {
      EXPECT_EQ(st, v1::WORKER_STATE_TRAINING) << id << " is " << v1::WorkerState_Name(st);
    }
  }

  // Worker 0 serves its Prometheus series; they show it training.
  {
    int port = 0;
    for (absl::string_view line : absl::StrSplit(workers[0]->Log(), '\n')) {
      const size_t at = line.find("metrics on port ");
      if (at != absl::string_view::npos) {
        absl::string_view rest = line.substr(at + 16);
        ASSERT_TRUE(absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &port)) << line;
      }
    }
    ASSERT_GT(port, 0) << workers[0]->Log();
    // TRAINING is reported before the first step ends: poll until one has.
    const std::string no_steps = "shardline_worker_steps_total{job=\"e2e\",worker_id=\"w0\"} 0\n";
    std::string text;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    do {
      text = HttpGet(port, "/metrics");
      if (!absl::StrContains(text, no_steps)) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    EXPECT_TRUE(absl::StrContains(text, "shardline_worker_generation{job=\"e2e\",worker_id=\"w0\"} 1\n"))
        << text;
    EXPECT_TRUE(absl::StrContains(text, "shardline_worker_steps_total{")) << text;
    EXPECT_FALSE(absl::StrContains(text, no_steps)) << text;
  }

  const absl::Time killed = absl::Now();
  workers[2]->Kill();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(workers[i]->WaitFor("world 2: communicators ready", absl::Seconds(30)))
        << "worker " << i << ":\n"
        << workers[i]->Log() << "\ncoordinator:\n"
        << coordinator.Log();
    const std::string log = workers[i]->Log();
    EXPECT_TRUE(absl::StrContains(log, "generation 2 rank ")) << log;
    EXPECT_TRUE(absl::StrContains(log, "generation 1 is over") ||
                absl::StrContains(log, "generation 1 ended during training"))
        << log;
    // The survivor learned of the loss from the coordinator, not by
    // reporting its own failed collective.
    EXPECT_FALSE(absl::StrContains(log, "training failed")) << log;
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));

  {
    v1::CancelJobRequest req;
    req.set_job_id("e2e");
    req.set_reason("test done");
    v1::Job job;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->CancelJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(workers[i]->WaitExit(absl::Seconds(15)), 0) << workers[i]->Log();
  }
  for (int i = 0; i < 2; ++i) std::cout << "worker " << i << "'s log:\n" << workers[i]->Log();
  std::cout << "coordinator's log:\n" << coordinator.Log() << std::flush;
}

// Errors an operator can act on: the flag to fix, and exit status 2 for bad
// flags, 1 for a coordinator that cannot be used.
// The admin token of the coordinators these tests start (the coordinator
// refuses one under 16 bytes).
constexpr char kAdminToken[] = "admin-token-for-tests";

// Creates job `id` for exactly one worker (min = max = 1) with the admin
// token kAdminToken; its worker token.
absl::StatusOr<std::string> CreateOneWorkerJob(const std::string& address, const std::string& id,
                                               v1::JobSpec spec) {
  spec.mutable_elastic()->set_min_workers(1);
  spec.mutable_elastic()->set_max_workers(1);
  auto jobs =
      v1::JobService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::CreateJobRequest req;
  req.set_job_id(id);
  *req.mutable_spec() = std::move(spec);
  v1::CreateJobResponse resp;
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
  if (!s.ok()) return absl::UnknownError(absl::StrCat("CreateJob: ", s.error_message()));
  return resp.worker_token();
}

// A coordinator restarted on another state file (here: memory) no longer
// knows the job or its worker token. The worker used to fail at its next
// checkpoint ("unknown token"), report, and train again from step 1, for
// ever; it now stops at the first refused heartbeat and exits 1 saying why.
TEST(WorkerProcessesTest, CoordinatorThatForgotTheJobStopsTheWorker) {
  // With the job's worker token the restarted coordinator refuses the token;
  // with the admin token it answers the worker's re-join "no job" (the
  // worker used to wait for an assignment for ever).
  for (const bool admin : {false, true}) {
    SCOPED_TRACE(admin ? "admin token" : "worker token");
    const std::string dir = absl::StrCat(TempDir(), "/forgot-", admin ? "admin" : "worker");
    ASSERT_TRUE(std::filesystem::create_directories(dir));
    auto coordinator = std::make_unique<Child>(
        Runfile("server/shardline-coordinator"),
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--state", "memory",
                                 "--admin-token", kAdminToken},
        dir + "/coordinator1.log");
    ASSERT_TRUE(coordinator->WaitFor("listening on ", absl::Seconds(20))) << coordinator->Log();
    const std::string address = ListeningAddress(*coordinator);
    ASSERT_FALSE(address.empty());
    absl::StatusOr<std::string> created = CreateOneWorkerJob(address, "forgotten", Spec());
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_FALSE(created->empty());
    Child worker(Runfile("worker/shardline-worker"),
                 {"--coordinator", address, "--job", "forgotten", "--worker-id", "w0", "--token",
                  admin ? std::string(kAdminToken) : *created, "--connect-timeout", "30s"},
                 dir + "/worker.log");
    ASSERT_TRUE(worker.WaitFor("world 1: communicators ready", absl::Seconds(30)))
        << worker.Log() << coordinator->Log();

    coordinator->Kill();
    Child forgetful(Runfile("server/shardline-coordinator"),
                    {"--listen", address, "--state", "memory", "--admin-token", kAdminToken},
                    dir + "/coordinator2.log");
    ASSERT_TRUE(forgetful.WaitFor("listening on ", absl::Seconds(20))) << forgetful.Log();

    EXPECT_EQ(worker.WaitExit(absl::Seconds(30)), 1) << worker.Log();
    const std::string log = worker.Log();
    EXPECT_TRUE(absl::StrContains(log, admin ? "no longer knows this job"
                                             : "no longer accepts this worker's token"))
        << log;
    EXPECT_TRUE(absl::StrContains(log, "--state")) << log;
    EXPECT_TRUE(absl::StrContains(log, admin ? "no job 'forgotten'" : "job 'forgotten'")) << log;
    // It never started training over.
    size_t starts = 0;
    for (size_t at = log.find("training steps 1.."); at != std::string::npos;
         at = log.find("training steps 1..", at + 1)) {
      ++starts;
    }
    EXPECT_EQ(starts, 1u) << log;
  }
}

TEST(WorkerProcessesTest, ClearErrors) {
  const std::string dir = TempDir();
  const std::string worker = Runfile("worker/shardline-worker");
  {
    Child c(worker, {"--coordinator", "127.0.0.1:1"}, dir + "/nojob.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--job is required")) << c.Log();
  }
  {
    Child c(worker, {"--job", "j", "--backend", "nccl"}, dir + "/nccl.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--backend=nccl needs --device=cuda:N")) << c.Log();
  }
  {
    Child c(worker,
            {"--job", "j", "--device", "cuda:0", "--backend", "nccl", "--inject-fault",
             "collective_count_mismatch_at_step=3"},
            dir + "/nccl-fault.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "collective_count_mismatch_at_step works with Gloo only"))
        << c.Log();
  }
  {
    // A GPU device that cannot be used (no plugin at that path, or no GPU)
    // is refused before joining, naming the device and the cause.
    Child c(worker,
            {"--coordinator", "127.0.0.1:1", "--job", "j", "--device", "cuda:0", "--gpu-plugin",
             dir + "/no-such-plugin.so"},
            dir + "/gpu.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 1);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--device=cuda:0: ")) << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "no-such-plugin.so")) << c.Log();
    EXPECT_FALSE(absl::StrContains(c.Log(), "cannot reach the coordinator")) << c.Log();
  }
  {
    // "cuda" is GPU 0, as shardline-train-local takes it.
    Child c(worker,
            {"--coordinator", "127.0.0.1:1", "--job", "j", "--device", "cuda", "--gpu-plugin",
             dir + "/no-such-plugin.so"},
            dir + "/gpu-cuda.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 1);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--device=cuda:0: ")) << c.Log();
  }
  {
    Child c(worker, {"--job", "j", "--log-interval", "-3"}, dir + "/log-interval.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--log-interval=-3 must be >= 1")) << c.Log();
  }
  {
    Child c(worker, {"--job", "j", "--sample-length", "999999999999"}, dir + "/sample.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(
        absl::StrContains(c.Log(), "--sample-length=999999999999 must be in 0..1048576 (bytes)"))
        << c.Log();
  }
  {
    Child c(worker, {"--job", "j", "--worker-id", ""}, dir + "/empty-id.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--worker-id is empty")) << c.Log();
  }
  {
    Child c(worker, {"--job", "j", "--device", "gpu0"}, dir + "/device.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(10)), 2);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--device")) << c.Log();
  }
  {
    Child c(worker, {"--coordinator", "127.0.0.1:1", "--job", "j", "--connect-timeout", "1s"},
            dir + "/unreachable.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(15)), 1);
    EXPECT_TRUE(absl::StrContains(c.Log(), "cannot reach the coordinator at 127.0.0.1:1"))
        << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "SHARDLINE_COORDINATOR")) << c.Log();
    // Nothing listens there; no TLS is configured, so TLS is not the cause.
    EXPECT_FALSE(absl::StrContains(c.Log(), "TLS")) << c.Log();
  }
  Child coordinator(Runfile("server/shardline-coordinator"),
                    {"--listen", "127.0.0.1:0", "--state", "memory", "--admin-token", kAdminToken},
                    dir + "/coordinator2.log");
  ASSERT_TRUE(coordinator.WaitFor("listening on ", absl::Seconds(20))) << coordinator.Log();
  std::string address;
  for (absl::string_view line : absl::StrSplit(coordinator.Log(), '\n')) {
    if (absl::ConsumePrefix(&line, "listening on ")) {
      address = std::string(absl::StripAsciiWhitespace(line));
    }
  }
  {
    Child c(worker, {"--coordinator", address, "--job", "j", "--token", "wrong"},
            dir + "/token.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(15)), 1);
    EXPECT_TRUE(absl::StrContains(c.Log(), "--token")) << c.Log();
  }
  {
    // A model no host here can hold (hidden 65536: 1.5 TiB of model states
    // for one rank): the worker says so and exits 1 at its first
    // assignment, without allocating it.
    v1::JobSpec huge = Spec();
    huge.mutable_model()->set_hidden_size(65536);
    huge.mutable_model()->set_num_heads(8);
    absl::StatusOr<std::string> created = CreateOneWorkerJob(address, "huge", huge);
    ASSERT_TRUE(created.ok()) << created.status();
    Child c(worker, {"--coordinator", address, "--job", "huge", "--token", kAdminToken},
            dir + "/huge.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(30)), 1) << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "this host lacks the memory for its rank")) << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "needs 1.50 TiB")) << c.Log();
  }
  {
    Child c(worker, {"--coordinator", address, "--job", "nope", "--token", kAdminToken},
            dir + "/unknown.log");
    EXPECT_EQ(c.WaitExit(absl::Seconds(15)), 1);
    EXPECT_TRUE(absl::StrContains(c.Log(), "no job")) << c.Log();
    EXPECT_TRUE(absl::StrContains(c.Log(), "--job")) << c.Log();
  }
}

}  // namespace
}  // namespace shardline::worker

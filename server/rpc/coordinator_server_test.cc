// Integration tests of the gRPC layer: a real in-process server on
// 127.0.0.1 (port 0) over the real Coordinator, Rendezvous and
// CheckpointRegistry, with simulated workers on threads.
#include "server/rpc/coordinator_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "checkpoint/geometry.h"
#include "server/checkpoint_registry.h"
#include "common/clock.h"
#include "server/coordinator.h"
#include "testing/grpc_test_util.h"
#include "testing/plan_checkpoint.h"
#include "metrics/metrics.h"
#include "server/rendezvous.h"
#include "server/state_store.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using testing::Harness;
using testing::IsRestart;
using testing::JoinAll;
using testing::MakeChannel;
using testing::Pointers;
using testing::Prepare;
using testing::SimWorker;
using testing::SmallSpec;

v1::CreateJobResponse CreateJob(v1::JobService::Stub* jobs, const std::string& job_id,
                                const v1::JobSpec& spec, const std::string& token = "") {
  v1::CreateJobRequest req;
  req.set_job_id(job_id);
  *req.mutable_spec() = spec;
  v1::CreateJobResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token);
  grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

grpc::Status GetJob(v1::JobService::Stub* jobs, const std::string& job_id,
                    const std::string& token, v1::Job* job = nullptr) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::Job out;
  grpc::ClientContext ctx;
  Prepare(&ctx, token);
  grpc::Status s = jobs->GetJob(&ctx, req, &out);
  if (job != nullptr) *job = out;
  return s;
}

std::map<std::string, v1::Member> Members(v1::JobService::Stub* jobs, const std::string& job_id) {
  v1::ListMembersRequest req;
  req.set_job_id(job_id);
  v1::ListMembersResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  grpc::Status s = jobs->ListMembers(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::map<std::string, v1::Member> out;
  for (const v1::Member& m : resp.members()) out[m.worker_id()] = m;
  return out;
}

// Sends a raw HTTP GET /metrics to 127.0.0.1:port and returns the body.
std::string Scrape(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// ---------------------------------------------------------------------------

// Three workers, world of two plus a spare; one dies (its stream is
// cancelled); the survivors are told to restart, re-join and form
// generation 2 with the spare. Rendezvous keys are scoped by generation.
TEST(GrpcServiceTest, ElasticRestartAfterStreamBreaks) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  // global_batch 4: dp in {1, 2, 4}; three workers give world 2 + 1 spare.
  v1::CreateJobResponse created = CreateJob(jobs.get(), "elastic", SmallSpec(2, 4, 4));
  EXPECT_EQ(created.job().generation(), 1u);
  EXPECT_EQ(created.worker_token(), "");  // no admin token: no worker token

  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<SimWorker>(h.Channel(), "elastic",
                                                  absl::StrCat("node", i, ":cpu"), 100 + i));
  }
  std::vector<absl::StatusOr<v1::Assignment>> assignments =
      JoinAll(Pointers(workers), /*open_session=*/true);
  std::set<uint32_t> ranks;
  int spare = -1;
  std::map<uint32_t, int> worker_of_rank;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(assignments[i].ok()) << assignments[i].status();
    EXPECT_EQ(assignments[i]->generation(), 1u);
    EXPECT_EQ(assignments[i]->world_size(), 2u);
    if (assignments[i]->spare()) {
      EXPECT_EQ(spare, -1) << "two spares";
      spare = i;
    } else {
      EXPECT_TRUE(ranks.insert(assignments[i]->rank()).second) << "rank twice";
      worker_of_rank[assignments[i]->rank()] = i;
    }
  }
  ASSERT_NE(spare, -1);
  ASSERT_EQ(ranks, (std::set<uint32_t>{0, 1}));
  v1::Job job;
  ASSERT_TRUE(GetJob(jobs.get(), "elastic", "", &job).ok());
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.world_size(), 2u);
  EXPECT_EQ(job.num_spares(), 1u);
  // Every session got SessionOpened and its assignment.
  for (auto& w : workers) {
    EXPECT_TRUE(w->WaitMessage([](const v1::SessionMessage& m) { return m.has_assignment(); },
                               absl::Seconds(5)))
        << w->worker_id();
  }
  for (auto& w : workers) w->StartHeartbeats(absl::Milliseconds(100));

  SimWorker& rank0 = *workers[worker_of_rank[0]];
  SimWorker& rank1 = *workers[worker_of_rank[1]];
  SimWorker& spare_worker = *workers[spare];

  // KV bootstrap: rank 1 waits for the key, rank 0 sets it.
  grpc::Status got_status;
  v1::KvGetResponse got;
  std::thread waiter([&] {
    v1::KvGetRequest req;
    *req.mutable_fence() = rank1.fence();
    req.set_scope("tp/0");
    req.set_key("nccl-unique-id");
    req.set_wait(true);
    req.mutable_timeout()->set_seconds(10);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    got_status = rank1.Rendezvous()->KvGet(&ctx, req, &got);
  });
  absl::SleepFor(absl::Milliseconds(300));
  {
    v1::KvSetRequest req;
    *req.mutable_fence() = rank0.fence();
    req.set_scope("tp/0");
    req.set_key("nccl-unique-id");
    req.set_value("id-of-generation-1");
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = rank0.Rendezvous()->KvSet(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  waiter.join();
  ASSERT_TRUE(got_status.ok()) << got_status.error_message();
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.value(), "id-of-generation-1");

  // The spare blocks on a key nobody sets; the generation's end frees it.
  grpc::Status blocked_status;
  std::thread blocked([&] {
    v1::KvGetRequest req;
    *req.mutable_fence() = spare_worker.fence();
    req.set_key("never-set");
    req.set_wait(true);
    req.mutable_timeout()->set_seconds(30);
    v1::KvGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    blocked_status = spare_worker.Rendezvous()->KvGet(&ctx, req, &resp);
  });
  absl::SleepFor(absl::Milliseconds(200));

  // Rank 0's process "dies": its stream is cancelled.
  const absl::Time killed_at = absl::Now();
  rank0.StopHeartbeats();
  rank0.KillSession();

  EXPECT_TRUE(rank1.WaitMessage([](const v1::SessionMessage& m) { return IsRestart(m, 2); },
                                absl::Seconds(5)))
      << "rank 1 got no RESTART_AT_GENERATION(2)";
  EXPECT_TRUE(spare_worker.WaitMessage(
      [](const v1::SessionMessage& m) { return IsRestart(m, 2); }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(3)) << "loss should be noticed at once";
  EXPECT_TRUE(rank1.SawHeartbeatCode(grpc::StatusCode::ABORTED, absl::Seconds(5)));
  blocked.join();
  EXPECT_EQ(blocked_status.error_code(), grpc::StatusCode::ABORTED)
      << blocked_status.error_message();

  // Survivors re-join and re-form at generation 2 with the spare.
  rank1.StopHeartbeats();
  spare_worker.StopHeartbeats();
  std::vector<absl::StatusOr<v1::Assignment>> next =
      JoinAll({&rank1, &spare_worker}, /*open_session=*/false);
  EXPECT_EQ(rank1.generation(), 2u);
  EXPECT_EQ(spare_worker.generation(), 2u);
  std::set<uint32_t> next_ranks;
  for (auto& a : next) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->generation(), 2u);
    EXPECT_EQ(a->world_size(), 2u);
    EXPECT_FALSE(a->spare());
    next_ranks.insert(a->rank());
  }
  EXPECT_EQ(next_ranks, (std::set<uint32_t>{0, 1}));
  std::map<std::string, v1::Member> members = Members(jobs.get(), "elastic");
  EXPECT_EQ(members[rank0.worker_id()].state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(members[rank0.worker_id()].loss_reason(), v1::LOSS_REASON_STREAM_BROKEN);
  EXPECT_EQ(members[rank1.worker_id()].state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(members[spare_worker.worker_id()].state(), v1::MEMBER_STATE_ACTIVE);

  // Keys are scoped by generation: generation 2 does not see generation 1's.
  {
    v1::KvGetRequest req;
    *req.mutable_fence() = rank1.fence();
    req.set_scope("tp/0");
    req.set_key("nccl-unique-id");
    v1::KvGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = rank1.Rendezvous()->KvGet(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(resp.found());
  }
  // A generation-1 fence is stale now.
  {
    v1::Fence stale = rank1.fence();
    stale.set_generation(1);
    v1::KvSetRequest req;
    *req.mutable_fence() = stale;
    req.set_key("k");
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_EQ(rank1.Rendezvous()->KvSet(&ctx, req, &resp).error_code(),
              grpc::StatusCode::ABORTED);
  }

  // Metrics over loopback show the real state.
  absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> http =
      metrics::MetricsHttpServer::Start("127.0.0.1", 0, &h.metrics());
  ASSERT_TRUE(http.ok()) << http.status();
  const std::string text = Scrape((*http)->port());
  EXPECT_THAT(text, HasSubstr("shardline_job_generation{job=\"elastic\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("shardline_job_members{job=\"elastic\",state=\"active\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("shardline_job_members{job=\"elastic\",state=\"lost\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("shardline_joins_total 5\n"));
  EXPECT_THAT(text, HasSubstr("shardline_rpc_duration_seconds_count{method=\"WorkerService/"
                              "Heartbeat\"}"));
  EXPECT_THAT(text, HasSubstr("shardline_rpcs_total{method=\"WorkerService/Heartbeat\","
                              "code=\"ABORTED\"}"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("shardline_heartbeats_total 0\n")));
}

// Malformed and oversized requests get the documented codes; the server
// keeps serving.
// Waiting KvGets and KvWaits hold no thread each: with the sync server
// capped at 4 threads, 300 of them wait at once (a thread per waiting call
// would have answered RESOURCE_EXHAUSTED from the 5th on); a cancelled one
// and one whose deadline passes are withdrawn on the server; the writes
// answer all the others with the value.
TEST(GrpcServiceTest, KeyWaitsHoldNoThread) {
  testing::HarnessOptions options;
  options.max_threads = 4;
  Harness h(options);
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "waits", SmallSpec(1, 1, 4));
  SimWorker w(h.Channel(), "waits", "node0:cpu", 1);
  std::vector<SimWorker*> one = {&w};
  std::vector<absl::StatusOr<v1::Assignment>> a = JoinAll(one, /*open_session=*/true);
  ASSERT_TRUE(a[0].ok()) << a[0].status();
  w.StartHeartbeats(absl::Milliseconds(100));
  const uint64_t generation = w.fence().generation();
  auto await_waiters = [&](int64_t n) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (h.rendezvous().GetUsage("waits", generation).waiters != n && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(h.rendezvous().GetUsage("waits", generation).waiters, n);
  };

  // Asynchronous client calls, so that the test needs no thread per call.
  constexpr int kGets = 150;
  constexpr int kWaits = 150;
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    v1::KvGetResponse get;
    v1::KvWaitResponse wait;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kGets + kWaits + 1; ++i) {
    calls.push_back(std::make_unique<Call>());
    Call& c = *calls.back();
    Prepare(&c.ctx, "");
    if (i < kGets) {
      v1::KvGetRequest req;
      *req.mutable_fence() = w.fence();
      req.set_scope("s");
      req.set_key("k");
      req.set_wait(true);
      req.mutable_timeout()->set_seconds(30);
      auto rpc = w.Rendezvous()->AsyncKvGet(&c.ctx, req, &cq);
      rpc->Finish(&c.get, &c.status, reinterpret_cast<void*>(static_cast<intptr_t>(i)));
    } else {
      v1::KvWaitRequest req;
      *req.mutable_fence() = w.fence();
      req.set_scope("s");
      req.add_keys("k");
      req.add_keys("other");
      req.mutable_timeout()->set_seconds(30);
      auto rpc = w.Rendezvous()->AsyncKvWait(&c.ctx, req, &cq);
      rpc->Finish(&c.wait, &c.status, reinterpret_cast<void*>(static_cast<intptr_t>(i)));
    }
  }
  await_waiters(kGets + kWaits + 1);
  // The last one is cancelled: withdrawn on the server.
  calls.back()->ctx.TryCancel();
  await_waiters(kGets + kWaits);
  // One more, whose gRPC deadline passes while it waits (the server's
  // alarm withdraws it).
  {
    v1::KvGetRequest req;
    *req.mutable_fence() = w.fence();
    req.set_scope("s");
    req.set_key("never");
    req.set_wait(true);
    v1::KvGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "", absl::Milliseconds(200));
    EXPECT_EQ(w.Rendezvous()->KvGet(&ctx, req, &resp).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    await_waiters(kGets + kWaits);
  }
  auto set = [&](const std::string& key, const std::string& value) {
    v1::KvSetRequest req;
    *req.mutable_fence() = w.fence();
    req.set_scope("s");
    req.set_key(key);
    req.set_value(value);
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(w.Rendezvous()->KvSet(&ctx, req, &resp).ok());
  };
  set("k", "value-of-k");
  await_waiters(kWaits);  // the KvWaits still miss "other"
  set("other", "x");
  std::set<intptr_t> done;
  for (int n = 0; n < kGets + kWaits + 1; ++n) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_EQ(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(20)),
              grpc::CompletionQueue::GOT_EVENT);
    ASSERT_TRUE(ok);
    const intptr_t i = reinterpret_cast<intptr_t>(tag);
    done.insert(i);
    const Call& c = *calls[i];
    if (i == kGets + kWaits) {
      EXPECT_EQ(c.status.error_code(), grpc::StatusCode::CANCELLED) << c.status.error_message();
      continue;
    }
    ASSERT_TRUE(c.status.ok()) << i << ": " << c.status.error_message();
    if (i < kGets) {
      EXPECT_TRUE(c.get.found()) << i;
      EXPECT_EQ(c.get.value(), "value-of-k") << i;
    }
  }
  EXPECT_EQ(done.size(), static_cast<size_t>(kGets + kWaits + 1));
  EXPECT_EQ(h.rendezvous().GetUsage("waits", generation).waiters, 0);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

// Barrier arrivals wait without a thread each: with the sync server capped
// at 4 threads, 24 members pass two barriers together, each with distinct
// positions (a thread per waiting arrival would have answered
// RESOURCE_EXHAUSTED from the 5th on).
TEST(GrpcServiceTest, BarrierArrivalsHoldNoThread) {
  testing::HarnessOptions options;
  options.max_threads = 4;
  Harness h(options);
  auto jobs = v1::JobService::NewStub(h.Channel());
  constexpr int kWorkers = 24;
  CreateJob(jobs.get(), "wide", SmallSpec(kWorkers, kWorkers, kWorkers));
  std::vector<std::unique_ptr<SimWorker>> workers;
  std::vector<SimWorker*> all;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<SimWorker>(h.Channel(), "wide", absl::StrCat("w", i), 1));
    all.push_back(workers.back().get());
  }
  std::vector<absl::StatusOr<v1::Assignment>> joined = JoinAll(all, /*open_session=*/true);
  for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(joined[i].ok()) << i << ": " << joined[i].status();
  for (const char* name : {"first", "second"}) {
    std::vector<grpc::Status> status(kWorkers);
    std::vector<v1::BarrierResponse> resp(kWorkers);
    std::vector<std::thread> arrivals;
    for (int i = 0; i < kWorkers; ++i) {
      arrivals.emplace_back([&, i] {
        v1::BarrierRequest req;
        *req.mutable_fence() = workers[i]->fence();
        req.set_name(name);
        req.set_participants(kWorkers);
        req.mutable_timeout()->set_seconds(20);
        grpc::ClientContext ctx;
        Prepare(&ctx, "");
        status[i] = workers[i]->Rendezvous()->Barrier(&ctx, req, &resp[i]);
      });
    }
    for (auto& t : arrivals) t.join();
    std::set<uint32_t> positions;
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_TRUE(status[i].ok()) << name << " " << i << ": " << status[i].error_message();
      positions.insert(resp[i].arrival());
    }
    EXPECT_EQ(positions.size(), static_cast<size_t>(kWorkers)) << name;
    EXPECT_EQ(*positions.rbegin(), static_cast<uint32_t>(kWorkers - 1)) << name;
  }
  // An arrival whose gRPC deadline passes is withdrawn on the server too
  // (its alarm, not a thread).
  {
    v1::BarrierRequest req;
    *req.mutable_fence() = workers[0]->fence();
    req.set_name("third");
    req.set_participants(2);
    v1::BarrierResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "", absl::Milliseconds(200));
    EXPECT_EQ(workers[0]->Rendezvous()->Barrier(&ctx, req, &resp).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    // The client's deadline and the server's alarm race: wait (bounded).
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (h.rendezvous().GetUsage("wide", 1).waiters != 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(h.rendezvous().GetUsage("wide", 1).waiters, 0);
  }
}

TEST(GrpcServiceTest, MalformedRequestsGetDocumentedCodes) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "solo", SmallSpec(1, 1, 4));
  SimWorker w(h.Channel(), "solo", "w0", 1);
  ASSERT_TRUE(w.Join().ok());
  ASSERT_TRUE(w.OpenSession().ok());
  absl::StatusOr<v1::Assignment> a = w.GetAssignment(true, absl::Seconds(10));
  ASSERT_TRUE(a.ok()) << a.status();

  // Empty ids.
  EXPECT_EQ(GetJob(jobs.get(), "", "").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(GetJob(jobs.get(), "no-such-job", "").error_code(), grpc::StatusCode::NOT_FOUND);
  {
    SimWorker nameless(h.Channel(), "solo", "", 5);
    grpc::Status s = nameless.Join();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    SimWorker jobless(h.Channel(), "", "w9", 5);
    EXPECT_EQ(jobless.Join().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    SimWorker zero(h.Channel(), "solo", "w9", 0);
    EXPECT_EQ(zero.Join().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // 65 MiB: over kMaxMessageBytes.
  {
    v1::KvSetRequest req;
    *req.mutable_fence() = w.fence();
    req.set_key("big");
    req.set_value(std::string(65 << 20, 'x'));
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = w.Rendezvous()->KvSet(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  // 2 MiB value: within the message limit, over kMaxValueBytes.
  {
    v1::KvSetRequest req;
    *req.mutable_fence() = w.fence();
    req.set_key("big");
    req.set_value(std::string(2 << 20, 'x'));
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_EQ(w.Rendezvous()->KvSet(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Bad fences.
  {
    v1::HeartbeatRequest req;
    *req.mutable_fence() = w.fence();
    req.mutable_fence()->set_generation(999);
    req.set_state(v1::WORKER_STATE_TRAINING);
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = w.Workers()->Heartbeat(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  }
  {
    v1::KvSetRequest req;
    *req.mutable_fence() = w.fence();
    req.mutable_fence()->mutable_worker()->set_incarnation(0);
    req.set_key("k");
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_EQ(w.Rendezvous()->KvSet(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    v1::KvSetRequest req;  // no fence at all
    req.set_key("k");
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_EQ(w.Rendezvous()->KvSet(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Timeouts: over the limit, the request's own, and the gRPC deadline.
  {
    v1::GetAssignmentRequest req;
    *req.mutable_fence() = w.fence();
    req.set_wait(true);
    req.mutable_timeout()->set_seconds(7200);
    v1::Assignment resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_EQ(w.Workers()->GetAssignment(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    v1::KvGetRequest req;
    *req.mutable_fence() = w.fence();
    req.set_key("missing");
    req.set_wait(true);
    req.mutable_timeout()->set_nanos(300 * 1000 * 1000);
    v1::KvGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    const absl::Time start = absl::Now();
    grpc::Status s = w.Rendezvous()->KvGet(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("missing"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  }
  {
    v1::KvWaitRequest req;
    *req.mutable_fence() = w.fence();
    req.add_keys("missing");
    v1::KvWaitResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "", absl::Milliseconds(300));  // default timeout 300 s; the deadline wins
    const absl::Time start = absl::Now();
    EXPECT_EQ(w.Rendezvous()->KvWait(&ctx, req, &resp).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  }
  {
    v1::BarrierRequest req;
    *req.mutable_fence() = w.fence();
    req.set_name("b");
    req.set_participants(2);
    req.mutable_timeout()->set_nanos(200 * 1000 * 1000);
    v1::BarrierResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_EQ(w.Rendezvous()->Barrier(&ctx, req, &resp).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    req.set_participants(1);
    req.set_name("b1");
    grpc::ClientContext ctx2;
    Prepare(&ctx2, "");
    EXPECT_TRUE(w.Rendezvous()->Barrier(&ctx2, req, &resp).ok());
  }
  // A second Session of the same incarnation (a reconnect after a network
  // blip) replaces the open one, whose stream ends with ABORTED; the worker
  // is not declared lost.
  {
    SimWorker twin(h.Channel(), "solo", "w0", 1);
    EXPECT_TRUE(twin.OpenSession().ok());
    const std::optional<grpc::Status> first = w.SessionEnd(absl::Seconds(5));
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->error_code(), grpc::StatusCode::ABORTED);
    v1::Job after;
    ASSERT_TRUE(GetJob(jobs.get(), "solo", "", &after).ok());
    EXPECT_EQ(after.phase(), v1::JOB_PHASE_RUNNING);
    ASSERT_TRUE(w.OpenSession().ok());  // and back again
  }
  // WatchJob from a sequence beyond the newest.
  {
    v1::WatchJobRequest req;
    req.set_job_id("solo");
    req.set_after_sequence(1000000);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    auto reader = jobs->WatchJob(&ctx, req);
    v1::JobEvent e;
    while (reader->Read(&e)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::OUT_OF_RANGE);
  }
  // Still serving.
  v1::Job job;
  ASSERT_TRUE(GetJob(jobs.get(), "solo", "", &job).ok());
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  v1::HeartbeatResponse hb;
  grpc::Status s = w.Heartbeat(&hb);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// WatchJob replays from a sequence and ends with OK after cancellation's
// PhaseChanged; CancelJob stops sessions.
TEST(GrpcServiceTest, WatchJobAndCancel) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "watched", SmallSpec(1, 1, 4));
  SimWorker w(h.Channel(), "watched", "w0", 1);
  ASSERT_TRUE(w.Join().ok());
  ASSERT_TRUE(w.OpenSession().ok());
  ASSERT_TRUE(w.GetAssignment(true, absl::Seconds(10)).ok());

  std::vector<v1::JobEvent> events;
  grpc::Status watch_status;
  grpc::ClientContext watch_ctx;
  Prepare(&watch_ctx, "", absl::Seconds(20));
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id("watched");
    req.set_after_sequence(0);
    auto reader = jobs->WatchJob(&watch_ctx, req);
    v1::JobEvent e;
    while (reader->Read(&e)) events.push_back(e);
    watch_status = reader->Finish();
  });
  absl::SleepFor(absl::Milliseconds(300));
  {
    v1::CancelJobRequest req;
    req.set_job_id("watched");
    req.set_reason("test over");
    v1::Job job;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = jobs->CancelJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(job.phase(), v1::JOB_PHASE_CANCELLED);
  }
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(events.empty());
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence(), events[i - 1].sequence() + 1);
  }
  EXPECT_TRUE(events.back().has_phase_changed());
  EXPECT_EQ(events.back().phase_changed().new_phase(), v1::JOB_PHASE_CANCELLED);
  // The session is told to stop and ends OK.
  EXPECT_TRUE(w.WaitMessage(
      [](const v1::SessionMessage& m) { return m.has_directive() && m.directive().has_stop(); },
      absl::Seconds(5)));
  std::optional<grpc::Status> end = w.SessionEnd(absl::Seconds(5));
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->ok()) << end->error_message();
}

// Tokens: none / unknown → UNAUTHENTICATED; another job's worker token or a
// worker token on an admin RPC → PERMISSION_DENIED; the admin token works.
TEST(GrpcServiceTest, Authentication) {
  Harness h("admin-secret");
  auto jobs = v1::JobService::NewStub(h.Channel());
  v1::CreateJobResponse a = CreateJob(jobs.get(), "job-a", SmallSpec(1, 1, 4), "admin-secret");
  v1::CreateJobResponse b = CreateJob(jobs.get(), "job-b", SmallSpec(1, 1, 4), "admin-secret");
  const std::string token_a = a.worker_token();
  const std::string token_b = b.worker_token();
  ASSERT_FALSE(token_a.empty());
  ASSERT_NE(token_a, token_b);

  EXPECT_EQ(GetJob(jobs.get(), "job-a", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(GetJob(jobs.get(), "job-a", "nope").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Basic admin-secret");
    v1::GetJobRequest req;
    req.set_job_id("job-a");
    v1::Job job;
    EXPECT_EQ(jobs->GetJob(&ctx, req, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(GetJob(jobs.get(), "job-a", token_b).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(GetJob(jobs.get(), "job-a", token_a).ok());
  EXPECT_TRUE(GetJob(jobs.get(), "job-a", "admin-secret").ok());
  EXPECT_TRUE(GetJob(jobs.get(), "job-b", "admin-secret").ok());
  {
    v1::CreateJobRequest req;
    req.set_job_id("job-c");
    *req.mutable_spec() = SmallSpec(1, 1, 4);
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, token_a);
    EXPECT_EQ(jobs->CreateJob(&ctx, req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, token_a);
    EXPECT_EQ(jobs->ListJobs(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx2;
    Prepare(&ctx2, "admin-secret");
    EXPECT_TRUE(jobs->ListJobs(&ctx2, req, &resp).ok());
    EXPECT_EQ(resp.jobs_size(), 2);
  }
  {
    auto checkpoints = v1::CheckpointService::NewStub(h.Channel());
    v1::CommitCheckpointRequest req;
    req.set_job_id("job-a");
    req.set_checkpoint_id("x");
    v1::CheckpointSummary resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, token_a);
    EXPECT_EQ(checkpoints->CommitCheckpoint(&ctx, req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // A worker with its job's token runs; with the other job's, it is refused.
  SimWorker good(h.Channel(), "job-a", "w0", 1, token_a);
  ASSERT_TRUE(good.Join().ok());
  ASSERT_TRUE(good.OpenSession().ok());
  ASSERT_TRUE(good.GetAssignment(true, absl::Seconds(10)).ok());
  v1::HeartbeatResponse hb;
  EXPECT_TRUE(good.Heartbeat(&hb).ok());
  SimWorker wrong(h.Channel(), "job-a", "w1", 1, token_b);
  EXPECT_EQ(wrong.Join().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(wrong.OpenSession().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  SimWorker anonymous(h.Channel(), "job-a", "w2", 1, "");
  EXPECT_EQ(anonymous.Join().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// ---------------------------------------------------------------------------
// TLS.

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A CA, a server certificate for 127.0.0.1/localhost and a client
// certificate, made with the openssl command line.
struct Pki {
  std::string dir, ca_crt, server_crt, server_key, client_crt, client_key;
};

Pki MakePki() {
  Pki p;
  p.dir = TempDir() + "/pki";
  const std::string d = p.dir;
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script = absl::StrCat(
      "set -e; mkdir -p ", d, "; cd ", d, "; ",
      "openssl req -x509 ", ec, " -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca "
      "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign; ",
      "openssl req ", ec, " -keyout server.key -out server.csr -subj /CN=localhost; ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' > "
      "server.ext; ",
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt "
      "-days 2 -extfile server.ext; ",
      "openssl req ", ec, " -keyout client.key -out client.csr -subj /CN=worker; ",
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; ",
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt "
      "-days 2 -extfile client.ext",
      " > openssl.log 2>&1");
  EXPECT_EQ(std::system(script.c_str()), 0) << ReadFile(d + "/openssl.log");
  p.ca_crt = d + "/ca.crt";
  p.server_crt = d + "/server.crt";
  p.server_key = d + "/server.key";
  p.client_crt = d + "/client.crt";
  p.client_key = d + "/client.key";
  return p;
}

grpc::Status TryGetJob(const std::string& address,
                       std::shared_ptr<grpc::ChannelCredentials> credentials) {
  auto jobs = v1::JobService::NewStub(MakeChannel(address, credentials));
  v1::GetJobRequest req;
  req.set_job_id("no-such-job");
  v1::Job job;
  grpc::ClientContext ctx;
  Prepare(&ctx, "", absl::Seconds(5));
  return jobs->GetJob(&ctx, req, &job);
}

TEST(GrpcServiceTest, TlsAndMutualTls) {
  const Pki pki = MakePki();
  {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        MakeServerCredentials(pki.server_crt, pki.server_key, "");
    ASSERT_TRUE(creds.ok()) << creds.status();
    Harness h("", "", *creds);
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFile(pki.ca_crt);
    // NOT_FOUND: the call went through TLS to the service.
    grpc::Status s = TryGetJob(h.address(), grpc::SslCredentials(tls));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_EQ(TryGetJob(h.address(), grpc::InsecureChannelCredentials()).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        MakeServerCredentials(pki.server_crt, pki.server_key, pki.ca_crt);
    ASSERT_TRUE(creds.ok()) << creds.status();
    Harness h("", "", *creds);
    grpc::SslCredentialsOptions no_cert;
    no_cert.pem_root_certs = ReadFile(pki.ca_crt);
    grpc::Status refused = TryGetJob(h.address(), grpc::SslCredentials(no_cert));
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    grpc::SslCredentialsOptions with_cert = no_cert;
    with_cert.pem_cert_chain = ReadFile(pki.client_crt);
    with_cert.pem_private_key = ReadFile(pki.client_key);
    grpc::Status s = TryGetJob(h.address(), grpc::SslCredentials(with_cert));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  EXPECT_EQ(MakeServerCredentials(pki.server_crt, "", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeServerCredentials(pki.dir + "/missing.crt", pki.server_key, "").status().code(),
            absl::StatusCode::kNotFound);
}

// Issue 14 defect 12: bad TLS files at start said "cannot listen ... (bad
// TLS files?)"; now MakeServerCredentials names the flag, the file and why.
TEST(GrpcServiceTest, BadTlsFilesAreNamedWithTheReason) {
  const Pki pki = MakePki();
  const std::string not_pem = pki.dir + "/not-pem.crt";
  std::ofstream(not_pem) << "not a certificate\n";
  struct Case {
    std::string cert, key, ca;
    absl::StatusCode code;
    std::string message;
  };
  const Case cases[] = {
      {pki.server_crt, pki.dir + "/missing.key", "", absl::StatusCode::kNotFound,
       absl::StrCat("cannot read --tls-key file '", pki.dir, "/missing.key': it does not exist")},
      {not_pem, pki.server_key, "", absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls-cert file '", not_pem, "' is not PEM")},
      {pki.server_key, pki.server_key, "", absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls-cert file '", pki.server_key, "' holds no certificate")},
      {pki.server_crt, pki.client_key, "", absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls-key file '", pki.client_key,
                    "' is not the private key of the certificate in --tls-cert file '",
                    pki.server_crt, "'")},
      {pki.server_crt, pki.server_key, not_pem, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls-client-ca file '", not_pem, "' is not PEM")},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        MakeServerCredentials(c.cert, c.key, c.ca);
    ASSERT_FALSE(creds.ok()) << c.message;
    EXPECT_EQ(creds.status().code(), c.code) << creds.status();
    EXPECT_THAT(std::string(creds.status().message()), ::testing::StartsWith(c.message));
  }
}

// ---------------------------------------------------------------------------
// Restart on the same SQLite file: the job, its generation, members and
// ranks survive; a worker reconnecting with the same fence carries on.
TEST(GrpcServiceTest, RestartOnSameStateFileKeepsGeneration) {
  const std::string path = TempDir() + "/restart-state.db";
  std::remove(path.c_str());
  auto h = std::make_unique<Harness>("", path);
  auto jobs = v1::JobService::NewStub(h->Channel());
  CreateJob(jobs.get(), "durable", SmallSpec(2, 2, 4));
  std::vector<std::unique_ptr<SimWorker>> workers;
  std::map<std::string, uint32_t> rank_of;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(
        std::make_unique<SimWorker>(h->Channel(), "durable", absl::StrCat("w", i), 40 + i));
  }
  {
    std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll(Pointers(workers), true);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_EQ(got[i]->generation(), 1u);
      rank_of[workers[i]->worker_id()] = got[i]->rank();
    }
  }

  // "kill": the server and every component go away. The open sessions end
  // UNAVAILABLE at once (reconnect), not after the server's 2 s grace.
  const absl::Time killed = absl::Now();
  h->Kill();
  for (auto& w : workers) {
    std::optional<grpc::Status> end = w->SessionEnd(absl::Seconds(5));
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE) << end->error_message();
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(1.5));
  h = std::make_unique<Harness>("", path);
  jobs = v1::JobService::NewStub(h->Channel());
  v1::Job job;
  ASSERT_TRUE(GetJob(jobs.get(), "durable", "", &job).ok());
  EXPECT_EQ(job.generation(), 1u);
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.world_size(), 2u);
  std::map<std::string, v1::Member> members = Members(jobs.get(), "durable");
  for (auto& w : workers) {
    ASSERT_EQ(members.count(w->worker_id()), 1u);
    EXPECT_EQ(members[w->worker_id()].state(), v1::MEMBER_STATE_ACTIVE);
    EXPECT_EQ(members[w->worker_id()].rank(), rank_of[w->worker_id()]);
  }
  // Workers reconnect with the same fence and carry on.
  for (auto& w : workers) {
    w->SetChannel(h->Channel());
    w->ClearMessages();
    grpc::Status s = w->OpenSession();
    ASSERT_TRUE(s.ok()) << s.error_message();
    std::optional<v1::SessionMessage> opened = w->WaitMessage(
        [](const v1::SessionMessage& m) { return m.has_opened(); }, absl::Seconds(5));
    ASSERT_TRUE(opened.has_value());
    EXPECT_EQ(opened->opened().generation(), 1u);
    std::optional<v1::SessionMessage> assignment = w->WaitMessage(
        [](const v1::SessionMessage& m) { return m.has_assignment(); }, absl::Seconds(5));
    ASSERT_TRUE(assignment.has_value());
    EXPECT_EQ(assignment->assignment().generation(), 1u);
    EXPECT_EQ(assignment->assignment().rank(), rank_of[w->worker_id()]);
    v1::HeartbeatResponse hb;
    grpc::Status beat = w->Heartbeat(&hb);
    EXPECT_TRUE(beat.ok()) << beat.error_message();
  }
  absl::SleepFor(absl::Milliseconds(500));  // a few ticks
  ASSERT_TRUE(GetJob(jobs.get(), "durable", "", &job).ok());
  EXPECT_EQ(job.generation(), 1u);
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
}

// Values far over any limit, sent over a real channel: the client gets
// INVALID_ARGUMENT naming the field, not "received initial metadata size
// exceeds limit". An invalid spec creates no checkpoint directory.
TEST(GrpcServiceTest, HugeValuesGetAShortMessageNamingTheField) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  auto create = [&](const v1::JobSpec& spec) {
    v1::CreateJobRequest req;
    req.set_job_id("big");
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    return jobs->CreateJob(&ctx, req, &resp);
  };
  v1::JobSpec spec = SmallSpec(1, 1, 4);
  spec.mutable_checkpoint()->set_directory("/" + std::string(20000, 'd'));
  grpc::Status s = create(spec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("spec.checkpoint.directory='/ddd"));
  EXPECT_THAT(s.error_message(), HasSubstr("... (20001 bytes)' must be an absolute path"));
  EXPECT_LT(s.error_message().size(), 400u);

  const std::string dir = ::testing::TempDir() + "/never-created";
  spec = SmallSpec(1, 1, 4);
  spec.mutable_checkpoint()->set_directory(dir);
  spec.mutable_data()->clear_dataset_path();
  s = create(spec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.data.dataset_path is empty"));
  EXPECT_FALSE(std::filesystem::exists(dir));

  CreateJob(jobs.get(), "solo", SmallSpec(1, 1, 4));
  SimWorker huge(h.Channel(), "solo", std::string(100000, 'w'), 5);
  s = huge.Join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // Refused by the request limits (server/limits.h) before anything else.
  EXPECT_EQ(s.error_message(), "worker.worker_id is 100000 bytes; at most 128 (kMaxWorkerIdBytes)");
  EXPECT_LT(s.error_message().size(), 300u);
}

// Two-phase checkpoint over gRPC: both ranks of a generation begin the same
// checkpoint, each reports its half of a tensor (C4-style: rank 1's half is
// shorter), the last report commits, the job's restore point moves, and the
// next generation's assignment names it. A save that dies half way (one rank
// reported, then a rank is lost) is never restored.
TEST(GrpcServiceTest, TwoPhaseCheckpointCommitsAndBecomesTheRestorePoint) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  auto checkpoints = v1::CheckpointService::NewStub(h.Channel());
  v1::JobSpec spec = SmallSpec(2, 2, 4);
  spec.mutable_checkpoint()->set_directory(::testing::TempDir() + "/ckpt");
  spec.mutable_checkpoint()->set_keep_last(3);
  CreateJob(jobs.get(), "ckpt", spec);
  SimWorker w0(h.Channel(), "ckpt", "w0", 1), w1(h.Channel(), "ckpt", "w1", 1);
  ASSERT_TRUE(w0.Join().ok() && w1.Join().ok());
  ASSERT_TRUE(w0.OpenSession().ok() && w1.OpenSession().ok());
  auto a0 = w0.GetAssignment(true, absl::Seconds(10));
  auto a1 = w1.GetAssignment(true, absl::Seconds(10));
  ASSERT_TRUE(a0.ok() && a1.ok());
  const uint64_t generation = a0->generation();

  auto begin = [&](SimWorker& w, uint64_t step, v1::BeginCheckpointResponse* out) {
    v1::BeginCheckpointRequest req;
    *req.mutable_fence() = w.fence();
    req.set_step(step);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    return checkpoints->BeginCheckpoint(&ctx, req, out);
  };
  v1::Plan plan;
  {
    v1::GetPlanRequest req;
    req.set_job_id("ckpt");
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->GetPlan(&ctx, req, &plan).ok());
  }
  // Every tensor of the plan, its elements split in halves: rank 0 the
  // first, rank 1 the second (fixtures::WritePlanShard).
  auto report = [&](SimWorker& w, const std::string& id, uint32_t rank,
                    v1::ReportShardResponse* out) {
    absl::StatusOr<v1::ReportShardRequest> shard = fixtures::WritePlanShard(
        plan, absl::StrCat(::testing::TempDir(), "/ckpt-shards/", id), static_cast<int>(rank), 2);
    if (!shard.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot write the shard");
    v1::ReportShardRequest req = *std::move(shard);
    *req.mutable_fence() = w.fence();
    req.set_checkpoint_id(id);
    req.set_data_cursor(40);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    return checkpoints->ReportShard(&ctx, req, out);
  };

  v1::BeginCheckpointResponse b0, b1;
  const grpc::Status began = begin(w0, 10, &b0);
  ASSERT_TRUE(began.ok()) << began.error_message();
  ASSERT_TRUE(begin(w1, 10, &b1).ok());
  EXPECT_EQ(b0.checkpoint_id(), b1.checkpoint_id());  // every rank gets the same id
  v1::ReportShardResponse r0, r1;
  ASSERT_TRUE(report(w0, b0.checkpoint_id(), 0, &r0).ok());
  EXPECT_EQ(r0.checkpoint().state(), v1::CHECKPOINT_STATE_PENDING);
  EXPECT_EQ(r0.checkpoint().reported_ranks(), 1u);
  grpc::Status last = report(w1, b0.checkpoint_id(), 1, &r1);
  ASSERT_TRUE(last.ok()) << last.error_message();
  EXPECT_EQ(r1.checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED)
      << r1.checkpoint().abort_reason();

  {
    v1::GetManifestRequest req;
    req.set_job_id("ckpt");  // empty checkpoint_id: the latest committed
    v1::Manifest m;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(checkpoints->GetManifest(&ctx, req, &m).ok());
    EXPECT_EQ(m.step(), 10u);
    EXPECT_EQ(m.generation(), generation);
    EXPECT_EQ(m.data_cursor(), 40u);
    ASSERT_EQ(m.tensors_size(), static_cast<int>(checkpoint::CheckpointTensors(plan).size()));
    for (const v1::SavedTensor& t : m.tensors()) EXPECT_EQ(t.pieces_size(), 2) << t.name();
  }
  v1::Job job;
  ASSERT_TRUE(GetJob(jobs.get(), "ckpt", "", &job).ok());
  EXPECT_EQ(job.last_checkpoint().step(), 10u);
  EXPECT_EQ(job.last_checkpoint().checkpoint_id(), b0.checkpoint_id());

  // A save of step 20 dies half way: rank 0 reports, then rank 1 is lost.
  v1::BeginCheckpointResponse half;
  ASSERT_TRUE(begin(w0, 20, &half).ok());
  ASSERT_TRUE(report(w0, half.checkpoint_id(), 0, &r0).ok());
  w1.KillSession();
  ASSERT_TRUE(w0.WaitMessage([](const v1::SessionMessage& m) {
                  return m.directive().has_restart_at_generation();
                }, absl::Seconds(5)).has_value());
  ASSERT_TRUE(w0.Join().ok());
  SimWorker w2(h.Channel(), "ckpt", "w2", 1);  // a replacement node
  ASSERT_TRUE(w2.Join().ok());
  auto next = w2.GetAssignment(true, absl::Seconds(10));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->generation(), generation + 1);
  EXPECT_EQ(next->restore().step(), 10u);  // never the half-done step 20
  EXPECT_EQ(next->restore().checkpoint_id(), b0.checkpoint_id());
  EXPECT_EQ(next->data_cursor(), 10u * 4);
  {
    v1::ListCheckpointsRequest req;
    req.set_job_id("ckpt");
    req.set_include_aborted(true);
    v1::ListCheckpointsResponse list;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(checkpoints->ListCheckpoints(&ctx, req, &list).ok());
    ASSERT_EQ(list.checkpoints_size(), 2);
    EXPECT_EQ(list.checkpoints(0).step(), 20u);
    EXPECT_EQ(list.checkpoints(0).state(), v1::CHECKPOINT_STATE_ABORTED);
    EXPECT_EQ(list.checkpoints(1).state(), v1::CHECKPOINT_STATE_COMMITTED);
  }
}


// Many simulated workers on threads over real loopback gRPC: 48 join a job
// with pp=2 and a global batch of 48 micro-batches, get unique ranks of
// world 48; three die at once; the 45 survivors re-join and the job re-forms
// at generation 2 with the largest world that keeps the global batch
// constant: dp must divide 48 and 2*dp <= 45, so dp 16, world 32, 13 spares.
TEST(GrpcServiceTest, ManyWorkersFormLoseThreeAndReform) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  v1::JobSpec spec = SmallSpec(32, 48, 48);
  spec.mutable_parallel()->set_pp(2);
  CreateJob(jobs.get(), "many", spec);
  constexpr int kWorkers = 48;
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<SimWorker>(h.Channel(), "many", absl::StrCat("node", i), 100 + i));
  }
  auto join_all = [&](const std::vector<int>& which, bool open_session) {
    std::vector<SimWorker*> chosen;
    for (int i : which) chosen.push_back(workers[i].get());
    std::vector<absl::StatusOr<v1::Assignment>> joined = JoinAll(chosen, open_session, absl::Seconds(20));
    std::vector<absl::StatusOr<v1::Assignment>> got(kWorkers, absl::UnknownError("unset"));
    for (size_t k = 0; k < which.size(); ++k) got[which[k]] = std::move(joined[k]);
    return got;
  };
  std::vector<int> everyone(kWorkers);
  for (int i = 0; i < kWorkers; ++i) everyone[i] = i;
  auto first = join_all(everyone, true);
  std::set<uint32_t> ranks;
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(first[i].ok()) << i << ": " << first[i].status();
    EXPECT_EQ(first[i]->generation(), 1u);
    EXPECT_EQ(first[i]->world_size(), 48u);
    EXPECT_EQ(first[i]->gradient_accumulation_steps(), 2u);  // 48 / (1 * 24)
    ranks.insert(first[i]->rank());
  }
  EXPECT_EQ(ranks.size(), 48u);
  EXPECT_EQ(*ranks.rbegin(), 47u);

  for (int i : {5, 17, 40}) workers[i]->KillSession();
  // All three are noticed at once; the first loss ends generation 1.
  v1::Job job;
  for (int tries = 0; tries < 100; ++tries) {
    v1::ListMembersRequest req;
    req.set_job_id("many");
    v1::ListMembersResponse members;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->ListMembers(&ctx, req, &members).ok());
    int lost = 0;
    for (const v1::Member& m : members.members()) lost += m.state() == v1::MEMBER_STATE_LOST;
    if (lost == 3) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Read after the losses (a job read before them would show generation 1).
  ASSERT_TRUE(GetJob(jobs.get(), "many", "", &job).ok());
  EXPECT_EQ(job.generation(), 2u);
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RECOVERING);

  std::vector<int> survivors;
  for (int i = 0; i < kWorkers; ++i) {
    if (i != 5 && i != 17 && i != 40) survivors.push_back(i);
  }
  auto second = join_all(survivors, false);
  ranks.clear();
  int spares = 0;
  for (int i : survivors) {
    ASSERT_TRUE(second[i].ok()) << i << ": " << second[i].status();
    EXPECT_EQ(second[i]->generation(), 2u);
    EXPECT_EQ(second[i]->world_size(), 32u);
    if (second[i]->spare()) {
      ++spares;
    } else {
      ranks.insert(second[i]->rank());
      EXPECT_EQ(second[i]->gradient_accumulation_steps(), 3u);  // 48 / 16
    }
  }
  EXPECT_EQ(ranks.size(), 32u);
  EXPECT_EQ(spares, 13);
  ASSERT_TRUE(GetJob(jobs.get(), "many", "", &job).ok());
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.dp(), 16u);
}

}  // namespace
}  // namespace shardline::server

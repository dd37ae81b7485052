// The RPCs external jobs added (coordinator.proto WorkerService.CompleteJob,
// RendezvousService.KvNumKeys) and the plan-less answers, over the
// in-process server with authentication: each acts only as the member
// token's own identity, limits come first, errors as the proto says.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/rpc/coordinator_server.h"
#include "testing/grpc_test_util.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;
using testing::Harness;
using ::testing::HasSubstr;
using testing::JoinAll;
using testing::Prepare;
using testing::SimWorker;

constexpr char kAdmin[] = "admin-token-0123456789";

v1::JobSpec External(uint32_t min_workers, uint32_t max_workers) {
  v1::JobSpec spec;
  spec.set_name("ext");
  spec.mutable_external()->set_framework("torchrun");
  spec.mutable_elastic()->set_min_workers(min_workers);
  spec.mutable_elastic()->set_max_workers(max_workers);
  *spec.mutable_elastic()->mutable_heartbeat_interval() = TimeUtil::SecondsToDuration(1);
  *spec.mutable_elastic()->mutable_heartbeat_timeout() = TimeUtil::SecondsToDuration(30);
  return spec;
}

std::string CreateJob(Harness& h, const std::string& job_id, const v1::JobSpec& spec) {
  return testing::CreateJobAs(h.Channel(), kAdmin, job_id, spec).worker_token();
}

grpc::Status CompleteAs(Harness& h, const v1::Fence& fence, const std::string& token,
                        const std::string& reason, v1::Job* job) {
  auto workers = v1::WorkerService::NewStub(h.Channel());
  v1::CompleteJobRequest req;
  *req.mutable_fence() = fence;
  req.set_reason(reason);
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  return workers->CompleteJob(&ctx, req, job);
}

grpc::Status NumKeysAs(Harness& h, const v1::Fence& fence, const std::string& token,
                       const std::string& scope, uint64_t* n) {
  auto rendezvous = v1::RendezvousService::NewStub(h.Channel());
  v1::KvNumKeysRequest req;
  *req.mutable_fence() = fence;
  req.set_scope(scope);
  v1::KvNumKeysResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  grpc::Status s = rendezvous->KvNumKeys(&ctx, req, &resp);
  *n = resp.num_keys();
  return s;
}

grpc::Status Set(Harness& h, const SimWorker& w, const std::string& scope, const std::string& key) {
  auto rendezvous = v1::RendezvousService::NewStub(h.Channel());
  v1::KvSetRequest req;
  *req.mutable_fence() = w.fence();
  req.set_scope(scope);
  req.set_key(key);
  req.set_value("v");
  v1::KvSetResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, w.member_token(), absl::Seconds(10));
  return rendezvous->KvSet(&ctx, req, &resp);
}

grpc::Status Add(Harness& h, const SimWorker& w, const std::string& scope, const std::string& key) {
  auto rendezvous = v1::RendezvousService::NewStub(h.Channel());
  v1::KvAddRequest req;
  *req.mutable_fence() = w.fence();
  req.set_scope(scope);
  req.set_key(key);
  req.set_delta(1);
  v1::KvAddResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, w.member_token(), absl::Seconds(10));
  return rendezvous->KvAdd(&ctx, req, &resp);
}

TEST(ExternalRpcTest, KvNumKeysCountsPerScopeAndActsOnlyAsItself) {
  Harness h(kAdmin);
  const std::string job_token = CreateJob(h, "ext", External(2, 2));
  SimWorker a(h.Channel(), "ext", "a", 11, job_token);
  SimWorker b(h.Channel(), "ext", "b", 22, job_token);
  std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll({&a, &b}, /*open_session=*/true);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[0]->world_size(), 2u);
  ASSERT_TRUE(Set(h, a, "s", "k1").ok());
  ASSERT_TRUE(Set(h, b, "s", "k2").ok());
  ASSERT_TRUE(Add(h, a, "s", "counter").ok());  // counters count
  ASSERT_TRUE(Set(h, a, "s", "k1").ok());       // an overwrite is one key
  ASSERT_TRUE(Set(h, a, "t", "k1").ok());
  uint64_t n = 99;
  grpc::Status s = NumKeysAs(h, a.fence(), a.member_token(), "s", &n);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(n, 3u);
  ASSERT_TRUE(NumKeysAs(h, b.fence(), b.member_token(), "t", &n).ok());
  EXPECT_EQ(n, 1u);
  ASSERT_TRUE(NumKeysAs(h, b.fence(), b.member_token(), "", &n).ok());
  EXPECT_EQ(n, 0u);
  // The admin may; A acting as B may not; nor the job token.
  ASSERT_TRUE(NumKeysAs(h, b.fence(), kAdmin, "s", &n).ok());
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(NumKeysAs(h, b.fence(), a.member_token(), "s", &n).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(NumKeysAs(h, a.fence(), job_token, "s", &n).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The scope's limit; a stale generation.
  s = NumKeysAs(h, a.fence(), a.member_token(), std::string(257, 's'), &n);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("kMaxScopeBytes"));
  v1::Fence stale = a.fence();
  stale.set_generation(2);
  EXPECT_EQ(NumKeysAs(h, stale, a.member_token(), "s", &n).error_code(), grpc::StatusCode::ABORTED);
}

TEST(ExternalRpcTest, CompleteJobStopsEveryoneAndAbortsBlockedRendezvousCalls) {
  Harness h(kAdmin);
  const std::string job_token = CreateJob(h, "ext", External(2, 2));
  SimWorker a(h.Channel(), "ext", "a", 11, job_token);
  SimWorker b(h.Channel(), "ext", "b", 22, job_token);
  std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll({&a, &b}, /*open_session=*/true);
  ASSERT_TRUE(got[0].ok() && got[1].ok());
  v1::Job job;
  // Limits first, then credentials: A may not complete as B.
  grpc::Status s = CompleteAs(h, a.fence(), a.member_token(), std::string(1025, 'r'), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("kMaxReasonBytes"));
  s = CompleteAs(h, b.fence(), a.member_token(), "", &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  s = CompleteAs(h, b.fence(), job_token, "", &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // B waits for a key nobody sets.
  grpc::Status waited;
  std::thread waiter([&] {
    auto rendezvous = v1::RendezvousService::NewStub(h.Channel());
    v1::KvGetRequest req;
    *req.mutable_fence() = b.fence();
    req.set_key("never");
    req.set_wait(true);
    *req.mutable_timeout() = TimeUtil::SecondsToDuration(60);
    v1::KvGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, b.member_token(), absl::Seconds(90));
    waited = rendezvous->KvGet(&ctx, req, &resp);
  });
  // Polled: the wait is registered once the rendezvous counts it.
  for (int i = 0; i < 1000 && h.rendezvous().GetUsage("ext", 1).waiters == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(h.rendezvous().GetUsage("ext", 1).waiters, 1);
  s = CompleteAs(h, a.fence(), a.member_token(), "training finished", &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED);
  EXPECT_EQ(job.phase_reason(), "completed by 'a': training finished");
  waiter.join();
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::ABORTED) << waited.error_message();
  // It hears that the job is gone, not "re-join" (a finished job refuses
  // JoinJob).
  EXPECT_THAT(waited.error_message(), HasSubstr("has been dropped (cancelled, completed or failed)"));
  EXPECT_THAT(waited.error_message(), ::testing::Not(HasSubstr("re-join")));
  // Both sessions get STOP.
  for (SimWorker* w : {&a, &b}) {
    auto stop = w->WaitMessage([](const v1::SessionMessage& m) { return m.directive().has_stop(); },
                               absl::Seconds(10));
    ASSERT_TRUE(stop.has_value()) << w->worker_id();
    EXPECT_EQ(stop->directive().stop().phase(), v1::JOB_PHASE_COMPLETED);
  }
  // Repeated (by the admin, as B): unchanged.
  v1::Job again;
  s = CompleteAs(h, b.fence(), kAdmin, "other", &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.phase_reason(), "completed by 'a': training finished");
}

TEST(ExternalRpcTest, GptJobsRefuseCompleteJobAndExternalJobsHaveNoPlan) {
  Harness h(kAdmin);
  const std::string gpt_token = CreateJob(h, "gpt", testing::SmallSpec(1, 1, 4));
  SimWorker g(h.Channel(), "gpt", "g", 1, gpt_token);
  ASSERT_TRUE(JoinAll({&g}, /*open_session=*/false)[0].ok());
  v1::Job job;
  grpc::Status s = CompleteAs(h, g.fence(), g.member_token(), "", &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("is a GPT training job"));

  const std::string ext_token = CreateJob(h, "ext", External(1, 1));
  SimWorker e(h.Channel(), "ext", "e", 1, ext_token);
  ASSERT_TRUE(JoinAll({&e}, /*open_session=*/false)[0].ok());
  auto jobs = v1::JobService::NewStub(h.Channel());
  v1::GetPlanRequest plan_req;
  plan_req.set_job_id("ext");
  v1::Plan plan;
  grpc::ClientContext ctx;
  Prepare(&ctx, kAdmin);
  s = jobs->GetPlan(&ctx, plan_req, &plan);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("job ext is an external job (spec.external): it has no plan"));
  auto checkpoints = v1::CheckpointService::NewStub(h.Channel());
  v1::BeginCheckpointRequest begin;
  *begin.mutable_fence() = e.fence();
  begin.set_step(1);
  v1::BeginCheckpointResponse begun;
  grpc::ClientContext ctx2;
  Prepare(&ctx2, e.member_token());
  s = checkpoints->BeginCheckpoint(&ctx2, begin, &begun);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("it has no plan"));
}

}  // namespace
}  // namespace shardline::server

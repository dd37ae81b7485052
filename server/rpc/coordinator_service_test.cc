// CoordinatorService.GetStatus on a single coordinator, and the serving
// gate (ServerOptions::gate) every call of the v1 services passes.
#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/grpc_test_util.h"

namespace shardline::server {
namespace {

using testing::Harness;
using testing::HarnessOptions;
using testing::Prepare;

constexpr char kAdmin[] = "admin-token-0123456789";

TEST(CoordinatorServiceTest, SingleCoordinatorListsItselfAsTheLeader) {
  HarnessOptions options;
  options.admin_token = kAdmin;
  Harness harness(options);
  auto stub = v1::CoordinatorService::NewStub(harness.Channel());
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    v1::CoordinatorStatus status;
    EXPECT_EQ(stub->GetStatus(&ctx, v1::GetStatusRequest(), &status).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, "wrong-token-0123456789");
    v1::CoordinatorStatus status;
    EXPECT_EQ(stub->GetStatus(&ctx, v1::GetStatusRequest(), &status).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, kAdmin);
  v1::CoordinatorStatus status;
  grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &status);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(status.state(), "memory");
  EXPECT_EQ(status.leader_address(), harness.address());
  ASSERT_EQ(status.replicas_size(), 1);
  EXPECT_EQ(status.replicas(0).address(), harness.address());
  EXPECT_EQ(status.replicas(0).role(), v1::REPLICA_ROLE_LEADER);
  EXPECT_GT(status.replicas(0).leader_since().seconds(), 0);
  EXPECT_EQ(status.etcd_size(), 0);
}

TEST(CoordinatorServiceTest, ClosedGateRefusesEveryCallAndStreamWithItsStatus) {
  std::atomic<bool> open{false};
  HarnessOptions options;
  options.gate = [&open]() -> absl::Status {
    if (open.load()) return absl::OkStatus();
    return absl::UnavailableError("not the leader: test gate");
  };
  Harness harness(options);
  auto jobs = v1::JobService::NewStub(harness.Channel());
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    v1::ListJobsResponse resp;
    grpc::Status s = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(s.error_message(), "not the leader: test gate");
  }
  {
    // A stream is refused at its start.
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    v1::WatchJobRequest req;
    req.set_job_id("j");
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = jobs->WatchJob(&ctx, req);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(s.error_message(), "not the leader: test gate");
  }
  {
    // GetStatus is not gated: an operator asks a replica that does not lead.
    auto status = v1::CoordinatorService::NewStub(harness.Channel());
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    v1::CoordinatorStatus answer;
    EXPECT_TRUE(status->GetStatus(&ctx, v1::GetStatusRequest(), &answer).ok());
  }
  open.store(true);
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  v1::ListJobsResponse resp;
  EXPECT_TRUE(jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp).ok());
}

}  // namespace
}  // namespace shardline::server

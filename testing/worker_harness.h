// A real in-process coordinator for worker tests: the coordinator's
// components (memory store) behind a gRPC server on 127.0.0.1:0, like
// server/rpc/coordinator_server_test.cc's Harness, plus job creation.
//
//   CoordinatorHarness h(/*admin_token=*/"secret");
//   std::string token = h.CreateJob("job", spec);   // the job's worker token
//   ... agents connect to h.address() ...
#ifndef SHARDLINE_TESTING_WORKER_HARNESS_H_
#define SHARDLINE_TESTING_WORKER_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/checkpoint_registry.h"
#include "common/clock.h"
#include "server/coordinator.h"
#include "server/rpc/coordinator_server.h"
#include "testing/grpc_test_util.h"
#include "metrics/metrics.h"
#include "server/rendezvous.h"
#include "server/state_store.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::worker::testing {

namespace v1 = ::shardline::v1;

// The spec the coordinator's own gRPC tests use.
using ::shardline::server::testing::SmallSpec;

class CoordinatorHarness {
 public:
  explicit CoordinatorHarness(const std::string& admin_token = "") : admin_token_(admin_token) {
    store_ = server::NewMemoryStore();
    coordinator_ = std::make_unique<server::Coordinator>(&clock_, store_.get());
    absl::Status recovered = coordinator_->Recover();
    EXPECT_TRUE(recovered.ok()) << recovered;
    rendezvous_ = std::make_unique<server::Rendezvous>(&clock_);
    absl::StatusOr<std::unique_ptr<server::CheckpointRegistry>> registry =
        server::CheckpointRegistry::Create(store_.get(), &clock_);
    EXPECT_TRUE(registry.ok()) << registry.status();
    checkpoints_ = *std::move(registry);
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.admin_token = admin_token;
    absl::StatusOr<std::unique_ptr<server::CoordinatorServer>> server =
        server::CoordinatorServer::Start(
            {coordinator_.get(), rendezvous_.get(), checkpoints_.get(), nullptr}, options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  ~CoordinatorHarness() {
    server_.reset();
    checkpoints_.reset();
    rendezvous_.reset();
    coordinator_.reset();
    store_.reset();
  }

  const std::string& address() const { return server_->address(); }
  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }

  // Creates a job with the admin token; returns its worker token.
  std::string CreateJob(const std::string& job_id, const v1::JobSpec& spec) {
    auto jobs = v1::JobService::NewStub(Channel());
    v1::CreateJobRequest req;
    req.set_job_id(job_id);
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    Authorize(&ctx);
    grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.worker_token();
  }

  // worker_id -> member, with the admin token.
  std::map<std::string, v1::Member> Members(const std::string& job_id) {
    auto jobs = v1::JobService::NewStub(Channel());
    v1::ListMembersRequest req;
    req.set_job_id(job_id);
    v1::ListMembersResponse resp;
    grpc::ClientContext ctx;
    Authorize(&ctx);
    grpc::Status s = jobs->ListMembers(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::map<std::string, v1::Member> out;
    for (const v1::Member& m : resp.members()) out[m.worker_id()] = m;
    return out;
  }

 private:
  void Authorize(grpc::ClientContext* ctx) const {
    if (!admin_token_.empty()) ctx->AddMetadata("authorization", "Bearer " + admin_token_);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  }

  const std::string admin_token_;
  RealClock clock_;
  std::unique_ptr<server::StateStore> store_;
  std::unique_ptr<server::Coordinator> coordinator_;
  std::unique_ptr<server::Rendezvous> rendezvous_;
  std::unique_ptr<server::CheckpointRegistry> checkpoints_;
  std::unique_ptr<server::CoordinatorServer> server_;
};

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_TESTING_WORKER_HARNESS_H_

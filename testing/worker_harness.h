// A real in-process coordinator for worker tests: the coordinator's
// components (memory store) behind a gRPC server on 127.0.0.1:0, like
// server/rpc/coordinator_server_test.cc's Harness, plus job creation, talked
// to with the client library (client/coordinator_client.h).
//
//   CoordinatorHarness h(/*admin_token=*/"secret");
//   std::string token = h.CreateJob("job", spec);   // the job's worker token
//   ... agents use h.Clients(token) ...
#ifndef SHARDLINE_TESTING_WORKER_HARNESS_H_
#define SHARDLINE_TESTING_WORKER_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
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
  // Options for this coordinator with `token` and a 5 s deadline.
  client::ConnectionOptions Connection(const std::string& token = "") const {
    client::ConnectionOptions o;
    o.address = address();
    o.token = token;
    o.timeout = absl::Seconds(5);
    return o;
  }
  // The client library's gRPC clients of this coordinator.
  client::CoordinatorClients Clients(const std::string& token = "") const {
    return client::GrpcCoordinatorClients(Channel(), Connection(token));
  }

  // Creates a job with the admin token; returns its worker token.
  std::string CreateJob(const std::string& job_id, const v1::JobSpec& spec) {
    v1::CreateJobRequest req;
    req.set_job_id(job_id);
    *req.mutable_spec() = spec;
    absl::StatusOr<v1::CreateJobResponse> resp = Clients(admin_token_).jobs->CreateJob(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_token() : "";
  }

  // worker_id -> member, with the admin token.
  std::map<std::string, v1::Member> Members(const std::string& job_id) {
    v1::ListMembersRequest req;
    req.set_job_id(job_id);
    absl::StatusOr<v1::ListMembersResponse> resp = Clients(admin_token_).jobs->ListMembers(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    std::map<std::string, v1::Member> out;
    if (!resp.ok()) return out;
    for (const v1::Member& m : resp->members()) out[m.worker_id()] = m;
    return out;
  }

  // Blocks until `n` rendezvous calls of (job_id, generation) wait in the
  // coordinator (KvGet with wait, KvWait, Barrier); false after
  // `real_timeout`, a guard against hanging.
  bool AwaitRendezvousWaiters(const std::string& job_id, uint64_t generation, int64_t n,
                              absl::Duration real_timeout = absl::Seconds(30)) const {
    const absl::Time deadline = absl::Now() + real_timeout;
    while (rendezvous_->GetUsage(job_id, generation).waiters < n) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }

 private:
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

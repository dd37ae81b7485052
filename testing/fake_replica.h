// FakeReplica: a test-only coordinator replica on 127.0.0.1:0 (a real gRPC
// server) for the client library's failover tests, until and besides the
// real replica server (server/replica.h). It plays the part of
// proto/shardline/v1/coordinator.proto "Replicas" that clients see:
//   * leading: serves JobService.GetJob (the job named, phase RUNNING,
//     phase_reason = this replica's name; NOT_FOUND for job "missing"), JobService.WatchJob (one
//     event, then OK), RendezvousService.KvAdd / KvSet (one in-memory table);
//   * following a leader: every one of those answers UNAVAILABLE "not the
//     leader: the leader is HOST:PORT; ..." with trailing metadata
//     kLeaderMetadataKey (common/grpc_status.h) = HOST:PORT;
//   * knowing no leader: UNAVAILABLE "not the leader: no leader is known
//     (election in progress)" without metadata;
//   * stepping down mid-call (StepDownAfterWrites): a write is done, then
//     answered UNAVAILABLE without metadata, as a leader whose lease ran out
//     while answering: the client cannot tell whether it was done;
//   * cancelling mid-call (CancelAfterWrites): a write is done, then the
//     call ends CANCELLED, as a leader stepping down cancels the calls
//     still open after its shutdown grace;
//   * CoordinatorService.GetStatus in every role: the status SetStatus set;
//   * every other RPC (WorkerService, CheckpointService, the rest), through a
//     generic fallback: the follower's or no-leader answer above when not
//     leading, UNIMPLEMENTED when leading.
//
//   FakeReplica a("a"), b("b");
//   a.Follow(b.address());
//   b.Lead();
//   ... a client given a.address() + "," + b.address() ...
//   EXPECT_EQ(a.Calls("GetJob"), 1);
//
// Thread-safety: thread-safe; roles may change while calls run.
#ifndef SHARDLINE_TESTING_FAKE_REPLICA_H_
#define SHARDLINE_TESTING_FAKE_REPLICA_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::client::testing {

namespace v1 = ::shardline::v1;

class FakeReplica final : public v1::JobService::Service,
                          public v1::RendezvousService::Service,
                          public v1::CoordinatorService::Service {
 public:
  // Starts serving on 127.0.0.1:0, knowing no leader. `name` shows in
  // GetJob's phase_reason.
  explicit FakeReplica(std::string name) : name_(std::move(name)) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(static_cast<v1::JobService::Service*>(this));
    builder.RegisterService(static_cast<v1::RendezvousService::Service*>(this));
    builder.RegisterService(static_cast<v1::CoordinatorService::Service*>(this));
    builder.RegisterCallbackGenericService(&fallback_);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~FakeReplica() override { Stop(); }

  // Stops serving (connections are refused afterwards). Idempotent.
  void Stop() {
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
  }

  const std::string& address() const { return address_; }
  const std::string& name() const { return name_; }

  void Lead() ABSL_LOCKS_EXCLUDED(mu_) { SetRole(Role::kLeader, ""); }
  void Follow(std::string leader) ABSL_LOCKS_EXCLUDED(mu_) {
    SetRole(Role::kFollower, std::move(leader));
  }
  void NoLeader() ABSL_LOCKS_EXCLUDED(mu_) { SetRole(Role::kNoLeader, ""); }
  void StepDownAfterWrites() ABSL_LOCKS_EXCLUDED(mu_) { SetRole(Role::kStepsDown, ""); }
  void CancelAfterWrites() ABSL_LOCKS_EXCLUDED(mu_) { SetRole(Role::kCancels, ""); }

  void SetStatus(v1::CoordinatorStatus status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }

  // Calls of `method` ("GetJob", "KvAdd", ...) received, in any role.
  int Calls(const std::string& method) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }
  // The counter `key` of the KvAdd table (every add done, whatever came back).
  int64_t Counter(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = counters_.find(key);
    return it == counters_.end() ? 0 : it->second;
  }

  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* out) override {
    if (grpc::Status s = Admit("GetJob", context); !s.ok()) return s;
    if (request->job_id() == "missing") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job missing");
    }
    out->set_job_id(request->job_id());
    out->set_phase(v1::JOB_PHASE_RUNNING);
    out->set_phase_reason(name_);
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    if (grpc::Status s = Admit("WatchJob", context); !s.ok()) return s;
    v1::JobEvent event;
    event.set_sequence(request->after_sequence() + 1);
    event.set_job_id(request->job_id());
    writer->Write(event);
    return grpc::Status::OK;
  }

  grpc::Status KvAdd(grpc::ServerContext* context, const v1::KvAddRequest* request,
                     v1::KvAddResponse* out) override {
    if (grpc::Status s = Admit("KvAdd", context); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    out->set_value(counters_[request->key()] += request->delta());
    return AfterWriteLocked();
  }

  grpc::Status KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request,
                     v1::KvSetResponse*) override {
    if (grpc::Status s = Admit("KvSet", context); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    values_[request->key()] = request->value();
    return AfterWriteLocked();
  }

  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::CoordinatorStatus* out) override {
    absl::MutexLock lock(&mu_);
    ++calls_["GetStatus"];
    *out = status_;
    return grpc::Status::OK;
  }

 private:
  enum class Role { kLeader, kFollower, kNoLeader, kStepsDown, kCancels };

  // Every method no service above registers: counted under its name
  // ("JoinJob"), answered as Admit says (UNIMPLEMENTED when leading).
  class Fallback final : public grpc::CallbackGenericService {
   public:
    explicit Fallback(FakeReplica* replica) : replica_(replica) {}
    grpc::ServerGenericBidiReactor* CreateReactor(
        grpc::GenericCallbackServerContext* context) override {
      class Reactor final : public grpc::ServerGenericBidiReactor {
       public:
        explicit Reactor(const grpc::Status& status) { Finish(status); }
        void OnDone() override { delete this; }
      };
      const std::string& full = context->method();  // "/shardline.v1.WorkerService/JoinJob"
      grpc::Status status = replica_->Admit(full.substr(full.rfind('/') + 1), context);
      if (status.ok()) {
        status = grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              absl::StrCat("the fake replica does not serve ", full));
      }
      return new Reactor(status);
    }

   private:
    FakeReplica* const replica_;
  };

  void SetRole(Role role, std::string leader) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    role_ = role;
    leader_ = std::move(leader);
  }

  // Counts the call; the follower's answer when not leading (a write of a
  // replica stepping down is done first: AfterWriteLocked).
  grpc::Status Admit(const std::string& method, grpc::ServerContextBase* context)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++calls_[method];
    switch (role_) {
      case Role::kLeader:
      case Role::kStepsDown:
      case Role::kCancels:
        return grpc::Status::OK;
      case Role::kFollower:
        context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("not the leader: the leader is ", leader_,
                                         "; clients follow the shardline-leader metadata"));
      case Role::kNoLeader:
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "not the leader: no leader is known (election in progress)");
    }
    return grpc::Status::OK;
  }

  grpc::Status AfterWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (role_ == Role::kCancels) return grpc::Status(grpc::StatusCode::CANCELLED, "Cancelled");
    if (role_ != Role::kStepsDown) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the coordinator lost its leader lease and stopped serving");
  }

  const std::string name_;
  Fallback fallback_{this};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  mutable absl::Mutex mu_;
  Role role_ ABSL_GUARDED_BY(mu_) = Role::kNoLeader;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  v1::CoordinatorStatus status_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTING_FAKE_REPLICA_H_

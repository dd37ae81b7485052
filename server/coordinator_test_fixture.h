// The coordinator on a fake clock and an in-memory store, with the calls a
// test makes as workers and operators (server/coordinator_test.cc,
// server/external_job_test.cc). Test-only.
//
//   class MyTest : public CoordinatorFixture {};
//   TEST_F(MyTest, X) { Create(Spec(2, 2)); ASSERT_TRUE(Join("a").ok()); ... }
//
// Thread-safety: as a gtest fixture, one test thread (the Coordinator it
// holds is thread-safe itself).
#ifndef SHARDLINE_SERVER_COORDINATOR_TEST_FIXTURE_H_
#define SHARDLINE_SERVER_COORDINATOR_TEST_FIXTURE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "server/state_store.h"
#include "testing/job_specs.h"

namespace shardline::server {

class CoordinatorFixture : public ::testing::Test {
 protected:
  CoordinatorFixture() : store_(NewMemoryStore()) { Restart(); }

  // A new coordinator and checkpoint registry (the owner of the unusable
  // marks) on the same store, like a restarted process.
  void Restart() {
    coordinator_ = std::make_unique<Coordinator>(&clock_, store_.get());
    ASSERT_TRUE(coordinator_->Recover().ok());
    absl::StatusOr<std::unique_ptr<CheckpointRegistry>> registry =
        CheckpointRegistry::Create(store_.get(), &clock_);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
  }

  // fixtures::SmallSpec (testing/job_specs.h) with `pp` stages, heartbeats
  // every 1 s, a 10 s heartbeat timeout and a 5 s last call.
  static v1::JobSpec Spec(int min_workers, int max_workers, int pp = 1, int global_batch = 12) {
    v1::JobSpec spec =
        fixtures::SmallSpec(min_workers, max_workers, global_batch, absl::Seconds(10));
    spec.mutable_parallel()->set_pp(pp);
    v1::ElasticPolicy* e = spec.mutable_elastic();
    *e->mutable_heartbeat_interval() = google::protobuf::util::TimeUtil::SecondsToDuration(1);
    *e->mutable_last_call() = google::protobuf::util::TimeUtil::SecondsToDuration(5);
    return spec;
  }

  void Create(const v1::JobSpec& spec, const std::string& id = "job") {
    v1::CreateJobRequest r;
    r.set_job_id(id);
    *r.mutable_spec() = spec;
    auto created = coordinator_->CreateJob(r);
    ASSERT_TRUE(created.ok()) << created.status();
    EXPECT_EQ(created->job().phase(), v1::JOB_PHASE_PENDING);
    EXPECT_EQ(created->job().generation(), 1u);
    EXPECT_EQ(created->worker_token().size(), 32u);
    last_token_ = created->worker_token();
  }

  static v1::WorkerIdentity Id(const std::string& worker, uint64_t incarnation = 7,
                               const std::string& job = "job") {
    v1::WorkerIdentity w;
    w.set_job_id(job);
    w.set_worker_id(worker);
    w.set_incarnation(incarnation);
    return w;
  }

  static v1::Fence Fence(const std::string& worker, uint64_t generation, uint64_t incarnation = 7) {
    v1::Fence f;
    *f.mutable_worker() = Id(worker, incarnation);
    f.set_generation(generation);
    return f;
  }

  absl::StatusOr<v1::JoinJobResponse> Join(const std::string& worker, uint64_t incarnation = 7) {
    v1::JoinJobRequest r;
    *r.mutable_worker() = Id(worker, incarnation);
    r.set_host("host-" + worker);
    r.set_device("cpu");
    return coordinator_->JoinJob(r);
  }

  absl::StatusOr<v1::HeartbeatResponse> Beat(const std::string& worker, uint64_t generation,
                                             uint64_t step = 0,
                                             v1::WorkerState state = v1::WORKER_STATE_TRAINING,
                                             uint64_t incarnation = 7) {
    v1::HeartbeatRequest r;
    *r.mutable_fence() = Fence(worker, generation, incarnation);
    r.set_step(step);
    r.set_state(state);
    return coordinator_->Heartbeat(r);
  }

  absl::Status Leave(const std::string& worker, uint64_t generation,
                     std::vector<GenerationEnded>* ended, const std::string& reason = "done") {
    v1::LeaveJobRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_reason(reason);
    return coordinator_->LeaveJob(r, ended);
  }

  absl::StatusOr<v1::Job> Complete(const std::string& worker, uint64_t generation,
                                   const std::string& reason, std::vector<GenerationEnded>* ended) {
    v1::CompleteJobRequest r;
    *r.mutable_fence() = Fence(worker, generation);
    r.set_reason(reason);
    return coordinator_->CompleteJob(r, ended);
  }

  v1::Job Job() { return *coordinator_->GetJob("job"); }

  std::map<std::string, v1::Member> Members() {
    std::map<std::string, v1::Member> out;
    const absl::StatusOr<v1::ListMembersResponse> list = coordinator_->ListMembers("job");
    EXPECT_TRUE(list.ok()) << list.status();
    for (const v1::Member& m : list->members()) out[m.worker_id()] = m;
    return out;
  }

  v1::Assignment AssignmentOf(const std::string& worker, uint64_t generation) {
    auto a = coordinator_->GetAssignment(Fence(worker, generation), false, absl::Now());
    EXPECT_TRUE(a.ok()) << worker << ": " << a.status();
    return a.ok() ? *a : v1::Assignment{};
  }

  FakeClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CheckpointRegistry> registry_;
  std::string last_token_;  // the worker token of the last Create
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_TEST_FIXTURE_H_

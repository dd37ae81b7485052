// The v1 API surface later work implements: every service has the RPCs the
// design names, streams stream, and messages round-trip.
#include <set>

#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::v1 {
namespace {

const google::protobuf::ServiceDescriptor* Service(const std::string& name) {
  return google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      "shardline.v1." + name);
}

std::set<std::string> Methods(const std::string& service) {
  std::set<std::string> out;
  const auto* s = Service(service);
  for (int i = 0; s != nullptr && i < s->method_count(); ++i) out.insert(s->method(i)->name());
  return out;
}

TEST(ApiTest, ServicesHaveTheDesignedRpcs) {
  EXPECT_EQ(Methods("JobService"),
            (std::set<std::string>{"CreateJob", "GetJob", "ListJobs", "CancelJob", "ListMembers",
                                   "DrainWorker", "GetPlan", "GetShardOwner", "WatchJob", "WhatIf"}));
  EXPECT_EQ(Methods("WorkerService"),
            (std::set<std::string>{"JoinJob", "Session", "GetAssignment", "Heartbeat",
                                   "ReportError", "LeaveJob", "CompleteJob"}));
  EXPECT_EQ(Methods("RendezvousService"),
            (std::set<std::string>{"KvSet", "KvGet", "KvAdd", "KvCompareAndSet", "KvWait",
                                   "KvDelete", "KvNumKeys", "Barrier"}));
  EXPECT_EQ(Methods("CheckpointService"),
            (std::set<std::string>{"BeginCheckpoint", "ReportShard", "CommitCheckpoint",
                                   "AbortCheckpoint", "ListCheckpoints", "GetManifest"}));
}

TEST(ApiTest, SessionAndWatchAreServerStreams) {
  const auto* session = Service("WorkerService")->FindMethodByName("Session");
  EXPECT_TRUE(session->server_streaming());
  const auto* watch = Service("JobService")->FindMethodByName("WatchJob");
  EXPECT_TRUE(watch->server_streaming());
  EXPECT_FALSE(Service("WorkerService")->FindMethodByName("Heartbeat")->server_streaming());
}

// The Session stream outlives generations (a survivor keeps it across
// re-joins), so it names the worker's identity rather than a generation.
TEST(ApiTest, EveryWorkerCallAfterJoinCarriesAFence) {
  for (const std::string service : {"WorkerService", "RendezvousService"}) {
    const auto* s = Service(service);
    for (int i = 0; i < s->method_count(); ++i) {
      const auto* m = s->method(i);
      if (m->name() == "JoinJob") continue;
      if (m->name() == "Session") {
        EXPECT_NE(m->input_type()->FindFieldByName("worker"), nullptr);
        continue;
      }
      EXPECT_NE(m->input_type()->FindFieldByName("fence"), nullptr) << m->full_name();
    }
  }
}

TEST(ApiTest, FenceRoundTrips) {
  Fence fence;
  fence.mutable_worker()->set_job_id("job-1");
  fence.mutable_worker()->set_worker_id("node3:cuda:1");
  fence.mutable_worker()->set_incarnation(0xfeedfacecafebeefULL);
  fence.set_generation(7);
  Fence parsed;
  ASSERT_TRUE(parsed.ParseFromString(fence.SerializeAsString()));
  EXPECT_EQ(parsed.worker().incarnation(), 0xfeedfacecafebeefULL);
  EXPECT_EQ(parsed.generation(), 7u);
  EXPECT_EQ(parsed.worker().worker_id(), "node3:cuda:1");
}

}  // namespace
}  // namespace shardline::v1

// The client library's gRPC clients against a real in-process coordinator
// (testing/worker_harness.h): what goes on the wire (token, fence, waits),
// how statuses come back (client::FromGrpcStatus), streams and
// cancellation.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/worker_harness.h"

namespace shardline::client {
namespace {

using ::testing::HasSubstr;
using worker::testing::CoordinatorHarness;
using worker::testing::SmallSpec;

google::protobuf::Duration Proto(absl::Duration d) {
  google::protobuf::Duration out;
  out.set_seconds(absl::ToInt64Seconds(d));
  return out;
}

v1::JoinJobRequest Join(const std::string& job, const std::string& worker_id) {
  v1::JoinJobRequest req;
  req.mutable_worker()->set_job_id(job);
  req.mutable_worker()->set_worker_id(worker_id);
  req.mutable_worker()->set_incarnation(11);
  req.set_host("localhost");
  req.set_device("cpu");
  return req;
}

// A joined worker with an open session (the coordinator counts it alive
// only while its stream is open).
struct Joined {
  v1::Fence fence;
  std::unique_ptr<SessionStream> session;
};

Joined JoinAndOpen(CoordinatorClients& clients, const std::string& job,
                   const std::string& worker_id) {
  Joined out;
  absl::StatusOr<v1::JoinJobResponse> joined = clients.workers->JoinJob(Join(job, worker_id));
  EXPECT_TRUE(joined.ok()) << joined.status();
  *out.fence.mutable_worker() = Join(job, worker_id).worker();
  out.fence.set_generation(joined.ok() ? joined->generation() : 0);
  v1::SessionRequest session;
  *session.mutable_worker() = out.fence.worker();
  out.session = clients.workers->Session(session);
  v1::SessionMessage first;
  EXPECT_TRUE(out.session->Read(&first));
  EXPECT_TRUE(first.has_opened());
  return out;
}

TEST(GrpcWorkerClientTest, JoinSessionAssignmentHeartbeatLeave) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  Joined w = JoinAndOpen(clients, "job", "w0");
  EXPECT_EQ(w.fence.generation(), 1u);

  v1::GetAssignmentRequest ask;
  *ask.mutable_fence() = w.fence;
  ask.set_wait(true);
  *ask.mutable_timeout() = Proto(absl::Seconds(10));
  absl::StatusOr<v1::Assignment> a = clients.workers->GetAssignment(ask);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank(), 0u);
  EXPECT_EQ(a->world_size(), 1u);
  v1::SessionMessage pushed;
  ASSERT_TRUE(w.session->Read(&pushed));  // the coordinator also sends it on the stream
  EXPECT_EQ(pushed.assignment().generation(), 1u);

  v1::HeartbeatRequest beat;
  *beat.mutable_fence() = w.fence;
  beat.set_state(v1::WORKER_STATE_READY);
  absl::StatusOr<v1::HeartbeatResponse> answer =
      clients.workers->Heartbeat(beat, absl::Seconds(5));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->directive().has_continue_training());

  v1::LeaveJobRequest leave;
  *leave.mutable_fence() = w.fence;
  leave.set_reason("test done");
  ASSERT_TRUE(clients.workers->LeaveJob(leave).ok());
  v1::SessionMessage rest;
  while (w.session->Read(&rest)) {
  }
  EXPECT_TRUE(w.session->Finish().ok());  // ends OK after LeaveJob
}

TEST(GrpcWorkerClientTest, StaleFenceIsAborted) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  Joined w = JoinAndOpen(clients, "job", "w0");
  v1::HeartbeatRequest beat;
  *beat.mutable_fence() = w.fence;
  beat.mutable_fence()->set_generation(7);
  beat.set_state(v1::WORKER_STATE_WAITING);
  absl::StatusOr<v1::HeartbeatResponse> answer =
      clients.workers->Heartbeat(beat, absl::Seconds(5));
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kAborted) << answer.status();
}

TEST(GrpcWorkerClientTest, WrongOrMissingTokenSaysWhichFlag) {
  CoordinatorHarness h("admin-secret");
  const std::string worker_token = h.CreateJob("job", SmallSpec(1, 1, 1));
  ASSERT_FALSE(worker_token.empty());
  {
    absl::StatusOr<v1::JoinJobResponse> r =
        h.Clients("wrong-token").workers->JoinJob(Join("job", "w0"));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("--token"));
    EXPECT_THAT(r.status().message(), HasSubstr("SHARDLINE_TOKEN"));
  }
  {
    absl::StatusOr<v1::JoinJobResponse> r = h.Clients().workers->JoinJob(Join("job", "w0"));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("requires a token"));
    EXPECT_THAT(r.status().message(), HasSubstr("--token"));
  }
  {
    CoordinatorClients clients = h.Clients(worker_token);
    Joined w = JoinAndOpen(clients, "job", "w0");
    v1::GetAssignmentRequest ask;
    *ask.mutable_fence() = w.fence;
    ask.set_wait(true);
    *ask.mutable_timeout() = Proto(absl::Seconds(10));
    absl::StatusOr<v1::Assignment> a = clients.workers->GetAssignment(ask);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->rank(), 0u);
    // A worker token may not make admin calls.
    EXPECT_EQ(clients.jobs->ListJobs(v1::ListJobsRequest()).status().code(),
              absl::StatusCode::kPermissionDenied);
    // JoinJob's member token went to every client of the bundle: the
    // rendezvous client acts as this worker (the job token alone may not).
    ASSERT_NE(clients.workers, nullptr);
    v1::KvSetRequest set;
    *set.mutable_fence() = w.fence;
    set.set_key("k");
    set.set_value("v");
    absl::Status with_member = clients.rendezvous->KvSet(set, nullptr).status();
    EXPECT_TRUE(with_member.ok()) << with_member;
    CoordinatorClients job_token_only = h.Clients(worker_token);
    absl::Status with_job_token = job_token_only.rendezvous->KvSet(set, nullptr).status();
    EXPECT_EQ(with_job_token.code(), absl::StatusCode::kPermissionDenied) << with_job_token;
    EXPECT_THAT(with_job_token.message(), HasSubstr("member_token"));
  }
}

TEST(GrpcWorkerClientTest, UnreachableCoordinatorSaysWhichFlag) {
  ConnectionOptions o;
  o.address = "127.0.0.1:1";
  o.address_source = "--coordinator";
  o.timeout = absl::Seconds(5);
  absl::StatusOr<CoordinatorClients> clients = ConnectCoordinator(o);
  ASSERT_TRUE(clients.ok()) << clients.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JoinJobResponse> r = clients->workers->JoinJob(Join("job", "w0"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(r.status().message(), HasSubstr("--coordinator"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // refused at once, not at the deadline
}

TEST(GrpcWorkerClientTest, SessionCancelledBeforeItsFirstReadEndsCancelled) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  ASSERT_TRUE(clients.workers->JoinJob(Join("job", "w0")).ok());
  v1::SessionRequest req;
  *req.mutable_worker() = Join("job", "w0").worker();
  std::unique_ptr<SessionStream> session = clients.workers->Session(req);
  session->Cancel();
  v1::SessionMessage m;
  EXPECT_FALSE(session->Read(&m));
  EXPECT_EQ(session->Finish().code(), absl::StatusCode::kCancelled);
}

TEST(GrpcRendezvousClientTest, KeysCountersSwapsWaitsAndBarriers) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  Joined w = JoinAndOpen(clients, "job", "w0");
  RendezvousClient& kv = *clients.rendezvous;

  v1::KvSetRequest set;
  *set.mutable_fence() = w.fence;
  set.set_scope("dp/0");
  set.set_key("addr");
  set.set_value("10.0.0.1:4000");
  ASSERT_TRUE(kv.KvSet(set, nullptr).ok());

  v1::KvGetRequest get;
  *get.mutable_fence() = w.fence;
  get.set_scope("dp/0");
  get.set_key("addr");
  absl::StatusOr<v1::KvGetResponse> got = kv.KvGet(get, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->found());
  EXPECT_EQ(got->value(), "10.0.0.1:4000");

  v1::KvAddRequest add;
  *add.mutable_fence() = w.fence;
  add.set_scope("dp/0");
  add.set_key("n");
  add.set_delta(4);
  EXPECT_EQ(kv.KvAdd(add, nullptr)->value(), 4);
  add.set_key("addr");
  EXPECT_EQ(kv.KvAdd(add, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);

  v1::KvCompareAndSetRequest cas;
  *cas.mutable_fence() = w.fence;
  cas.set_scope("dp/0");
  cas.set_key("leader");
  cas.set_desired("w0");
  absl::StatusOr<v1::KvCompareAndSetResponse> swapped = kv.KvCompareAndSet(cas, nullptr);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(swapped->swapped());
  EXPECT_FALSE(kv.KvCompareAndSet(cas, nullptr)->swapped());

  v1::KvWaitRequest wait;
  *wait.mutable_fence() = w.fence;
  wait.set_scope("dp/0");
  wait.add_keys("addr");
  wait.add_keys("leader");
  *wait.mutable_timeout() = Proto(absl::Seconds(5));
  EXPECT_TRUE(kv.KvWait(wait, nullptr).ok());

  v1::KvDeleteRequest del;
  *del.mutable_fence() = w.fence;
  del.set_scope("dp/0");
  del.set_key("addr");
  EXPECT_TRUE(kv.KvDelete(del, nullptr)->deleted());
  EXPECT_FALSE(kv.KvGet(get, nullptr)->found());

  v1::BarrierRequest barrier;
  *barrier.mutable_fence() = w.fence;
  barrier.set_scope("dp/0");
  barrier.set_name("start");
  barrier.set_participants(1);
  *barrier.mutable_timeout() = Proto(absl::Seconds(5));
  absl::StatusOr<v1::BarrierResponse> arrived = kv.Barrier(barrier, nullptr);
  ASSERT_TRUE(arrived.ok()) << arrived.status();
}

TEST(GrpcRendezvousClientTest, WaitThatTimesOutOnTheCoordinatorNamesTheKey) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  Joined w = JoinAndOpen(clients, "job", "w0");
  v1::KvGetRequest get;
  *get.mutable_fence() = w.fence;
  get.set_scope("dp/0");
  get.set_key("never");
  get.set_wait(true);
  get.mutable_timeout()->set_nanos(200'000'000);
  absl::StatusOr<v1::KvGetResponse> got = clients.rendezvous->KvGet(get, nullptr);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("never"));
}

// A cancelled token ends a call blocked on the coordinator at once, and a
// call on a cancelled token is never sent.
TEST(GrpcRendezvousClientTest, CancelTokenEndsABlockedCall) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  Joined w = JoinAndOpen(clients, "job", "w0");
  v1::KvGetRequest get;
  *get.mutable_fence() = w.fence;
  get.set_scope("dp/0");
  get.set_key("never");
  get.set_wait(true);
  *get.mutable_timeout() = Proto(absl::Seconds(60));
  CancelToken token;
  absl::StatusOr<v1::KvGetResponse> got;
  std::thread getter([&] { got = clients.rendezvous->KvGet(get, &token); });
  ASSERT_TRUE(h.AwaitRendezvousWaiters("job", w.fence.generation(), 1));  // blocked there
  const absl::Time cancelled = absl::Now();
  token.Cancel("generation over");
  getter.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(10));  // not the 60 s wait
  absl::StatusOr<v1::KvGetResponse> later = clients.rendezvous->KvGet(get, &token);
  EXPECT_EQ(later.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(later.status().message(), HasSubstr("generation over"));
}

TEST(GrpcCheckpointClientTest, ErrorsComeBackWithTheirCodes) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  absl::StatusOr<v1::ListCheckpointsResponse> listed =
      clients.checkpoints->ListCheckpoints([] {
        v1::ListCheckpointsRequest r;
        r.set_job_id("job");
        return r;
      }());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->checkpoints_size(), 0);
  v1::GetManifestRequest manifest;
  manifest.set_job_id("job");
  EXPECT_EQ(clients.checkpoints->GetManifest(manifest).status().code(),
            absl::StatusCode::kNotFound);
  Joined w = JoinAndOpen(clients, "job", "w0");
  v1::BeginCheckpointRequest begin;
  *begin.mutable_fence() = w.fence;
  begin.set_step(1);
  // SmallSpec has no checkpoint directory (and the job is not running).
  EXPECT_EQ(clients.checkpoints->BeginCheckpoint(begin).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GrpcJobClientTest, GetListMembersAndWatch) {
  CoordinatorHarness h;
  h.CreateJob("job", SmallSpec(1, 1, 1));
  CoordinatorClients clients = h.Clients();
  Joined w = JoinAndOpen(clients, "job", "w0");
  v1::GetJobRequest get;
  get.set_job_id("job");
  absl::StatusOr<v1::Job> job = clients.jobs->GetJob(get);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id(), "job");
  v1::ListMembersRequest members;
  members.set_job_id("job");
  absl::StatusOr<v1::ListMembersResponse> listed = clients.jobs->ListMembers(members);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->members_size(), 1);
  EXPECT_EQ(listed->members(0).worker_id(), "w0");
  get.set_job_id("nope");
  EXPECT_EQ(clients.jobs->GetJob(get).status().code(), absl::StatusCode::kNotFound);

  // WatchJob from the start: the first event, then stop by returning false.
  v1::WatchJobRequest watch;
  watch.set_job_id("job");
  watch.set_after_sequence(0);
  int events = 0;
  const absl::Status watched = clients.jobs->WatchJob(watch, [&](const v1::JobEvent&) {
    ++events;
    return false;
  });
  EXPECT_TRUE(watched.ok()) << watched;
  EXPECT_EQ(events, 1);
}

}  // namespace
}  // namespace shardline::client

// Credentials end to end over the in-process server (coordinator.proto
// "Authentication"): a worker acts only as itself (member tokens), an
// unknown token is answered without the coordinator's lock, and the state
// file keeps only hashes of worker and member tokens.
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "server/rpc/coordinator_server.h"
#include "server/state_store.h"
#include "testing/grpc_test_util.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;
using testing::Harness;
using testing::JoinAll;
using testing::Prepare;
using testing::SimWorker;
using testing::SmallSpec;

constexpr char kAdmin[] = "admin-token-0123456789";

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

v1::CreateJobResponse CreateJob(Harness& h, const std::string& job_id, const v1::JobSpec& spec) {
  return testing::CreateJobAs(h.Channel(), kAdmin, job_id, spec);
}

std::map<std::string, v1::Member> Members(Harness& h, const std::string& job_id,
                                          const std::string& token) {
  auto jobs = v1::JobService::NewStub(h.Channel());
  v1::ListMembersRequest req;
  req.set_job_id(job_id);
  v1::ListMembersResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token);
  grpc::Status s = jobs->ListMembers(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::map<std::string, v1::Member> out;
  for (const v1::Member& m : resp.members()) out[m.worker_id()] = m;
  return out;
}

grpc::Status LeaveAs(Harness& h, const v1::Fence& fence, const std::string& token) {
  auto workers = v1::WorkerService::NewStub(h.Channel());
  v1::LeaveJobRequest req;
  *req.mutable_fence() = fence;
  req.set_reason("evil");
  v1::LeaveJobResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  return workers->LeaveJob(&ctx, req, &resp);
}

grpc::Status HeartbeatAs(Harness& h, const v1::Fence& fence, const std::string& token) {
  auto workers = v1::WorkerService::NewStub(h.Channel());
  v1::HeartbeatRequest req;
  *req.mutable_fence() = fence;
  req.set_state(v1::WORKER_STATE_TRAINING);
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  return workers->Heartbeat(&ctx, req, &resp);
}

grpc::Status KvSetAs(Harness& h, const v1::Fence& fence, const std::string& token) {
  auto rendezvous = v1::RendezvousService::NewStub(h.Channel());
  v1::KvSetRequest req;
  *req.mutable_fence() = fence;
  req.set_key("k");
  req.set_value("v");
  v1::KvSetResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  return rendezvous->KvSet(&ctx, req, &resp);
}

grpc::Status JoinAs(Harness& h, const v1::WorkerIdentity& who, const std::string& token,
                    v1::JoinJobResponse* resp) {
  auto workers = v1::WorkerService::NewStub(h.Channel());
  v1::JoinJobRequest req;
  *req.mutable_worker() = who;
  req.set_device("cpu");
  grpc::ClientContext ctx;
  Prepare(&ctx, token, absl::Seconds(10));
  return workers->JoinJob(&ctx, req, resp);
}

// Worker A learns worker B's incarnation from ListMembers (any token of the
// job may read it) and tries to act as B: with its own member token or with
// the job token, every call that acts is PERMISSION_DENIED and B stays
// ACTIVE. (Before member tokens, A's LeaveJob with B's fence succeeded and
// ended the generation.)
TEST(AuthServerTest, AWorkerCannotActAsAnother) {
  Harness h(kAdmin);
  const std::string job_token = CreateJob(h, "pair", SmallSpec(2, 2, 4)).worker_token();
  ASSERT_EQ(job_token.size(), 32u);
  SimWorker a(h.Channel(), "pair", "a", 11, job_token);
  SimWorker b(h.Channel(), "pair", "b", 22, job_token);
  std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll({&a, &b}, /*open_session=*/true);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  const std::string a_token = a.member_token();
  ASSERT_EQ(a_token.size(), 64u);
  ASSERT_EQ(b.member_token().size(), 64u);
  ASSERT_NE(a_token, b.member_token());

  // What A can see of B: everything it needs to forge B's fence.
  std::map<std::string, v1::Member> seen = Members(h, "pair", a_token);
  ASSERT_EQ(seen.count("b"), 1u);
  v1::Fence b_fence;
  b_fence.mutable_worker()->set_job_id("pair");
  b_fence.mutable_worker()->set_worker_id("b");
  b_fence.mutable_worker()->set_incarnation(seen["b"].incarnation());
  b_fence.set_generation(seen["b"].generation());
  EXPECT_EQ(Members(h, "pair", job_token).size(), 2u);  // the job token reads too

  for (const std::string& token : {a_token, job_token}) {
    SCOPED_TRACE(token == a_token ? "A's member token" : "the job token");
    grpc::Status left = LeaveAs(h, b_fence, token);
    EXPECT_EQ(left.error_code(), grpc::StatusCode::PERMISSION_DENIED) << left.error_message();
    grpc::Status beat = HeartbeatAs(h, b_fence, token);
    EXPECT_EQ(beat.error_code(), grpc::StatusCode::PERMISSION_DENIED) << beat.error_message();
    grpc::Status set = KvSetAs(h, b_fence, token);
    EXPECT_EQ(set.error_code(), grpc::StatusCode::PERMISSION_DENIED) << set.error_message();
    v1::JoinJobResponse joined;
    grpc::Status rejoin = JoinAs(h, b_fence.worker(), token, &joined);
    EXPECT_EQ(rejoin.error_code(), grpc::StatusCode::PERMISSION_DENIED) << rejoin.error_message();
    EXPECT_EQ(joined.member_token(), "");
  }
  // The messages say what to use and whom the token belongs to.
  EXPECT_THAT(LeaveAs(h, b_fence, a_token).error_message(),
              HasSubstr("the member token of worker 'a' (incarnation 11) of job 'pair' may act "
                        "only as itself, not as worker 'b' (incarnation 22)"));
  EXPECT_THAT(LeaveAs(h, b_fence, job_token).error_message(),
              HasSubstr("needs the member_token that JoinJob returned"));
  v1::JoinJobResponse ignored;
  EXPECT_THAT(JoinAs(h, b_fence.worker(), job_token, &ignored).error_message(),
              HasSubstr("re-join with this incarnation's member token"));

  // B is untouched and carries on; A acts as itself.
  std::map<std::string, v1::Member> now = Members(h, "pair", kAdmin);
  EXPECT_EQ(now["b"].state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(now["a"].state(), v1::MEMBER_STATE_ACTIVE);
  v1::HeartbeatResponse hb;
  grpc::Status b_beat = b.Heartbeat(&hb);
  EXPECT_TRUE(b_beat.ok()) << b_beat.error_message();
  EXPECT_TRUE(KvSetAs(h, b.fence(), b.member_token()).ok());
  // The admin keeps every right.
  EXPECT_TRUE(HeartbeatAs(h, b_fence, kAdmin).ok());
  // A re-join of B with its own member token is fine and hands out nothing.
  v1::JoinJobResponse rejoined;
  grpc::Status own = JoinAs(h, b.identity(), b.member_token(), &rejoined);
  EXPECT_TRUE(own.ok()) << own.error_message();
  EXPECT_EQ(rejoined.member_token(), "");
  grpc::Status a_left = LeaveAs(h, a.fence(), a_token);
  EXPECT_TRUE(a_left.ok()) << a_left.error_message();
  EXPECT_EQ(Members(h, "pair", kAdmin)["a"].state(), v1::MEMBER_STATE_LEFT);
}

// A new incarnation of a worker_id (a restarted process) joins with the job
// token and gets its own member token; the replaced one's stops working.
TEST(AuthServerTest, NewIncarnationReplacesTheOldMemberToken) {
  Harness h(kAdmin);
  const std::string job_token = CreateJob(h, "solo", SmallSpec(1, 1, 4)).worker_token();
  SimWorker first(h.Channel(), "solo", "w0", 1, job_token);
  ASSERT_TRUE(first.Join().ok());
  const std::string old_token = first.member_token();
  ASSERT_FALSE(old_token.empty());
  SimWorker second(h.Channel(), "solo", "w0", 2, job_token);
  grpc::Status joined = second.Join();
  ASSERT_TRUE(joined.ok()) << joined.error_message();
  ASSERT_FALSE(second.member_token().empty());
  EXPECT_NE(second.member_token(), old_token);
  EXPECT_EQ(HeartbeatAs(h, first.fence(), old_token).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Without authentication nothing is issued or checked.
  Harness open("");
  CreateJob(open, "free", SmallSpec(1, 1, 4));
  SimWorker w(open.Channel(), "free", "w0", 1);
  ASSERT_TRUE(w.Join().ok());
  EXPECT_EQ(w.member_token(), "");
}

// Token lookup never takes the coordinator's lock: with that lock held by
// another thread, a call with an unknown token (and one with another job's
// token) is still answered. Before, the lookup asked the coordinator for
// every job's token under its lock, so the call waited for the lock (here:
// until its deadline).
TEST(AuthServerTest, UnknownTokenIsAnsweredWhileTheCoordinatorLockIsHeld) {
  Harness h(kAdmin);
  const std::string token_a = CreateJob(h, "held", SmallSpec(1, 1, 4)).worker_token();
  const std::string token_b = CreateJob(h, "other", SmallSpec(1, 1, 4)).worker_token();
  v1::JoinJobRequest join;
  join.mutable_worker()->set_job_id("held");
  join.mutable_worker()->set_worker_id("w0");
  join.mutable_worker()->set_incarnation(1);
  ASSERT_TRUE(h.coordinator().JoinJob(join).ok());
  // A session waker runs with the coordinator's lock held (coordinator.h
  // OpenSession): once armed, it blocks there until released.
  std::atomic<bool> armed{false};
  absl::Notification entered, release;
  absl::StatusOr<uint64_t> session =
      h.coordinator().OpenSession(join.worker(), [&] {
        if (armed.exchange(false)) {
          entered.Notify();
          release.WaitForNotification();
        }
      });
  ASSERT_TRUE(session.ok()) << session.status();
  armed.store(true);
  std::thread holder([&] {
    v1::CancelJobRequest cancel;
    cancel.set_job_id("held");
    EXPECT_TRUE(h.coordinator().CancelJob(cancel).ok());  // queues STOP: the waker runs
  });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));

  v1::Fence fence;
  *fence.mutable_worker() = join.worker();
  fence.set_generation(1);
  grpc::Status unknown = HeartbeatAs(h, fence, "not-a-token-of-any-job");
  grpc::Status other = HeartbeatAs(h, fence, token_b);
  grpc::Status job_token = HeartbeatAs(h, fence, token_a);  // a read-only credential
  release.Notify();
  holder.join();
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED) << unknown.error_message();
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other.error_message();
  EXPECT_EQ(job_token.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << job_token.error_message();
}

// The state file keeps hashes only: neither the worker token nor a member
// token appears in state.db or its -wal; a restarted coordinator accepts
// both (by their hashes).
TEST(AuthServerTest, StateFileKeepsOnlyHashesAndTheyWorkAfterARestart) {
  const std::string path = TempDir() + "/hashes-state.db";
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  auto h = std::make_unique<Harness>(kAdmin, path);
  const std::string job_token = CreateJob(*h, "durable", SmallSpec(1, 1, 4)).worker_token();
  SimWorker w(h->Channel(), "durable", "w0", 5, job_token);
  std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll({&w}, /*open_session=*/true);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  const std::string member_token = w.member_token();
  ASSERT_FALSE(member_token.empty());
  const std::string bytes = ReadBytes(path) + ReadBytes(path + "-wal");
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(bytes.find(job_token), std::string::npos);
  EXPECT_EQ(bytes.find(member_token), std::string::npos);
  EXPECT_NE(bytes.find(Sha256Hex(job_token)), std::string::npos);
  EXPECT_NE(bytes.find(Sha256Hex(member_token)), std::string::npos);

  h->Kill();
  w.SessionEnd(absl::Seconds(5));
  h = std::make_unique<Harness>(kAdmin, path);
  w.SetChannel(h->Channel());
  grpc::Status beat = HeartbeatAs(*h, w.fence(), member_token);
  EXPECT_TRUE(beat.ok()) << beat.error_message();
  EXPECT_EQ(Members(*h, "durable", job_token).size(), 1u);
  // The job token still admits only joins and reads.
  EXPECT_EQ(HeartbeatAs(*h, w.fence(), job_token).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A CreateJob repeated after the restart returns the job without a token.
  v1::CreateJobResponse again = CreateJob(*h, "durable", SmallSpec(1, 1, 4));
  EXPECT_EQ(again.job().job_id(), "durable");
  EXPECT_EQ(again.worker_token(), "");
}

// A state file of an older version keeps plain-text worker tokens (records
// of kind "token"): the coordinator replaces them by their hashes at start,
// and the token keeps working.
TEST(AuthServerTest, PlainTextTokensOfAnOlderStateFileAreMigratedToHashes) {
  const std::string path = TempDir() + "/old-format-state.db";
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  const std::string plain = "0123456789abcdef0123456789abcdef";
  {
    // An old-format file: the job record, and its token in plain text.
    absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    RealClock clock;
    Coordinator c(&clock, store->get());
    ASSERT_TRUE(c.Recover().ok());
    v1::CreateJobRequest req;
    req.set_job_id("legacy");
    *req.mutable_spec() = SmallSpec(1, 1, 4);
    ASSERT_TRUE(c.CreateJob(req).ok());
    ASSERT_TRUE((*store)
                    ->Write({Mutation::Delete("token_sha256", "legacy"),
                             Mutation::Put("token", "legacy", plain)})
                    .ok());
  }
  {
    Harness h(kAdmin, path);
    auto jobs = v1::JobService::NewStub(h.Channel());
    v1::GetJobRequest req;
    req.set_job_id("legacy");
    v1::Job job;
    grpc::ClientContext ctx;
    Prepare(&ctx, plain);
    grpc::Status s = jobs->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    SimWorker w(h.Channel(), "legacy", "w0", 1, plain);
    grpc::Status joined = w.Join();
    EXPECT_TRUE(joined.ok()) << joined.error_message();
    EXPECT_FALSE(w.member_token().empty());
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<Record>> old_rows = (*store)->Scan("token");
  ASSERT_TRUE(old_rows.ok());
  EXPECT_TRUE(old_rows->empty());
  absl::StatusOr<std::vector<Record>> hashes = (*store)->Scan("token_sha256");
  ASSERT_TRUE(hashes.ok());
  ASSERT_EQ(hashes->size(), 1u);
  EXPECT_EQ((*hashes)[0].key, "legacy");
  EXPECT_EQ((*hashes)[0].value, Sha256Hex(plain));
  // Nor is the plain text left anywhere in the files (state_store.cc also
  // sets secure_delete, so deleted rows are zeroed whatever the page layout).
  store->reset();
  for (const std::string& file : {path, path + "-wal"}) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.find(plain), std::string::npos) << file << " still holds the plain token";
  }
}

}  // namespace
}  // namespace shardline::server

// shardctl's coordinator commands against an in-process fake coordinator on
// loopback (a real gRPC server, hand-written service fakes): what is sent
// (auth metadata, request fields, paging), what is printed, and how every
// failure reads and which exit code it gets. `whatif` and the members'
// progress columns also against the real coordinator in-process
// (testing/grpc_test_util.h), whose WhatIf answers by the formation rules.
#include "client/shardctl/job_commands.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/grpc_test_util.h"

namespace shardline::shardctl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Args = std::vector<std::string>;

// The three services shardctl calls, over one in-memory job table. Checks the
// bearer token like the coordinator: when admin_token is set, every call
// must carry "authorization: Bearer <admin_token>".
class FakeCoordinator final : public v1::JobService::Service,
                              public v1::CheckpointService::Service,
                              public v1::RendezvousService::Service {
 public:
  std::string admin_token;
  absl::Duration get_job_delay = absl::ZeroDuration();
  // Page size the fake uses whatever the client asks, to exercise paging.
  int page_size = 2;

  absl::Mutex mu;
  int cancel_calls ABSL_GUARDED_BY(mu) = 0;  // CancelJob requests seen
  std::map<std::string, v1::Job> jobs ABSL_GUARDED_BY(mu);
  std::vector<std::string> order ABSL_GUARDED_BY(mu);  // creation order
  std::vector<v1::Member> members ABSL_GUARDED_BY(mu);
  std::optional<v1::Plan> plan ABSL_GUARDED_BY(mu);
  std::vector<v1::CheckpointSummary> checkpoints ABSL_GUARDED_BY(mu);
  std::vector<v1::JobEvent> events ABSL_GUARDED_BY(mu);
  // Sent to every watcher after the replay, as if they happened during it.
  std::vector<v1::JobEvent> live_events ABSL_GUARDED_BY(mu);
  bool end_watch = true;
  std::map<std::string, std::string> kv ABSL_GUARDED_BY(mu);  // scope + "/" + key
  // What the last calls carried.
  std::vector<std::string> authorizations ABSL_GUARDED_BY(mu);
  v1::CreateJobRequest last_create ABSL_GUARDED_BY(mu);
  v1::ListJobsRequest last_list ABSL_GUARDED_BY(mu);
  v1::GetShardOwnerRequest last_owner ABSL_GUARDED_BY(mu);
  v1::ListCheckpointsRequest last_checkpoints ABSL_GUARDED_BY(mu);
  v1::KvGetRequest last_kv ABSL_GUARDED_BY(mu);
  std::optional<v1::WatchJobRequest> last_watch ABSL_GUARDED_BY(mu);

  grpc::Status CreateJob(grpc::ServerContext* c, const v1::CreateJobRequest* r,
                         v1::CreateJobResponse* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    last_create = *r;
    if (r->spec().model().num_heads() == 3) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "spec.model.num_heads=3 does not divide spec.model.hidden_size=128"};
    }
    const std::string id = r->job_id().empty() ? "job-1" : r->job_id();
    if (jobs.count(id)) {
      // Like the coordinator: the same spec again returns the job and its token.
      if (jobs[id].spec().SerializeAsString() != r->spec().SerializeAsString()) {
        return {grpc::StatusCode::ALREADY_EXISTS, "job " + id + " exists with a different spec"};
      }
      *out->mutable_job() = jobs[id];
      out->set_worker_token(admin_token.empty() ? "" : "worker-token-" + id);
      return grpc::Status::OK;
    }
    v1::Job& job = jobs[id];
    order.push_back(id);
    job.set_job_id(id);
    *job.mutable_spec() = r->spec();
    job.set_phase(v1::JOB_PHASE_PENDING);
    job.set_generation(1);
    job.mutable_create_time()->set_seconds(1714557600);
    *out->mutable_job() = job;
    out->set_worker_token(admin_token.empty() ? "" : "worker-token-" + id);
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* c, const v1::GetJobRequest* r, v1::Job* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    if (get_job_delay > absl::ZeroDuration()) absl::SleepFor(get_job_delay);
    absl::MutexLock lock(&mu);
    auto it = jobs.find(r->job_id());
    if (it == jobs.end()) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
    *out = it->second;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* c, const v1::ListJobsRequest* r,
                        v1::ListJobsResponse* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    last_list = *r;
    const size_t start = r->page_token().empty() ? 0 : std::stoul(r->page_token());
    std::vector<std::string> newest(order.rbegin(), order.rend());
    size_t i = start;
    for (; i < newest.size() && out->jobs_size() < page_size; ++i) {
      *out->add_jobs() = jobs[newest[i]];
    }
    if (i < newest.size()) out->set_next_page_token(std::to_string(i));
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* c, const v1::CancelJobRequest* r,
                         v1::Job* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    auto it = jobs.find(r->job_id());
    if (it == jobs.end()) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
    ++cancel_calls;
    // As the coordinator: a cancelled job is answered as it is.
    if (it->second.phase() != v1::JOB_PHASE_CANCELLED) {
      it->second.set_phase(v1::JOB_PHASE_CANCELLED);
      it->second.set_phase_reason(r->reason());
    }
    *out = it->second;
    return grpc::Status::OK;
  }

  // As the coordinator: with a checkpoint directory, an ACTIVE member drains
  // after the next checkpoint; otherwise it leaves at once.
  grpc::Status DrainWorker(grpc::ServerContext* c, const v1::DrainWorkerRequest* r,
                           v1::Member* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    auto job = jobs.find(r->job_id());
    if (job == jobs.end()) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
    for (v1::Member& m : members) {
      if (m.worker_id() != r->worker_id()) continue;
      const std::string reason = r->reason().empty() ? "operator request" : r->reason();
      if (job->second.spec().checkpoint().directory().empty()) {
        m.set_state(v1::MEMBER_STATE_LEFT);
        m.clear_rank();
        m.set_detail("drained: " + reason);
      } else {
        m.set_drain_reason(reason);
        m.set_detail("draining (" + reason + "): leaves after the next checkpoint commits");
      }
      *out = m;
      return grpc::Status::OK;
    }
    return {grpc::StatusCode::NOT_FOUND, "no worker '" + r->worker_id() + "'"};
  }

  grpc::Status ListMembers(grpc::ServerContext* c, const v1::ListMembersRequest* r,
                           v1::ListMembersResponse* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    auto it = jobs.find(r->job_id());
    if (it == jobs.end()) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
    out->set_generation(it->second.generation());
    for (const v1::Member& m : members) *out->add_members() = m;
    return grpc::Status::OK;
  }

  grpc::Status GetPlan(grpc::ServerContext* c, const v1::GetPlanRequest* r,
                       v1::Plan* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    if (!jobs.count(r->job_id())) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
    if (!plan) return {grpc::StatusCode::FAILED_PRECONDITION, "job " + r->job_id() + " is PENDING"};
    *out = *plan;
    return grpc::Status::OK;
  }

  grpc::Status GetShardOwner(grpc::ServerContext* c, const v1::GetShardOwnerRequest* r,
                             v1::GetShardOwnerResponse* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    last_owner = *r;
    if (r->parameter() != "layers.0.mlp.fc1.weight") {
      return {grpc::StatusCode::NOT_FOUND, "no parameter '" + r->parameter() +
                                               "'; close names: layers.0.mlp.fc1.weight"};
    }
    out->set_parameter(r->parameter());
    out->set_numel(65536);
    v1::ShardHolder* h = out->add_holders();
    h->set_kind(v1::HOLDER_KIND_PARAM);
    h->set_rank(1);
    h->set_unit("layers.0");
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* c, const v1::WatchJobRequest* r,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    if (auto s = Auth(c); !s.ok()) return s;
    std::vector<v1::JobEvent> to_send;
    {
      absl::MutexLock lock(&mu);
      last_watch = *r;
      if (!jobs.count(r->job_id())) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
      if (r->has_after_sequence() && r->after_sequence() > events.size()) {
        return {grpc::StatusCode::OUT_OF_RANGE, "after_sequence " +
                                                    std::to_string(r->after_sequence()) +
                                                    " is beyond the newest event; retained [0, " +
                                                    std::to_string(events.size()) + "]"};
      }
      for (const v1::JobEvent& e : events) {
        if (r->has_after_sequence() && e.sequence() > r->after_sequence()) to_send.push_back(e);
      }
      to_send.insert(to_send.end(), live_events.begin(), live_events.end());
    }
    for (const v1::JobEvent& e : to_send) {
      if (!writer->Write(e)) return grpc::Status::CANCELLED;
    }
    while (!end_watch && !c->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status::OK;
  }

  grpc::Status ListCheckpoints(grpc::ServerContext* c, const v1::ListCheckpointsRequest* r,
                               v1::ListCheckpointsResponse* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    last_checkpoints = *r;
    if (!jobs.count(r->job_id())) return {grpc::StatusCode::NOT_FOUND, "no job '" + r->job_id() + "'"};
    const size_t start = r->page_token().empty() ? 0 : std::stoul(r->page_token());
    size_t i = start;
    for (; i < checkpoints.size() && out->checkpoints_size() < page_size; ++i) {
      *out->add_checkpoints() = checkpoints[i];
    }
    if (i < checkpoints.size()) out->set_next_page_token(std::to_string(i));
    return grpc::Status::OK;
  }

  grpc::Status KvGet(grpc::ServerContext* c, const v1::KvGetRequest* r,
                     v1::KvGetResponse* out) override {
    if (auto s = Auth(c); !s.ok()) return s;
    absl::MutexLock lock(&mu);
    last_kv = *r;
    // An operator read: no fence, the job's current generation.
    if (r->has_fence()) return {grpc::StatusCode::INVALID_ARGUMENT, "unexpected fence"};
    if (r->generation() != 1) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "generation=2 does not exist yet"};
    }
    auto it = kv.find(r->scope() + "/" + r->key());
    out->set_found(it != kv.end());
    if (it != kv.end()) out->set_value(it->second);
    return grpc::Status::OK;
  }

 private:
  grpc::Status Auth(grpc::ServerContext* c) {
    std::string got;
    auto it = c->client_metadata().find("authorization");
    if (it != c->client_metadata().end()) got.assign(it->second.data(), it->second.size());
    {
      absl::MutexLock lock(&mu);
      authorizations.push_back(got);
    }
    if (!admin_token.empty() && got != "Bearer " + admin_token) {
      return {grpc::StatusCode::UNAUTHENTICATED, got.empty() ? "no authorization metadata"
                                                             : "unknown token"};
    }
    return grpc::Status::OK;
  }
};

class JobCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv(client::kCoordinatorEnv);
    unsetenv(client::kTokenEnv);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(static_cast<v1::JobService::Service*>(&fake_));
    builder.RegisterService(static_cast<v1::CheckpointService::Service*>(&fake_));
    builder.RegisterService(static_cast<v1::RendezvousService::Service*>(&fake_));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    unsetenv(client::kCoordinatorEnv);
    unsetenv(client::kTokenEnv);
  }

  // Runs `shardctl <command> <args> --coordinator <fake>`.
  absl::StatusOr<std::string> Run(const std::string& command, Args args) {
    args.push_back("--coordinator");
    args.push_back(address_);
    return RunRaw(command, args);
  }
  absl::StatusOr<std::string> RunRaw(const std::string& command, const Args& args) {
    std::ostringstream out;
    absl::Status s = RunCoordinatorCommand(command, args, out);
    if (!s.ok()) {
      EXPECT_EQ(out.str(), "") << "no partial output on error";
      return s;
    }
    return out.str();
  }
  void CreateDemo(const std::string& id = "shakespeare") {
    absl::StatusOr<std::string> out = Run("job", {"create", "deploy/jobs/shakespeare.yaml", "--id", id});
    ASSERT_TRUE(out.ok()) << out.status();
  }

  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

TEST_F(JobCommandsTest, CreateSendsTheSpecAndPrintsTheTokenOnce) {
  fake_.admin_token = "admin-secret";
  absl::StatusOr<std::string> out = Run("job", {"create", "deploy/jobs/shakespeare.yaml", "--id",
                                               "shakespeare", "--token", "admin-secret"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("Job:              shakespeare\n"),
                          HasSubstr("Phase:            PENDING\n"),
                          HasSubstr("Worker token (shown only now; give it to this job's workers "
                                    "as SHARDLINE_TOKEN):\n  worker-token-shakespeare\n")));
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.authorizations.back(), "Bearer admin-secret");
  EXPECT_EQ(fake_.last_create.job_id(), "shakespeare");
  EXPECT_EQ(fake_.last_create.spec().model().num_layers(), 4u);
  EXPECT_EQ(fake_.last_create.spec().elastic().heartbeat_timeout().seconds(), 10);
}

// Creating again with the same --id and spec succeeds (idempotent) and
// says the job already existed, not "shown only now".
TEST_F(JobCommandsTest, CreateAgainSaysTheJobAlreadyExisted) {
  fake_.admin_token = "admin-secret";
  const Args create = {"create", "deploy/jobs/shakespeare.yaml", "--id", "shakespeare",
                       "--token", "admin-secret"};
  absl::StatusOr<std::string> first = Run("job", create);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, AllOf(Not(HasSubstr("already existed")), HasSubstr("shown only now")));
  absl::StatusOr<std::string> again = Run("job", create);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rfind("Job shakespeare already existed with this spec; nothing was created "
                         "(job create is idempotent). It is:\n",
                         0),
            0u)
      << *again;
  EXPECT_THAT(*again, AllOf(HasSubstr("Worker token (the one issued when the job was created; "
                                      "give it to this job's workers as SHARDLINE_TOKEN):\n"
                                      "  worker-token-shakespeare\n"),
                            Not(HasSubstr("shown only now"))));
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.order.size(), 1u);
}

TEST_F(JobCommandsTest, TokenAndAddressFromTheEnvironment) {
  fake_.admin_token = "from-env";
  setenv(client::kTokenEnv, "from-env\n", 1);  // A trailing newline from $(cat file) is trimmed.
  setenv(client::kCoordinatorEnv, address_.c_str(), 1);
  CreateDemo();
  absl::StatusOr<std::string> out = RunRaw("job", {"get", "shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.authorizations.back(), "Bearer from-env");
}

TEST_F(JobCommandsTest, TokenFromAFile) {
  CreateDemo();  // no token needed yet
  fake_.admin_token = "from-a-file";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/shardctl-token";
  {
    std::ofstream file(path);
    file << "from-a-file\n";
  }
  setenv(client::kCoordinatorEnv, address_.c_str(), 1);
  absl::StatusOr<std::string> out = RunRaw("job", {"get", "shakespeare", "--token-file", path});
  ASSERT_TRUE(out.ok()) << out.status();
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_EQ(fake_.authorizations.back(), "Bearer from-a-file");
  }
  out = RunRaw("job", {"get", "shakespeare", "--token-file", path + ".missing"});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("cannot read --token-file"));
  out = RunRaw("job", {"get", "shakespeare", "--token-file", path, "--token", "x"});
  EXPECT_THAT(out.status().message(), HasSubstr("give --token or --token-file, not both"));
}

TEST_F(JobCommandsTest, NoTokenSendsNoMetadata) {
  CreateDemo();
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.authorizations.back(), "");
}

TEST_F(JobCommandsTest, MissingOrWrongToken) {
  fake_.admin_token = "admin-secret";
  absl::StatusOr<std::string> out = Run("job", {"list"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(out.status().message(),
              HasSubstr("requires a token (no authorization metadata); pass --token or set "
                        "SHARDLINE_TOKEN"));
  EXPECT_EQ(ExitCodeFor(out.status()), 1);
  out = Run("job", {"list", "--token", "nope"});
  EXPECT_THAT(out.status().message(), HasSubstr("unknown token; check the token"));
}

TEST_F(JobCommandsTest, GetAndCancel) {
  CreateDemo();
  absl::StatusOr<std::string> out = Run("job", {"get", "shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("World:            not formed yet; waiting for workers: 0 joined, "
                              "needs at least 4 (min_workers)\n"));
  {
    absl::MutexLock lock(&fake_.mu);
    for (const char* id : {"w0", "w1"}) {
      v1::Member m;
      m.set_worker_id(id);
      m.set_state(v1::MEMBER_STATE_JOINING);
      m.set_generation(1);
      fake_.members.push_back(m);
    }
  }
  out = Run("job", {"get", "shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("World:            not formed yet; waiting for workers: 2 joined, "
                              "needs at least 4 (min_workers)\n"));
  out = Run("job", {"cancel", "shakespeare", "--reason", "bad data"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("Phase:            CANCELLED (bad data)\n"),
                          HasSubstr("World:            none: cancelled before it formed\n")));
  // Again: nothing changes, and it says so (exit 0).
  out = Run("job", {"cancel", "shakespeare", "--reason", "other"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "job shakespeare is already CANCELLED (bad data); nothing to do\n");
  out = Run("job", {"cancel", "shakespeare", "--json"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(nlohmann::json::parse(*out)["phase_reason"], "bad data");
  absl::MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.jobs["shakespeare"].phase_reason(), "bad data");  // The reason was kept.
  // Every cancel was sent, so the coordinator checked each reason.
  EXPECT_EQ(fake_.cancel_calls, 3);
}

TEST_F(JobCommandsTest, DrainSaysWhatHappensOnce) {
  CreateDemo();  // The demo spec has a checkpoint directory: a graceful drain.
  CreateDemo("nockpt");
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.jobs["nockpt"].mutable_spec()->mutable_checkpoint()->clear_directory();
    for (const char* id : {"w0", "w1"}) {
      v1::Member m;
      m.set_worker_id(id);
      m.set_state(v1::MEMBER_STATE_ACTIVE);
      m.set_rank(id[1] - '0');
      fake_.members.push_back(m);
    }
  }
  absl::StatusOr<std::string> out =
      Run("drain", {"shakespeare", "w1", "--reason", "kernel upgrade"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "w1: draining (kernel upgrade); leaves after the next checkpoint commits\n");
  out = Run("drain", {"nockpt", "w0"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "w0: left the job (drained: operator request)\n");
  // Text from the coordinator is printed escaped (an older coordinator may
  // have stored control characters).
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.jobs["shakespeare"].set_phase(v1::JOB_PHASE_CANCELLED);
    fake_.jobs["shakespeare"].set_phase_reason("cancelled: a\x1b[2Jb\nPhase: fake");
  }
  out = Run("job", {"cancel", "shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "job shakespeare is already CANCELLED (cancelled: a\\x1b[2Jb\\nPhase: fake); "
                  "nothing to do\n");
}

TEST_F(JobCommandsTest, UnknownJobIsExitCode2WithTheCoordinatorsMessage) {
  for (const Args& args : {Args{"get", "nope"}, Args{"cancel", "nope"}}) {
    absl::StatusOr<std::string> out = Run("job", args);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(out.status().message(), "no job 'nope'; 'shardctl job list' lists the jobs");
    EXPECT_EQ(ExitCodeFor(out.status()), 2);
  }
  for (const char* command : {"members", "topology", "checkpoints", "watch"}) {
    absl::StatusOr<std::string> out = Run(command, {"nope"});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound) << command;
  }
}

TEST_F(JobCommandsTest, ListFollowsPagesAndFiltersPhases) {
  for (const char* id : {"a", "b", "c"}) CreateDemo(id);
  absl::StatusOr<std::string> out = Run("job", {"list", "--phase", "pending,Running"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("JOB  NAME         PHASE    GEN  WORLD    STEP  CREATED\n"),
                          HasSubstr("\nc    shakespeare  PENDING"), HasSubstr("\na    shakespeare")));
  absl::MutexLock lock(&fake_.mu);
  ASSERT_EQ(fake_.last_list.phases_size(), 2);
  EXPECT_EQ(fake_.last_list.phases(0), v1::JOB_PHASE_PENDING);
  EXPECT_EQ(fake_.last_list.phases(1), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(fake_.last_list.page_token(), "2");  // The second page was asked for.
}

TEST_F(JobCommandsTest, JsonIsTheResponseWithProtoNames) {
  for (const char* id : {"a", "b", "c"}) CreateDemo(id);
  absl::StatusOr<std::string> out = Run("job", {"list", "--json"});
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json j = nlohmann::json::parse(*out);
  ASSERT_EQ(j["jobs"].size(), 3u);
  EXPECT_EQ(j["jobs"][0]["job_id"], "c");
  EXPECT_EQ(j["jobs"][0]["spec"]["model"]["hidden_size"], 128);
  EXPECT_EQ(j["next_page_token"], "");
  out = Run("job", {"get", "a", "--json"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(nlohmann::json::parse(*out)["phase"], "JOB_PHASE_PENDING");
}

// Issue 14 defect 11: one job whose spec protobuf's JSON printer refuses (a
// Duration past its range, stored by a coordinator that did not check it)
// made `job list --json` print {"error": ...} for the whole listing, with
// exit code 0. Now the others are printed and the bad one is named, with a
// non-zero exit code.
TEST_F(JobCommandsTest, JsonListingSurvivesAJobItCannotPrint) {
  for (const char* id : {"a", "b", "c"}) CreateDemo(id);
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.jobs["b"].mutable_spec()->mutable_elastic()->mutable_join_timeout()->set_seconds(
        std::numeric_limits<int64_t>::max());
  }
  std::ostringstream out;
  const absl::Status s =
      RunCoordinatorCommand("job", {"list", "--json", "--coordinator", address_}, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(ExitCodeFor(s), 0);
  EXPECT_THAT(s.message(), HasSubstr("1 of 3 jobs could not be printed as JSON"));
  EXPECT_THAT(s.message(), HasSubstr("b: "));
  const nlohmann::json j = nlohmann::json::parse(out.str());
  ASSERT_EQ(j["jobs"].size(), 2u);
  EXPECT_EQ(j["jobs"][0]["job_id"], "c");
  EXPECT_EQ(j["jobs"][1]["job_id"], "a");
  // The text listing shows all three.
  absl::StatusOr<std::string> text = Run("job", {"list"});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, AllOf(HasSubstr("\na "), HasSubstr("\nb "), HasSubstr("\nc ")));
}

TEST_F(JobCommandsTest, MembersTopologyOwnerCheckpoints) {
  CreateDemo();
  absl::StatusOr<std::string> out = Run("members", {"shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "no workers have joined job shakespeare (generation 1)\n");

  out = Run("topology", {"shakespeare"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(), HasSubstr("the topology exists once the first generation forms"));
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.plan.emplace();
    fake_.plan->set_job_id("shakespeare");
    fake_.plan->set_world_size(4);
    v1::ProcessGroup* g = fake_.plan->add_groups();
    g->set_name("pp/0");
    g->set_kind(v1::GROUP_KIND_PP);
    g->add_ranks(0);
    g->add_ranks(2);
  }
  out = Run("topology", {"shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("0  pp/0   pp    0,2\n"));

  out = Run("owner", {"shakespeare", "layers.0.mlp.fc1.weight", "--element", "17"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("param     1   0   0   0  layers.0"));
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_TRUE(fake_.last_owner.has_element_index());
    EXPECT_EQ(fake_.last_owner.element_index(), 17u);
  }
  out = Run("owner", {"shakespeare", "layers.9.x"});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(out.status().message(), HasSubstr("close names: layers.0.mlp.fc1.weight"));
  EXPECT_EQ(Run("owner", {"shakespeare", "x", "--element", "-1"}).status().code(),
            absl::StatusCode::kInvalidArgument);

  {
    absl::MutexLock lock(&fake_.mu);
    for (int step : {300, 200, 100}) {
      v1::CheckpointSummary c;
      c.set_checkpoint_id("step-" + std::to_string(step));
      c.set_step(step);
      c.set_state(v1::CHECKPOINT_STATE_COMMITTED);
      fake_.checkpoints.push_back(c);
    }
  }
  out = Run("checkpoints", {"shakespeare", "--all"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("step-300"), HasSubstr("step-200"), HasSubstr("step-100")));
  absl::MutexLock lock(&fake_.mu);
  EXPECT_TRUE(fake_.last_checkpoints.include_aborted());
}

TEST_F(JobCommandsTest, WatchStreamsLinesUntilCountOrEnd) {
  CreateDemo();
  {
    absl::MutexLock lock(&fake_.mu);
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      v1::JobEvent e;
      e.set_sequence(seq);
      e.set_job_id("shakespeare");
      e.set_generation(1);
      e.mutable_step_progress()->set_step(seq * 10);
      fake_.events.push_back(e);
    }
  }
  absl::StatusOr<std::string> out = Run("watch", {"shakespeare", "--after", "0"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "#1 - g1 step 10\n"
            "#2 - g1 step 20\n"
            "#3 - g1 step 30\n");
  {
    absl::MutexLock lock(&fake_.mu);
    ASSERT_TRUE(fake_.last_watch->has_after_sequence());  // --after 0 is sent, not dropped.
    EXPECT_EQ(fake_.last_watch->after_sequence(), 0u);
  }

  fake_.end_watch = false;  // Now the stream stays open: --count ends it.
  out = Run("watch", {"shakespeare", "--after", "1", "--count", "1", "--json"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(nlohmann::json::parse(*out)["sequence"], "2");
  EXPECT_EQ(std::count(out->begin(), out->end(), '\n'), 1);

  // A job that has ended: no new events, so its history and how it ended.
  fake_.end_watch = true;
  {
    absl::MutexLock lock(&fake_.mu);
    v1::JobEvent e;
    e.set_sequence(4);
    e.set_job_id("shakespeare");
    e.set_generation(1);
    e.mutable_phase_changed()->set_old_phase(v1::JOB_PHASE_RUNNING);
    e.mutable_phase_changed()->set_new_phase(v1::JOB_PHASE_COMPLETED);
    fake_.events.push_back(e);
    fake_.jobs["shakespeare"].set_phase(v1::JOB_PHASE_COMPLETED);
    fake_.jobs["shakespeare"].set_phase_reason("every rank finished 2000 steps");
  }
  out = Run("watch", {"shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "#1 - g1 step 10\n"
            "#2 - g1 step 20\n"
            "#3 - g1 step 30\n"
            "#4 - g1 phase_changed RUNNING -> COMPLETED\n"
            "job shakespeare has ended: COMPLETED (every rank finished 2000 steps); no more "
            "events will come\n");
  out = Run("watch", {"shakespeare", "--count", "2"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "#1 - g1 step 10\n#2 - g1 step 20\n");
  {
    // A watch that saw the job end live prints only what it saw.
    absl::MutexLock lock(&fake_.mu);
    fake_.live_events.push_back(fake_.events.back());
  }
  out = Run("watch", {"shakespeare"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "#4 - g1 phase_changed RUNNING -> COMPLETED\n");
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.live_events.clear();
  }
  out = Run("watch", {"shakespeare", "--json"});  // Events only: every line is JSON.
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::count(out->begin(), out->end(), '\n'), 4);
  const std::string last_line = out->substr(out->rfind('\n', out->size() - 2) + 1);
  EXPECT_EQ(nlohmann::json::parse(last_line)["phase_changed"]["new_phase"], "JOB_PHASE_COMPLETED");

  out = Run("watch", {"shakespeare", "--after", "9"});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ExitCodeFor(out.status()), 2);
  EXPECT_EQ(Run("watch", {"shakespeare", "--count", "0"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobCommandsTest, KvGetIsAnOperatorReadWithoutAFence) {
  CreateDemo();
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.kv["tp/0/addr"] = "10.0.0.1:29500";
    fake_.kv["tp/0/nccl_id"] = std::string("\x01\x02\xff", 3);
  }
  absl::StatusOr<std::string> out =
      Run("kv", {"get", "shakespeare", "--generation", "1", "--scope", "tp/0", "addr"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("Scope:       tp/0\n"), HasSubstr("Value:       14 bytes, text\n"),
                          HasSubstr("\n10.0.0.1:29500\n")));
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_FALSE(fake_.last_kv.has_fence());
    EXPECT_EQ(fake_.last_kv.job_id(), "shakespeare");
    EXPECT_EQ(fake_.last_kv.generation(), 1u);
    EXPECT_FALSE(fake_.last_kv.wait());
  }
  out = Run("kv", {"get", "shakespeare", "--generation", "1", "--scope", "tp/0", "nccl_id"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("3 bytes, hex"), HasSubstr("\n01 02 ff\n")));
  out = Run("kv", {"get", "shakespeare", "--generation", "1", "missing"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("Value:       not set"), HasSubstr("(generation-wide)")));
  out = Run("kv", {"get", "shakespeare", "--generation", "2", "k"});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("does not exist yet"));
  out = Run("kv", {"get", "shakespeare", "k"});
  EXPECT_THAT(out.status().message(), HasSubstr("--generation is required"));
  out = Run("kv", {"set", "shakespeare", "k", "v"});
  EXPECT_THAT(out.status().message(), HasSubstr("the only one is 'get'"));
}

TEST_F(JobCommandsTest, CoordinatorRejectsTheSpec) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/heads.yaml";
  std::ofstream(path) << "model:\n  num_layers: 4\n  hidden_size: 128\n  num_heads: 3\n";
  absl::StatusOr<std::string> out = Run("job", {"create", path});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            path + ": spec.model.num_heads=3 does not divide spec.model.hidden_size=128");
  EXPECT_EQ(ExitCodeFor(out.status()), 2);
  // A field error in the file never reaches the coordinator.
  std::ofstream(path) << "model:\n  num_heads: 3\n  colour: blue\n";
  out = Run("job", {"create", path});
  EXPECT_THAT(out.status().message(), HasSubstr(path + ":3:3: unknown field 'model.colour'"));
  EXPECT_EQ(ExitCodeFor(out.status()), 2);
}

// A loopback port nothing listens on: bound, then closed.
std::string ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

TEST_F(JobCommandsTest, UnreachableCoordinatorIsOneClearLine) {
  const std::string closed = ClosedPort();
  for (const Args& args : {Args{"job", "get", "x"}, Args{"watch", "x"}}) {
    Args rest(args.begin() + 1, args.end());
    rest.push_back("--coordinator=" + closed);
    const absl::Status s = RunRaw(args[0], rest).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "cannot reach the coordinator at " + closed +
                               ": connection refused; start shardline-coordinator or set "
                               "--coordinator / SHARDLINE_COORDINATOR");
    EXPECT_EQ(ExitCodeFor(s), 1);
  }
}

TEST_F(JobCommandsTest, DeadlineNamesTheTimeoutFlag) {
  CreateDemo();
  fake_.get_job_delay = absl::Milliseconds(500);
  absl::StatusOr<std::string> out = Run("job", {"get", "shakespeare", "--timeout", "100ms"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(out.status().message(),
              HasSubstr("no answer from the coordinator at " + address_ +
                        " to GetJob within 100ms (--timeout)"));
}

// "w0,w1,...": `n` worker ids for --lose.
std::string ManyWorkers(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("w" + std::to_string(i));
  return absl::StrJoin(ids, ",");
}

// "whatif JOB --lose" with nothing after --lose (or another flag after it)
// says that --lose needs a value, not that the job id is missing (the shared
// ArgParser, common/flags.h).
TEST_F(JobCommandsTest, WhatIfLoseWithoutAValueSaysSo) {
  for (const Args& args : {Args{"shakespeare", "--lose"}, Args{"shakespeare", "--lose", "--json"},
                           Args{"--lose", "--json", "shakespeare"}}) {
    absl::StatusOr<std::string> out = RunRaw("whatif", args);
    ASSERT_FALSE(out.ok()) << args.size();
    EXPECT_EQ(out.status().message(),
              "--lose needs a value: WORKER[,WORKER...]; worker ids to suppose lost, "
              "comma-separated (1 to 1024; may repeat)");
    EXPECT_EQ(ExitCodeFor(out.status()), 2);
  }
}

TEST_F(JobCommandsTest, UsageErrors) {
  // A TLS file that is not PEM is named with the reason (common/tls_files.h).
  const std::string not_pem = ::testing::TempDir() + "/not-pem-ca.crt";
  std::ofstream(not_pem) << "not a certificate\n";
  struct Case {
    std::string command;
    Args args;
    std::string message;
  } cases[] = {
      {"job", {}, "job needs a subcommand"},
      {"job", {"start"}, "unknown job subcommand 'start'"},
      {"job", {"create"}, "job create needs a spec file"},
      {"job", {"create", "a.yaml", "--id", "Bad_Id"}, "--id='Bad_Id' is not a job id"},
      {"job", {"get"}, "job get takes one job id"},
      {"job", {"get", "a", "--bogus"}, "unknown flag --bogus for 'shardctl job get'"},
      {"job", {"get", "a", "-json"}, "unknown option '-json'"},
      {"job", {"list", "--phase", "done"}, "'done' is not a job phase; choose from pending"},
      {"members", {}, "takes one job id"},
      {"whatif", {"--lose", "w1"}, "takes one job id, e.g. 'shardctl whatif shakespeare --lose"},
      {"whatif", {"j"}, "whatif needs --lose WORKER[,WORKER...]"},
      {"whatif", {"j", "--lose"}, "--lose needs a value: WORKER[,WORKER...]"},
      {"whatif", {"j", "--lose", "--json"}, "--lose needs a value: WORKER[,WORKER...]"},
      {"drain", {"j", "w", "--reason"}, "--reason needs a value"},
      {"job", {"get", "j", "--timeout", "--json"}, "--timeout needs a value"},
      {"whatif", {"j", "--lose", ""}, "--lose is empty; give 1 to 1024 worker ids"},
      {"whatif", {"j", "--lose", "w1,,w2"}, "--lose='w1,,w2': worker 2 is empty"},
      {"whatif", {"j", "--lose", "w1,"}, "--lose='w1,': worker 2 is empty"},
      {"whatif", {"j", "--lose", "w1,w2", "--lose", "w1"},
       "--lose names 'w1' twice (workers 1 and 3); name each worker once"},
      {"whatif", {"j", "--lose", "node 3"},
       "--lose: 'node 3' is not a worker id: 1 to 128 printable ASCII characters"},
      {"whatif", {"j", "--lose", std::string(129, 'x')}, "is not a worker id"},
      {"whatif", {"j", "--lose", ManyWorkers(1025)},
       "--lose names 1025 workers; at most 1024 can be supposed lost at once"},
      {"owner", {"j"}, "owner takes a job id and a parameter name"},
      {"job", {"get", "a", "--coordinator", "localhost"}, "--coordinator='localhost' is not HOST:PORT"},
      {"job", {"get", "a", "--timeout", "soon"}, "--timeout='soon' is not a positive duration"},
      {"job", {"get", "a", "--tls-cert", "c.pem"}, "mutual TLS needs both --tls-cert and --tls-key"},
      {"job", {"get", "a", "--tls-ca", "/nonexistent/ca.pem"},
       "cannot read --tls-ca file '/nonexistent/ca.pem': it does not exist"},
      {"job", {"get", "a", "--tls-ca", not_pem},
       "--tls-ca file '" + not_pem + "' is not PEM (no -----BEGIN line)"},
      {"job", {"create", "/nonexistent/spec.yaml"},
       "cannot read spec file '/nonexistent/spec.yaml': No such file or directory"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> out = RunRaw(c.command, c.args);
    ASSERT_FALSE(out.ok()) << c.command << " " << c.args.size();
    EXPECT_THAT(out.status().message(), HasSubstr(c.message));
    EXPECT_EQ(ExitCodeFor(out.status()), 2) << out.status();
  }
  setenv(client::kCoordinatorEnv, "nowhere", 1);
  EXPECT_THAT(RunRaw("job", {"get", "a"}).status().message(),
              HasSubstr("SHARDLINE_COORDINATOR='nowhere' is not HOST:PORT"));
}

TEST_F(JobCommandsTest, HelpGoesToStdout) {
  for (const auto& [command, args] : std::vector<std::pair<std::string, Args>>{
           {"job", {"--help"}}, {"job", {"create", "--help"}}, {"watch", {"--help"}},
           {"kv", {"get", "--help"}}, {"whatif", {"--help"}}}) {
    absl::StatusOr<std::string> out = RunRaw(command, args);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_THAT(*out, HasSubstr("Usage"));
  }
}

TEST(ConnectionFlagsTest, DefaultsAndPrecedence) {
  client::ConnectionFlags flags;
  ArgParser parser("t");
  flags.Register(parser);
  ASSERT_TRUE(parser.Parse({}).ok());
  std::map<std::string, std::string> env;
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  absl::StatusOr<client::ConnectionOptions> o = flags.Resolve(parser, getenv);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "127.0.0.1:7070");
  EXPECT_EQ(o->token, "");
  EXPECT_EQ(o->timeout, absl::Seconds(10));
  EXPECT_FALSE(o->tls());
  env = {{"SHARDLINE_COORDINATOR", "[::1]:9000"}, {"SHARDLINE_TOKEN", "t1"}};
  o = flags.Resolve(parser, getenv);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "[::1]:9000");
  EXPECT_EQ(o->address_source, "SHARDLINE_COORDINATOR");
  EXPECT_EQ(o->token, "t1");

  client::ConnectionFlags flags2;
  ArgParser parser2("t");
  flags2.Register(parser2);
  ASSERT_TRUE(parser2.Parse({"--coordinator", "coord.example:7070", "--token", "t2",
                             "--tls-ca", "ca.pem", "--timeout", "1m"})
                  .ok());
  o = flags2.Resolve(parser2, getenv);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "coord.example:7070");
  EXPECT_EQ(o->token, "t2");
  EXPECT_TRUE(o->tls());
  EXPECT_EQ(o->timeout, absl::Minutes(1));

  env = {{"SHARDLINE_TOKEN", "a b"}};
  EXPECT_THAT(flags.Resolve(parser, getenv).status().message(),
              HasSubstr("SHARDLINE_TOKEN holds a space or control character"));
}

TEST(FromGrpcStatusTest, Messages) {
  client::ConnectionOptions o;
  EXPECT_EQ(client::FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                        "DNS resolution failed for x:1: C-ares status is not "
                                        "ARES_SUCCESS: Domain name not found"),
                           o, "GetJob")
                .message(),
            "cannot reach the coordinator at 127.0.0.1:7070: the host name does not resolve; "
            "start shardline-coordinator or set --coordinator / SHARDLINE_COORDINATOR");
  EXPECT_EQ(client::FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator is starting"),
                           o, "GetJob")
                .message(),
            "the coordinator at 127.0.0.1:7070 is unavailable: coordinator is starting; retry "
            "shortly");
  EXPECT_THAT(client::FromGrpcStatus(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                          "worker token of job a on job b"),
                             o, "CancelJob")
                  .message(),
              HasSubstr("CancelJob needs the coordinator's admin token"));
  EXPECT_EQ(client::FromGrpcStatus(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                        "a worker token may not make this call; it needs the "
                                        "admin token"),
                           o, "ListJobs")
                .message(),
            "a worker token may not make this call; it needs the admin token (--token or "
            "SHARDLINE_TOKEN)");
  EXPECT_EQ(client::FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "x"), o, "R").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client::FromGrpcStatus(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                          "Received http2 header with status: 404"),
                             o, "GetJob")
                  .message(),
              HasSubstr("is not a Shardline coordinator"));
}

// An older coordinator (here: the fake, which has no WhatIf) says so, exit 1.
TEST_F(JobCommandsTest, WhatIfOnACoordinatorWithoutIt) {
  CreateDemo();
  absl::StatusOr<std::string> out = Run("whatif", {"shakespeare", "--lose", "w1"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(out.status().message(), HasSubstr("does not implement WhatIf"));
  EXPECT_EQ(ExitCodeFor(out.status()), 1);
}

// `whatif` and `members` against the real coordinator: job-a has ranks w0
// and w1 (tp 1, pp 1, dp 2; min_workers 1, max_workers 2, global batch 4,
// micro-batch 1) and the spare s0.
class RealCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv(client::kCoordinatorEnv);
    unsetenv(client::kTokenEnv);
    server::testing::CreateJobAs(h_.Channel(), "", "job-a", server::testing::SmallSpec(1, 2, 4));
    server::testing::CreateJobAs(h_.Channel(), "", "job-b", server::testing::SmallSpec(1, 1, 4));
    const std::vector<absl::StatusOr<v1::Assignment>> assigned =
        server::testing::JoinAll({&w0_, &w1_}, /*open_session=*/true);
    for (const absl::StatusOr<v1::Assignment>& a : assigned) {
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_EQ(a->world_size(), 2u) << "both joined within the last call";
    }
    // Ranks go in join order; the two joined at once.
    w1_rank_ = assigned[1]->rank();
    ASSERT_TRUE(s0_.Join().ok());
    ASSERT_TRUE(s0_.OpenSession().ok());
  }

  absl::StatusOr<std::string> Run(const std::string& command, Args args) {
    args.push_back("--coordinator");
    args.push_back(h_.address());
    std::ostringstream out;
    absl::Status s = RunCoordinatorCommand(command, args, out);
    if (!s.ok()) return s;
    return out.str();
  }
  // The client library's clients of the coordinator (no token).
  client::CoordinatorClients Clients() {
    client::ConnectionOptions o;
    o.address = h_.address();
    o.timeout = absl::Seconds(5);
    return client::GrpcCoordinatorClients(h_.Channel(), o);
  }

  server::testing::Harness h_;
  server::testing::SimWorker w0_{h_.Channel(), "job-a", "w0", 1};
  server::testing::SimWorker w1_{h_.Channel(), "job-a", "w1", 1};
  server::testing::SimWorker s0_{h_.Channel(), "job-a", "s0", 1};
  uint32_t w1_rank_ = 0;
};

TEST_F(RealCoordinatorTest, WhatIfSaysWhatALossWouldDo) {
  // The spare takes w1's rank: world and dp unchanged, restored from the
  // seed (no checkpoint yet). With tp 1 and pp 1 a rank is its dp rank.
  const std::string r = std::to_string(w1_rank_);
  absl::StatusOr<std::string> out = Run("whatif", {"job-a", "--lose", "w1"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("Generation 1 now: world 2, dp 2\n"),
                          HasSubstr("\nw1    ACTIVE     " + r + "   0   " + r + "   0  "),
                          HasSubstr("Generation:         ends: generation 1 stops and the job "
                                    "re-forms\n"),
                          HasSubstr("Spares:             s0: they take every lost rank\n"),
                          HasSubstr("New world:          2, dp 2, gradient accumulation 2 (world "
                                    "and dp unchanged)\n"),
                          // Survivors first, then spares (server/formation.h).
                          HasSubstr("New ranks:          0 w0, 1 s0\n"),
                          HasSubstr("Below min workers:  no\n"),
                          HasSubstr("Restore:            from the seed (step 0); 0 steps trained "
                                    "again\n"),
                          HasSubstr("Summary:            Losing rank " + r + " (w1) ends "
                                    "generation 1. Spare s0 takes a rank.")));

  // Without the spare dp shrinks to 1, and each step accumulates 4
  // micro-batches to keep the global batch.
  out = Run("whatif", {"job-a", "--lose", "w1, s0"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("\ns0    SPARE      -   -   -   -  "),
                          HasSubstr("Spares:             none to take the lost ranks\n"),
                          HasSubstr("New world:          1, dp 1, gradient accumulation 4 (from "
                                    "world 2, dp 2)\n"),
                          HasSubstr("New ranks:          0 w0\n"),
                          HasSubstr("Below min workers:  no\n")));

  // Every worker: nothing is left to form.
  out = Run("whatif", {"job-a", "--lose", "w0,w1", "--lose", "s0"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, AllOf(HasSubstr("New world:          none: the live workers left cannot "
                                    "form a generation\n"),
                          HasSubstr("Below min workers:  yes")));

  // Only the spare: nothing re-forms.
  out = Run("whatif", {"job-a", "--lose", "s0"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("Generation:         goes on: no rank is among the losses (only "
                              "spares or joining workers), nothing re-forms\n"));

  // Nothing changed.
  v1::GetJobRequest get;
  get.set_job_id("job-a");
  absl::StatusOr<v1::Job> job = Clients().jobs->GetJob(get);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->generation(), 1u);
  EXPECT_EQ(job->phase(), v1::JOB_PHASE_RUNNING);
}

// --json prints the response the client library gets, whole: parsed back,
// the same message.
TEST_F(RealCoordinatorTest, WhatIfJsonIsTheResponse) {
  absl::StatusOr<std::string> out = Run("whatif", {"job-a", "--lose", "w1", "--json"});
  ASSERT_TRUE(out.ok()) << out.status();
  v1::WhatIfResponse printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*out, &printed).ok()) << *out;
  v1::WhatIfRequest request;
  request.set_job_id("job-a");
  request.add_lose_worker_ids("w1");
  absl::StatusOr<v1::WhatIfResponse> direct = Clients().jobs->WhatIf(request);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(printed, *direct))
      << printed.DebugString() << "\nvs\n" << direct->DebugString();
  ASSERT_EQ(printed.new_worker_ids_size(), 2);
  EXPECT_EQ(printed.new_worker_ids(0), "w0");
  EXPECT_EQ(printed.new_worker_ids(1), "s0");
  EXPECT_TRUE(printed.spares_cover());
  EXPECT_EQ(nlohmann::json::parse(*out)["losses"][0]["worker_id"], "w1");
}

// The coordinator's refusals, with the flag named and the exit code.
TEST_F(RealCoordinatorTest, WhatIfErrors) {
  absl::StatusOr<std::string> out = Run("whatif", {"job-a", "--lose", "w1,nobody"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "--lose: no worker 'nobody' in job 'job-a' (see shardctl members job-a)");
  EXPECT_EQ(ExitCodeFor(out.status()), 2);
  out = Run("whatif", {"job-z", "--lose", "w1"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "no job 'job-z'; 'shardctl job list' lists the jobs");
  EXPECT_EQ(ExitCodeFor(out.status()), 2);
  // job-b has not formed: nobody joined.
  out = Run("whatif", {"job-b", "--lose", "w1"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(), HasSubstr("job 'job-b' has no formed generation"));
  EXPECT_EQ(ExitCodeFor(out.status()), 1);
}

// A rank's progress report as the coordinator keeps it shows in `members`.
TEST_F(RealCoordinatorTest, MembersShowTheProgressReport) {
  v1::HeartbeatRequest hb;
  *hb.mutable_fence() = w0_.fence();
  hb.set_state(v1::WORKER_STATE_TRAINING);
  v1::RankProgress* p = hb.mutable_progress();
  p->set_activity(v1::ACTIVITY_COLLECTIVE);
  v1::CollectiveProgress* c = p->add_collectives();
  c->set_group("dp/0");
  c->set_operation("all_reduce");
  c->set_sequence(7);
  c->set_count(1024);
  c->set_dtype("float32");
  c->set_in_flight(true);
  c->mutable_elapsed()->set_seconds(1);
  c->mutable_elapsed()->set_nanos(500000000);
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  server::testing::Prepare(&ctx, w0_.CallToken(), absl::Seconds(5));
  grpc::Status sent = w0_.Workers()->Heartbeat(&ctx, hb, &resp);
  ASSERT_TRUE(sent.ok()) << sent.error_message();

  absl::StatusOr<std::string> out = Run("members", {"job-a"});
  ASSERT_TRUE(out.ok()) << out.status();
  std::string w0_row, s0_row;
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    if (absl::StartsWith(line, "w0 ")) w0_row = std::string(line);
    if (absl::StartsWith(line, "s0 ")) s0_row = std::string(line);
  }
  EXPECT_THAT(w0_row,
              HasSubstr("  TRAINING      collective  all_reduce #7 dp/0 (waiting 1.5s)  -  "))
      << *out;
  EXPECT_THAT(s0_row, HasSubstr("SPARE")) << *out;
  EXPECT_THAT(*out, HasSubstr("WORKER STATE  ACTIVITY    COLLECTIVE"));
}

}  // namespace
}  // namespace shardline::shardctl

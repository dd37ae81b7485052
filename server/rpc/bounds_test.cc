// Hostile input through the real RPC path (issue 14): a real in-process
// server (testing/grpc_test_util.h Harness) over the real components.
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/limits.h"
#include "server/rendezvous.h"
#include "server/rpc/coordinator_server.h"
#include "testing/grpc_test_util.h"

namespace shardline::server {
namespace {

namespace pb = ::google::protobuf;

using ::testing::HasSubstr;
using testing::Harness;
using testing::Prepare;
using testing::SimWorker;
using testing::SmallSpec;

void CreateJob(v1::JobService::Stub* jobs, const std::string& job_id, const v1::JobSpec& spec) {
  v1::CreateJobRequest req;
  req.set_job_id(job_id);
  *req.mutable_spec() = spec;
  v1::CreateJobResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// Waits (real time, bounded) until `done` holds.
bool Eventually(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time give_up = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Issue 14: a job that COMPLETED (no GenerationEnded) kept its rendezvous
// keys forever. The server's sweep drops them.
TEST(BoundsTest, RendezvousStateOfACompletedJobIsFreed) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  v1::JobSpec spec = SmallSpec(1, 1, 4);
  spec.mutable_training()->set_train_steps(1);
  CreateJob(jobs.get(), "done", spec);
  SimWorker w(h.Channel(), "done", "w0", 1);
  ASSERT_TRUE(w.Join().ok());
  ASSERT_TRUE(w.OpenSession().ok());
  ASSERT_TRUE(w.GetAssignment(true, absl::Seconds(10)).ok());
  for (int i = 0; i < 10; ++i) {
    v1::KvSetRequest req;
    *req.mutable_fence() = w.fence();
    req.set_scope(absl::StrCat("scope-", i));
    req.set_key("k");
    req.set_value("v");
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(w.Rendezvous()->KvSet(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(h.rendezvous().GetJobUsage("done").keys, 10);
  EXPECT_EQ(h.rendezvous().GetJobUsage("done").scopes, 10);
  {
    v1::HeartbeatRequest req;
    *req.mutable_fence() = w.fence();
    req.set_state(v1::WORKER_STATE_DONE);
    req.set_step(1);
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(w.Workers()->Heartbeat(&ctx, req, &resp).ok());
    ASSERT_TRUE(resp.directive().has_stop());
    EXPECT_EQ(resp.directive().stop().phase(), v1::JOB_PHASE_COMPLETED);
  }
  EXPECT_TRUE(Eventually([&] { return h.rendezvous().GetJobUsage("done").bytes == 0; }))
      << h.rendezvous().GetJobUsage("done").bytes << " bytes still held";
  EXPECT_EQ(h.rendezvous().GetJobUsage("done").keys, 0);
  EXPECT_TRUE(h.rendezvous().JobsHoldingState().empty());
}

// One over-long field of one request: `path` from the request down to the
// field, "[0]" entries of repeated messages on the way.
struct OverLong {
  const pb::MethodDescriptor* method;
  std::vector<const pb::FieldDescriptor*> path;
  std::string name;  // "tensors[0].pieces[0].file"
};

// Every string, bytes or repeated field reachable from `type`, by path.
void Walk(const pb::Descriptor* type, std::vector<const pb::FieldDescriptor*>* path,
          const std::string& prefix, const std::function<void(const std::string&)>& on_field,
          std::vector<std::vector<const pb::FieldDescriptor*>>* paths,
          std::vector<std::string>* names, int depth = 0) {
  ASSERT_LT(depth, 16) << "recursive message " << type->full_name();
  for (int i = 0; i < type->field_count(); ++i) {
    const pb::FieldDescriptor* f = type->field(i);
    path->push_back(f);
    const std::string name = prefix + f->name();
    const bool is_message = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    if (f->is_repeated() || f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      on_field(f->full_name());
      paths->push_back(*path);
      names->push_back(name);
    }
    if (is_message) {
      Walk(f->message_type(), path, name + (f->is_repeated() ? "[0]." : "."), on_field, paths,
           names, depth + 1);
    }
    path->pop_back();
  }
}

std::vector<OverLong> AllOverLongFields(std::set<std::string>* unlisted) {
  std::vector<OverLong> out;
  EXPECT_EQ(Services().size(), 4u);
  for (const pb::ServiceDescriptor* service : Services()) {
    for (int m = 0; m < service->method_count(); ++m) {
      const pb::MethodDescriptor* method = service->method(m);
      std::vector<const pb::FieldDescriptor*> path;
      std::vector<std::vector<const pb::FieldDescriptor*>> paths;
      std::vector<std::string> names;
      Walk(
          method->input_type(), &path, "",
          [&](const std::string& field) {
            if (unlisted != nullptr &&
                !FieldLimit(*pb::DescriptorPool::generated_pool()->FindFieldByName(field))) {
              unlisted->insert(field);
            }
          },
          &paths, &names);
      for (size_t i = 0; i < paths.size(); ++i) out.push_back({method, paths[i], names[i]});
    }
  }
  return out;
}

// A request of `c.method` whose field `c.path` is one byte (or entry) over
// its limit; every message on the way gets one entry.
std::unique_ptr<pb::Message> Build(const OverLong& c, size_t limit) {
  std::unique_ptr<pb::Message> request(
      pb::MessageFactory::generated_factory()->GetPrototype(c.method->input_type())->New());
  if (auto* create = dynamic_cast<v1::CreateJobRequest*>(request.get()); create != nullptr) {
    *create->mutable_spec() = SmallSpec(1, 1, 4);  // valid but for the one field
  }
  pb::Message* m = request.get();
  for (size_t i = 0; i + 1 < c.path.size(); ++i) {
    const pb::FieldDescriptor* f = c.path[i];
    m = f->is_repeated() ? m->GetReflection()->AddMessage(m, f)
                         : m->GetReflection()->MutableMessage(m, f);
  }
  const pb::FieldDescriptor* f = c.path.back();
  const pb::Reflection* r = m->GetReflection();
  if (!f->is_repeated()) {
    r->SetString(m, f, std::string(limit + 1, 'x'));
    return request;
  }
  for (size_t i = 0; i <= limit; ++i) {
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING:
        r->AddString(m, f, "x");
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        r->AddMessage(m, f);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        r->AddUInt64(m, f, 1);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        r->AddUInt32(m, f, 1);
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        r->AddEnumValue(m, f, 1);
        break;
      default:
        ADD_FAILURE() << "no builder for repeated " << f->full_name();
        return request;
    }
  }
  return request;
}

// Sends `request` to `method` through the real server (any kind of RPC:
// for server-streaming methods, the status at the stream's end).
grpc::Status Send(const std::shared_ptr<grpc::Channel>& channel,
                  const pb::MethodDescriptor* method, const pb::Message& request) {
  const std::string path =
      absl::StrCat("/", method->service()->full_name(), "/", method->name());
  const std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  Prepare(&ctx, "", absl::Seconds(10));
  grpc::CompletionQueue cq;
  grpc::Status status;
  void* tag = nullptr;
  bool ok = false;
  if (!method->server_streaming()) {
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
        stub.PrepareUnaryCall(&ctx, path, buffer, &cq);
    call->StartCall();
    grpc::ByteBuffer response;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    return status;
  }
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, path, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  call->Write(buffer, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer message;
  for (;;) {  // an over-long request gets no message before its status
    call->Read(&message, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
  }
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

// Issue 14 defect 8: every string, bytes and repeated field a client sends
// has a limit (server/limits.h)...
TEST(BoundsTest, EveryRequestFieldHasALimit) {
  std::set<std::string> unlisted;
  std::vector<OverLong> all = AllOverLongFields(&unlisted);
  EXPECT_GT(all.size(), 60u);
  EXPECT_THAT(unlisted, ::testing::IsEmpty());
}

// ... and one byte (or entry) over it gets INVALID_ARGUMENT naming the
// field, its size and the limit, through the real RPC path, before any
// other check (so no job needs to exist).
TEST(BoundsTest, EveryOverLongFieldIsRefusedNamingIt) {
  Harness h;
  std::shared_ptr<grpc::Channel> channel = h.Channel();
  int checked = 0;
  for (const OverLong& c : AllOverLongFields(nullptr)) {
    std::optional<size_t> limit = FieldLimit(*c.path.back());
    ASSERT_TRUE(limit.has_value()) << c.path.back()->full_name();
    std::unique_ptr<pb::Message> request = Build(c, *limit);
    grpc::Status s = Send(channel, c.method, *request);
    const std::string where = absl::StrCat(c.method->full_name(), " ", c.name);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << where << ": "
                                                                  << s.error_message();
    if (c.path.back()->containing_type()->file()->name() == "shardline/v1/job.proto" &&
        c.name.rfind("spec.", 0) == 0) {
      // The spec's own check (spec::ResolveJobSpec) names the field and size.
      EXPECT_THAT(s.error_message(), HasSubstr(c.name)) << where;
      EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat(*limit + 1, " bytes"))) << where;
      ++checked;
      continue;
    }
    const std::string size =
        c.path.back()->is_repeated()
            ? absl::StrCat(c.name, " has ", *limit + 1, " entries; at most ", *limit)
            : absl::StrCat(c.name, " is ", *limit + 1, " bytes; at most ", *limit);
    EXPECT_THAT(s.error_message(), HasSubstr(size)) << where;
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

// The issue's own case: five joins with 15 MB hosts made ListMembers 78.6 MB.
TEST(BoundsTest, HugeHostIsRefusedAndNotStored) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "hosts", SmallSpec(1, 2, 4));
  v1::JoinJobRequest req;
  req.mutable_worker()->set_job_id("hosts");
  req.mutable_worker()->set_worker_id("w0");
  req.mutable_worker()->set_incarnation(1);
  req.set_host(std::string(15 << 20, 'h'));
  req.set_device("cpu");
  auto workers = v1::WorkerService::NewStub(h.Channel());
  v1::JoinJobResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  grpc::Status s = workers->JoinJob(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "host is 15728640 bytes; at most 255 (kMaxHostBytes)");
  absl::StatusOr<v1::ListMembersResponse> members = h.coordinator().ListMembers("hosts");
  ASSERT_TRUE(members.ok()) << members.status();
  EXPECT_EQ(members->members_size(), 0);
  // At the limit it joins.
  req.set_host(std::string(kMaxHostBytes, 'h'));
  grpc::ClientContext ctx2;
  Prepare(&ctx2, "");
  EXPECT_TRUE(workers->JoinJob(&ctx2, req, &resp).ok());
}

// Threads of this process (/proc/self/status).
int Threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

struct Watcher {
  std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
};

Watcher Watch(v1::JobService::Stub* jobs, const std::string& job_id) {
  Watcher w;
  Prepare(w.ctx.get(), "", absl::Seconds(30));
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  w.reader = jobs->WatchJob(w.ctx.get(), req);
  return w;
}

// Issue 14: watchers were a thread each polling every 100 ms. Now an open
// watcher holds no server thread and pulls nothing until the job's event
// log wakes it; an event still reaches it at once.
TEST(BoundsTest, WatchersAreWokenByEventsNotPolling) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "quiet", SmallSpec(1, 1, 4));
  CreateJob(jobs.get(), "busy", SmallSpec(1, 1, 4));
  const rpc::WatchStreams& watches = h.server().watches();

  Watcher one = Watch(jobs.get(), "busy");
  ASSERT_TRUE(Eventually([&] { return watches.open("busy") == 1; }));
  const int threads_before = Threads();
  std::vector<Watcher> many;
  for (int i = 0; i < 60; ++i) many.push_back(Watch(jobs.get(), "quiet"));
  ASSERT_TRUE(Eventually([&] { return watches.open("quiet") == 60; }));
  // The replay pulls are done once each stream is open; then nothing
  // happens to the jobs, and nobody pulls.
  ASSERT_TRUE(Eventually([&] {
    const uint64_t p = watches.pulls();
    absl::SleepFor(absl::Milliseconds(50));
    return watches.pulls() == p;
  }));
  const uint64_t idle = watches.pulls();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(watches.pulls(), idle) << "an idle watcher polled";
  // 60 open streams hold no thread each (a sync handler held one).
  EXPECT_LT(Threads() - threads_before, 16) << threads_before << " threads before";

  // An event wakes exactly the watchers of its job.
  {
    v1::CancelJobRequest req;
    req.set_job_id("busy");
    v1::Job job;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->CancelJob(&ctx, req, &job).ok());
  }
  v1::JobEvent e;
  ASSERT_TRUE(one.reader->Read(&e));
  ASSERT_TRUE(e.has_phase_changed()) << e.DebugString();
  EXPECT_EQ(e.phase_changed().new_phase(), v1::JOB_PHASE_CANCELLED);
  EXPECT_FALSE(one.reader->Read(&e));
  grpc::Status end = one.reader->Finish();
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_TRUE(Eventually([&] { return watches.open("busy") == 0; }));
  EXPECT_EQ(watches.open("quiet"), 60);
  for (Watcher& w : many) w.ctx->TryCancel();
  EXPECT_TRUE(Eventually([&] { return watches.open() == 0; }));
}

// A watcher of a job that is already over gets the replay it asked for,
// then OK, without waiting for an event that will never come.
TEST(BoundsTest, WatchersOfAFinishedJobEndAfterTheReplay) {
  Harness h;
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "over", SmallSpec(1, 1, 4));
  {
    v1::CancelJobRequest req;
    req.set_job_id("over");
    v1::Job job;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->CancelJob(&ctx, req, &job).ok());
  }
  for (bool replay : {false, true}) {
    grpc::ClientContext ctx;
    Prepare(&ctx, "", absl::Seconds(10));
    v1::WatchJobRequest req;
    req.set_job_id("over");
    if (replay) req.set_after_sequence(0);
    auto reader = jobs->WatchJob(&ctx, req);
    std::vector<v1::JobEvent> events;
    v1::JobEvent e;
    while (reader->Read(&e)) events.push_back(e);
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << replay << ": " << s.error_message();
    if (!replay) {
      EXPECT_TRUE(events.empty());
    } else {
      ASSERT_FALSE(events.empty());
      EXPECT_EQ(events.front().sequence(), 1u);
      EXPECT_EQ(events.back().phase_changed().new_phase(), v1::JOB_PHASE_CANCELLED);
    }
  }
  // Released when gRPC reports the stream done (just after the client's Finish).
  EXPECT_TRUE(Eventually([&] { return h.server().watches().open() == 0; }));
}

// Open watchers are capped per job and in all; one more is
// RESOURCE_EXHAUSTED naming the limit, and a closed one frees its slot.
TEST(BoundsTest, WatchersAreCapped) {
  EXPECT_EQ(ServerOptions().watch_limits.per_job, rpc::kMaxWatchersPerJob);
  EXPECT_EQ(ServerOptions().watch_limits.total, rpc::kMaxWatchers);
  EXPECT_EQ(rpc::kMaxWatchersPerJob, 64);
  EXPECT_EQ(rpc::kMaxWatchers, 1024);
  testing::HarnessOptions options;
  options.watch_limits = {/*per_job=*/3, /*total=*/5};
  Harness h(options);
  auto jobs = v1::JobService::NewStub(h.Channel());
  CreateJob(jobs.get(), "a", SmallSpec(1, 1, 4));
  CreateJob(jobs.get(), "b", SmallSpec(1, 1, 4));
  const rpc::WatchStreams& watches = h.server().watches();
  auto refused = [&](const std::string& job_id) {
    Watcher w = Watch(jobs.get(), job_id);
    v1::JobEvent e;
    while (w.reader->Read(&e)) {
    }
    return w.reader->Finish();
  };
  std::vector<Watcher> open;
  for (int i = 0; i < 3; ++i) open.push_back(Watch(jobs.get(), "a"));
  ASSERT_TRUE(Eventually([&] { return watches.open("a") == 3; }));
  grpc::Status s = refused("a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("already has 3 open watchers, the most "
                                           "kMaxWatchersPerJob = 3 allows"));
  for (int i = 0; i < 2; ++i) open.push_back(Watch(jobs.get(), "b"));
  ASSERT_TRUE(Eventually([&] { return watches.open() == 5; }));
  s = refused("b");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("already has 5 open watchers, the most "
                                           "kMaxWatchers = 5 allows"));
  EXPECT_EQ(watches.open(), 5);
  // Closing one frees its slot.
  open[0].ctx->TryCancel();
  ASSERT_TRUE(Eventually([&] { return watches.open() == 4; }));
  open.push_back(Watch(jobs.get(), "b"));
  EXPECT_TRUE(Eventually([&] { return watches.open("b") == 3; }));
  for (Watcher& w : open) w.ctx->TryCancel();
  EXPECT_TRUE(Eventually([&] { return watches.open() == 0; }));
}

}  // namespace
}  // namespace shardline::server

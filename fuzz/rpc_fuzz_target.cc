#include "fuzz/rpc_fuzz_target.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fuzz/check.h"
#include "grpcpp/grpcpp.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/worker_harness.h"

namespace shardline::fuzz {
namespace {

namespace v1 = ::shardline::v1;

constexpr char kAdminToken[] = "fuzz-admin-token-0123456789abcdef";
constexpr absl::Duration kDeadline = absl::Milliseconds(200);
// A call may finish a little after its deadline (the server's answer in
// flight, a loaded machine); beyond this it hung.
constexpr absl::Duration kHangSlack = absl::Seconds(10);

struct Stubs {
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::unique_ptr<v1::WorkerService::Stub> workers;
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints;
};

// Sends one call; returns its status.
using Sender = std::function<grpc::Status(Stubs&, grpc::ClientContext*, const std::string&)>;

struct Method {
  const char* name;
  Sender send;
};

template <typename Req, typename Resp, typename Stub>
Sender Unary(std::unique_ptr<Stub> Stubs::*stub,
             grpc::Status (Stub::*call)(grpc::ClientContext*, const Req&, Resp*)) {
  return [stub, call](Stubs& s, grpc::ClientContext* ctx, const std::string& bytes) {
    Req req;
    if (!req.ParseFromString(bytes)) return grpc::Status(grpc::StatusCode::UNKNOWN, "unparsed");
    Resp resp;
    return ((*(s.*stub)).*call)(ctx, req, &resp);
  };
}

template <typename Req, typename Msg, typename Stub>
Sender Stream(std::unique_ptr<Stub> Stubs::*stub,
              std::unique_ptr<grpc::ClientReader<Msg>> (Stub::*call)(grpc::ClientContext*,
                                                                    const Req&)) {
  return [stub, call](Stubs& s, grpc::ClientContext* ctx, const std::string& bytes) {
    Req req;
    if (!req.ParseFromString(bytes)) return grpc::Status(grpc::StatusCode::UNKNOWN, "unparsed");
    std::unique_ptr<grpc::ClientReader<Msg>> reader = ((*(s.*stub)).*call)(ctx, req);
    Msg msg;
    for (int i = 0; i < 4 && reader->Read(&msg); ++i) {
    }
    ctx->TryCancel();
    return reader->Finish();
  };
}

// Every method in a fixed order: the order is the input format (never
// reorder; append).
const std::vector<Method>& Methods() {
  static const auto* methods = new std::vector<Method>{
      {"JobService/CreateJob", Unary(&Stubs::jobs, &v1::JobService::Stub::CreateJob)},
      {"JobService/GetJob", Unary(&Stubs::jobs, &v1::JobService::Stub::GetJob)},
      {"JobService/ListJobs", Unary(&Stubs::jobs, &v1::JobService::Stub::ListJobs)},
      {"JobService/CancelJob", Unary(&Stubs::jobs, &v1::JobService::Stub::CancelJob)},
      {"JobService/ListMembers", Unary(&Stubs::jobs, &v1::JobService::Stub::ListMembers)},
      {"JobService/DrainWorker", Unary(&Stubs::jobs, &v1::JobService::Stub::DrainWorker)},
      {"JobService/GetPlan", Unary(&Stubs::jobs, &v1::JobService::Stub::GetPlan)},
      {"JobService/GetShardOwner", Unary(&Stubs::jobs, &v1::JobService::Stub::GetShardOwner)},
      {"JobService/WatchJob", Stream(&Stubs::jobs, &v1::JobService::Stub::WatchJob)},
      {"WorkerService/JoinJob", Unary(&Stubs::workers, &v1::WorkerService::Stub::JoinJob)},
      {"WorkerService/Session", Stream(&Stubs::workers, &v1::WorkerService::Stub::Session)},
      {"WorkerService/GetAssignment",
       Unary(&Stubs::workers, &v1::WorkerService::Stub::GetAssignment)},
      {"WorkerService/Heartbeat", Unary(&Stubs::workers, &v1::WorkerService::Stub::Heartbeat)},
      {"WorkerService/ReportError",
       Unary(&Stubs::workers, &v1::WorkerService::Stub::ReportError)},
      {"WorkerService/LeaveJob", Unary(&Stubs::workers, &v1::WorkerService::Stub::LeaveJob)},
      {"WorkerService/CompleteJob",
       Unary(&Stubs::workers, &v1::WorkerService::Stub::CompleteJob)},
      {"RendezvousService/KvSet", Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvSet)},
      {"RendezvousService/KvGet", Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvGet)},
      {"RendezvousService/KvAdd", Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvAdd)},
      {"RendezvousService/KvCompareAndSet",
       Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvCompareAndSet)},
      {"RendezvousService/KvWait",
       Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvWait)},
      {"RendezvousService/KvDelete",
       Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvDelete)},
      {"RendezvousService/KvNumKeys",
       Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::KvNumKeys)},
      {"RendezvousService/Barrier",
       Unary(&Stubs::rendezvous, &v1::RendezvousService::Stub::Barrier)},
      {"CheckpointService/BeginCheckpoint",
       Unary(&Stubs::checkpoints, &v1::CheckpointService::Stub::BeginCheckpoint)},
      {"CheckpointService/ReportShard",
       Unary(&Stubs::checkpoints, &v1::CheckpointService::Stub::ReportShard)},
      {"CheckpointService/CommitCheckpoint",
       Unary(&Stubs::checkpoints, &v1::CheckpointService::Stub::CommitCheckpoint)},
      {"CheckpointService/AbortCheckpoint",
       Unary(&Stubs::checkpoints, &v1::CheckpointService::Stub::AbortCheckpoint)},
      {"CheckpointService/ListCheckpoints",
       Unary(&Stubs::checkpoints, &v1::CheckpointService::Stub::ListCheckpoints)},
      {"CheckpointService/GetManifest",
       Unary(&Stubs::checkpoints, &v1::CheckpointService::Stub::GetManifest)},
  };
  return *methods;
}

// A private folder for the fuzzed jobs' checkpoint directories, made once
// per process under TEST_TMPDIR or /tmp.
const std::string& CheckpointRoot() {
  static const std::string* root = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp", "/shardline-fuzz-XXXXXX");
    CheckOrDie(::mkdtemp(tmpl.data()) != nullptr, "cannot make a temporary folder", tmpl);
    return new std::string(tmpl);
  }();
  return *root;
}

// Keeps a fuzzed CreateJob's checkpoint files inside CheckpointRoot().
std::string Confine(const std::string& bytes) {
  v1::CreateJobRequest req;
  if (!req.ParseFromString(bytes)) return bytes;
  if (req.has_spec() && req.spec().has_checkpoint()) {
    req.mutable_spec()->mutable_checkpoint()->set_directory(CheckpointRoot());
  }
  return req.SerializeAsString();
}

// The stubs of one CoordinatorHarness (testing/worker_harness.h: the real
// components over a memory store, served on loopback, no metrics).
class Coordinator {
 public:
  explicit Coordinator(const std::string& admin_token) : harness_(admin_token) {
    std::shared_ptr<grpc::Channel> channel = harness_.Channel();
    stubs_.jobs = v1::JobService::NewStub(channel);
    stubs_.workers = v1::WorkerService::NewStub(channel);
    stubs_.rendezvous = v1::RendezvousService::NewStub(channel);
    stubs_.checkpoints = v1::CheckpointService::NewStub(channel);
  }

  Stubs& stubs() { return stubs_; }

 private:
  worker::testing::CoordinatorHarness harness_;
  Stubs stubs_;
};

void AddCredential(int credential, grpc::ClientContext* ctx) {
  switch (credential) {
    case 0:
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
      break;
    case 1:
      break;
    case 2:
      ctx->AddMetadata("authorization", "Bearer not-a-token-this-coordinator-issued");
      break;
    default:
      ctx->AddMetadata("authorization", "Basic Zm9vOmJhcg==");
      break;
  }
}

}  // namespace

int MethodIndex(const std::string& name) {
  const std::vector<Method>& methods = Methods();
  for (size_t i = 0; i < methods.size(); ++i) {
    if (name == methods[i].name) return static_cast<int>(i);
  }
  return -1;
}

std::string EncodeCall(int method, int credential, const std::string& request) {
  const int n = static_cast<int>(Methods().size());
  CheckOrDie(method >= 0 && method < n && credential >= 0 && credential < 4 &&
                 n * 4 <= 256 && request.size() <= 0xffff,
             "EncodeCall: bad arguments");
  std::string out;
  out.push_back(static_cast<char>(method + n * credential));
  out.push_back(static_cast<char>(request.size() & 0xff));
  out.push_back(static_cast<char>(request.size() >> 8));
  out += request;
  return out;
}

int FuzzCoordinatorRpcs(const uint8_t* data, size_t size) {
  const std::vector<Method>& methods = Methods();
  const size_t n = methods.size();
  Coordinator coordinator(kAdminToken);
  size_t pos = 0;
  for (int calls = 0; calls < kMaxCallsPerInput && pos + 3 <= size; ++calls) {
    const size_t method = data[pos] % n;
    const int credential = static_cast<int>((data[pos] / n) % 4);
    size_t len = data[pos + 1] | (static_cast<size_t>(data[pos + 2]) << 8);
    pos += 3;
    if (len > size - pos) len = size - pos;
    std::string request(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    if (method == 0) request = Confine(request);

    grpc::ClientContext ctx;
    AddCredential(credential, &ctx);
    const absl::Time start = absl::Now();
    ctx.set_deadline(absl::ToChronoTime(start + kDeadline));
    grpc::Status status = methods[method].send(coordinator.stubs(), &ctx, request);
    const absl::Duration took = absl::Now() - start;
    CheckOrDie(took < kDeadline + kHangSlack,
               "a call did not answer within its deadline",
               absl::StrCat(methods[method].name, " took ", absl::FormatDuration(took)));
    if (!status.ok() && status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
        status.error_code() != grpc::StatusCode::CANCELLED) {
      CheckOrDie(!status.error_message().empty(), "an error without a message",
                 methods[method].name);
    }
  }
  return 0;
}

}  // namespace shardline::fuzz

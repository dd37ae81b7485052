// Writes the seed corpus of the coordinator RPC fuzzer (fuzz/rpc_fuzz_target.h)
// into the folder given: real requests as a worker and an operator send them,
// in the order they send them (create, join, assignment, heartbeat,
// key-values, barrier, checkpoint, session, leave), plus one short input per method.
//   bazel-bin/fuzz/make_rpc_corpus fuzz/corpus/rpc
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/rpc_fuzz_target.h"
#include "shardline/v1/coordinator.pb.h"
#include "testing/job_specs.h"

namespace shardline::fuzz {
namespace {

namespace v1 = ::shardline::v1;

constexpr char kJob[] = "fuzz-job";

v1::Fence Fence(const char* worker = "w0") {
  v1::Fence f;
  f.mutable_worker()->set_job_id(kJob);
  f.mutable_worker()->set_worker_id(worker);
  f.mutable_worker()->set_incarnation(1);
  f.set_generation(1);
  return f;
}

std::string Call(const char* method, const google::protobuf::Message& request,
                 int credential = 0) {
  const int index = MethodIndex(method);
  if (index < 0) {
    std::fprintf(stderr, "no method %s\n", method);
    std::exit(1);
  }
  return EncodeCall(index, credential, request.SerializeAsString());
}

std::string CreateJob() {
  v1::CreateJobRequest req;
  req.set_job_id(kJob);
  *req.mutable_spec() = fixtures::SmallSpec(1, 2, 4);
  req.mutable_spec()->mutable_checkpoint()->set_directory("/replaced/by/the/fuzzer");
  return Call("JobService/CreateJob", req);
}

std::string JoinJob(const char* worker = "w0") {
  v1::JoinJobRequest req;
  *req.mutable_worker() = Fence(worker).worker();
  req.set_host("host-a");
  req.set_device("cpu");
  return Call("WorkerService/JoinJob", req);
}

std::vector<std::pair<std::string, std::string>> Seeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  const std::string prefix = CreateJob() + JoinJob();

  v1::SessionRequest session;
  *session.mutable_worker() = Fence().worker();
  v1::GetAssignmentRequest assignment;
  *assignment.mutable_fence() = Fence();
  assignment.set_wait(true);
  assignment.mutable_timeout()->set_nanos(100000000);
  v1::HeartbeatRequest heartbeat;
  *heartbeat.mutable_fence() = Fence();
  heartbeat.set_state(v1::WORKER_STATE_TRAINING);
  heartbeat.set_step(1);
  v1::KvSetRequest kv_set;
  *kv_set.mutable_fence() = Fence();
  kv_set.set_scope("gloo/dp0");
  kv_set.set_key("rank0");
  kv_set.set_value("127.0.0.1:40000");
  v1::KvGetRequest kv_get;
  *kv_get.mutable_fence() = Fence();
  kv_get.set_scope("gloo/dp0");
  kv_get.set_key("rank0");
  kv_get.set_wait(true);
  kv_get.mutable_timeout()->set_nanos(50000000);
  v1::KvAddRequest kv_add;
  *kv_add.mutable_fence() = Fence();
  kv_add.set_scope("counters");
  kv_add.set_key("arrived");
  kv_add.set_delta(1);
  v1::KvCompareAndSetRequest kv_cas;
  *kv_cas.mutable_fence() = Fence();
  kv_cas.set_scope("gloo/dp0");
  kv_cas.set_key("leader");
  kv_cas.set_desired("rank0");
  v1::KvWaitRequest kv_wait;
  *kv_wait.mutable_fence() = Fence();
  kv_wait.set_scope("gloo/dp0");
  kv_wait.add_keys("rank0");
  kv_wait.mutable_timeout()->set_nanos(50000000);
  v1::KvDeleteRequest kv_delete;
  *kv_delete.mutable_fence() = Fence();
  kv_delete.set_scope("gloo/dp0");
  kv_delete.set_key("rank0");
  v1::BarrierRequest barrier;
  *barrier.mutable_fence() = Fence();
  barrier.set_scope("setup");
  barrier.set_name("communicators");
  barrier.set_participants(1);
  barrier.mutable_timeout()->set_nanos(50000000);
  v1::BeginCheckpointRequest begin;
  *begin.mutable_fence() = Fence();
  begin.set_step(1);
  v1::ReportShardRequest report;
  *report.mutable_fence() = Fence();
  report.set_checkpoint_id("ckpt-000001-g1");
  v1::ShardFile* file = report.add_files();
  file->set_path("rank0.bin");
  file->set_size_bytes(64);
  v1::SavedTensor* tensor = report.add_tensors();
  tensor->set_name("wte");
  tensor->set_dtype(v1::DTYPE_FLOAT32);
  tensor->add_global_shape(16);
  v1::SavedPiece* piece = tensor->add_pieces();
  piece->mutable_range()->set_end(16);
  piece->set_file("rank0.bin");
  piece->set_byte_length(64);
  report.set_data_cursor(4);
  v1::ListCheckpointsRequest list_checkpoints;
  list_checkpoints.set_job_id(kJob);
  v1::LeaveJobRequest leave;
  *leave.mutable_fence() = Fence();

  // The whole life of one worker, as the worker sends it.
  seeds.emplace_back(
      "worker_life",
      prefix + Call("WorkerService/GetAssignment", assignment) +
          Call("WorkerService/Heartbeat", heartbeat) +
          Call("RendezvousService/KvSet", kv_set) + Call("RendezvousService/KvGet", kv_get) +
          Call("RendezvousService/KvAdd", kv_add) +
          Call("RendezvousService/KvCompareAndSet", kv_cas) +
          Call("RendezvousService/KvWait", kv_wait) +
          Call("RendezvousService/KvDelete", kv_delete) +
          Call("RendezvousService/Barrier", barrier) +
          Call("CheckpointService/BeginCheckpoint", begin) +
          Call("CheckpointService/ReportShard", report) +
          Call("CheckpointService/ListCheckpoints", list_checkpoints) +
          Call("WorkerService/Session", session) + Call("WorkerService/LeaveJob", leave));

  // An operator's calls.
  v1::GetJobRequest get_job;
  get_job.set_job_id(kJob);
  v1::ListJobsRequest list_jobs;
  list_jobs.set_page_size(10);
  v1::ListMembersRequest members;
  members.set_job_id(kJob);
  v1::GetPlanRequest plan;
  plan.set_job_id(kJob);
  v1::GetShardOwnerRequest owner;
  owner.set_job_id(kJob);
  owner.set_parameter("wte");
  v1::WatchJobRequest watch;
  watch.set_job_id(kJob);
  v1::DrainWorkerRequest drain;
  drain.set_job_id(kJob);
  drain.set_worker_id("w0");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(kJob);
  cancel.set_reason("done with it");
  seeds.emplace_back("operator",
                     prefix + Call("JobService/GetJob", get_job) +
                         Call("JobService/ListJobs", list_jobs) +
                         Call("JobService/ListMembers", members) +
                         Call("JobService/GetPlan", plan) +
                         Call("JobService/GetShardOwner", owner) +
                         Call("JobService/WatchJob", watch) +
                         Call("JobService/DrainWorker", drain) +
                         Call("JobService/CancelJob", cancel));

  v1::ReportErrorRequest error;
  *error.mutable_fence() = Fence();
  error.set_message("all_reduce on dp group 0: peer rank 1 closed the connection");
  error.set_operation("all_reduce");
  error.set_peer_rank(1);
  seeds.emplace_back("report_error", prefix + Call("WorkerService/ReportError", error));

  v1::CommitCheckpointRequest commit;
  commit.set_job_id(kJob);
  commit.set_checkpoint_id("ckpt-000001-g1");
  v1::AbortCheckpointRequest abort;
  abort.set_job_id(kJob);
  abort.set_checkpoint_id("ckpt-000001-g1");
  abort.set_reason("operator");
  v1::GetManifestRequest manifest;
  manifest.set_job_id(kJob);
  manifest.set_checkpoint_id("ckpt-000001-g1");
  seeds.emplace_back("checkpoint_admin",
                     prefix + Call("CheckpointService/BeginCheckpoint", begin) +
                         Call("CheckpointService/CommitCheckpoint", commit) +
                         Call("CheckpointService/AbortCheckpoint", abort) +
                         Call("CheckpointService/GetManifest", manifest));

  // Credentials other than the admin token on the same calls.
  for (int credential = 1; credential < 4; ++credential) {
    seeds.emplace_back(absl::StrCat("credential_", credential),
                       prefix + Call("WorkerService/Heartbeat", heartbeat, credential) +
                           Call("JobService/ListJobs", list_jobs, credential));
  }
  return seeds;
}

}  // namespace
}  // namespace shardline::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  for (const auto& [name, bytes] : shardline::fuzz::Seeds()) {
    const std::string path = absl::StrCat(argv[1], "/", name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

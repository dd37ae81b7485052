// End-to-end: `shardctl checkpoint list/show/verify/consolidate` (and the old `checkpoints`
// spelling) against the real shardline-coordinator binary. Two simulated
// ranks write their shard files into the directory BeginCheckpoint names
// and report them; the coordinator verifies the files, commits, and writes
// manifest.json and LATEST; shardctl then shows what the manifest records,
// and `--json` is the same manifest as manifest.json on disk.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "testing/grpc_test_util.h"
#include "testing/plan_checkpoint.h"
#include "testing/coordinator_process.h"
#include "checkpoint/geometry.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using server::testing::Prepare;
using server::testing::SimWorker;
using e2e::CoordinatorProcess;
using e2e::Runfile;

struct Result {
  int rc = -1;
  std::string out;  // stdout
  std::string all;  // stdout and stderr
};

Result Shardctl(const std::string& address, const std::string& args) {
  Result r;
  for (const bool with_stderr : {false, true}) {
    const std::string command = absl::StrCat(Runfile("client/shardctl/shardctl"), " ", args,
                                             " --coordinator ", address,
                                             with_stderr ? " 2>&1" : " 2>/dev/null");
    const e2e::CommandResult run = e2e::RunCommand(command);
    r.rc = run.rc;
    (with_stderr ? r.all : r.out) = run.output;
  }
  return r;
}

TEST(CheckpointCommandsTest, ListAndShowACommittedCheckpoint) {
  CoordinatorProcess coordinator;
  ASSERT_FALSE(coordinator.address().empty()) << "no 'listening on' line from the coordinator";
  const std::string& address = coordinator.address();
  std::string root = fs::path(::testing::TempDir() + "/shardctl-ckpt").lexically_normal();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  fs::remove_all(root);

  auto channel = server::testing::MakeChannel(address);
  auto jobs = v1::JobService::NewStub(channel);
  auto checkpoints = v1::CheckpointService::NewStub(channel);
  {
    v1::CreateJobRequest req;
    req.set_job_id("ck");
    *req.mutable_spec() = server::testing::SmallSpec(2, 2, 2);
    req.mutable_spec()->mutable_checkpoint()->set_directory(root);
    req.mutable_spec()->mutable_checkpoint()->set_keep_last(2);
    root += "/ck";  // the job's checkpoints live in <directory>/<job_id>/
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->CreateJob(&ctx, req, &resp).ok());
  }
  Result r = Shardctl(address, "checkpoint list ck");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_EQ(r.out, "no checkpoints of job ck\n");
  r = Shardctl(address, "checkpoint show ck");
  EXPECT_EQ(r.rc, 2) << r.all;
  EXPECT_THAT(r.all, HasSubstr("shardctl checkpoint list ck --all"));

  SimWorker w0(channel, "ck", "w0", 1), w1(channel, "ck", "w1", 1);
  std::vector<absl::StatusOr<v1::Assignment>> got =
      server::testing::JoinAll({&w0, &w1}, /*open_session=*/true);
  ASSERT_TRUE(got[0].ok() && got[1].ok());
  SimWorker* by_rank[2] = {got[0]->rank() == 0 ? &w0 : &w1, got[0]->rank() == 0 ? &w1 : &w0};

  // Both ranks save step 7: every tensor of the plan, its elements in
  // halves (rank 0 the first, values 1; rank 1 the second, values 2).
  v1::Plan plan;
  {
    v1::GetPlanRequest req;
    req.set_job_id("ck");
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs->GetPlan(&ctx, req, &plan).ok());
  }
  const std::vector<checkpoint::PlannedTensor> tensors = checkpoint::CheckpointTensors(plan);
  ASSERT_FALSE(tensors.empty());
  std::string id, directory;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    v1::BeginCheckpointRequest req;
    *req.mutable_fence() = by_rank[rank]->fence();
    req.set_step(7);
    v1::BeginCheckpointResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = checkpoints->BeginCheckpoint(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    id = resp.checkpoint_id();
    directory = resp.directory();
  }
  v1::ReportShardResponse reported;
  uint64_t total_bytes = 0;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    absl::StatusOr<v1::ReportShardRequest> shard = fixtures::WritePlanShard(
        plan, directory, static_cast<int>(rank), 2, static_cast<float>(rank + 1));
    ASSERT_TRUE(shard.ok()) << shard.status();
    v1::ReportShardRequest req = *std::move(shard);
    total_bytes += req.files(0).size_bytes();
    *req.mutable_fence() = by_rank[rank]->fence();
    req.set_checkpoint_id(id);
    req.set_data_cursor(14);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = checkpoints->ReportShard(&ctx, req, &reported);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_EQ(reported.checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED)
      << reported.checkpoint().abort_reason();

  for (const char* spelling : {"checkpoint list ck", "checkpoints ck"}) {
    r = Shardctl(address, spelling);
    ASSERT_EQ(r.rc, 0) << spelling << ": " << r.all;
    EXPECT_THAT(r.out, AllOf(HasSubstr("CHECKPOINT"), HasSubstr(id), HasSubstr("COMMITTED"),
                             HasSubstr("2/2")))
        << spelling;
  }

  r = Shardctl(address, "checkpoint show ck");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, HasSubstr("Checkpoint:"));
  EXPECT_THAT(r.out, HasSubstr(id));
  EXPECT_THAT(r.out, HasSubstr("COMMITTED"));
  EXPECT_THAT(r.out, HasSubstr("world 2 = tp 1 x pp 1 x dp 2"));
  EXPECT_THAT(r.out, HasSubstr("sample 14"));
  EXPECT_THAT(r.out, HasSubstr("2 of 2, 2 files, "));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("(", total_bytes, " bytes)")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(tensors.size(), " (", 2 * tensors.size(), " pieces)")));
  EXPECT_THAT(r.out, HasSubstr(directory));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("TENSOR")));

  r = Shardctl(address, absl::StrCat("checkpoint show ck ", id, " --tensors"));
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, HasSubstr("TENSOR"));
  EXPECT_THAT(r.out, HasSubstr("FLOAT32"));
  EXPECT_THAT(r.out, HasSubstr("[256, 8]"));  // embedding.word_embeddings.weight

  // --json is the manifest; the same one the coordinator wrote next to the
  // shards, and LATEST names it.
  r = Shardctl(address, "checkpoint show ck --json");
  ASSERT_EQ(r.rc, 0) << r.all;
  v1::Manifest shown;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &shown).ok()) << r.out;
  std::ifstream manifest_file(directory + "/manifest.json");
  const std::string on_disk((std::istreambuf_iterator<char>(manifest_file)),
                            std::istreambuf_iterator<char>());
  v1::Manifest written;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(on_disk, &written).ok()) << on_disk;
  EXPECT_EQ(shown.SerializeAsString(), written.SerializeAsString());
  EXPECT_EQ(shown.checkpoint_id(), id);
  std::ifstream latest(root + "/LATEST");
  std::string latest_text((std::istreambuf_iterator<char>(latest)),
                          std::istreambuf_iterator<char>());
  EXPECT_EQ(latest_text, id + "\n");

  // Usage and the commands still to come.
  r = Shardctl(address, "checkpoint show ck nope");
  EXPECT_EQ(r.rc, 2) << r.all;
  EXPECT_THAT(r.all, HasSubstr("nope"));
  r = Shardctl(address, "checkpoint show");
  EXPECT_EQ(r.rc, 2) << r.all;
  r = Shardctl(address, "checkpoint frobnicate ck");
  EXPECT_EQ(r.rc, 2) << r.all;
  EXPECT_THAT(r.all, HasSubstr("unknown checkpoint subcommand 'frobnicate'"));
  r = Shardctl(address, "checkpoint --help");
  EXPECT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, AllOf(HasSubstr("checkpoint list"), HasSubstr("checkpoint show"),
                           HasSubstr("checkpoint verify"), HasSubstr("checkpoint consolidate")));

  // verify and consolidate through GetManifest (the files are visible here).
  r = Shardctl(address, "checkpoint verify ck");
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("checkpoint ", id, " (step 7): OK: ", tensors.size(),
                                            " tensors, 2 files, ", 2 * tensors.size(),
                                            " pieces, ")));
  const std::string out = root + "-model.safetensors";
  r = Shardctl(address, absl::StrCat("checkpoint consolidate ck ", id, " --out ", out));
  ASSERT_EQ(r.rc, 0) << r.all;
  std::ifstream model_file(out, std::ios::binary);
  const std::string model((std::istreambuf_iterator<char>(model_file)),
                          std::istreambuf_iterator<char>());
  ASSERT_GT(model.size(), 48u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(model[i])} << (8 * i);
  // The parameters (not the moments), sorted by name, back to back;
  // final_layernorm.weight [8]: 4 values 1 (rank 0), then 4 values 2.
  uint64_t data_bytes = 0, norm_offset = 0;
  for (const checkpoint::PlannedTensor& t : tensors) {
    if (absl::StrContains(t.name, "/")) continue;
    uint64_t numel = 1;
    for (uint64_t d : t.global_shape) numel *= d;
    if (t.name == "final_layernorm.weight") norm_offset = data_bytes;
    data_bytes += numel * 4;
  }
  ASSERT_EQ(model.size(), 8 + n + data_bytes);
  EXPECT_THAT(model.substr(8, n),
              HasSubstr(absl::StrCat("\"final_layernorm.weight\":{\"dtype\":\"F32\",\"shape\":[8],"
                                     "\"data_offsets\":[",
                                     norm_offset, ",", norm_offset + 32, "]}")));
  const float one = 1.0f, two = 2.0f;
  std::string expected;
  for (int i = 0; i < 8; ++i) {
    expected.append(reinterpret_cast<const char*>(i < 4 ? &one : &two), 4);
  }
  EXPECT_EQ(model.substr(8 + n + norm_offset, 32), expected);
  r = Shardctl(address, "checkpoint consolidate ck");
  EXPECT_EQ(r.rc, 2) << r.all;
  EXPECT_THAT(r.all, HasSubstr("--out"));
  r = Shardctl(address, "checkpoint verify ck ckpt-nope");
  EXPECT_EQ(r.rc, 2) << r.all;
  // A flipped byte: DataLoss, exit 1, naming the file.
  {
    std::fstream shard(directory + "/rank-00001.bin",
                       std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(3);
    shard.put('y');
  }
  r = Shardctl(address, absl::StrCat("checkpoint verify ck ", id));
  EXPECT_EQ(r.rc, 1) << r.all;
  EXPECT_THAT(r.all, AllOf(HasSubstr("is damaged"), HasSubstr("rank-00001.bin")));
}

}  // namespace
}  // namespace shardline

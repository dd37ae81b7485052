// The coordinator's checkpoint file work end to end: a real in-process
// server over a SQLite store with the verify_files hook, simulated ranks
// that write their shard files into the directory BeginCheckpoint names and
// report them. Checks manifest.json and LATEST after a commit, retention,
// deletion of aborted attempts, a missing file, and case C10 (a save that
// dies half way, three ways).
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "checkpoint/checkpoint_files.h"
#include "checkpoint/geometry.h"
#include "server/checkpoint_registry.h"
#include "common/clock.h"
#include "server/coordinator.h"
#include "server/rpc/coordinator_server.h"
#include "testing/grpc_test_util.h"
#include "testing/plan_checkpoint.h"
#include "server/rendezvous.h"
#include "server/state_store.h"

namespace shardline::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::Harness;
using testing::JoinAll;
using testing::MakeChannel;
using testing::Prepare;
using testing::SimWorker;
using testing::SmallSpec;

std::string Fresh(const std::string& name) {
  std::string dir = fs::path(::testing::TempDir() + "/" + name).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The coordinator's components over a SQLite store, as main.cc wires them
// (verify_files = VerifyShardFiles; no metrics).
testing::HarnessOptions Options(const std::string& state_path) {
  testing::HarnessOptions options;
  options.state_path = state_path;
  options.checkpoints.verify_files = checkpoint::VerifyShardFiles;
  options.metrics = false;
  return options;
}

// One job of `world` ranks with its checkpoint root, and the calls a rank
// makes to save.
class CheckpointE2eTest : public ::testing::Test {
 protected:
  void Start(const std::string& name, int world, uint32_t keep_last) {
    job_ = name;
    world_ = world;
    // spec.checkpoint.directory; the job's checkpoints live in its
    // <directory>/<job_id>/ root.
    const std::string directory = Fresh(name + "-ckpt");
    root_ = absl::StrCat(directory, "/", job_);
    state_ = absl::StrCat(Fresh(name + "-state"), "/state.db");
    h_ = std::make_unique<Harness>(Options(state_));
    Connect();
    v1::JobSpec spec = SmallSpec(world, world, world);
    spec.mutable_checkpoint()->set_directory(directory);
    spec.mutable_checkpoint()->set_keep_last(keep_last);
    v1::CreateJobRequest req;
    req.set_job_id(job_);
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    ASSERT_TRUE(jobs_->CreateJob(&ctx, req, &resp).ok());
    for (int i = 0; i < world; ++i) {
      owned_.push_back(std::make_unique<SimWorker>(h_->Channel(), job_, absl::StrCat("w", i), 1));
    }
    ASSERT_NO_FATAL_FAILURE(FormGeneration(testing::Pointers(owned_)));
  }

  void Connect() {
    jobs_ = v1::JobService::NewStub(h_->Channel());
    checkpoints_ = v1::CheckpointService::NewStub(h_->Channel());
  }

  // Joins `workers` (opening sessions when `open_session`) and fills rank_
  // (index = rank).
  void FormGeneration(const std::vector<SimWorker*>& workers, bool open_session = true) {
    std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll(workers, open_session);
    rank_.assign(world_, nullptr);
    for (size_t i = 0; i < workers.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      if (got[i]->spare()) continue;
      ASSERT_LT(got[i]->rank(), static_cast<uint32_t>(world_));
      rank_[got[i]->rank()] = workers[i];
    }
    for (SimWorker* w : rank_) ASSERT_NE(w, nullptr);
    plan_ = Plan();
  }

  grpc::Status Begin(int rank, uint64_t step, v1::BeginCheckpointResponse* out) {
    v1::BeginCheckpointRequest req;
    *req.mutable_fence() = rank_[rank]->fence();
    req.set_step(step);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    return checkpoints_->BeginCheckpoint(&ctx, req, out);
  }

  // Every rank begins `step`; returns the (common) response.
  v1::BeginCheckpointResponse BeginAll(uint64_t step) {
    v1::BeginCheckpointResponse first;
    for (int r = 0; r < world_; ++r) {
      v1::BeginCheckpointResponse b;
      grpc::Status s = Begin(r, step, &b);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (r == 0) first = b;
      EXPECT_EQ(b.checkpoint_id(), first.checkpoint_id());
    }
    return first;
  }

  static std::string FileOf(int rank) { return absl::StrFormat("rank-%05d.bin", rank); }

  // The job's current plan (GetPlan).
  v1::Plan Plan() {
    v1::GetPlanRequest req;
    req.set_job_id(job_);
    v1::Plan plan;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = jobs_->GetPlan(&ctx, req, &plan);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return plan;
  }

  // Writes rank `rank`'s shard file: its share of every tensor of plan_
  // (fixtures::WritePlanShard, values rank + 1); returns what it reports.
  v1::ReportShardRequest WriteShard(const std::string& directory, int rank) {
    absl::StatusOr<v1::ReportShardRequest> r =
        fixtures::WritePlanShard(plan_, directory, rank, world_, static_cast<float>(rank + 1));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::ReportShardRequest();
  }

  // Rank `rank`'s report of the share WriteShard writes (computed in a
  // scratch directory, so it can be reported without the real file).
  grpc::Status Report(int rank, const std::string& id, v1::ReportShardResponse* out,
                      SimWorker* as = nullptr) {
    v1::ReportShardRequest req = WriteShard(absl::StrCat(root_, "-scratch/", id), rank);
    *req.mutable_fence() = (as != nullptr ? as : rank_[rank])->fence();
    req.set_checkpoint_id(id);
    req.set_data_cursor(999);
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    return checkpoints_->ReportShard(&ctx, req, out);
  }

  // A full save of `step` by every rank; returns the last report's summary.
  v1::CheckpointSummary Save(uint64_t step) {
    const v1::BeginCheckpointResponse b = BeginAll(step);
    v1::ReportShardResponse resp;
    for (int r = 0; r < world_; ++r) {
      WriteShard(b.directory(), r);
      grpc::Status s = Report(r, b.checkpoint_id(), &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return resp.checkpoint();
  }

  absl::StatusOr<v1::Manifest> Manifest(const std::string& id) {
    v1::GetManifestRequest req;
    req.set_job_id(job_);
    req.set_checkpoint_id(id);
    v1::Manifest m;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    grpc::Status s = checkpoints_->GetManifest(&ctx, req, &m);
    if (!s.ok()) return FromGrpcStatus(s);
    return m;
  }

  std::vector<v1::CheckpointSummary> List() {
    v1::ListCheckpointsRequest req;
    req.set_job_id(job_);
    req.set_include_aborted(true);
    v1::ListCheckpointsResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, "");
    EXPECT_TRUE(checkpoints_->ListCheckpoints(&ctx, req, &resp).ok());
    return {resp.checkpoints().begin(), resp.checkpoints().end()};
  }

  // The restore point is `id` everywhere: GetManifest(""), LATEST, and its
  // manifest.json.
  void ExpectLatest(const std::string& id, uint64_t step) {
    absl::StatusOr<v1::Manifest> latest = Manifest("");
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(latest->checkpoint_id(), id);
    EXPECT_EQ(latest->step(), step);
    absl::StatusOr<std::string> on_disk = checkpoint::ReadLatestFile(root_);
    ASSERT_TRUE(on_disk.ok()) << on_disk.status();
    EXPECT_EQ(*on_disk, id);
    absl::StatusOr<v1::Manifest> file = checkpoint::ReadManifestFile(latest->directory());
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->SerializeAsString(), latest->SerializeAsString());
  }

  // Waits until `w` is told to restart at a later generation.
  static bool ToldToRestart(SimWorker* w) {
    return w
        ->WaitMessage([](const v1::SessionMessage& m) {
          return m.directive().has_restart_at_generation();
        }, absl::Seconds(5))
        .has_value();
  }

  std::string job_;
  int world_ = 0;
  std::string root_;
  std::string state_;
  std::unique_ptr<Harness> h_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
  std::vector<std::unique_ptr<SimWorker>> owned_;
  std::vector<SimWorker*> rank_;  // index = rank in the current generation
  v1::Plan plan_;                 // of the last generation formed
};

TEST_F(CheckpointE2eTest, CommitWritesManifestJsonThenLatest) {
  ASSERT_NO_FATAL_FAILURE(Start("commit", 2, 0));
  const v1::CheckpointSummary c = Save(10);
  ASSERT_EQ(c.state(), v1::CHECKPOINT_STATE_COMMITTED) << c.abort_reason();
  EXPECT_EQ(c.directory(), root_ + "/" + c.checkpoint_id());
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(c.checkpoint_id(), 10));
  absl::StatusOr<v1::Manifest> file = checkpoint::ReadManifestFile(c.directory());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(file->data_cursor(), 999u);
  ASSERT_EQ(file->ranks_size(), 2);
  EXPECT_EQ(file->ranks(1).files(0).path(), FileOf(1));
  // Every tensor of the plan, one piece from each rank.
  ASSERT_EQ(file->tensors_size(), static_cast<int>(checkpoint::CheckpointTensors(plan_).size()));
  for (const v1::SavedTensor& t : file->tensors()) EXPECT_EQ(t.pieces_size(), 2) << t.name();
  // LATEST moves with the next commit.
  const v1::CheckpointSummary d = Save(20);
  ASSERT_EQ(d.state(), v1::CHECKPOINT_STATE_COMMITTED) << d.abort_reason();
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(d.checkpoint_id(), 20));
  EXPECT_TRUE(fs::exists(c.directory() + "/manifest.json"));  // keep_last 0 keeps all
}

TEST_F(CheckpointE2eTest, KeepLastTwoDeletesTheOldestDirectory) {
  ASSERT_NO_FATAL_FAILURE(Start("retention", 2, 2));
  const v1::CheckpointSummary a = Save(10);
  const v1::CheckpointSummary b = Save(20);
  ASSERT_TRUE(fs::exists(a.directory()));
  const v1::CheckpointSummary c = Save(30);
  ASSERT_EQ(c.state(), v1::CHECKPOINT_STATE_COMMITTED) << c.abort_reason();
  EXPECT_FALSE(fs::exists(a.directory()));
  EXPECT_TRUE(fs::exists(b.directory() + "/" + FileOf(0)));
  EXPECT_TRUE(fs::exists(c.directory() + "/manifest.json"));
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(c.checkpoint_id(), 30));
  EXPECT_EQ(Manifest(a.checkpoint_id()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointE2eTest, AbortedCheckpointDirectoryIsDeleted) {
  ASSERT_NO_FATAL_FAILURE(Start("abort", 2, 0));
  const v1::CheckpointSummary kept = Save(10);
  const v1::BeginCheckpointResponse b = BeginAll(20);
  WriteShard(b.directory(), 0);
  v1::ReportShardResponse resp;
  ASSERT_TRUE(Report(0, b.checkpoint_id(), &resp).ok());
  v1::AbortCheckpointRequest req;
  req.set_job_id(job_);
  req.set_checkpoint_id(b.checkpoint_id());
  req.set_reason("rank 1 ran out of disk");
  *req.mutable_fence() = rank_[1]->fence();
  v1::CheckpointSummary aborted;
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  ASSERT_TRUE(checkpoints_->AbortCheckpoint(&ctx, req, &aborted).ok());
  EXPECT_EQ(aborted.state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_FALSE(fs::exists(b.directory()));
  EXPECT_TRUE(fs::exists(kept.directory() + "/" + FileOf(0)));
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(kept.checkpoint_id(), 10));
}

TEST_F(CheckpointE2eTest, ReportedFileMissingOnDiskAbortsWithDataLoss) {
  ASSERT_NO_FATAL_FAILURE(Start("missing", 2, 0));
  const v1::CheckpointSummary kept = Save(10);
  const v1::BeginCheckpointResponse b = BeginAll(20);
  WriteShard(b.directory(), 0);  // rank 1 reports without writing its file
  v1::ReportShardResponse r0, r1;
  ASSERT_TRUE(Report(0, b.checkpoint_id(), &r0).ok());
  ASSERT_TRUE(Report(1, b.checkpoint_id(), &r1).ok());
  EXPECT_EQ(r1.checkpoint().state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(r1.checkpoint().abort_reason(), StartsWith("DATA_LOSS:"));
  EXPECT_THAT(r1.checkpoint().abort_reason(), HasSubstr(FileOf(1)));
  EXPECT_FALSE(fs::exists(b.directory()));
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(kept.checkpoint_id(), 10));
  // A file of the wrong size is DATA_LOSS too.
  const v1::BeginCheckpointResponse c = BeginAll(30);
  WriteShard(c.directory(), 0);
  fs::create_directories(c.directory());
  std::ofstream(c.directory() + "/" + FileOf(1), std::ios::binary) << "short";
  ASSERT_TRUE(Report(0, c.checkpoint_id(), &r0).ok());
  ASSERT_TRUE(Report(1, c.checkpoint_id(), &r1).ok());
  EXPECT_EQ(r1.checkpoint().state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(r1.checkpoint().abort_reason(), HasSubstr("has 5 bytes"));
}

// C10 (i) and (ii): W=4 saves step 10 after step 5 committed; rank 2 dies
// before writing (i), or after writing and reporting but before the commit
// (ii). The generation ends at once, every survivor is told to restart, the
// attempt is ABORTED and its directory gone, and the restore point stays
// step 5. The next save of step 10 (generation 2) has another directory and
// holds only its own files.
TEST_F(CheckpointE2eTest, C10RankDiesBeforeWritingOrBeforeCommit) {
  for (const bool rank2_reported : {false, true}) {
    SCOPED_TRACE(rank2_reported ? "(ii) after its shard" : "(i) before it writes");
    owned_.clear();
    ASSERT_NO_FATAL_FAILURE(Start(rank2_reported ? "c10-ii" : "c10-i", 4, 0));
    const v1::CheckpointSummary five = Save(5);
    ASSERT_EQ(five.state(), v1::CHECKPOINT_STATE_COMMITTED) << five.abort_reason();
    const v1::BeginCheckpointResponse b = BeginAll(10);
    v1::ReportShardResponse resp;
    for (int r : {0, 1}) {
      WriteShard(b.directory(), r);
      ASSERT_TRUE(Report(r, b.checkpoint_id(), &resp).ok());
    }
    if (rank2_reported) {
      WriteShard(b.directory(), 2);
      ASSERT_TRUE(Report(2, b.checkpoint_id(), &resp).ok());
      EXPECT_EQ(resp.checkpoint().reported_ranks(), 3u);
    }
    SimWorker* dead = rank_[2];
    const absl::Time killed = absl::Now();
    dead->KillSession();
    std::vector<SimWorker*> survivors;
    for (int r : {0, 1, 3}) {
      EXPECT_TRUE(ToldToRestart(rank_[r])) << "rank " << r;
      survivors.push_back(rank_[r]);
    }
    EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
    // The abort runs right after the generation ended; its directory goes.
    for (int i = 0; i < 50 && fs::exists(b.directory()); ++i) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_FALSE(fs::exists(b.directory()));
    // Rank 3 had not reported yet; its report now is refused (stale
    // generation), and the checkpoint shows ABORTED to anyone who asks.
    grpc::Status late = Report(3, b.checkpoint_id(), &resp);
    EXPECT_EQ(late.error_code(), grpc::StatusCode::ABORTED) << late.error_message();
    absl::StatusOr<v1::Manifest> attempt = Manifest(b.checkpoint_id());
    ASSERT_TRUE(attempt.ok()) << attempt.status();
    EXPECT_EQ(attempt->state(), v1::CHECKPOINT_STATE_ABORTED);
    EXPECT_FALSE(attempt->abort_reason().empty());
    ASSERT_NO_FATAL_FAILURE(ExpectLatest(five.checkpoint_id(), 5));
    // Re-form with a replacement for rank 2 and save step 10 again.
    owned_.push_back(std::make_unique<SimWorker>(h_->Channel(), job_, "w-new", 1));
    survivors.push_back(owned_.back().get());
    ASSERT_NO_FATAL_FAILURE(FormGeneration(survivors, /*open_session=*/false));
    const v1::BeginCheckpointResponse again = BeginAll(10);
    EXPECT_NE(again.checkpoint_id(), b.checkpoint_id());
    EXPECT_NE(again.directory(), b.directory());
    EXPECT_FALSE(fs::exists(again.directory()));  // nothing of the dead attempt in it
    for (int r = 0; r < world_; ++r) {
      WriteShard(again.directory(), r);
      ASSERT_TRUE(Report(r, again.checkpoint_id(), &resp).ok());
    }
    ASSERT_EQ(resp.checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED)
        << resp.checkpoint().abort_reason();
    ASSERT_NO_FATAL_FAILURE(ExpectLatest(again.checkpoint_id(), 10));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(again.directory())) {
      names.push_back(e.path().filename().string());
    }
    EXPECT_THAT(names, ::testing::UnorderedElementsAre(FileOf(0), FileOf(1), FileOf(2), FileOf(3),
                                                       "manifest.json"));
    h_.reset();
  }
}

// C10 (iii): the coordinator dies while the save of step 10 is in flight
// (three ranks reported, rank 2 wrote its shard but had not reported). The
// restarted coordinator aborts the attempt, deletes its directory before
// serving, and still restores step 5; rank 2's report and every rank's
// question about the checkpoint get the abort and its reason.
TEST_F(CheckpointE2eTest, C10CoordinatorRestartsDuringTheSave) {
  ASSERT_NO_FATAL_FAILURE(Start("c10-iii", 4, 0));
  const v1::CheckpointSummary five = Save(5);
  ASSERT_EQ(five.state(), v1::CHECKPOINT_STATE_COMMITTED) << five.abort_reason();
  const v1::BeginCheckpointResponse b = BeginAll(10);
  v1::ReportShardResponse resp;
  for (int r : {0, 1, 3}) {
    WriteShard(b.directory(), r);
    ASSERT_TRUE(Report(r, b.checkpoint_id(), &resp).ok());
  }
  WriteShard(b.directory(), 2);
  h_->Kill();
  h_ = std::make_unique<Harness>(Options(state_));
  Connect();
  EXPECT_FALSE(fs::exists(b.directory()));
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(five.checkpoint_id(), 5));
  for (SimWorker* w : rank_) {  // the workers reconnect, same generation
    w->SetChannel(h_->Channel());
    w->ClearMessages();
    ASSERT_TRUE(w->OpenSession().ok());
  }
  grpc::Status late = Report(2, b.checkpoint_id(), &resp);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << late.error_message();
  EXPECT_THAT(late.error_message(), HasSubstr("coordinator restarted"));
  absl::StatusOr<v1::Manifest> attempt = Manifest(b.checkpoint_id());
  ASSERT_TRUE(attempt.ok()) << attempt.status();
  EXPECT_EQ(attempt->state(), v1::CHECKPOINT_STATE_ABORTED);
  // The same generation saves step 10 again under the same id? No: that
  // (generation, step) stays aborted; the ranks save a later step.
  v1::BeginCheckpointResponse retry;
  EXPECT_EQ(Begin(0, 10, &retry).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const v1::CheckpointSummary eleven = Save(11);
  ASSERT_EQ(eleven.state(), v1::CHECKPOINT_STATE_COMMITTED) << eleven.abort_reason();
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(eleven.checkpoint_id(), 11));
}

// manifest.json cannot be written (here: a directory is in its way): the
// checkpoint is still committed — the store decided — and GetManifest serves
// it; LATEST is not moved past a checkpoint without its manifest.json.
TEST_F(CheckpointE2eTest, ManifestWriteFailureKeepsTheCommit) {
  ASSERT_NO_FATAL_FAILURE(Start("unwritable", 2, 0));
  const v1::CheckpointSummary a = Save(10);
  const v1::BeginCheckpointResponse b = BeginAll(20);
  fs::create_directories(b.directory() + "/manifest.json/blocker");
  v1::ReportShardResponse resp;
  for (int r = 0; r < world_; ++r) {
    WriteShard(b.directory(), r);
    ASSERT_TRUE(Report(r, b.checkpoint_id(), &resp).ok());
  }
  EXPECT_EQ(resp.checkpoint().state(), v1::CHECKPOINT_STATE_COMMITTED)
      << resp.checkpoint().abort_reason();
  absl::StatusOr<v1::Manifest> latest = Manifest("");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->checkpoint_id(), b.checkpoint_id());
  EXPECT_EQ(*checkpoint::ReadLatestFile(root_), a.checkpoint_id());
  v1::Job job;
  v1::GetJobRequest req;
  req.set_job_id(job_);
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  ASSERT_TRUE(jobs_->GetJob(&ctx, req, &job).ok());
  EXPECT_EQ(job.last_checkpoint().checkpoint_id(), b.checkpoint_id());
}

// A coordinator that died after the commit was durable but before
// manifest.json and LATEST were written: the next start writes them.
TEST_F(CheckpointE2eTest, RestartRepairsManifestJsonAndLatest) {
  ASSERT_NO_FATAL_FAILURE(Start("repair", 2, 0));
  const v1::CheckpointSummary a = Save(10);
  const v1::CheckpointSummary b = Save(20);
  ASSERT_EQ(b.state(), v1::CHECKPOINT_STATE_COMMITTED) << b.abort_reason();
  h_->Kill();
  fs::remove(b.directory() + "/manifest.json");
  ASSERT_TRUE(checkpoint::WriteLatestFile(root_, a.checkpoint_id()).ok());
  h_ = std::make_unique<Harness>(Options(state_));
  Connect();
  ASSERT_NO_FATAL_FAILURE(ExpectLatest(b.checkpoint_id(), 20));
}

}  // namespace
}  // namespace shardline::server

// The checkpoint commit workflow without gRPC: the real Coordinator and
// CheckpointRegistry over a memory store with a FakeClock, checkpoint files
// in a temp directory. Commit order (manifest.json, then LATEST, then
// expired directories) and its failure semantics, recovery at start, the
// unusable marks' fallback, and CheckpointService's rules.
#include "server/checkpoint_flow.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "checkpoint/checkpoint_files.h"
#include "common/clock.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "server/state_store.h"
#include "testing/job_specs.h"

namespace shardline::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using google::protobuf::util::TimeUtil;

constexpr char kJob[] = "job";

std::string Fresh(const std::string& name) {
  std::string dir = fs::path(::testing::TempDir() + "/" + name).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  fs::remove_all(dir);
  return dir;
}

void Touch(const std::string& path, const std::string& content = "x") {
  std::ofstream(path, std::ios::binary) << content;
}

class CheckpointFlowTest : public ::testing::Test {
 protected:
  CheckpointFlowTest()
      : dir_(Fresh(::testing::UnitTest::GetInstance()->current_test_info()->name())),
        root_(dir_ + "/" + kJob),
        store_(NewMemoryStore()) {
    Restart();
  }

  // A new coordinator, registry and flow on the same store, like a
  // restarted process (the files stay).
  void Restart() {
    flow_.reset();
    coordinator_ = std::make_unique<Coordinator>(&clock_, store_.get());
    ASSERT_TRUE(coordinator_->Recover().ok());
    absl::StatusOr<std::unique_ptr<CheckpointRegistry>> registry =
        CheckpointRegistry::Create(store_.get(), &clock_);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    flow_ = std::make_unique<CheckpointFlow>(
        coordinator_.get(), registry_.get(), [this](const std::vector<GenerationEnded>& ended) {
          for (const GenerationEnded& e : ended) {
            ended_.push_back(e);
            flow_->AbortPendingCheckpoint(e.job_id, e.reason);
          }
        });
  }

  // One worker, tp = pp = 1, keep_last as given; the checkpoint directory
  // is dir_ unless `directory` is false.
  v1::JobSpec Spec(uint32_t keep_last, bool directory = true) const {
    v1::JobSpec spec = fixtures::SmallSpec(/*min_workers=*/1, /*max_workers=*/1,
                                           /*global_batch=*/12, absl::Seconds(10));
    v1::ElasticPolicy* e = spec.mutable_elastic();
    *e->mutable_heartbeat_interval() = TimeUtil::SecondsToDuration(1);
    *e->mutable_last_call() = TimeUtil::SecondsToDuration(5);
    if (directory) spec.mutable_checkpoint()->set_directory(dir_);
    spec.mutable_checkpoint()->set_keep_last(keep_last);
    return spec;
  }

  // Creates the job through the flow and forms generation 1 with worker
  // "a" as rank 0.
  void CreateAndForm(const v1::JobSpec& spec) {
    v1::CreateJobRequest create;
    create.set_job_id(kJob);
    *create.mutable_spec() = spec;
    absl::StatusOr<v1::CreateJobResponse> created = flow_->CreateJob(create);
    ASSERT_TRUE(created.ok()) << created.status();
    v1::JoinJobRequest join;
    join.mutable_worker()->set_job_id(kJob);
    join.mutable_worker()->set_worker_id("a");
    join.mutable_worker()->set_incarnation(7);
    join.set_host("host-a");
    join.set_device("cpu");
    absl::StatusOr<v1::JoinJobResponse> joined = coordinator_->JoinJob(join);
    ASSERT_TRUE(joined.ok()) << joined.status();
    ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  }

  v1::Job Job() const { return *coordinator_->GetJob(kJob); }

  v1::Fence Fence() const {
    v1::Fence f;
    f.mutable_worker()->set_job_id(kJob);
    f.mutable_worker()->set_worker_id("a");
    f.mutable_worker()->set_incarnation(7);
    f.set_generation(Job().generation());
    return f;
  }

  FencedWorker Caller() {
    absl::StatusOr<FencedWorker> fw = coordinator_->CheckFence(Fence());
    EXPECT_TRUE(fw.ok()) << fw.status();
    return fw.ok() ? *fw : FencedWorker{};
  }

  // Begins the checkpoint of `step`; the rank writes its shard file unless
  // `write_shard` is false. Returns the begin answer.
  v1::BeginCheckpointResponse Begin(uint64_t step, bool write_shard = true) {
    absl::StatusOr<v1::BeginCheckpointResponse> begun = flow_->Begin(Caller(), step);
    EXPECT_TRUE(begun.ok()) << begun.status();
    if (!begun.ok()) return {};
    if (write_shard) {
      fs::create_directories(begun->directory());
      Touch(begun->directory() + "/rank-00000.bin", std::string(16, 'w'));
    }
    return *begun;
  }

  // The one rank's report of tensor "w" [4] (fp32) in rank-00000.bin.
  absl::StatusOr<v1::CheckpointSummary> Report(const std::string& checkpoint_id) {
    v1::ReportShardRequest r;
    *r.mutable_fence() = Fence();
    r.set_checkpoint_id(checkpoint_id);
    r.set_data_cursor(120);
    v1::ShardFile* f = r.add_files();
    f->set_path("rank-00000.bin");
    f->set_size_bytes(16);
    f->set_crc32c(1);
    v1::SavedTensor* t = r.add_tensors();
    t->set_name("w");
    t->set_dtype(v1::DTYPE_FLOAT32);
    t->add_global_shape(4);
    v1::SavedPiece* p = t->add_pieces();
    v1::DimSlice* d = p->mutable_slice()->add_dims();
    d->set_offset(0);
    d->set_length(4);
    p->mutable_range()->set_begin(0);
    p->mutable_range()->set_end(4);
    p->set_file("rank-00000.bin");
    p->set_byte_offset(0);
    p->set_byte_length(16);
    p->set_crc32c(2);
    return flow_->ReportShard(Caller(), r);
  }

  // Begin + the report; returns the committed checkpoint's id.
  std::string Save(uint64_t step) {
    const v1::BeginCheckpointResponse begun = Begin(step);
    absl::StatusOr<v1::CheckpointSummary> s = Report(begun.checkpoint_id());
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s.ok() ? s->state() : v1::CHECKPOINT_STATE_UNSPECIFIED,
              v1::CHECKPOINT_STATE_COMMITTED);
    return begun.checkpoint_id();
  }

  std::string Latest() const {
    absl::StatusOr<std::string> id = checkpoint::ReadLatestFile(root_);
    return id.ok() ? *id : std::string("<none: ") + std::string(id.status().message()) + ">";
  }

  std::string ManifestIdOnDisk(const std::string& checkpoint_id) const {
    absl::StatusOr<v1::Manifest> m = checkpoint::ReadManifestFile(root_ + "/" + checkpoint_id);
    return m.ok() ? m->checkpoint_id() : std::string("<none>");
  }

  const std::string dir_;   // spec.checkpoint.directory
  const std::string root_;  // the job's checkpoint root, dir_/job
  FakeClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CheckpointRegistry> registry_;
  std::unique_ptr<CheckpointFlow> flow_;
  std::vector<GenerationEnded> ended_;
};

TEST_F(CheckpointFlowTest, CreateJobMakesTheDirectoryAndABadSpecMakesNothing) {
  v1::CreateJobRequest bad;
  bad.set_job_id(kJob);
  *bad.mutable_spec() = Spec(0);
  bad.mutable_spec()->mutable_parallel()->set_tp(3);  // does not divide num_heads
  EXPECT_EQ(flow_->CreateJob(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(coordinator_->GetJob(kJob).status().code(), absl::StatusCode::kNotFound);

  // A directory that cannot be created (a file is in the way).
  fs::create_directories(fs::path(dir_).parent_path());
  Touch(dir_);
  v1::CreateJobRequest blocked;
  blocked.set_job_id(kJob);
  *blocked.mutable_spec() = Spec(0);
  absl::StatusOr<v1::CreateJobResponse> r = flow_->CreateJob(blocked);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("cannot be created by the coordinator"));
  EXPECT_EQ(coordinator_->GetJob(kJob).status().code(), absl::StatusCode::kNotFound);
  fs::remove(dir_);

  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(0)));
  EXPECT_TRUE(fs::is_directory(dir_));
}

TEST_F(CheckpointFlowTest, BeginEnforcesStepPhaseAndDirectory) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(0, /*directory=*/false)));
  absl::StatusOr<v1::BeginCheckpointResponse> r = flow_->Begin(Caller(), 101);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("step=101 is beyond spec.training.train_steps=100"));
  r = flow_->Begin(Caller(), 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("has no checkpoint directory"));
  FencedWorker spare = Caller();
  spare.active = false;
  r = flow_->Begin(spare, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("holds no rank"));
  EXPECT_EQ(flow_->ReportShard(spare, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  // Not RUNNING: the job is cancelled.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(kJob);
  FencedWorker caller = Caller();
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  r = flow_->Begin(caller, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("not RUNNING"));
  // The checkpoint RPCs on an unknown or unnamed job.
  EXPECT_EQ(flow_->Commit("", "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(flow_->Abort("nope", "x", "").status().code(), absl::StatusCode::kNotFound);
  v1::ListCheckpointsRequest list;
  list.set_job_id("nope");
  EXPECT_EQ(flow_->List(list).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointFlowTest, CommitWritesManifestThenLatestAndRetentionDeletesExpired) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/1)));
  const std::string s5 = Save(5);
  EXPECT_EQ(ManifestIdOnDisk(s5), s5);
  EXPECT_EQ(Latest(), s5);
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), s5);  // noted: the restore point

  const std::string s10 = Save(10);
  EXPECT_EQ(ManifestIdOnDisk(s10), s10);
  EXPECT_EQ(Latest(), s10);
  EXPECT_FALSE(fs::exists(root_ + "/" + s5));  // expired (keep_last 1): deleted
  EXPECT_TRUE(fs::exists(root_ + "/" + s10 + "/rank-00000.bin"));
  EXPECT_TRUE(ended_.empty());  // no spares: the commits grew nothing
}

TEST_F(CheckpointFlowTest, FailedManifestWriteLeavesLatestAndKeepsExpiredUntilRepaired) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/1)));
  const std::string s5 = Save(5);
  ASSERT_EQ(Latest(), s5);

  // A regular file where step 10's directory goes: manifest.json cannot be
  // written there.
  const v1::BeginCheckpointResponse begun = Begin(10, /*write_shard=*/false);
  Touch(begun.directory());
  absl::StatusOr<v1::CheckpointSummary> s = Report(begun.checkpoint_id());
  ASSERT_TRUE(s.ok()) << s.status();
  // Committed all the same (the store decides) and the restore point...
  EXPECT_EQ(s->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), begun.checkpoint_id());
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), begun.checkpoint_id());
  // ...but LATEST did not move past a checkpoint without its manifest.json,
  // and the directory retention expired is kept while LATEST names it.
  EXPECT_EQ(Latest(), s5);
  EXPECT_EQ(ManifestIdOnDisk(s5), s5);

  // The next start repairs manifest.json and LATEST.
  fs::remove(begun.directory());
  Restart();
  flow_->RecoverCheckpointFiles();
  EXPECT_EQ(ManifestIdOnDisk(begun.checkpoint_id()), begun.checkpoint_id());
  EXPECT_EQ(Latest(), begun.checkpoint_id());
}

TEST_F(CheckpointFlowTest, RecoveryDeletesAbortedDirectoriesAndRepairsLatest) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  const std::string s5 = Save(5);
  const std::string s10 = Save(10);
  // The coordinator dies with step 15 PENDING (its shard already written)
  // and LATEST behind (as if it died between the durable commit of step 10
  // and the file writes).
  const v1::BeginCheckpointResponse pending = Begin(15);
  ASSERT_TRUE(checkpoint::WriteLatestFile(root_, s5).ok());
  fs::remove(root_ + "/" + s10 + "/manifest.json");

  Restart();
  flow_->RecoverCheckpointFiles();
  EXPECT_FALSE(fs::exists(pending.directory()));
  absl::StatusOr<v1::Manifest> aborted = registry_->GetManifest(kJob, pending.checkpoint_id());
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_EQ(aborted->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_EQ(Latest(), s10);
  EXPECT_EQ(ManifestIdOnDisk(s10), s10);
  EXPECT_EQ(ManifestIdOnDisk(s5), s5);
}

TEST_F(CheckpointFlowTest, AbortsDeleteTheDirectory) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  // By request: a reason by default.
  v1::BeginCheckpointResponse begun = Begin(5);
  absl::StatusOr<v1::CheckpointSummary> r = flow_->Abort(kJob, begun.checkpoint_id(), "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_EQ(r->abort_reason(), "aborted by request");
  EXPECT_FALSE(fs::exists(begun.directory()));
  // A generation that ends aborts its pending checkpoint.
  begun = Begin(6);
  flow_->AbortPendingCheckpoint(kJob, "rank 0 lost");
  EXPECT_FALSE(fs::exists(begun.directory()));
  EXPECT_EQ(registry_->GetManifest(kJob, begun.checkpoint_id())->abort_reason(), "rank 0 lost");
}

// A DATA_LOSS report naming the restore point: the coordinator marks it in
// the registry (the marks' owner) and falls back; LATEST moves back at once;
// the mark is shown, and survives a restart.
TEST_F(CheckpointFlowTest, DataLossMarkMovesLatestBack) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  const std::string s5 = Save(5);
  const std::string s10 = Save(10);
  ASSERT_EQ(Latest(), s10);
  ASSERT_EQ(Job().last_checkpoint().checkpoint_id(), s10);

  v1::ReportErrorRequest report;
  *report.mutable_fence() = Fence();
  report.set_code(static_cast<int>(absl::StatusCode::kDataLoss));
  report.set_operation("restore");
  report.set_message(absl::StrCat("restoring ", s10, ": crc32c 0x1234 expected 0x5678"));
  absl::StatusOr<v1::ReportErrorResponse> r = flow_->ReportError(report);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->directive().restart_at_generation().generation(), 2u);
  ASSERT_EQ(ended_.size(), 1u);  // passed on
  EXPECT_EQ(ended_[0].generation, 1u);

  EXPECT_EQ(Latest(), s5);
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), s5);
  EXPECT_THAT(registry_->UnusableReason(kJob, s10).value_or(""), HasSubstr("crc32c 0x1234"));
  v1::ListCheckpointsRequest list;
  list.set_job_id(kJob);
  absl::StatusOr<v1::ListCheckpointsResponse> listed = flow_->List(list);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->checkpoints_size(), 2);
  EXPECT_THAT(listed->checkpoints(0).unusable_reason(), HasSubstr("crc32c 0x1234"));
  EXPECT_EQ(listed->checkpoints(1).unusable_reason(), "");
  v1::GetManifestRequest get;
  get.set_job_id(kJob);
  get.set_checkpoint_id(s10);
  EXPECT_THAT(flow_->GetManifest(get)->unusable_reason(), HasSubstr("crc32c 0x1234"));
  get.clear_checkpoint_id();  // the newest usable one
  EXPECT_EQ(flow_->GetManifest(get)->checkpoint_id(), s5);

  Restart();
  EXPECT_THAT(registry_->UnusableReason(kJob, s10).value_or(""), HasSubstr("crc32c 0x1234"));
  EXPECT_EQ(CheckpointFlow::JobCheckpointRoot(Job()), root_);
  flow_->RecoverCheckpointFiles();
  EXPECT_EQ(Latest(), s5);
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), s5);
}

// The last usable checkpoint found corrupt: LATEST is removed and the job
// starts over.
TEST_F(CheckpointFlowTest, DataLossOfTheOnlyCheckpointRemovesLatest) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  const std::string s5 = Save(5);
  v1::ReportErrorRequest report;
  *report.mutable_fence() = Fence();
  report.set_code(static_cast<int>(absl::StatusCode::kDataLoss));
  report.set_message(absl::StrCat("restoring ", s5, ": short file"));
  ASSERT_TRUE(flow_->ReportError(report).ok());
  EXPECT_FALSE(Job().has_last_checkpoint());
  EXPECT_EQ(checkpoint::ReadLatestFile(root_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_->UnusableReason(kJob, s5).has_value());
}

}  // namespace
}  // namespace shardline::server

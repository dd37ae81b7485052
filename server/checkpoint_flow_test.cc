// The checkpoint commit workflow without gRPC: the real Coordinator and
// CheckpointRegistry over a memory store with a FakeClock, checkpoint files
// in a temp directory. Commit order (manifest.json, then LATEST, then
// expired directories) and its failure semantics, recovery at start, the
// unusable marks' fallback, and CheckpointService's rules.
#include "server/checkpoint_flow.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "checkpoint/checkpoint_files.h"
#include "checkpoint/geometry.h"
#include "common/clock.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "server/state_store.h"
#include "testing/job_specs.h"
#include "testing/plan_checkpoint.h"

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

  // Begins the checkpoint of `step`; the rank writes its shard file (every
  // tensor of the plan, fixtures::WritePlanShard) unless `write_shard` is
  // false. Returns the begin answer.
  v1::BeginCheckpointResponse Begin(uint64_t step, bool write_shard = true) {
    absl::StatusOr<v1::BeginCheckpointResponse> begun = flow_->Begin(Caller(), step);
    EXPECT_TRUE(begun.ok()) << begun.status();
    if (!begun.ok()) return {};
    // Without the shard on disk the report is what it would have been.
    const std::string into = write_shard ? begun->directory() : dir_ + "-unwritten";
    absl::StatusOr<v1::Plan> plan = coordinator_->GetPlan(kJob);
    EXPECT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<v1::ReportShardRequest> shard =
        fixtures::WritePlanShard(*plan, into, /*rank=*/0, /*world=*/1);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (shard.ok()) shards_[begun->checkpoint_id()] = *shard;
    return *begun;
  }

  // The one rank's report of the plan's tensors (files and tensors as
  // Begin wrote them, or `content` when given).
  absl::StatusOr<v1::CheckpointSummary> Report(const std::string& checkpoint_id,
                                               const v1::ReportShardRequest* content = nullptr) {
    v1::ReportShardRequest r = content != nullptr ? *content : shards_[checkpoint_id];
    *r.mutable_fence() = Fence();
    r.set_checkpoint_id(checkpoint_id);
    r.set_data_cursor(120);
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

  // Worker "a" joins again after its generation ended; the next one forms.
  void Rejoin() {
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
  std::map<std::string, v1::ReportShardRequest> shards_;  // by checkpoint id, from Begin
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


// Issue 14, defect 6: rank 0 reporting no files and no tensors got the
// checkpoint COMMITTED and LATEST (the adapter never set expected_tensors),
// and its restore then failed the job.
TEST_F(CheckpointFlowTest, AnEmptyReportIsRefused) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  const v1::BeginCheckpointResponse begun = Begin(5, /*write_shard=*/false);
  const v1::ReportShardRequest empty;
  absl::StatusOr<v1::CheckpointSummary> s = Report(begun.checkpoint_id(), &empty);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(s->abort_reason(), HasSubstr("DATA_LOSS"));
  EXPECT_THAT(s->abort_reason(), HasSubstr("no rank saved any tensor"));
  EXPECT_FALSE(registry_->Latest(kJob).has_value());
  EXPECT_FALSE(Job().has_last_checkpoint());
  EXPECT_EQ(checkpoint::ReadLatestFile(root_).status().code(), absl::StatusCode::kNotFound);
}

// A commit needs every tensor of the plan, covered exactly, and nothing
// else.
TEST_F(CheckpointFlowTest, APartialOrForeignCoverIsRefused) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  absl::StatusOr<v1::Plan> plan = coordinator_->GetPlan(kJob);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(checkpoint::CheckpointTensors(*plan).size(), 3u);

  // Half of every tensor (what rank 0 of two would write).
  v1::BeginCheckpointResponse begun = Begin(5, /*write_shard=*/false);
  absl::StatusOr<v1::ReportShardRequest> half =
      fixtures::WritePlanShard(*plan, begun.directory(), 0, /*world=*/2);
  ASSERT_TRUE(half.ok()) << half.status();
  absl::StatusOr<v1::CheckpointSummary> s = Report(begun.checkpoint_id(), &*half);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(s->abort_reason(), HasSubstr("are in no piece"));

  // One tensor of the plan missing.
  begun = Begin(6);
  v1::ReportShardRequest missing = shards_[begun.checkpoint_id()];
  const std::string dropped = missing.tensors(0).name();
  missing.mutable_tensors()->erase(missing.mutable_tensors()->begin());
  s = Report(begun.checkpoint_id(), &missing);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(s->abort_reason(), HasSubstr("\"" + dropped + "\" was saved by no rank"));

  // A tensor the plan does not have (here: a renamed one).
  begun = Begin(7);
  v1::ReportShardRequest foreign = shards_[begun.checkpoint_id()];
  foreign.mutable_tensors(0)->set_name("w");
  s = Report(begun.checkpoint_id(), &foreign);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_FALSE(registry_->Latest(kJob).has_value());

  // The whole plan commits.
  EXPECT_FALSE(Save(8).empty());
  EXPECT_TRUE(registry_->Latest(kJob).has_value());
}

// A restore that finds its checkpoint unusable for another reason than a
// checksum (here NOT_FOUND: a tensor missing from its manifest) falls back
// as for DATA_LOSS instead of counting as the worker's error (three such
// generations failed the job).
TEST_F(CheckpointFlowTest, AnUnusableRestorePointFallsBackWhateverTheCode) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  const std::string s5 = Save(5);
  const std::string s10 = Save(10);
  // A save error that names the restore point is not a restore failure.
  v1::ReportErrorRequest save;
  *save.mutable_fence() = Fence();
  save.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  save.set_message(absl::StrCat("BeginCheckpoint: step=10 is not above ", s10));
  ASSERT_TRUE(flow_->ReportError(save).ok());
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), s10);
  EXPECT_FALSE(registry_->UnusableReason(kJob, s10).has_value());
  ASSERT_NO_FATAL_FAILURE(Rejoin());

  v1::ReportErrorRequest report;
  *report.mutable_fence() = Fence();
  report.set_code(static_cast<int>(absl::StatusCode::kNotFound));
  report.set_operation("train");
  report.set_message(
      absl::StrCat("restoring ", s10, ": no tensor \"embedding.word_embeddings.weight\""));
  absl::StatusOr<v1::ReportErrorResponse> r = flow_->ReportError(report);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), s5);
  EXPECT_THAT(registry_->UnusableReason(kJob, s10).value_or(""), HasSubstr("no tensor"));
  EXPECT_EQ(Latest(), s5);
  EXPECT_NE(Job().phase(), v1::JOB_PHASE_FAILED);
  ASSERT_NO_FATAL_FAILURE(Rejoin());
  // A transient failure (UNAVAILABLE) of the restore of s5 keeps it.
  report.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  *report.mutable_fence() = Fence();
  report.set_message(absl::StrCat("restoring ", s5, ": coordinator unreachable"));
  ASSERT_TRUE(flow_->ReportError(report).ok());
  EXPECT_EQ(Job().last_checkpoint().checkpoint_id(), s5);
  EXPECT_FALSE(registry_->UnusableReason(kJob, s5).has_value());
}

// Issue 14, defect 5: with <dir>/<job> -> /victim the coordinator overwrote
// /victim/LATEST and wrote /victim/ckpt-*/manifest.json.
TEST_F(CheckpointFlowTest, ASymlinkedJobRootGetsNoCoordinatorWrite) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/0)));
  const std::string victim = dir_ + "-victim";
  fs::create_directories(victim);
  Touch(victim + "/LATEST", "precious\n");
  fs::remove_all(root_);
  fs::create_symlink(victim, root_);
  const v1::BeginCheckpointResponse begun = Begin(5);  // the rank writes through the link
  absl::StatusOr<v1::CheckpointSummary> s = Report(begun.checkpoint_id());
  ASSERT_TRUE(s.ok()) << s.status();
  std::ifstream in(victim + "/LATEST");
  std::string latest;
  std::getline(in, latest);
  EXPECT_EQ(latest, "precious");
  EXPECT_FALSE(fs::exists(victim + "/" + begun.checkpoint_id() + "/manifest.json"));
  // And at start nothing there is touched either.
  Restart();
  flow_->RecoverCheckpointFiles();
  EXPECT_TRUE(fs::exists(victim + "/" + begun.checkpoint_id() + "/rank-00000.bin"));
  EXPECT_TRUE(fs::exists(victim + "/LATEST"));
}

// Issue 14, defect 9: a commit forgets expired checkpoints in the store and
// then deletes their directories; a crash in between (or during a LATEST
// write, or part way through a deletion) left an expired ckpt-* directory
// with a valid-looking manifest unknown to the registry, a tombstone or a
// .LATEST.tmp-* file. The next start removes them and keeps every
// checkpoint the registry knows and any newer directory.
TEST_F(CheckpointFlowTest, StartRemovesWhatACrashDuringRetentionLeft) {
  ASSERT_NO_FATAL_FAILURE(CreateAndForm(Spec(/*keep_last=*/1)));
  const std::string s5 = Save(5);
  const std::string s10 = Save(10);
  ASSERT_FALSE(fs::exists(root_ + "/" + s5));
  // The crash states: s5's directory still whole (the store forgot it; the
  // coordinator died before deleting), a tombstone of a deletion cut short,
  // a LATEST temp file, a manifest.json temp file.
  fs::copy(root_ + "/" + s10, root_ + "/" + s5, fs::copy_options::recursive);
  const std::string s3 = CheckpointRegistry::CheckpointId(1, 3);
  fs::copy(root_ + "/" + s10, root_ + "/.deleting-" + s3, fs::copy_options::recursive);
  Touch(root_ + "/.LATEST.tmp-4242-0", s5);
  Touch(root_ + "/" + s10 + "/.manifest.json.tmp-4242-1", "{");
  // Kept: a newer directory the registry does not know (never deleted: a
  // save is always above the newest), and what is not named like a
  // checkpoint.
  const std::string s50 = CheckpointRegistry::CheckpointId(1, 50);
  fs::create_directories(root_ + "/" + s50);
  fs::create_directories(root_ + "/notes");

  Restart();
  flow_->RecoverCheckpointFiles();
  EXPECT_FALSE(fs::exists(root_ + "/" + s5));
  EXPECT_FALSE(fs::exists(root_ + "/.deleting-" + s3));
  EXPECT_FALSE(fs::exists(root_ + "/.LATEST.tmp-4242-0"));
  EXPECT_FALSE(fs::exists(root_ + "/" + s10 + "/.manifest.json.tmp-4242-1"));
  EXPECT_TRUE(fs::exists(root_ + "/" + s10 + "/rank-00000.bin"));
  EXPECT_EQ(ManifestIdOnDisk(s10), s10);
  EXPECT_EQ(Latest(), s10);
  EXPECT_TRUE(fs::exists(root_ + "/" + s50));
  EXPECT_TRUE(fs::exists(root_ + "/notes"));
}

}  // namespace
}  // namespace shardline::server

// Restore fallback end to end (issue 6; DESIGN.md "Checkpoints": a checksum
// mismatch is DataLoss and restore falls back to the previous committed
// checkpoint). A real shardline-coordinator and three shardline-worker
// processes (world 2 and a spare) train with a checkpoint every 5 steps.
// The ranks are frozen, a byte of every shard file of the newest committed
// checkpoint is flipped, and one rank is killed: the job re-forms, the
// restore of the corrupt checkpoint fails with DataLoss, the coordinator
// marks it unusable and re-forms from the previous committed checkpoint, and
// the job completes with the loss of an uninterrupted run.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/job_spec.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "worker/process_harness.h"
#include "worker/train/data.h"
#include "worker/train/job_options.h"
#include "worker/train/local_cluster.h"
#include "worker/train/trainer.h"

namespace shardline::worker {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::shardline::v1;

constexpr int kSteps = 30;

// As in elastic_training_test.cc; keep_last 3 so that the previous
// checkpoint is still there.
v1::JobSpec Spec(const std::string& checkpoint_dir) {
  v1::JobSpec spec;
  spec.set_name("fallback");
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(2);
  m->set_vocab_size(256);
  m->set_seq_length(16);
  spec.mutable_parallel()->set_tp(1);
  spec.mutable_parallel()->set_pp(1);
  spec.mutable_parallel()->set_zero_stage(1);
  v1::TrainingConfig* t = spec.mutable_training();
  t->set_global_batch(12);
  t->set_micro_batch(2);
  t->set_train_steps(kSteps);
  t->set_learning_rate(3e-3);
  t->set_min_learning_rate(3e-4);
  t->set_warmup_steps(4);
  t->set_weight_decay(0.1);
  t->set_grad_clip(1.0);
  t->set_seed(7);
  spec.mutable_data()->set_dataset_path(Runfile("data/tinyshakespeare.txt"));
  spec.mutable_data()->set_validation_fraction(0.1);
  spec.mutable_checkpoint()->set_directory(checkpoint_dir);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_keep_last(3);
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(2);
  e->set_max_workers(2);
  e->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
  e->mutable_heartbeat_timeout()->set_seconds(3);
  e->mutable_last_call()->set_nanos(500 * 1000 * 1000);
  e->mutable_join_timeout()->set_seconds(60);
  e->mutable_collective_timeout()->set_seconds(20);
  return spec;
}

// The final loss of the same job trained without interruption (one rank).
double UninterruptedFinalLoss(const v1::JobSpec& raw) {
  absl::StatusOr<v1::JobSpec> spec = server::ResolveJobSpec(raw);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<train::TrainingOptions> options = train::TrainingOptionsFromSpec(*spec, 1);
  EXPECT_TRUE(options.ok()) << options.status();
  absl::StatusOr<train::Corpus> corpus =
      train::Corpus::Load(spec->data().dataset_path(), spec->data().validation_fraction());
  EXPECT_TRUE(corpus.ok()) << corpus.status();
  double loss = -1;
  absl::Status s = train::RunLocalCluster(
      options->parallel, [&](int, const train::RankGroups& groups) -> absl::Status {
        absl::StatusOr<std::unique_ptr<train::Trainer>> t =
            train::Trainer::Create(*options, groups, &*corpus);
        if (!t.ok()) return t.status();
        for (int i = 0; i < kSteps; ++i) {
          absl::StatusOr<train::StepStats> st = (*t)->TrainStep();
          if (!st.ok()) return st.status();
          loss = st->loss;
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
  return loss;
}

// "gen G step S/T loss L ..." lines of a worker log: step -> loss.
std::map<int, double> StepLosses(const std::string& log) {
  std::map<int, double> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const size_t at = line.find(" step ");
    const size_t loss_at = line.find(" loss ");
    if (at == absl::string_view::npos || loss_at == absl::string_view::npos ||
        !absl::StrContains(line, "gen ")) {
      continue;
    }
    absl::string_view step = line.substr(at + 6);
    step = step.substr(0, step.find('/'));
    absl::string_view loss = line.substr(loss_at + 6);
    loss = loss.substr(0, loss.find(' '));
    int s;
    double l;
    if (absl::SimpleAtoi(step, &s) && absl::SimpleAtod(loss, &l)) out[s] = l;
  }
  return out;
}

// "ckpt-step000000000010-gen1" -> 10.
uint64_t StepOf(const std::string& checkpoint_id) {
  uint64_t step = 0;
  const size_t at = checkpoint_id.find("step");
  if (at == std::string::npos) return 0;
  absl::SimpleAtoi(checkpoint_id.substr(at + 4, 12), &step);
  return step;
}

class RestoreFallbackTest : public ::testing::Test {
 protected:
  void TearDown() override { std::cout << Logs() << std::flush; }

  std::string Logs() {
    std::string out;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i] != nullptr) {
        absl::StrAppend(&out, "\n--- worker ", i, ":\n", workers_[i]->Log());
      }
    }
    if (coordinator_ != nullptr) absl::StrAppend(&out, "\n--- coordinator:\n", coordinator_->Log());
    return out;
  }

  v1::Job GetJob() {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    auto jobs = v1::JobService::NewStub(channel);
    v1::GetJobRequest req;
    req.set_job_id("fallback");
    v1::Job job;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  std::string dir_ = [] {
    const std::string d = TempDir() + "/restore_fallback";
    ::mkdir(d.c_str(), 0755);
    return d;
  }();
  std::unique_ptr<Child> coordinator_;
  std::vector<std::unique_ptr<Child>> workers_;
  std::string address_;
};

TEST_F(RestoreFallbackTest, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  const std::string root = dir_ + "/ckpt";
  const v1::JobSpec spec = Spec(root);
  const double reference = UninterruptedFinalLoss(spec);

  coordinator_ = std::make_unique<Child>(
      Runfile("server/shardline-coordinator"),
      std::vector<std::string>{"--listen", "127.0.0.1:0", "--state", dir_ + "/state.db"},
      dir_ + "/coordinator.log");
  ASSERT_TRUE(coordinator_->WaitFor("listening on ", absl::Seconds(20))) << coordinator_->Log();
  address_ = ListeningAddress(*coordinator_);
  ASSERT_FALSE(address_.empty());
  {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    auto jobs = v1::JobService::NewStub(channel);
    v1::CreateJobRequest req;
    req.set_job_id("fallback");
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int i = 0; i < 3; ++i) {
    workers_.push_back(std::make_unique<Child>(
        Runfile("worker/shardline-worker"),
        std::vector<std::string>{"--coordinator", address_, "--job", "fallback", "--worker-id",
                                 absl::StrCat("w", i), "--log-interval", "1",
                                 "--connect-timeout", "30s"},
        absl::StrCat(dir_, "/worker", i, ".log")));
  }
  // Two checkpoints committed (steps 5 and 10) once step 12 is done.
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  bool reached = false;
  while (!reached && absl::Now() < deadline) {
    for (const auto& w : workers_) reached |= StepLosses(w->Log()).count(12) > 0;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(reached) << Logs();

  // Freeze the ranks so that no newer checkpoint commits meanwhile, then
  // corrupt every shard file of the newest committed one.
  std::vector<int> ranked;
  for (int i = 0; i < 3; ++i) {
    if (!absl::StrContains(workers_[i]->Log(), ": spare")) ranked.push_back(i);
  }
  ASSERT_EQ(ranked.size(), 2u) << Logs();
  for (int i : ranked) workers_[i]->Signal(SIGSTOP);
  absl::SleepFor(absl::Milliseconds(300));
  std::ifstream latest_file(root + "/LATEST");
  std::string corrupt;
  std::getline(latest_file, corrupt);
  ASSERT_FALSE(corrupt.empty());
  const uint64_t corrupt_step = StepOf(corrupt);
  ASSERT_GE(corrupt_step, 10u) << corrupt;
  std::string previous;  // the newest committed checkpoint before it
  for (const fs::directory_entry& d : fs::directory_iterator(root)) {
    const std::string id = d.path().filename().string();
    if (!fs::exists(d.path() / "manifest.json") || StepOf(id) >= corrupt_step) continue;
    if (previous.empty() || StepOf(id) > StepOf(previous)) previous = id;
  }
  ASSERT_FALSE(previous.empty()) << "no committed checkpoint before " << corrupt;
  int flipped = 0;
  for (const fs::directory_entry& f : fs::directory_iterator(fs::path(root) / corrupt)) {
    if (!absl::StartsWith(f.path().filename().string(), "rank-")) continue;
    std::fstream shard(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff at = static_cast<std::streamoff>(fs::file_size(f.path()) / 2);
    shard.seekg(at);
    const char c = static_cast<char>(shard.get());
    shard.seekp(at);
    shard.put(static_cast<char>(c ^ 0x10));
    ++flipped;
  }
  ASSERT_GT(flipped, 0);
  // One rank dies; the other goes on (the spare takes the dead one's rank).
  workers_[ranked[0]]->Kill();
  workers_[ranked[0]].reset();
  workers_[ranked[1]]->Signal(SIGCONT);

  // The job completes with the uninterrupted loss.
  const absl::Time end = absl::Now() + absl::Seconds(240);
  while (absl::Now() < end && GetJob().phase() != v1::JOB_PHASE_COMPLETED &&
         GetJob().phase() != v1::JOB_PHASE_FAILED) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  const v1::Job job = GetJob();
  ASSERT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED) << job.phase_reason() << Logs();
  double final_loss = -1;
  bool restored_previous = false, restored_corrupt = false, skipped = false;
  for (const auto& w : workers_) {
    if (w == nullptr) continue;
    const std::string log = w->Log();
    std::map<int, double> losses = StepLosses(log);
    if (losses.count(kSteps)) final_loss = losses[kSteps];
    restored_previous |= absl::StrContains(log, absl::StrCat("restored ", previous, " "));
    restored_corrupt |= absl::StrContains(log, absl::StrCat("restored ", corrupt, " "));
    skipped |= absl::StrContains(log, "checkpoint skipped");
  }
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
  EXPECT_TRUE(restored_previous) << "no worker restored " << previous << Logs();
  EXPECT_FALSE(restored_corrupt) << Logs();
  // The corrupt one stays the newest committed until training passes its
  // step: the save of that step is refused and skipped, not fatal.
  EXPECT_TRUE(skipped) << Logs();
  const std::string log = coordinator_->Log();
  EXPECT_TRUE(absl::StrContains(log, absl::StrCat("restore point ", corrupt))) << log;
  EXPECT_TRUE(absl::StrContains(
      log, absl::StrCat("falling back to the previous committed checkpoint ", previous)))
      << log;
}

}  // namespace
}  // namespace shardline::worker

// Growing a running job end to end (issue 6): a real shardline-coordinator
// and real shardline-worker processes. Two workers form world 2 (min 2,
// max 4); two more start mid-training and wait as spares; at the next
// committed checkpoint the coordinator ends generation 1 ("grow: ...") and
// re-forms at world 4, restoring that checkpoint. The global batch is
// constant (16 samples: dp 2 runs 4 micro-batches, dp 4 runs 2), so the run
// must finish with the final loss of an uninterrupted single-rank run.
// 60 steps (checkpoints every 5) leave the late workers many commits to
// catch even on a loaded machine; a run takes a few seconds.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <iostream>
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

namespace v1 = ::shardline::v1;

constexpr int kSteps = 60;
constexpr char kJob[] = "grow";

// The tiny model of elastic_training_test. global batch 16 of micro-batch 2:
// 8 micro-batches per step, so dp 2 and dp 4 fit and dp 3 does not (three
// workers do not grow a world of two).
v1::JobSpec Spec(const std::string& checkpoint_dir) {
  v1::JobSpec spec;
  spec.set_name("grow");
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
  t->set_global_batch(16);
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
  spec.mutable_checkpoint()->set_keep_last(2);
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(2);
  e->set_max_workers(4);
  e->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
  e->mutable_heartbeat_timeout()->set_seconds(5);
  // The first formation waits this long for more than two workers; a long
  // one also keeps a slow re-join (2 shared cores) in the grown generation.
  e->mutable_last_call()->set_seconds(2);
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

class GrowTrainingTest : public ::testing::Test {
 protected:
  void StartCoordinator() {
    coordinator_ = std::make_unique<Child>(
        Runfile("server/shardline-coordinator"),
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--state", dir_ + "/state.db"},
        dir_ + "/coordinator.log");
    ASSERT_TRUE(coordinator_->WaitFor("listening on ", absl::Seconds(20))) << coordinator_->Log();
    address_ = ListeningAddress(*coordinator_);
    ASSERT_FALSE(address_.empty());
  }

  std::unique_ptr<v1::JobService::Stub> Jobs() {
    return v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void CreateJob(const v1::JobSpec& spec) {
    v1::CreateJobRequest req;
    req.set_job_id(kJob);
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = Jobs()->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  v1::Job GetJob() {
    v1::GetJobRequest req;
    req.set_job_id(kJob);
    v1::Job job;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = Jobs()->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  void StartWorker(int i) {
    workers_.push_back(std::make_unique<Child>(
        Runfile("worker/shardline-worker"),
        std::vector<std::string>{"--coordinator", address_, "--job", kJob, "--worker-id",
                                 absl::StrCat("w", i), "--log-interval", "1",
                                 "--connect-timeout", "30s"},
        absl::StrCat(dir_, "/worker", i, ".log")));
  }

  // Waits until some worker's log shows step `step` done.
  bool WaitForStep(int step, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      for (const auto& w : workers_) {
        if (StepLosses(w->Log()).count(step) > 0) return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::string Logs() {
    std::string out;
    for (size_t i = 0; i < workers_.size(); ++i) {
      absl::StrAppend(&out, "\n--- worker ", i, ":\n", workers_[i]->Log());
    }
    if (coordinator_ != nullptr) absl::StrAppend(&out, "\n--- coordinator:\n", coordinator_->Log());
    return out;
  }

  // The test's processes' logs end up in test.log.
  void TearDown() override { std::cout << Logs() << std::flush; }

  std::string dir_ = [] {
    const std::string d =
        TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::mkdir(d.c_str(), 0755);
    return d;
  }();
  std::unique_ptr<Child> coordinator_;
  std::vector<std::unique_ptr<Child>> workers_;
  std::string address_;
};

TEST_F(GrowTrainingTest, TwoWorkersJoiningMidTrainingGrowTheWorldAtACheckpoint) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt");
  const double reference = UninterruptedFinalLoss(spec);
  StartCoordinator();
  CreateJob(spec);
  StartWorker(0);
  StartWorker(1);
  ASSERT_TRUE(WaitForStep(8, absl::Seconds(120))) << Logs();
  {
    const v1::Job job = GetJob();
    ASSERT_EQ(job.generation(), 1u) << job.phase_reason() << Logs();
    ASSERT_EQ(job.world_size(), 2u) << Logs();
  }
  StartWorker(2);
  StartWorker(3);
  // They wait as spares until a checkpoint commits; then world 4.
  ASSERT_TRUE(workers_[2]->WaitFor(": spare (world 2)", absl::Seconds(60))) << Logs();

  const absl::Time deadline = absl::Now() + absl::Seconds(240);
  while (absl::Now() < deadline && GetJob().phase() != v1::JOB_PHASE_COMPLETED) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  const v1::Job job = GetJob();
  ASSERT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED) << job.phase_reason() << Logs();
  EXPECT_EQ(job.generation(), 2u) << Logs();
  EXPECT_EQ(job.world_size(), 4u) << Logs();
  EXPECT_EQ(job.dp(), 4u) << Logs();
  EXPECT_TRUE(absl::StrContains(coordinator_->Log(),
                                "grow: 2 spares joined; world 2 -> 4 at checkpoint step"))
      << Logs();

  // Every worker trained in world 4 from the checkpoint the grow named.
  for (const auto& w : workers_) {
    EXPECT_TRUE(absl::StrContains(w->Log(), "world 4: communicators ready")) << w->Log();
    EXPECT_TRUE(absl::StrContains(w->Log(), "restored ckpt-step")) << w->Log();
  }
  double final_loss = -1;
  for (const auto& w : workers_) {
    std::map<int, double> losses = StepLosses(w->Log());
    if (losses.count(kSteps)) final_loss = losses[kSteps];
  }
  ASSERT_GT(final_loss, 0) << "no worker logged step " << kSteps << Logs();
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs();
}

}  // namespace
}  // namespace shardline::worker

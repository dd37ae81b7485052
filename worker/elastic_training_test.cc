// Elastic training end to end (issue 6): a real shardline-coordinator on
// SQLite and real shardline-worker processes train a small GPT on the
// repository's corpus with checkpoints every few steps, and survive
//   * a worker SIGKILLed mid-training (the spare takes its rank; with no
//     spare dp shrinks and gradient accumulation keeps the global batch),
//   * a worker frozen with SIGSTOP (case C9: found by heartbeat timeout;
//     after SIGCONT it is fenced off and re-joins as a new member),
//   * the coordinator killed and restarted on its state file.
// Each run must finish all steps with the final loss of an uninterrupted
// run of the same job (data order and global batch are fixed, so every
// layout follows the same curve), computed here in-process.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cmath>
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

constexpr int kSteps = 40;

v1::JobSpec Spec(const std::string& checkpoint_dir, int min_workers, int max_workers) {
  v1::JobSpec spec;
  spec.set_name("elastic");
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(2);
  m->set_vocab_size(256);
  m->set_seq_length(16);
  spec.mutable_parallel()->set_tp(1);
  spec.mutable_parallel()->set_pp(1);
  spec.mutable_parallel()->set_zero_stage(1);
  // global batch 12: dp 3 (m 2), dp 2 (m 3) or dp 1 (m 6).
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
  spec.mutable_checkpoint()->set_keep_last(2);
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(min_workers);
  e->set_max_workers(max_workers);
  e->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
  e->mutable_heartbeat_timeout()->set_seconds(2);
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

class ElasticTrainingTest : public ::testing::Test {
 protected:
  void StartCoordinator() {
    coordinator_ = std::make_unique<Child>(
        Runfile("server/shardline-coordinator"),
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--state", dir_ + "/state.db"},
        absl::StrCat(dir_, "/coordinator", ++coordinator_starts_, ".log"));
    ASSERT_TRUE(coordinator_->WaitFor("listening on ", absl::Seconds(20))) << coordinator_->Log();
    address_ = ListeningAddress(*coordinator_);
    ASSERT_FALSE(address_.empty());
  }

  void CreateJob(const v1::JobSpec& spec) {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    auto jobs = v1::JobService::NewStub(channel);
    v1::CreateJobRequest req;
    req.set_job_id("elastic");
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  v1::Job GetJob() {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    auto jobs = v1::JobService::NewStub(channel);
    v1::GetJobRequest req;
    req.set_job_id("elastic");
    v1::Job job;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = jobs->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  std::unique_ptr<Child> StartWorker(int i) {
    return std::make_unique<Child>(
        Runfile("worker/shardline-worker"),
        std::vector<std::string>{"--coordinator", address_, "--job", "elastic", "--worker-id",
                                 absl::StrCat("w", i), "--log-interval", "1",
                                 "--connect-timeout", "30s"},
        absl::StrCat(dir_, "/worker", i, "-", ++worker_starts_, ".log"));
  }

  // Waits until some worker's log shows step `step` done.
  bool WaitForStep(const std::vector<std::unique_ptr<Child>>& workers, int step,
                   absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      for (const auto& w : workers) {
        if (w != nullptr && StepLosses(w->Log()).count(step) > 0) return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // Waits for the job to complete; returns the final step's loss from the
  // workers' logs (every rank 0 of the last generation logs it).
  double WaitForCompletion(const std::vector<std::unique_ptr<Child>>& workers) {
    const absl::Time deadline = absl::Now() + absl::Seconds(240);
    while (absl::Now() < deadline && GetJob().phase() != v1::JOB_PHASE_COMPLETED) {
      absl::SleepFor(absl::Milliseconds(200));
    }
    const v1::Job job = GetJob();
    EXPECT_EQ(job.phase(), v1::JOB_PHASE_COMPLETED) << job.phase_reason() << Logs(workers);
    for (const auto& w : workers) {
      if (w == nullptr) continue;
      std::map<int, double> losses = StepLosses(w->Log());
      if (losses.count(kSteps)) return losses[kSteps];
    }
    ADD_FAILURE() << "no worker logged step " << kSteps << Logs(workers);
    return -1;
  }

  // Every test ends by printing its processes' logs (test.log keeps them).
  void TearDown() override { std::cout << Logs(workers_) << std::flush; }

  std::string Logs(const std::vector<std::unique_ptr<Child>>& workers) {
    std::string out;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i] != nullptr) absl::StrAppend(&out, "\n--- worker ", i, ":\n", workers[i]->Log());
    }
    if (coordinator_ != nullptr) absl::StrAppend(&out, "\n--- coordinator:\n", coordinator_->Log());
    return out;
  }

  // Per test: logs, state file and checkpoints never mix between tests of
  // one shard (a stale log could show another coordinator's address).
  std::string dir_ = [] {
    const std::string d =
        TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::mkdir(d.c_str(), 0755);
    return d;
  }();
  std::unique_ptr<Child> coordinator_;
  std::vector<std::unique_ptr<Child>> workers_;
  std::string address_;
  int coordinator_starts_ = 0;
  int worker_starts_ = 0;
};

// Three workers (world 3 at most 3... here max 2: one spare); SIGKILL a
// ranked worker: the spare takes its place, training resumes from the last
// committed checkpoint and ends at the uninterrupted loss.
TEST_F(ElasticTrainingTest, SigkillWithSpareResumesFromCheckpoint) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt-kill", 2, 2);
  const double reference = UninterruptedFinalLoss(spec);
  StartCoordinator();
  CreateJob(spec);
  std::vector<std::unique_ptr<Child>>& workers = workers_;
  for (int i = 0; i < 3; ++i) workers.push_back(StartWorker(i));
  ASSERT_TRUE(WaitForStep(workers, 12, absl::Seconds(120))) << Logs(workers);
  // Kill a worker that holds a rank (the spare logs "spare").
  int victim = -1;
  for (int i = 0; i < 3 && victim < 0; ++i) {
    if (!absl::StrContains(workers[i]->Log(), ": spare")) victim = i;
  }
  ASSERT_GE(victim, 0);
  workers[victim]->Kill();
  workers[victim].reset();
  const double final_loss = WaitForCompletion(workers);
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs(workers);
  bool logged_recovery = false;
  for (const auto& w : workers) {
    if (w != nullptr && absl::StrContains(w->Log(), "recovery (")) logged_recovery = true;
    if (w != nullptr) EXPECT_TRUE(absl::StrContains(w->Log(), "restored ckpt-step")) << w->Log();
  }
  EXPECT_TRUE(logged_recovery) << Logs(workers);
}

// No spare: dp shrinks from 3 to 2 with more micro-batches per rank; the
// global batch and so the loss curve stay the same.
TEST_F(ElasticTrainingTest, SigkillWithoutSpareShrinksDp) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt-shrink", 2, 3);
  const double reference = UninterruptedFinalLoss(spec);
  StartCoordinator();
  CreateJob(spec);
  std::vector<std::unique_ptr<Child>>& workers = workers_;
  for (int i = 0; i < 3; ++i) workers.push_back(StartWorker(i));
  ASSERT_TRUE(WaitForStep(workers, 12, absl::Seconds(120))) << Logs(workers);
  workers[1]->Kill();
  workers[1].reset();
  const double final_loss = WaitForCompletion(workers);
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs(workers);
  EXPECT_EQ(GetJob().dp(), 2u);
}

// Case C9: a frozen worker is declared lost by heartbeat timeout, the job
// re-forms without it; after SIGCONT it is fenced off and re-joins as a new
// member (a spare here, since the job is RUNNING).
TEST_F(ElasticTrainingTest, C9SigstopIsDetectedByHeartbeatTimeout) {
  const v1::JobSpec spec = Spec(dir_ + "/ckpt-stop", 2, 3);
  const double reference = UninterruptedFinalLoss(spec);
  StartCoordinator();
  CreateJob(spec);
  std::vector<std::unique_ptr<Child>>& workers = workers_;
  for (int i = 0; i < 3; ++i) workers.push_back(StartWorker(i));
  ASSERT_TRUE(WaitForStep(workers, 12, absl::Seconds(120))) << Logs(workers);
  const absl::Time stopped = absl::Now();
  workers[2]->Signal(SIGSTOP);
  // Re-formed at generation 2 without it.
  ASSERT_TRUE(workers[0]->WaitFor("world 2: communicators ready", absl::Seconds(30)))
      << Logs(workers);
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(2 + 1 + 5));  // timeout + interval + slack
  workers[2]->Signal(SIGCONT);
  ASSERT_TRUE(workers[2]->WaitFor("generation 1 is over", absl::Seconds(30)) ||
              workers[2]->WaitFor("ended during training", absl::Seconds(1)))
      << Logs(workers);
  const double final_loss = WaitForCompletion(workers);
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs(workers);
}

// The coordinator is killed (SIGKILL) mid-training and restarted on its
// SQLite file: the workers reconnect and training goes on to the end.
TEST_F(ElasticTrainingTest, CoordinatorRestartMidTraining) {
  v1::JobSpec spec = Spec(dir_ + "/ckpt-coord", 2, 2);
  // Heartbeats resume within a second or two of the restart; a timeout
  // longer than that (the default is 30 s) keeps the generation.
  spec.mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(10);
  const double reference = UninterruptedFinalLoss(spec);
  StartCoordinator();
  CreateJob(spec);
  const std::string address = address_;
  std::vector<std::unique_ptr<Child>>& workers = workers_;
  for (int i = 0; i < 2; ++i) workers.push_back(StartWorker(i));
  ASSERT_TRUE(WaitForStep(workers, 8, absl::Seconds(120))) << Logs(workers);
  coordinator_->Kill();
  // Down long enough that checkpoint calls meet a dead coordinator (they
  // retry), then back on the same address and state file.
  absl::SleepFor(absl::Milliseconds(1500));
  coordinator_ = std::make_unique<Child>(
      Runfile("server/shardline-coordinator"),
      std::vector<std::string>{"--listen", address, "--state", dir_ + "/state.db"},
      absl::StrCat(dir_, "/coordinator", ++coordinator_starts_, ".log"));
  ASSERT_TRUE(coordinator_->WaitFor("listening on ", absl::Seconds(20))) << coordinator_->Log();
  const double final_loss = WaitForCompletion(workers);
  EXPECT_NEAR(final_loss, reference, 1e-3 * reference) << Logs(workers);
  // Training went on in the same generation: nothing re-formed.
  EXPECT_EQ(GetJob().generation(), 1u);
}

}  // namespace
}  // namespace shardline::worker

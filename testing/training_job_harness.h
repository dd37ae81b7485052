// Test helpers for end-to-end training tests with a real shardline-coordinator
// and real shardline-worker processes (elastic_training_test,
// grow_training_test, restore_fallback_test): the spec of a tiny GPT job on
// the repository's corpus, the final loss of the same job trained without
// interruption in-process, the step losses of a worker log, and a fixture
// that starts the processes and talks to the coordinator.
#ifndef SHARDLINE_TESTING_TRAINING_JOB_HARNESS_H_
#define SHARDLINE_TESTING_TRAINING_JOB_HARNESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/process_harness.h"
#include "worker/train/data.h"
#include "worker/train/job_options.h"
#include "worker/train/local_cluster.h"
#include "worker/train/trainer.h"

namespace shardline::worker {

// What differs between the tests' jobs; everything else of the spec (a
// 2-layer GPT of hidden size 16, tp 1, pp 1, ZeRO 1, the optimizer, seed 7,
// data/tinyshakespeare.txt, a checkpoint every 5 steps, heartbeats every
// 200 ms) is the same.
struct TinyGptJob {
  std::string name;
  std::string checkpoint_dir;
  int steps = 40;
  int global_batch = 12;
  int micro_batch = 2;
  int keep_last = 2;
  int min_workers = 2;
  int max_workers = 2;
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  absl::Duration last_call = absl::Milliseconds(500);
};

inline void SetDuration(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t seconds = absl::ToInt64Seconds(d);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d - absl::Seconds(seconds))));
}

inline ::shardline::v1::JobSpec TinyGptSpec(const TinyGptJob& job) {
  ::shardline::v1::JobSpec spec;
  spec.set_name(job.name);
  ::shardline::v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(2);
  m->set_vocab_size(256);
  m->set_seq_length(16);
  spec.mutable_parallel()->set_tp(1);
  spec.mutable_parallel()->set_pp(1);
  spec.mutable_parallel()->set_zero_stage(1);
  ::shardline::v1::TrainingConfig* t = spec.mutable_training();
  t->set_global_batch(job.global_batch);
  t->set_micro_batch(job.micro_batch);
  t->set_train_steps(job.steps);
  t->set_learning_rate(3e-3);
  t->set_min_learning_rate(3e-4);
  t->set_warmup_steps(4);
  t->set_weight_decay(0.1);
  t->set_grad_clip(1.0);
  t->set_seed(7);
  spec.mutable_data()->set_dataset_path(Runfile("data/tinyshakespeare.txt"));
  spec.mutable_data()->set_validation_fraction(0.1);
  spec.mutable_checkpoint()->set_directory(job.checkpoint_dir);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_keep_last(job.keep_last);
  ::shardline::v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(job.min_workers);
  e->set_max_workers(job.max_workers);
  SetDuration(absl::Milliseconds(200), e->mutable_heartbeat_interval());
  SetDuration(job.heartbeat_timeout, e->mutable_heartbeat_timeout());
  SetDuration(job.last_call, e->mutable_last_call());
  SetDuration(absl::Seconds(60), e->mutable_join_timeout());
  SetDuration(absl::Seconds(20), e->mutable_collective_timeout());
  return spec;
}

// The final loss of the same job trained without interruption (one rank),
// all of its train_steps.
inline double UninterruptedFinalLoss(const ::shardline::v1::JobSpec& raw) {
  absl::StatusOr<::shardline::v1::JobSpec> spec = spec::ResolveJobSpec(raw);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<train::TrainingOptions> options = train::TrainingOptionsFromSpec(*spec, 1);
  EXPECT_TRUE(options.ok()) << options.status();
  absl::StatusOr<train::Corpus> corpus =
      train::Corpus::Load(spec->data().dataset_path(), spec->data().validation_fraction());
  EXPECT_TRUE(corpus.ok()) << corpus.status();
  const int steps = static_cast<int>(raw.training().train_steps());
  double loss = -1;
  absl::Status s = train::RunLocalCluster(
      options->parallel, [&](int, const train::RankGroups& groups) -> absl::Status {
        absl::StatusOr<std::unique_ptr<train::Trainer>> t =
            train::Trainer::Create(*options, groups, &*corpus);
        if (!t.ok()) return t.status();
        for (int i = 0; i < steps; ++i) {
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
inline std::map<int, double> StepLosses(const std::string& log) {
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

// A coordinator on SQLite and workers of the job `job_id` (all in workers_,
// in start order; a test may reset one it killed). Every test ends by
// printing its processes' logs (test.log keeps them).
class TrainingJobTest : public ::testing::Test {
 protected:
  explicit TrainingJobTest(std::string job_id) : job_id_(std::move(job_id)) {}
  ~TrainingJobTest() override = default;

  // On `listen` (an ephemeral port by default; a restart passes address_)
  // with the state file of the test.
  void StartCoordinator(const std::string& listen = "127.0.0.1:0") {
    coordinator_ = std::make_unique<Child>(
        Runfile("server/shardline-coordinator"),
        std::vector<std::string>{"--listen", listen, "--state", dir_ + "/state.db"},
        absl::StrCat(dir_, "/coordinator", ++coordinator_starts_, ".log"));
    ASSERT_TRUE(coordinator_->WaitFor("listening on ", absl::Seconds(20))) << coordinator_->Log();
    address_ = ListeningAddress(*coordinator_);
    ASSERT_FALSE(address_.empty());
  }

  // The coordinator's JobService (a fixture with several replicas points
  // it at the leader).
  virtual std::unique_ptr<::shardline::v1::JobService::Stub> Jobs() {
    return ::shardline::v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void CreateJob(const ::shardline::v1::JobSpec& spec) {
    spec_ = spec;
    ::shardline::v1::CreateJobRequest req;
    req.set_job_id(job_id_);
    *req.mutable_spec() = spec;
    ::shardline::v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = Jobs()->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  ::shardline::v1::Job GetJob() {
    ::shardline::v1::GetJobRequest req;
    req.set_job_id(job_id_);
    ::shardline::v1::Job job;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s = Jobs()->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  // Starts worker "w<i>" (with `extra_flags` after the usual ones) and
  // appends it to workers_.
  Child& StartWorker(int i, const std::vector<std::string>& extra_flags = {}) {
    std::vector<std::string> flags{"--coordinator", address_,  "--job",
                                   job_id_,         "--worker-id", absl::StrCat("w", i),
                                   "--log-interval", "1",         "--connect-timeout",
                                   "30s"};
    flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
    workers_.push_back(std::make_unique<Child>(
        Runfile("worker/shardline-worker"), flags,
        absl::StrCat(dir_, "/worker", i, "-", ++worker_starts_, ".log"), worker_env_));
    return *workers_.back();
  }

  // A coordinator, the job of `spec`, and `workers` workers, running until
  // some worker logged step `until_step` (fatal failure otherwise).
  void StartTraining(const ::shardline::v1::JobSpec& spec, int workers, int until_step) {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator());
    ASSERT_NO_FATAL_FAILURE(CreateJob(spec));
    for (int i = 0; i < workers; ++i) StartWorker(i);
    ASSERT_TRUE(WaitForStep(until_step, absl::Seconds(120))) << Logs();
  }

  // The first started worker that holds a rank (a spare logs "spare"), or
  // -1.
  int RankedWorker() const {
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i] != nullptr && !absl::StrContains(workers_[i]->Log(), ": spare")) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  // Waits until some worker's log shows step `step` done.
  bool WaitForStep(int step, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      for (const auto& w : workers_) {
        if (w != nullptr && StepLosses(w->Log()).count(step) > 0) return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // Waits until the job is COMPLETED or FAILED (or `timeout` passed); the job.
  ::shardline::v1::Job WaitForJobEnd(absl::Duration timeout = absl::Seconds(240)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const ::shardline::v1::JobPhase phase = GetJob().phase();
      if (phase == ::shardline::v1::JOB_PHASE_COMPLETED ||
          phase == ::shardline::v1::JOB_PHASE_FAILED) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return GetJob();
  }

  // The loss of the job's last step from the workers' logs (every rank 0 of
  // the last generation logs it), or -1.
  double FinalLoss() {
    const int steps = static_cast<int>(spec_.training().train_steps());
    for (const auto& w : workers_) {
      if (w == nullptr) continue;
      std::map<int, double> losses = StepLosses(w->Log());
      if (losses.count(steps)) return losses[steps];
    }
    return -1;
  }

  // Waits for the job to complete; returns FinalLoss().
  double WaitForCompletion() {
    const ::shardline::v1::Job job = WaitForJobEnd();
    EXPECT_EQ(job.phase(), ::shardline::v1::JOB_PHASE_COMPLETED) << job.phase_reason() << Logs();
    const double loss = FinalLoss();
    if (loss < 0) {
      ADD_FAILURE() << "no worker logged step " << spec_.training().train_steps() << Logs();
    }
    return loss;
  }

  virtual std::string Logs() {
    std::string out;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i] != nullptr) absl::StrAppend(&out, "\n--- worker ", i, ":\n", workers_[i]->Log());
    }
    if (coordinator_ != nullptr) absl::StrAppend(&out, "\n--- coordinator:\n", coordinator_->Log());
    return out;
  }

  void TearDown() override { std::cout << Logs() << std::flush; }

  const std::string job_id_;
  // Per test: logs, state file and checkpoints never mix between tests of
  // one shard (a stale log could show another coordinator's address).
  const std::string dir_ = [] {
    const std::string d =
        TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::mkdir(d.c_str(), 0755);
    return d;
  }();
  ::shardline::v1::JobSpec spec_;  // as passed to CreateJob
  std::unique_ptr<Child> coordinator_;
  std::vector<std::unique_ptr<Child>> workers_;
  std::string address_;
  int coordinator_starts_ = 0;
  int worker_starts_ = 0;
  // Environment variables of every worker started from now on.
  std::vector<std::pair<std::string, std::string>> worker_env_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_TESTING_TRAINING_JOB_HARNESS_H_

// Test helpers: run every rank of a (tp, pp, dp) layout as a thread of this
// process, each with real Gloo backends over loopback for its tp, dp, pp and
// embedding groups, bootstrapped through one in-memory store, and train.
#ifndef SHARDLINE_WORKER_TRAIN_TEST_UTIL_H_
#define SHARDLINE_WORKER_TRAIN_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "plan/topology.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/train/local_cluster.h"
#include "worker/train/ops.h"
#include "worker/train/trainer.h"

namespace shardline::worker::train::testing {

// The corpus shipped with the repository (a data dependency of the test).
inline const Corpus& ShakespeareCorpus() {
  static const Corpus* corpus = [] {
    absl::StatusOr<Corpus> c = Corpus::Load("data/tinyshakespeare.txt", 0.1);
    if (!c.ok()) {
      ADD_FAILURE() << c.status();
      return new Corpus(*Corpus::FromBytes(std::string(4096, 'x'), 0.1));
    }
    return new Corpus(*std::move(c));
  }();
  return *corpus;
}

// A parallel layout of the small test model; the global batch is always
// kTestGlobalBatch samples, so micro_batches = kTestGlobalBatch /
// (micro_batch_size * dp).
constexpr int64_t kTestGlobalBatch = 8;
struct Layout {
  int tp = 1, pp = 1, vpp = 1, dp = 1, zero = 0;
  plan::ScheduleKind schedule = plan::ScheduleKind::kOneFOneB;
  int64_t micro_batch_size = 2;
  int64_t alignment = 1;

  int micro_batches() const {
    return static_cast<int>(kTestGlobalBatch / (micro_batch_size * dp));
  }
  // e.g. "tp2_pp2_vpp1_dp2_zero1_1F1B_mbs1_m4" (a valid gtest name).
  std::string Name() const {
    const std::string schedule_name = plan::ScheduleName(schedule) == "1f1b"
                                          ? std::string("1F1B")
                                          : std::string(plan::ScheduleName(schedule));
    return absl::StrCat("tp", tp, "_pp", pp, "_vpp", vpp, "_dp", dp, "_zero", zero, "_",
                        schedule_name, "_mbs", micro_batch_size, "_m", micro_batches(),
                        alignment > 1 ? absl::StrCat("_align", alignment) : "");
  }
};

// The small GPT every multi-layout test trains (4 layers, width 16, 4
// heads, byte vocabulary, context 16) at `layout`, with a learning rate
// large enough that `total_steps` move the loss far, the clip active early
// and weight decay on.
inline TrainingOptions SmallGptOptions(const Layout& l, int total_steps) {
  TrainingOptions o;
  o.model.num_layers = 4;
  o.model.hidden_size = 16;
  o.model.num_heads = 4;
  o.model.vocab_size = 256;
  o.model.seq_length = 16;
  o.parallel.tp = l.tp;
  o.parallel.pp = l.pp;
  o.parallel.vpp = l.vpp;
  o.parallel.dp = l.dp;
  o.parallel.zero_stage = l.zero;
  o.parallel.zero_alignment = l.alignment;
  o.parallel.schedule = l.schedule;
  o.parallel.micro_batch_size = l.micro_batch_size;
  o.parallel.micro_batches = l.micro_batches();
  o.seed = 1234;
  o.learning_rate = {.learning_rate = 1e-2, .min_learning_rate = 1e-3,
                     .warmup_steps = std::min(3, total_steps / 4 + 1),
                     .total_steps = total_steps};
  o.adamw = {.beta1 = 0.9, .beta2 = 0.99, .epsilon = 1e-8, .weight_decay = 0.1};
  o.grad_clip = 1.0;
  return o;
}

// Trains `steps` steps with every rank of options.parallel as a thread and
// returns rank 0's stats; every rank's losses must agree (checked). `after`
// (optional) runs on every rank's thread after training.
// `factory` (optional) makes the backends instead of Gloo (e.g. NCCL over
// the loopback fake plugin).
inline std::vector<StepStats> Train(
    const TrainingOptions& options, int steps,
    const std::function<void(int rank, Trainer&)>& after = nullptr,
    BackendFactory factory = nullptr) {
  SetIntraOpThreads(1);
  const int world = options.parallel.world_size();
  std::vector<std::vector<StepStats>> stats(world);
  if (factory == nullptr) {
    GlooOptions gloo;
    gloo.timeout = absl::Seconds(60);
    gloo.connect_timeout = absl::Seconds(60);
    factory = GlooFactory(gloo);
  }
  absl::Status status = RunLocalCluster(
      options.parallel,
      [&](int rank, const RankGroups& groups) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Trainer>> trainer =
            Trainer::Create(options, groups, &ShakespeareCorpus());
        if (!trainer.ok()) return trainer.status();
        for (int s = 0; s < steps; ++s) {
          absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
          if (!st.ok()) return st.status();
          stats[rank].push_back(*st);
        }
        if (after) after(rank, **trainer);
        return absl::OkStatus();
      },
      factory);
  EXPECT_TRUE(status.ok()) << status;
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_EQ(stats[rank].size(), stats[0].size());
    for (size_t s = 0; s < std::min(stats[rank].size(), stats[0].size()); ++s) {
      EXPECT_EQ(stats[rank][s].loss, stats[0][s].loss) << "rank " << rank << " step " << s;
      EXPECT_EQ(stats[rank][s].grad_norm, stats[0][s].grad_norm) << "rank " << rank << " step " << s;
    }
  }
  return stats[0];
}

// Checks that `got` follows `ref` step by step: loss within `loss_rel`
// relative, gradient norm within `grad_norm_rel` relative (not checked when
// it is 0), over ref's steps.
inline void ExpectOnCurve(const std::vector<StepStats>& got, const std::vector<StepStats>& ref,
                          double loss_rel, double grad_norm_rel) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t s = 0; s < ref.size(); ++s) {
    EXPECT_NEAR(got[s].loss, ref[s].loss, loss_rel * std::abs(ref[s].loss))
        << "step " << s << " loss " << got[s].loss << " vs reference " << ref[s].loss;
    if (grad_norm_rel > 0) {
      EXPECT_NEAR(got[s].grad_norm, ref[s].grad_norm, grad_norm_rel * ref[s].grad_norm)
          << "step " << s;
    }
  }
}

// Every rank of `options` is restored by `restore` (which must leave it at
// step `from`), then trains steps [from, to); returns rank 0's losses and
// checks each step's index. `factory`: as Train's.
inline std::vector<double> ResumeAndTrain(const TrainingOptions& options, int from, int to,
                                          const std::function<void(Trainer&)>& restore,
                                          BackendFactory factory = nullptr) {
  absl::Mutex mu;
  std::vector<double> resumed;
  Train(options, 0, [&](int rank, Trainer& t) {
    restore(t);
    std::vector<double> mine;
    for (int s = from; s < to; ++s) {
      absl::StatusOr<StepStats> st = t.TrainStep();
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(st->step, s);
      mine.push_back(st->loss);
    }
    absl::MutexLock lock(&mu);
    if (rank == 0) resumed = std::move(mine);
  }, std::move(factory));
  return resumed;
}

// Checkpoint state without files: whole global tensors by name (weights and
// AdamW moments), and how often each element was written.
struct GlobalState {
  mutable absl::Mutex mu;
  std::map<std::string, std::vector<float>> values ABSL_GUARDED_BY(mu);
  std::map<std::string, std::vector<int>> writes ABSL_GUARDED_BY(mu);
};

// Writes `t`'s SaveSlices into `g` (every rank of a layout together covers
// every element once).
inline void Save(Trainer& t, GlobalState& g) {
  absl::MutexLock lock(&g.mu);
  absl::StatusOr<std::vector<Trainer::StateSlice>> slices = t.SaveSlices();
  ASSERT_TRUE(slices.ok()) << slices.status();
  for (const Trainer::StateSlice& s : *slices) {
    const int64_t n = s.spec->numel();
    auto& v = g.values[s.tensor];
    auto& w = g.writes[s.tensor];
    v.resize(n, 0.0f);
    w.resize(n, 0);
    for (int64_t i = s.begin; i < s.end; ++i) {
      const int64_t global = s.spec->global_index(s.tp, s.tp_rank, i);
      v[global] = s.data[i - s.begin];
      ++w[global];
    }
  }
}

// Fills `t`'s RestoreSlices from `g` (any layout) and sets its step.
inline void Restore(Trainer& t, const GlobalState& g, int64_t step) {
  {
    absl::ReaderMutexLock lock(&g.mu);  // shared: every rank restores at once
    for (const Trainer::StateSlice& s : t.RestoreSlices()) {
      const auto& v = g.values.at(s.tensor);
      for (int64_t i = s.begin; i < s.end; ++i) {
        s.data[i - s.begin] = v[s.spec->global_index(s.tp, s.tp_rank, i)];
      }
    }
  }
  ASSERT_TRUE(t.FinishRestore(step).ok());
}

}  // namespace shardline::worker::train::testing

#endif  // SHARDLINE_WORKER_TRAIN_TEST_UTIL_H_

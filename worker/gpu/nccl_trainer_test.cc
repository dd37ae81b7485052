// The trainer over the NCCL backend (worker/comm/nccl_backend.h) instead of
// Gloo, every rank a thread with its own communicators for its tp, pp, dp and
// embedding groups, on the fake plugin's loopback communicators
// (fake_plugin.cc: they really reduce, gather and send between the ranks of
// this process, one fake device per rank, one stream per communicator, no
// tags on send/recv, as NCCL). It checks what NCCL changes for the trainer:
// the order in which each rank issues its collectives and pipeline messages
// (NCCL matches by issue order, not by tag), and the failure path.
//
// The layers' math and the buffers are the CPU's (CpuDevice): the "device"
// memory of the fake is host memory. Contract (docs/ARCHITECTURE.md "Numbers
// that are contracts"): every layout reproduces the single-rank loss curve
// within 1e-4 relative (and the gradient norm within 1e-3) over 20 steps, as
// worker/train/trainer_equivalence_test.cc checks over Gloo.
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/model.h"
#include "worker/comm/nccl_backend.h"
#include "worker/gpu/nccl_test_util.h"
#include "worker/train/local_cluster.h"
#include "worker/train/staging_device.h"
#include "worker/train/test_util.h"
#include "worker/train/trainer.h"

namespace shardline::worker {
namespace {

using ::testing::HasSubstr;
using train::StepStats;
using train::TrainingOptions;
using train::testing::Layout;

constexpr char kPlugin[] = "worker/gpu/libshardline_gpu_fake.so";  // runfiles
constexpr int kSteps = 20;

// NCCL backends over the loopback fake: world rank r on fake device r (the
// BUILD rule sets SHARDLINE_FAKE_LOOPBACK_DEVICES=8).
train::BackendFactory NcclFactory(absl::Duration timeout = absl::Seconds(60),
                                  bool p2p_channels = true) {
  return testing::NcclLoopbackFactory(kPlugin, timeout, p2p_channels);
}

TrainingOptions Options(const Layout& l) { return train::testing::SmallGptOptions(l, kSteps); }

const std::vector<StepStats>& Reference() {
  static const std::vector<StepStats>* ref =
      new std::vector<StepStats>(train::testing::Train(Options(Layout{}), kSteps));
  return *ref;
}

class NcclTrainerTest : public ::testing::TestWithParam<Layout> {};

TEST_P(NcclTrainerTest, MatchesSingleRankLossCurve) {
  const std::vector<StepStats>& ref = Reference();
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(ref.back().loss, ref.front().loss - 1.0) << "reference did not learn";
  train::testing::ExpectOnCurve(
      train::testing::Train(Options(GetParam()), kSteps, nullptr, NcclFactory()), ref, 1e-4,
      1e-3);
}

// The trainer's GPU shape on the loopback: the state on a StagingDevice
// whose "stream" the NCCL backends are ordered against (Collectives::Order /
// Finish, as on a GPU: the host waits only at Settle), every loopback
// operation held 300 us on its stream, so a result the trainer uses before
// the device is ordered after its operation is read stale and leaves the
// curve. (Checked: without Work::OrderBefore in Collectives::Finish, every
// layout with tp, pp or ZeRO-3 fails here, most of them crashing on memory
// the trainer had freed while the loopback still wrote it; the dp-only
// ZeRO 0-2 layouts read their collectives' results only after Settle.)
struct SlowLoopback : testing::ScopedFakeSetting<int64_t> {
  SlowLoopback() : ScopedFakeSetting(kPlugin, "shardline_fake_set_op_delay", 300, 0) {}
};

TEST_P(NcclTrainerTest, StreamOrderedOnTheDeviceMatchesSingleRankLossCurve) {
  SlowLoopback slow;
  train::testing::StagingDevice device(/*stream_ordered=*/true);
  TrainingOptions options = Options(GetParam());
  options.device = &device;
  train::testing::ExpectOnCurve(train::testing::Train(options, kSteps, nullptr, NcclFactory()),
                                Reference(), 1e-4, 1e-3);
  EXPECT_EQ(device.live_bytes(), 0) << "device memory leaked after the trainers ended";
}

using plan::ScheduleKind;
constexpr ScheduleKind k1F1B = ScheduleKind::kOneFOneB;
constexpr ScheduleKind kGpipe = ScheduleKind::kGpipe;
constexpr ScheduleKind kInterleaved = ScheduleKind::kInterleaved;

INSTANTIATE_TEST_SUITE_P(
    Layouts, NcclTrainerTest,
    ::testing::Values(
        Layout{.tp = 2},
        Layout{.pp = 2, .schedule = k1F1B},
        Layout{.pp = 2, .vpp = 2, .schedule = kInterleaved},
        Layout{.pp = 4, .schedule = k1F1B, .micro_batch_size = 4},
        Layout{.dp = 2, .zero = 0},
        Layout{.dp = 2, .zero = 1},
        Layout{.dp = 2, .zero = 2},
        Layout{.dp = 2, .zero = 3},
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .schedule = k1F1B, .micro_batch_size = 1},
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 3, .schedule = kGpipe},
        Layout{.tp = 2, .pp = 2, .vpp = 2, .dp = 2, .zero = 2, .schedule = kInterleaved,
               .micro_batch_size = 2},
        Layout{.pp = 2, .vpp = 2, .dp = 2, .zero = 3, .schedule = kInterleaved,
               .micro_batch_size = 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.Name(); });

// precision bf16 (worker/train/bf16_device.h) over NCCL: the single-rank bf16
// curve within bf16's layout tolerance (2e-3 relative; bf16_device_test).
const std::vector<StepStats>& Bf16Reference() {
  static const std::vector<StepStats>* ref = [] {
    TrainingOptions o = Options(Layout{});
    o.parallel.precision = plan::Precision::kMixed;
    return new std::vector<StepStats>(train::testing::Train(o, kSteps));
  }();
  return *ref;
}

class NcclTrainerBf16Test : public ::testing::TestWithParam<Layout> {};

TEST_P(NcclTrainerBf16Test, FollowsTheSingleRankBf16Curve) {
  const std::vector<StepStats>& ref = Bf16Reference();
  TrainingOptions o = Options(GetParam());
  o.parallel.precision = plan::Precision::kMixed;
  train::testing::ExpectOnCurve(train::testing::Train(o, kSteps, nullptr, NcclFactory()), ref,
                                2e-3, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NcclTrainerBf16Test,
    ::testing::Values(
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 3, .schedule = k1F1B, .micro_batch_size = 1},
        Layout{.pp = 2, .vpp = 2, .dp = 2, .zero = 2, .schedule = kInterleaved,
               .micro_batch_size = 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.Name(); });

// Every pipeline send waits for its receive (the fake's rendezvous for all
// sizes, as NCCL does for messages larger than its buffers). 1F1B and
// interleaved 1F1B have neighbouring stages that each send to the other
// before receiving: on the pp group's one stream those sends wait on each
// other forever (they did here, every layout below but GPipe's, failing at
// the op timeout); with NcclOptions::p2p_channels each direction between
// neighbours has its own stream and every schedule finishes.
class NcclTrainerRendezvousTest : public ::testing::TestWithParam<Layout> {};

// Every send of the fake waits for its receive while this lives; then back
// to the fake's default (4 MiB).
struct EverySendWaits : testing::ScopedFakeSetting<size_t> {
  EverySendWaits()
      : ScopedFakeSetting(kPlugin, "shardline_fake_set_rendezvous_bytes", 0, size_t{4} << 20) {}
};

TEST_P(NcclTrainerRendezvousTest, SendsThatWaitForTheirReceiveDoNotDeadlock) {
  EverySendWaits rendezvous;
  constexpr int kRendezvousSteps = 3;
  const std::vector<StepStats> ref(Reference().begin(), Reference().begin() + kRendezvousSteps);
  // A deadlock fails the step at the op timeout instead of hanging the test.
  train::testing::ExpectOnCurve(
      train::testing::Train(Options(GetParam()), kRendezvousSteps, nullptr,
                            NcclFactory(absl::Seconds(20))),
      ref, 1e-4, 1e-3);
}

// The same with the state on a device whose "stream" the communicators are
// ordered against: its receives are waited for on the stream, its sends are
// not (their buffers are kept until they are seen to finish), so no
// schedule deadlocks here either.
TEST_P(NcclTrainerRendezvousTest, SendsThatWaitForTheirReceiveDoNotDeadlockStreamOrdered) {
  EverySendWaits rendezvous;
  constexpr int kRendezvousSteps = 3;
  const std::vector<StepStats> ref(Reference().begin(), Reference().begin() + kRendezvousSteps);
  train::testing::StagingDevice device(/*stream_ordered=*/true);
  TrainingOptions options = Options(GetParam());
  options.device = &device;
  train::testing::ExpectOnCurve(
      train::testing::Train(options, kRendezvousSteps, nullptr, NcclFactory(absl::Seconds(20))),
      ref, 1e-4, 1e-3);
}

// The hazard itself: the same 1F1B pipeline without p2p channels, every send
// waiting for its receive, stops at the op timeout.
TEST(NcclTrainerRendezvousTest, WithoutP2pChannels1F1BWaitsForever) {
  EverySendWaits rendezvous;
  const TrainingOptions options = Options(Layout{.pp = 2, .schedule = k1F1B});
  const absl::Status status = train::RunLocalCluster(
      options.parallel,
      [&](int, const train::RankGroups& groups) -> absl::Status {
        auto trainer = train::Trainer::Create(options, groups, &train::testing::ShakespeareCorpus());
        if (!trainer.ok()) return trainer.status();
        return (*trainer)->TrainStep().status();
      },
      NcclFactory(absl::Seconds(2), /*p2p_channels=*/false));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("NcclOptions::timeout"));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NcclTrainerRendezvousTest,
    ::testing::Values(
        Layout{.pp = 2, .schedule = k1F1B},
        Layout{.pp = 2, .schedule = kGpipe},
        Layout{.pp = 2, .vpp = 2, .schedule = kInterleaved},
        Layout{.pp = 2, .vpp = 2, .schedule = kInterleaved, .micro_batch_size = 1},
        Layout{.pp = 4, .schedule = k1F1B, .micro_batch_size = 1},
        Layout{.pp = 4, .schedule = k1F1B, .micro_batch_size = 4},
        Layout{.tp = 2, .pp = 2, .vpp = 2, .dp = 2, .zero = 2, .schedule = kInterleaved,
               .micro_batch_size = 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.Name(); });

// The state on the device (worker/train/trainer.h "Where the state lives"):
// every rank's compute device is a StagingDevice, whose memory the trainer
// must treat as device memory (it is host memory underneath, which the
// fake's loopback communicators read as a GPU's). With NCCL backends the
// parameters, gradients, AdamW moments, ZeRO shards and pipeline messages
// then stay on it, clipping and AdamW run through the device, and every
// collective runs on its buffers. The math is the CPU's, so the result must
// be bit-identical to the host path over the same communicators; and what
// crosses between host and device during training (token ids, losses, the
// norm) must stay far below one copy of the model per step, which the
// offload path moves at least twice (parameters up, gradients down).
class NcclResidentTrainerTest : public ::testing::TestWithParam<Layout> {
 protected:
  static constexpr int kResidentSteps = 4;

  // Trains `steps` on a fresh StagingDevice; *copied = its host<->device bytes.
  static std::vector<StepStats> TrainResident(const TrainingOptions& options, int steps,
                                              int64_t* copied,
                                              const std::function<void(int, train::Trainer&)>&
                                                  after = nullptr) {
    train::testing::StagingDevice device;  // thread-safe: shared by the rank threads
    TrainingOptions o = options;
    o.device = &device;
    std::vector<StepStats> stats = train::testing::Train(o, steps, after, NcclFactory());
    *copied = device.copied_bytes();
    EXPECT_EQ(device.live_bytes(), 0) << "device memory leaked after the trainers ended";
    return stats;
  }
};

TEST_P(NcclResidentTrainerTest, BitIdenticalToTheHostPathAndMovesNoStatePerStep) {
  const TrainingOptions options = Options(GetParam());
  const std::vector<StepStats> host =
      train::testing::Train(options, kResidentSteps, nullptr, NcclFactory());
  int64_t copied_one = 0, copied_all = 0;
  TrainResident(options, 1, &copied_one);
  const std::vector<StepStats> resident = TrainResident(options, kResidentSteps, &copied_all);
  ASSERT_EQ(resident.size(), static_cast<size_t>(kResidentSteps));
  EXPECT_LT(host.back().loss, host.front().loss) << "did not learn";
  for (int s = 0; s < kResidentSteps; ++s) {
    EXPECT_EQ(resident[s].loss, host[s].loss) << "step " << s;
    EXPECT_EQ(resident[s].grad_norm, host[s].grad_norm) << "step " << s;
  }
  const absl::StatusOr<std::vector<plan::ParameterSpec>> specs =
      plan::GptParameters(options.model);
  ASSERT_TRUE(specs.ok()) << specs.status();
  int64_t model_bytes = 0;
  for (const plan::ParameterSpec& p : *specs)
    model_bytes += p.numel() * static_cast<int64_t>(sizeof(float));
  const int64_t per_step = (copied_all - copied_one) / (kResidentSteps - 1);
  EXPECT_GT(per_step, 0) << "token ids and losses cross every step";
  // The offload path moves at least 2 * model_bytes per step (and this
  // test model is tiny, 70 kB, so token ids and losses are not negligible).
  EXPECT_LT(per_step, model_bytes / 4)
      << per_step << " bytes between host and device per step for a model of " << model_bytes
      << " bytes: state is being staged";
}

// After training, EvaluateValidation (its loss all-reduced from host memory,
// staged through the device for NCCL), Sample (the last-token logits
// gathered over tp, the next byte broadcast over pp, both staged) and
// Parameter (ZeRO-3 gathered on the device, then downloaded) give what the
// host path gives, bit for bit.
TEST_P(NcclResidentTrainerTest, EvaluatesSamplesAndReadsParametersAsTheHostPath) {
  struct Results {
    double validation = 0;
    std::string sample;
    std::vector<float> qkv;
  };
  auto after = [](Results* out) {
    return [out](int rank, train::Trainer& t) {
      absl::StatusOr<double> v = t.EvaluateValidation(8);
      ASSERT_TRUE(v.ok()) << v.status();
      absl::StatusOr<std::string> s = t.Sample("ROMEO:", 6, 0.8, 11);
      ASSERT_TRUE(s.ok()) << s.status();
      absl::StatusOr<std::vector<float>> p = t.Parameter("layers.0.attention.qkv.weight");
      if (rank == 0) {
        out->validation = *v;
        out->sample = *s;
        ASSERT_TRUE(p.ok()) << p.status();
        out->qkv = *p;
      }
    };
  };
  const TrainingOptions options = Options(GetParam());
  Results host, resident;
  train::testing::Train(options, 2, after(&host), NcclFactory());
  int64_t copied = 0;
  TrainResident(options, 2, &copied, after(&resident));
  EXPECT_GT(host.validation, 0);
  EXPECT_EQ(resident.validation, host.validation);
  EXPECT_EQ(host.sample.size(), 6u);
  EXPECT_EQ(resident.sample, host.sample);
  EXPECT_FALSE(host.qkv.empty());
  EXPECT_EQ(resident.qkv, host.qkv);
}

// SaveSlices / RestoreSlices / FinishRestore with the state on the device:
// resumed at step 2 on fresh trainers, the same layout continues the
// uninterrupted run bit for bit.
TEST_P(NcclResidentTrainerTest, SavesAndRestoresTheDeviceState) {
  const TrainingOptions options = Options(GetParam());
  int64_t copied = 0;
  const std::vector<StepStats> whole = TrainResident(options, kResidentSteps, &copied);
  train::testing::GlobalState checkpoint;
  TrainResident(options, 2, &copied,
                [&](int, train::Trainer& t) { train::testing::Save(t, checkpoint); });
  train::testing::StagingDevice device;
  TrainingOptions o = options;
  o.device = &device;
  const std::vector<double> resumed = train::testing::ResumeAndTrain(
      o, 2, kResidentSteps,
      [&](train::Trainer& t) { train::testing::Restore(t, checkpoint, 2); }, NcclFactory());
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kResidentSteps - 2));
  for (int s = 2; s < kResidentSteps; ++s) EXPECT_EQ(resumed[s - 2], whole[s].loss) << "step " << s;
}

// The checkpoint copies are in the host memory the device allocates for
// copies (pinned on a GPU), made at the first SaveSlices and reused by the
// next (page-locking is slow), and freed with the trainer; in bf16 too
// (the bf16 wrapper hands the allocation to the device).
class NcclResidentTrainerHostCopiesTest : public ::testing::TestWithParam<plan::Precision> {};

TEST_P(NcclResidentTrainerHostCopiesTest, InTheDevicesHostMemoryAndReused) {
  TrainingOptions options = Options(Layout{.dp = 2, .zero = 2});
  options.parallel.precision = GetParam();
  train::testing::StagingDevice device;
  options.device = &device;
  train::testing::Train(
      options, 2,
      [&](int rank, train::Trainer& t) {
        absl::StatusOr<std::vector<train::Trainer::StateSlice>> first = t.SaveSlices();
        ASSERT_TRUE(first.ok()) << first.status();
        ASSERT_FALSE(first->empty());
        for (const train::Trainer::StateSlice& s : *first) {
          EXPECT_TRUE(device.InHostMemory(s.data, (s.end - s.begin) * sizeof(float)))
              << "rank " << rank << " " << s.tensor << " is not in AllocHostBytes memory";
        }
        // Every rank's first SaveSlices is done once the step's collectives
        // returned: from here on no host copy may be allocated.
        absl::StatusOr<StepStats> step = t.TrainStep();
        ASSERT_TRUE(step.ok()) << step.status();
        const int64_t before = device.host_allocations();
        absl::StatusOr<std::vector<train::Trainer::StateSlice>> second = t.SaveSlices();
        ASSERT_TRUE(second.ok()) << second.status();
        EXPECT_EQ(device.host_allocations(), before) << "rank " << rank << " allocated again";
        ASSERT_EQ(second->size(), first->size());
        for (size_t i = 0; i < second->size(); ++i) {
          EXPECT_EQ((*second)[i].data, (*first)[i].data) << "rank " << rank << " slice " << i;
        }
      },
      NcclFactory());
  EXPECT_GT(device.host_allocations(), 0);
  EXPECT_EQ(device.live_host_blocks(), 0) << "host copies leaked after the trainers ended";
}

INSTANTIATE_TEST_SUITE_P(Precisions, NcclResidentTrainerHostCopiesTest,
                         ::testing::Values(plan::Precision::kFp32, plan::Precision::kMixed),
                         [](const ::testing::TestParamInfo<plan::Precision>& i) {
                           return i.param == plan::Precision::kMixed ? "Bf16" : "Fp32";
                         });

// SaveSlicesAsync with the state on the device: the copies run beside the
// next step (StagingDevice runs them as late as a GPU's copy stream may: at
// the trainer's OrderAfterHostCopies or at the Wait), and still hold the
// saved step's values when waited for after that step, at every ZeRO stage.
// (A trainer that wrote the state before ordering its writes after the
// copies fails here: the copies would then take the next step's values.)
class NcclResidentTrainerAsyncCopiesTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclResidentTrainerAsyncCopiesTest, HoldTheSavedStepWhileTheNextStepTrains) {
  TrainingOptions options = Options(Layout{.dp = 2, .zero = GetParam()});
  train::testing::StagingDevice device;
  options.device = &device;
  auto values = [](const std::vector<train::Trainer::StateSlice>& slices) {
    std::vector<std::vector<float>> out;
    for (const train::Trainer::StateSlice& s : slices) {
      out.emplace_back(s.data, s.data + (s.end - s.begin));
    }
    return out;
  };
  train::testing::Train(
      options, 2,
      [&](int rank, train::Trainer& t) {
        absl::StatusOr<std::vector<train::Trainer::StateSlice>> now = t.SaveSlices();
        ASSERT_TRUE(now.ok()) << now.status();
        const std::vector<std::vector<float>> saved = values(*now);
        absl::StatusOr<train::Trainer::SavedSlices> async = t.SaveSlicesAsync();
        ASSERT_TRUE(async.ok()) << async.status();
        EXPECT_TRUE(async->host_copies);
        ASSERT_NE(async->ready, nullptr);
        absl::StatusOr<StepStats> step = t.TrainStep();
        ASSERT_TRUE(step.ok()) << step.status();
        ASSERT_TRUE(async->ready->Wait().ok());
        EXPECT_EQ(values(async->slices), saved) << "rank " << rank;
        // The step did change the state (else the test proves nothing).
        absl::StatusOr<std::vector<train::Trainer::StateSlice>> later = t.SaveSlices();
        ASSERT_TRUE(later.ok()) << later.status();
        EXPECT_NE(values(*later), saved) << "rank " << rank;
      },
      NcclFactory());
  EXPECT_GT(device.async_copies(), 0);
  EXPECT_EQ(device.pending_copies(), 0);
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, NcclResidentTrainerAsyncCopiesTest,
                         ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat("Zero", i.param);
                         });

INSTANTIATE_TEST_SUITE_P(
    Layouts, NcclResidentTrainerTest,
    ::testing::Values(
        Layout{},  // world 1: no backend at all
        Layout{.dp = 2, .zero = 2},
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .schedule = k1F1B, .micro_batch_size = 1},
        Layout{.pp = 2, .vpp = 2, .dp = 2, .zero = 3, .schedule = kInterleaved,
               .micro_batch_size = 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.Name(); });

// precision bf16 with the state on the device (the rounding through the
// device, Device::RoundToBFloat16): bit-identical to bf16 on the host path.
TEST(NcclResidentTrainerBf16Test, BitIdenticalToTheHostPath) {
  TrainingOptions options =
      Options(Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 3, .schedule = k1F1B, .micro_batch_size = 1});
  options.parallel.precision = plan::Precision::kMixed;
  constexpr int kBf16Steps = 4;
  const std::vector<StepStats> host =
      train::testing::Train(options, kBf16Steps, nullptr, NcclFactory());
  train::testing::StagingDevice device;
  options.device = &device;
  const std::vector<StepStats> resident =
      train::testing::Train(options, kBf16Steps, nullptr, NcclFactory());
  ASSERT_EQ(resident.size(), static_cast<size_t>(kBf16Steps));
  ASSERT_EQ(host.size(), static_cast<size_t>(kBf16Steps));
  EXPECT_LT(host.back().loss, host.front().loss) << "did not learn";
  for (int s = 0; s < kBf16Steps; ++s) {
    EXPECT_EQ(resident[s].loss, host[s].loss) << "step " << s;
    EXPECT_EQ(resident[s].grad_norm, host[s].grad_norm) << "step " << s;
  }
}

// host_optimizer keeps the state on the host, which an NCCL backend cannot
// read: refused on every rank, naming the group and the option.
TEST(NcclResidentTrainerRefusalTest, HostOptimizerWithNcclIsRefused) {
  train::testing::StagingDevice device;
  TrainingOptions options = Options(Layout{.dp = 2, .zero = 1});
  options.device = &device;
  options.host_optimizer = true;
  std::vector<absl::Status> created(2);
  const absl::Status status = train::RunLocalCluster(
      options.parallel,
      [&](int rank, const train::RankGroups& groups) -> absl::Status {
        created[rank] =
            train::Trainer::Create(options, groups, &train::testing::ShakespeareCorpus()).status();
        return absl::OkStatus();
      },
      NcclFactory());
  EXPECT_TRUE(status.ok()) << status;
  for (const absl::Status& s : created) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("groups.dp takes device memory (NCCL)"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("host_optimizer is set"));
  }
}

// A rank lost in the middle of a step: its communicators are aborted (what
// its peers see when its process dies), and every other rank's step fails
// with Unavailable naming it, in far less than the op timeout. Then the job
// re-forms without it, as the coordinator's next generation would: new
// communicators at dp 1 (tp 2) from the state every rank saved after step 2
// (the last committed checkpoint), continuing the single-rank curve.
enum class StateAt { kHost, kDevice, kDeviceStreamOrdered };
class NcclTrainerFailureTest : public ::testing::TestWithParam<StateAt> {};

// GetParam(): the state on the host (the CPU), or on the device (a
// StagingDevice per run, the trainer resident), its collectives ordered by
// the host or on its "stream" (then the lost rank's peers are waiting for
// it on the device, and the backend's watchdog must notice the error).
TEST_P(NcclTrainerFailureTest, ARankLostMidStepIsUnavailableNamingItAndTheJobReForms) {
  train::testing::StagingDevice device(GetParam() == StateAt::kDeviceStreamOrdered);
  TrainingOptions options = Options(Layout{.tp = 2, .dp = 2, .zero = 1});
  if (GetParam() != StateAt::kHost) options.device = &device;
  train::SetIntraOpThreads(1);
  train::testing::GlobalState checkpoint;
  std::vector<absl::Status> failed(4);
  const absl::Status status = train::RunLocalCluster(
      options.parallel,
      [&](int rank, const train::RankGroups& groups) -> absl::Status {
        auto trainer = train::Trainer::Create(options, groups, &train::testing::ShakespeareCorpus());
        if (!trainer.ok()) return trainer.status();
        for (int s = 0; s < 2; ++s) {
          absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
          if (!st.ok()) return st.status();
        }
        train::testing::Save(**trainer, checkpoint);
        // World rank 3 (tp rank 1 of dp rank 1) dies before step 2: the
        // cluster aborts its groups when it returns an error.
        if (rank == 3) return absl::InternalError("killed");
        const absl::Time start = absl::Now();
        absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
        failed[rank] = st.status();
        EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "rank " << rank;
        return st.status();
      },
      NcclFactory(/*timeout=*/absl::Seconds(120)));
  EXPECT_FALSE(status.ok());
  for (int rank = 0; rank < 3; ++rank) {
    // Rank 3's tp peer (rank 2) and dp peer (rank 1) see it gone; rank 0
    // sees its own peers fail in turn (its dp or tp collective).
    EXPECT_TRUE(absl::IsUnavailable(failed[rank])) << "rank " << rank << ": " << failed[rank];
    EXPECT_THAT(std::string(failed[rank].message()), HasSubstr("is gone")) << "rank " << rank;
  }
  EXPECT_THAT(std::string(failed[2].message()), HasSubstr("rank 1 of this 2-rank communicator is gone"));

  // The next generation: tp 2 at dp 1 over new communicators, restored from
  // step 2, on the single-rank curve (the global batch is unchanged).
  const std::vector<StepStats>& ref = Reference();
  TrainingOptions next = Options(Layout{.tp = 2});
  next.device = options.device;
  const std::vector<double> resumed = train::testing::ResumeAndTrain(
      next, 2, 5,
      [&](train::Trainer& t) { train::testing::Restore(t, checkpoint, 2); }, NcclFactory());
  ASSERT_EQ(resumed.size(), 3u);
  for (int s = 2; s < 5; ++s)
    EXPECT_NEAR(resumed[s - 2], ref[s].loss, 1e-4 * ref[s].loss) << "step " << s;
}

INSTANTIATE_TEST_SUITE_P(StateOnDeviceOrHost, NcclTrainerFailureTest,
                         ::testing::Values(StateAt::kHost, StateAt::kDevice,
                                           StateAt::kDeviceStreamOrdered),
                         [](const ::testing::TestParamInfo<StateAt>& info) {
                           switch (info.param) {
                             case StateAt::kHost: return std::string("StateOnHost");
                             case StateAt::kDevice: return std::string("StateOnDevice");
                             case StateAt::kDeviceStreamOrdered: break;
                           }
                           return std::string("StateOnDeviceStreamOrdered");
                         });

}  // namespace
}  // namespace shardline::worker

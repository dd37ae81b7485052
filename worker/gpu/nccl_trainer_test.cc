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
#include <dlfcn.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl_backend.h"
#include "worker/train/local_cluster.h"
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
// BUILD rule sets SHARDLINE_FAKE_LOOPBACK_DEVICES=8); pipeline groups with
// their p2p channels (NcclOptions::p2p_channels) unless `p2p_channels` is
// false.
train::BackendFactory NcclFactory(absl::Duration timeout = absl::Seconds(60),
                                  bool p2p_channels = true) {
  return [timeout, p2p_channels](std::shared_ptr<Store> store, plan::GroupKind kind, int rank,
                                 int group_rank, int group_size) {
    NcclOptions o;
    o.plugin_path = kPlugin;
    o.device = rank;
    o.p2p_channels = p2p_channels && kind == plan::GroupKind::kPp;
    o.timeout = timeout;
    o.connect_timeout = absl::Seconds(60);
    return CreateNcclBackend(std::move(store), group_rank, group_size, o);
  };
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
class EverySendWaits {
 public:
  EverySendWaits() {
    void* fake = dlopen(kPlugin, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(fake, nullptr) << dlerror();
    if (fake != nullptr) {
      set_ = reinterpret_cast<void (*)(size_t)>(
          dlsym(fake, "shardline_fake_set_rendezvous_bytes"));
    }
    EXPECT_NE(set_, nullptr);
    if (set_ != nullptr) set_(0);
  }
  ~EverySendWaits() {
    if (set_ != nullptr) set_(size_t{4} << 20);
  }

 private:
  void (*set_)(size_t) = nullptr;
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

// A rank lost in the middle of a step: its communicators are aborted (what
// its peers see when its process dies), and every other rank's step fails
// with Unavailable naming it, in far less than the op timeout. Then the job
// re-forms without it, as the coordinator's next generation would: new
// communicators at dp 1 (tp 2) from the state every rank saved after step 2
// (the last committed checkpoint), continuing the single-rank curve.
TEST(NcclTrainerFailureTest, ARankLostMidStepIsUnavailableNamingItAndTheJobReForms) {
  const TrainingOptions options = Options(Layout{.tp = 2, .dp = 2, .zero = 1});
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
  const std::vector<double> resumed = train::testing::ResumeAndTrain(
      Options(Layout{.tp = 2}), 2, 5,
      [&](train::Trainer& t) { train::testing::Restore(t, checkpoint, 2); }, NcclFactory());
  ASSERT_EQ(resumed.size(), 3u);
  for (int s = 2; s < 5; ++s)
    EXPECT_NEAR(resumed[s - 2], ref[s].loss, 1e-4 * ref[s].loss) << "step " << s;
}

}  // namespace
}  // namespace shardline::worker

// The trainer's GPU path (TrainingOptions::device = a GpuComputeDevice) against
// its CPU path: a tiny GPT trained for a few steps at a few layouts on both,
// every rank a thread with real Gloo backends over loopback (as
// worker/train/test_util.h does) and its own GPU device, must give the same
// loss and gradient norm at every step within fp32 tolerance.
//
// gpu_trainer_test runs this against the real plugin on CUDA device 0 and
// skips (naming the CUDA error) without a GPU; it is tagged "external" so a
// skip is never replayed from the cache on a GPU machine.
// gpu_trainer_emu_test runs it on any machine against the CPU emulation of
// the plugin (testing/libshardline_gpu_emu.so: the real train_kernels.cu
// and train_plugin.cc over host memory), which checks the trainer's device
// plumbing (uploads, gradient downloads, staged tensor-parallel all-reduces,
// pipeline boundaries) with the real kernels, but not CUDA itself.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gpu/nccl_test_util.h"
#include "worker/gpu/gpu_compute_device.h"
#include "worker/gpu/gpu_plugin.h"
#include "worker/comm/nccl_backend.h"
#include "worker/comm/store.h"
#include "worker/train/local_cluster.h"
#include "worker/train/model.h"
#include "worker/train/test_util.h"
#include "worker/train/trainer.h"

namespace shardline::worker {
namespace {

using ::testing::HasSubstr;
using train::testing::Layout;
using train::testing::SmallGptOptions;
using train::StepStats;
using train::TrainingOptions;

// Runfiles-relative.
#ifdef SHARDLINE_GPU_TRAINER_EMU
constexpr char kPlugin[] = "worker/gpu/testing/libshardline_gpu_emu.so";
#else
constexpr char kPlugin[] = "worker/gpu/libshardline_gpu.so";
#endif

// Steps per run. Step 0's loss checks the forward; later steps check that the
// gradients (and so the updates) agree.
constexpr int kSteps = 3;
// fp32 tolerance: cuBLAS (or the emulator's double-accumulating reference
// gemm) against OpenBLAS, and the kernels' reductions, differ in summation
// order only. The emulator (no CUDA math library, no GPU scheduling) stays
// within ~1e-7; a GPU gets the contract's 1e-4 (docs/ARCHITECTURE.md).
#ifdef SHARDLINE_GPU_TRAINER_EMU
constexpr double kLossRelTol = 1e-5;
constexpr double kGradNormRelTol = 1e-5;
#else
constexpr double kLossRelTol = 1e-4;
constexpr double kGradNormRelTol = 1e-4;
#endif

// test_util.h's small GPT (and layout) made tinier for the emulator (one
// thread per CUDA thread): 2 layers, 2 heads, context 8, a global batch of 2
// samples in micro-batches of 1 (gradient accumulation on every layout).
TrainingOptions TinyOptions(const Layout& l) {
  TrainingOptions o = SmallGptOptions(l, kSteps);
  o.model.num_layers = 2;
  o.model.num_heads = 2;
  o.model.seq_length = 8;
  o.parallel.micro_batch_size = 1;
  o.parallel.micro_batches = 2 / l.dp;
  return o;
}

class GpuTrainerTest : public ::testing::TestWithParam<Layout> {
 public:
  void SetUp() override {
    absl::StatusOr<GpuPlugin> plugin = GpuPlugin::Load(kPlugin);
    ASSERT_TRUE(plugin.ok()) << plugin.status();
    // One device up front tells whether there is a GPU at all.
    absl::StatusOr<std::unique_ptr<GpuComputeDevice>> probe =
        GpuComputeDevice::Create(*plugin, 0);
    if (absl::IsUnavailable(probe.status())) {
      GTEST_SKIP() << "no GPU: " << probe.status().message();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
    plugin_ = std::make_unique<GpuPlugin>(*std::move(plugin));
    train::SetIntraOpThreads(1);
  }

  // Trains `steps` steps at options.parallel, every rank a thread; on the
  // GPU (one GpuComputeDevice per rank on device 0) when `gpu`, else on the
  // CPU. Backends: Gloo over loopback, or `factory`'s. Returns rank 0's
  // stats; every rank must agree on each step's loss. `waits` (GPU only;
  // may be null) receives each rank's counts over the steps of
  // GpuOps::synchronizations and GpuOps::host_waits.
  std::vector<StepStats> Train(const TrainingOptions& options, bool gpu,
                               train::BackendFactory factory = nullptr, int steps = kSteps,
                               std::vector<std::pair<int64_t, int64_t>>* waits = nullptr) {
    const int world = options.parallel.world_size();
    if (waits != nullptr) waits->assign(world, {-1, -1});
    std::vector<std::vector<StepStats>> stats(world);
    GlooOptions gloo;
    gloo.timeout = absl::Seconds(300);  // the emulator is slow
    gloo.connect_timeout = absl::Seconds(60);
    if (factory == nullptr) factory = train::GlooFactory(gloo);
    const absl::Status status = train::RunLocalCluster(
        options.parallel,
        [&](int rank, const train::RankGroups& groups) -> absl::Status {
          TrainingOptions mine = options;
          std::unique_ptr<GpuComputeDevice> device;
          if (gpu) {
            absl::StatusOr<std::unique_ptr<GpuComputeDevice>> d =
                GpuComputeDevice::Create(*plugin_, 0);
            if (!d.ok()) return d.status();
            device = *std::move(d);
            mine.device = device.get();
          }
          absl::StatusOr<std::unique_ptr<train::Trainer>> trainer =
              train::Trainer::Create(mine, groups, &train::testing::ShakespeareCorpus());
          if (!trainer.ok()) return trainer.status();
          const std::pair<int64_t, int64_t> before =
              device != nullptr ? std::make_pair(device->ops().synchronizations(),
                                                 device->ops().host_waits())
                                : std::make_pair(int64_t{0}, int64_t{0});
          for (int s = 0; s < steps; ++s) {
            absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
            if (!st.ok()) return st.status();
            stats[rank].push_back(*st);
          }
          if (waits != nullptr && device != nullptr) {
            (*waits)[rank] = {device->ops().synchronizations() - before.first,
                              device->ops().host_waits() - before.second};
          }
          return absl::OkStatus();  // the trainer goes before its device
        },
        factory);
    EXPECT_TRUE(status.ok()) << status;
    for (int rank = 1; rank < world; ++rank) {
      EXPECT_EQ(stats[rank].size(), stats[0].size()) << "rank " << rank;
      for (size_t s = 0; s < std::min(stats[rank].size(), stats[0].size()); ++s)
        EXPECT_EQ(stats[rank][s].loss, stats[0][s].loss) << "rank " << rank << " step " << s;
    }
    return stats[0];
  }

  std::unique_ptr<GpuPlugin> plugin_;
};

// The GPU run of `options` (with `factory`'s backends, else Gloo) against the
// CPU run over Gloo: loss and gradient norm at every step.
void ExpectGpuMatchesCpu(GpuTrainerTest& test, const TrainingOptions& options,
                         const std::string& name, train::BackendFactory factory = nullptr) {
  const absl::Time cpu_start = absl::Now();
  const std::vector<StepStats> cpu = test.Train(options, /*gpu=*/false);
  const absl::Time gpu_start = absl::Now();
  const std::vector<StepStats> gpu = test.Train(options, /*gpu=*/true, std::move(factory));
  const absl::Time end = absl::Now();
  ASSERT_EQ(cpu.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(gpu.size(), static_cast<size_t>(kSteps));
  // The curve must move, or agreement would prove little.
  EXPECT_LT(cpu.back().loss, cpu.front().loss) << "the CPU run did not learn";
  double max_loss_rel = 0, max_norm_rel = 0;
  for (int s = 0; s < kSteps; ++s) {
    max_loss_rel = std::max(max_loss_rel, std::abs(gpu[s].loss - cpu[s].loss) / cpu[s].loss);
    max_norm_rel = std::max(max_norm_rel,
                            std::abs(gpu[s].grad_norm - cpu[s].grad_norm) / cpu[s].grad_norm);
    EXPECT_NEAR(gpu[s].loss, cpu[s].loss, kLossRelTol * std::abs(cpu[s].loss))
        << "step " << s << ": gpu loss " << gpu[s].loss << " vs cpu " << cpu[s].loss;
    EXPECT_NEAR(gpu[s].grad_norm, cpu[s].grad_norm, kGradNormRelTol * cpu[s].grad_norm)
        << "step " << s << ": gpu grad_norm " << gpu[s].grad_norm << " vs cpu "
        << cpu[s].grad_norm;
    EXPECT_EQ(gpu[s].learning_rate, cpu[s].learning_rate);
  }
  std::printf("%s: cpu %.2f s, gpu %.2f s for %d steps; largest relative difference: "
              "loss %.2e, grad_norm %.2e\n",
              name.c_str(), absl::ToDoubleSeconds(gpu_start - cpu_start),
              absl::ToDoubleSeconds(end - gpu_start), kSteps, max_loss_rel, max_norm_rel);
}

// World 1: the state on the GPU (no backend: trainer.h "Where the state
// lives"). tp 2 x pp 2 over Gloo: the state on the host (ZeRO-Offload).
TEST_P(GpuTrainerTest, MatchesCpuLossAndGradNorm) {
  ExpectGpuMatchesCpu(*this, TinyOptions(GetParam()),
                      absl::StrCat("tp", GetParam().tp, "_pp", GetParam().pp));
}

// World 1 with host_optimizer: the host-staged path the GPU benchmark sets
// beside the resident one.
TEST_F(GpuTrainerTest, HostOptimizerAtWorldOneMatchesCpu) {
  TrainingOptions options = TinyOptions(Layout{});
  options.host_optimizer = true;
  ExpectGpuMatchesCpu(*this, options, "world 1, host_optimizer");
}

// precision bf16 on the GPU (the rounding in the plugin's kernel, the
// products fp32 cuBLAS on bf16-exact inputs) against bf16 on the CPU. A
// product summed in another order can land on the other side of a bf16
// rounding boundary, so the contract is bf16's layout tolerance (2e-3 for
// the loss, bf16_device_test; 2e-2 for the gradient norm, a sum of squares
// of bf16-rounded products that such a flip moves more), not fp32's.
TEST_F(GpuTrainerTest, Bf16MatchesCpuBf16) {
  TrainingOptions options = TinyOptions(Layout{});
  options.parallel.precision = plan::Precision::kMixed;
  const std::vector<StepStats> cpu = Train(options, /*gpu=*/false);
  const std::vector<StepStats> gpu = Train(options, /*gpu=*/true);
  ASSERT_EQ(cpu.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(gpu.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(cpu.back().loss, cpu.front().loss) << "the CPU run did not learn";
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(gpu[s].loss, cpu[s].loss, 2e-3 * cpu[s].loss) << "step " << s;
    EXPECT_NEAR(gpu[s].grad_norm, cpu[s].grad_norm, 2e-2 * cpu[s].grad_norm) << "step " << s;
  }
  std::printf("bf16 world 1: loss %.6f vs cpu %.6f at the last step\n", gpu.back().loss,
              cpu.back().loss);
}

#ifdef SHARDLINE_GPU_TRAINER_EMU
// The emulated plugin's fake controls (fake_plugin.cc is part of it).
class EmuFake {
 public:
  EmuFake() {
    handle_ = dlopen(kPlugin, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle_, nullptr) << dlerror();
    if (handle_ == nullptr) return;
    reinterpret_cast<void (*)()>(dlsym(handle_, "shardline_fake_reset"))();
    delay_.emplace(kPlugin, "shardline_fake_set_op_delay", 2000, 0);  // after the reset
    stream_calls_ = reinterpret_cast<void (*)(int64_t*, int64_t*)>(
        dlsym(handle_, "shardline_fake_stream_calls"));
  }
  // comm_order_after_stream and stream_wait_event calls so far.
  std::pair<int64_t, int64_t> StreamCalls() const {
    int64_t orders = 0, waits = 0;
    if (stream_calls_ != nullptr) stream_calls_(&orders, &waits);
    return {orders, waits};
  }

 private:
  void* handle_ = nullptr;
  std::optional<testing::ScopedFakeSetting<int64_t>> delay_;
  void (*stream_calls_)(int64_t*, int64_t*) = nullptr;
};

#endif

// The compute stream and an NCCL communicator ordered both ways with CUDA
// events, as the trainer's collectives are (model.h Collectives::OnDevice),
// at world 1, which one GPU can run: ten kernels double `in` one after
// another, the all_gather copies it to `out` on NCCL's stream, and a kernel
// halves `out`; the host, reading `out` after Settle, must see 512 times
// what it uploaded. On a GPU, without the communicator's wait for the
// compute stream the gather may copy `in` half-doubled, and without the
// compute stream's wait for the gather the halving may run before `out` is
// written. Under the emulator, whose kernels run as they are enqueued, the
// loopback gather waits 2 ms on its stream first, which catches the second.
TEST_F(GpuTrainerTest, ComputeStreamAndNcclOrderedBothWaysWithoutHostWaits) {
#ifdef SHARDLINE_GPU_TRAINER_EMU
  EmuFake fake;
  constexpr int64_t kCount = 512;  // the emulator runs a host thread per CUDA thread
#else
  constexpr int64_t kCount = int64_t{16} << 20;  // 64 MiB: long enough to overtake
#endif
  absl::StatusOr<std::unique_ptr<GpuComputeDevice>> device = GpuComputeDevice::Create(*plugin_, 0);
  ASSERT_TRUE(device.ok()) << device.status();
  NcclOptions o;
  o.plugin_path = kPlugin;
  o.device = 0;
  o.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Backend>> nccl = CreateNcclBackend(NewInMemoryStore(), 0, 1, o);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  train::Collectives group(nccl->get(), nullptr);
  ASSERT_TRUE(group.StreamOrdered(**device));

  std::vector<float> host(kCount);
  for (int64_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 7 + 1);
  train::DeviceBuffer<float> in, out;
  ASSERT_TRUE(in.Resize(**device, kCount).ok());
  ASSERT_TRUE(out.Resize(**device, kCount).ok());
  ASSERT_TRUE((*device)->CopyToDevice(in.data(), host.data(), in.bytes()).ok());
  ASSERT_TRUE((*device)->Zero(out.data(), out.bytes()).ok());
  const int64_t syncs = (*device)->ops().synchronizations();
  for (int k = 0; k < 10; ++k) ASSERT_TRUE((*device)->Scale(in.data(), 2.0f, kCount).ok());
  ASSERT_TRUE(group
                  .OnDevice(**device,
                            [&] {
                              return (*nccl)->AllGather(in.data(), static_cast<size_t>(kCount),
                                                        out.data(), DType::kFloat32);
                            })
                  .ok());
  EXPECT_EQ(group.unsettled(), 1u);
  ASSERT_TRUE((*device)->Scale(out.data(), 0.5f, kCount).ok());
  EXPECT_EQ((*device)->ops().synchronizations(), syncs) << "the host waited for the device";
  ASSERT_TRUE(group.Settle().ok());
  EXPECT_EQ(group.unsettled(), 0u);
  std::vector<float> got(kCount);
  ASSERT_TRUE((*device)->CopyToHost(got.data(), out.data(), out.bytes()).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < kCount; ++i) wrong += got[i] != 512.0f * host[i];
  EXPECT_EQ(wrong, 0) << "e.g. out[1] = " << got[1] << ", want " << 512.0f * host[1];
}

#ifdef SHARDLINE_GPU_TRAINER_EMU
// The state on the device at world > 1: NCCL backends over the emulated
// plugin's loopback communicators (fake_plugin.cc; "device" memory is host
// memory there, as in the emulator), so every collective, pipeline message,
// ZeRO shard and the optimizer step run on the emulated GPU's buffers. Not
// on a real GPU: NCCL refuses two ranks on one device.
//
// The device's stream and the communicators' are ordered with events
// (Collectives::Finish / Order; the fake's stream_wait_event blocks, as the
// emulator's streams run their work at once), and every loopback operation
// waits 2 ms on its stream before it runs: a result used before the device
// is ordered after its operation is read stale, and the run leaves the CPU
// curve (checked: without Work::OrderBefore in Collectives::Finish, both
// tests below fail at step 0).
train::BackendFactory EmuNcclFactory() {
  return testing::NcclLoopbackFactory(kPlugin, absl::Seconds(300));  // the emulator is slow
}

TEST_F(GpuTrainerTest, ResidentOverNcclTp2Pp2MatchesCpu) {
  EmuFake fake;
  ExpectGpuMatchesCpu(*this, TinyOptions(Layout{.tp = 2, .pp = 2}), "nccl tp2_pp2",
                      EmuNcclFactory());
  const auto [orders, waits] = fake.StreamCalls();
  EXPECT_GT(orders, 0);
  EXPECT_GT(waits, 0);
}

TEST_F(GpuTrainerTest, ResidentOverNcclDp2Zero3MatchesCpu) {
  EmuFake fake;
  ExpectGpuMatchesCpu(*this, TinyOptions(Layout{.dp = 2, .zero = 3}), "nccl dp2_zero3",
                      EmuNcclFactory());
  const auto [orders, waits] = fake.StreamCalls();
  EXPECT_GT(orders, 0);
  EXPECT_GT(waits, 0);
}

// A rank lost in the middle of a step while the others' compute streams
// wait for its collectives on the device: its communicators are aborted
// (what its peers see when its process dies); on every other rank the
// backend's watchdog sees the asynchronous error of an operation the stream
// waits for, aborts it, and the step fails with Unavailable naming the lost
// rank, in far less than the 120 s op timeout.
TEST_F(GpuTrainerTest, ARankLostMidStepOverStreamOrderedNcclIsUnavailableNamingIt) {
  EmuFake fake;
  TrainingOptions options = TinyOptions(Layout{.tp = 2, .dp = 2, .zero = 1});
  std::vector<absl::Status> failed(4);
  const absl::Status status = train::RunLocalCluster(
      options.parallel,
      [&](int rank, const train::RankGroups& groups) -> absl::Status {
        absl::StatusOr<std::unique_ptr<GpuComputeDevice>> device =
            GpuComputeDevice::Create(*plugin_, 0);
        if (!device.ok()) return device.status();
        TrainingOptions mine = options;
        mine.device = device->get();
        auto trainer = train::Trainer::Create(mine, groups, &train::testing::ShakespeareCorpus());
        if (!trainer.ok()) return trainer.status();
        absl::StatusOr<StepStats> first = (*trainer)->TrainStep();
        if (!first.ok()) return first.status();
        // World rank 3 (tp rank 1 of dp rank 1) dies before step 1: the
        // cluster aborts its groups when it returns an error.
        if (rank == 3) return absl::InternalError("killed");
        const absl::Time start = absl::Now();
        absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
        failed[rank] = st.status();
        EXPECT_LT(absl::Now() - start, absl::Seconds(60)) << "rank " << rank;
        return st.status();
      },
      testing::NcclLoopbackFactory(kPlugin, absl::Seconds(120)));
  EXPECT_FALSE(status.ok());
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(absl::IsUnavailable(failed[rank])) << "rank " << rank << ": " << failed[rank];
    EXPECT_THAT(std::string(failed[rank].message()), HasSubstr("is gone")) << "rank " << rank;
  }
  const auto [orders, waits] = fake.StreamCalls();
  EXPECT_GT(waits, 0);
}

// The host synchronises with the device (Device::Synchronize) a fixed
// number of times per step, however many layers (and so tp all-reduces)
// there are: the collectives inside the forward and backward are ordered on
// the streams, not by the host. (Before stream ordering every tp all-reduce
// synchronised the device: 17 times per step at tp 2 with 1 layer, 33 with
// 3.) And no host wait of any kind (a synchronisation, a blocking copy, the
// norm's read-back) comes per layer or per micro-batch: 3 layers make as
// many as 1, and the same global batch in 2 micro-batches as in 1.
// (Before, each micro-batch uploaded its tokens and targets and read its
// loss back, 3 waits more each, and the norm read back each unit's sum.)
TEST_F(GpuTrainerTest, HostWaitsPerStepGrowWithNeitherLayersNorMicroBatchesOverNccl) {
  struct Run {
    int layers, micro_batches;
    std::vector<std::pair<int64_t, int64_t>> waits;
  };
  Run runs[3] = {{1, 1, {}}, {3, 1, {}}, {1, 2, {}}};
  for (Run& r : runs) {
    TrainingOptions options = TinyOptions(Layout{.tp = 2});
    options.model.num_layers = r.layers;
    options.parallel.micro_batch_size = 2 / r.micro_batches;
    options.parallel.micro_batches = r.micro_batches;
    Train(options, /*gpu=*/true, EmuNcclFactory(), /*steps=*/2, &r.waits);
    ASSERT_EQ(r.waits.size(), 2u);
    for (const auto& [syncs, waits] : r.waits) {
      EXPECT_GE(syncs, 0) << "layers " << r.layers;
      EXPECT_GE(waits, syncs) << "layers " << r.layers;
    }
    std::printf("tp 2, %d layer(s), %d micro-batch(es), 2 steps, rank 0: %lld synchronisations, "
                "%lld host waits in all\n",
                r.layers, r.micro_batches, static_cast<long long>(r.waits[0].first),
                static_cast<long long>(r.waits[0].second));
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(runs[0].waits[rank].first, runs[1].waits[rank].first) << "rank " << rank;
    EXPECT_EQ(runs[0].waits[rank].second, runs[1].waits[rank].second) << "rank " << rank;
    EXPECT_EQ(runs[0].waits[rank].second, runs[2].waits[rank].second) << "rank " << rank;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(
    Layouts, GpuTrainerTest,
    ::testing::Values(
        // One rank: uploads, device gradient accumulation over 2 micro-batches.
        Layout{},
        // Tensor parallelism (all-reduces staged through host memory) and a
        // pipeline (activations and gradients copied at the boundary).
        Layout{.tp = 2, .pp = 2}),
    [](const ::testing::TestParamInfo<Layout>& info) {
      return absl::StrCat("tp", info.param.tp, "_pp", info.param.pp);
    });

#ifndef SHARDLINE_GPU_TRAINER_EMU
// Runs on every machine: a GPU device by name, or the reason there is none.
TEST(GpuComputeDeviceTest, FromNameGivesDeviceOrNamesTheCause) {
  absl::StatusOr<std::unique_ptr<GpuComputeDevice>> d =
      GpuComputeDevice::FromName("cuda:0", kPlugin);
  if (d.ok()) {
    EXPECT_EQ((*d)->name(), "cuda:0");
    EXPECT_FALSE((*d)->host_memory());
  } else {
    EXPECT_TRUE(absl::IsUnavailable(d.status())) << d.status();
    EXPECT_FALSE(d.status().message().empty());
  }
}
#endif

TEST(GpuComputeDeviceTest, FromNameRejectsOtherNames) {
  for (const char* name :
       {"cpu", "cuda:", "cuda:-1", "cuda:x", "gpu0", "cuda:0 ", "cuda: 1", "cuda:+1"}) {
    absl::StatusOr<std::unique_ptr<GpuComputeDevice>> d = GpuComputeDevice::FromName(name, kPlugin);
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << name << ": " << d.status();
  }
}

}  // namespace
}  // namespace shardline::worker

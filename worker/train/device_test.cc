// The compute-device seam (device.h) and the trainer's device path, on the
// CPU. StagingDevice runs the very same CPU kernels but claims its memory is
// not host memory, so the trainer takes its GPU path (parameter uploads,
// device gradients downloaded into the host buffers, tensor-parallel
// all-reduces staged through host memory, pipeline messages copied at chunk
// boundaries) with fresh memory poisoned with NaN. Since only copies differ,
// every layout must give BIT-identical losses and gradient norms to the
// CpuDevice path, and free every byte it allocated.
#include "worker/train/device.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/train/staging_device.h"
#include "worker/train/test_util.h"

namespace shardline::worker::train {
namespace {

using testing::Layout;
using testing::StagingDevice;

TEST(DeviceBufferTest, ResizeReuseMoveAndReset) {
  Device& d = *CpuDevice::Default();
  DeviceBuffer<float> a;
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.data(), nullptr);
  ASSERT_TRUE(a.Resize(d, 10).ok());
  EXPECT_EQ(a.size(), 10);
  EXPECT_EQ(a.bytes(), 10 * sizeof(float));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.data()[i], 0.0f) << "CpuDevice zero-fills";
  float* const p = a.data();
  ASSERT_TRUE(a.Resize(d, 10).ok());
  EXPECT_EQ(a.data(), p) << "same count on the same device keeps the allocation";
  DeviceBuffer<float> b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  ASSERT_TRUE(b.Resize(d, 0).ok());
  EXPECT_TRUE(b.empty());
  EXPECT_TRUE(absl::IsInvalidArgument(b.Resize(d, -1)));
}

// A HostBuffer takes its memory from the device's AllocHostBytes and gives
// it back to FreeHost (StagingDevice remembers its host blocks); the
// device's own memory is not touched.
TEST(HostBufferTest, AllocatesFromTheDevicesHostMemory) {
  StagingDevice d;
  {
    HostBuffer<float> h;
    ASSERT_TRUE(h.Resize(d, 100).ok());
    EXPECT_EQ(d.host_allocations(), 1);
    EXPECT_TRUE(d.InHostMemory(h.data(), h.bytes()));
    EXPECT_FALSE(d.InHostMemory(h.data(), h.bytes() + 1));
    EXPECT_EQ(d.allocations(), 0) << "no device memory";
    float* const p = h.data();
    ASSERT_TRUE(h.Resize(d, 100).ok());
    EXPECT_EQ(h.data(), p);
    EXPECT_EQ(d.host_allocations(), 1) << "same count: the allocation is kept";
    EXPECT_EQ(d.live_host_blocks(), 1);
  }
  EXPECT_EQ(d.live_host_blocks(), 0) << "freed with the buffer";
  // The default (CpuDevice's): ordinary memory; 0 bytes may be null.
  Device& cpu = *CpuDevice::Default();
  absl::StatusOr<void*> m = cpu.AllocHostBytes(64);
  ASSERT_TRUE(m.ok());
  ASSERT_NE(*m, nullptr);
  static_cast<char*>(*m)[63] = 1;
  cpu.FreeHost(*m);
  cpu.FreeHost(nullptr);
}

// A freed block of a cached size comes back for the same size, as its last
// user left it (not zero-filled again); other sizes and small blocks get
// fresh memory; idle bytes never exceed the cap.
TEST(CpuDeviceTest, ReusesFreedBlocks) {
  CpuDevice d;
  const size_t big = CpuDevice::kMinCachedBlock * 4;
  absl::StatusOr<void*> a = d.AllocBytes(big);
  ASSERT_TRUE(a.ok()) << a.status();
  std::memset(*a, 0x5A, big);
  d.Free(*a);
  EXPECT_EQ(d.cached_bytes(), big);

  absl::StatusOr<void*> other = d.AllocBytes(big + 4);  // another size: fresh
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *a);
  EXPECT_EQ(d.cached_bytes(), big);

  absl::StatusOr<void*> again = d.AllocBytes(big);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
  EXPECT_EQ(d.cached_bytes(), 0u);
  const auto* bytes = static_cast<const unsigned char*>(*again);
  for (size_t i = 0; i < big; ++i) ASSERT_EQ(bytes[i], 0x5A) << "byte " << i;
  d.Free(*again);
  d.Free(*other);
  EXPECT_EQ(d.cached_bytes(), 2 * big + 4);

  absl::StatusOr<void*> small = d.AllocBytes(CpuDevice::kMinCachedBlock - 1);
  ASSERT_TRUE(small.ok());
  d.Free(*small);
  EXPECT_EQ(d.cached_bytes(), 2 * big + 4);  // not kept

  // Fill the cache to its cap: the block that would pass it is freed.
  const size_t block = CpuDevice::kMaxCachedBytes / 4;
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<void*> p = d.AllocBytes(block);
    ASSERT_TRUE(p.ok());
    blocks.push_back(*p);
  }
  for (void* p : blocks) d.Free(p);
  EXPECT_LE(d.cached_bytes(), CpuDevice::kMaxCachedBytes);
  EXPECT_GE(d.cached_bytes(), 3 * block);
  d.Free(nullptr);  // a no-op
}

TEST(BlockPoolTest, ReusesExactSizesWithinItsCapAndDrains) {
  BlockPool pool(/*max_idle_bytes=*/300, /*min_block=*/100);
  int a = 0, b = 0, c = 0, small = 0;
  pool.Track(&a, 100);
  pool.Track(&b, 200);
  pool.Track(&c, 150);
  pool.Track(&small, 50);               // below min_block: not tracked
  EXPECT_FALSE(pool.Release(&small));   // the caller frees it
  EXPECT_TRUE(pool.Release(&a));
  EXPECT_TRUE(pool.Release(&b));
  EXPECT_EQ(pool.idle_bytes(), 300u);
  EXPECT_FALSE(pool.Release(&c)) << "past the cap the caller frees it";
  EXPECT_EQ(pool.Reuse(150), nullptr) << "only exactly the same size";
  EXPECT_EQ(pool.Reuse(200), &b);
  EXPECT_EQ(pool.Reuse(200), nullptr);
  EXPECT_EQ(pool.idle_bytes(), 100u);
  EXPECT_TRUE(pool.Release(&b));
  std::vector<void*> idle = pool.TakeIdle();
  EXPECT_EQ(idle.size(), 2u);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  EXPECT_EQ(pool.Reuse(100), nullptr);
}

TEST(CpuDeviceTest, IsHostMemoryAndCopies) {
  CpuDevice& d = *CpuDevice::Default();
  EXPECT_TRUE(d.host_memory());
  EXPECT_EQ(d.name(), "cpu");
  const std::vector<float> host = {1, 2, 3};
  DeviceBuffer<float> x;
  ASSERT_TRUE(x.Resize(d, 3).ok());
  ASSERT_TRUE(d.CopyToDevice(x.data(), host.data(), x.bytes()).ok());
  ASSERT_TRUE(d.AddInPlace(x.data(), x.data(), 3).ok());
  std::vector<float> back(3);
  ASSERT_TRUE(d.CopyToHost(back.data(), x.data(), x.bytes()).ok());
  EXPECT_EQ(back, (std::vector<float>{2, 4, 6}));
  ASSERT_TRUE(d.Zero(x.data(), x.bytes()).ok());
  EXPECT_EQ(x.data()[2], 0.0f);
}

constexpr int kSteps = 5;

class StagingDeviceTrainerTest : public ::testing::TestWithParam<Layout> {};

TEST_P(StagingDeviceTrainerTest, BitIdenticalToCpuDevice) {
  const TrainingOptions cpu_options = testing::SmallGptOptions(GetParam(), kSteps);
  std::vector<double> cpu_validation(1), staged_validation(1);
  std::vector<std::string> cpu_sample(1), staged_sample(1);
  // After training, rank 0 also evaluates and samples (every rank takes part).
  auto after = [](std::vector<double>* validation, std::vector<std::string>* sample) {
    return [validation, sample](int rank, Trainer& t) {
      absl::StatusOr<double> v = t.EvaluateValidation(8);
      ASSERT_TRUE(v.ok()) << v.status();
      absl::StatusOr<std::string> s = t.Sample("ROMEO:", 4, 0.8, 7);
      ASSERT_TRUE(s.ok()) << s.status();
      if (rank == 0) {
        (*validation)[0] = *v;
        (*sample)[0] = *s;
      }
    };
  };
  const std::vector<StepStats> cpu =
      testing::Train(cpu_options, kSteps, after(&cpu_validation, &cpu_sample));

  StagingDevice staging;
  TrainingOptions staged_options = cpu_options;
  staged_options.device = &staging;
  const std::vector<StepStats> staged =
      testing::Train(staged_options, kSteps, after(&staged_validation, &staged_sample));

  ASSERT_EQ(cpu.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(staged.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(staged[s].loss, cpu[s].loss) << "step " << s;
    EXPECT_EQ(staged[s].grad_norm, cpu[s].grad_norm) << "step " << s;
  }
  EXPECT_FALSE(std::isnan(cpu.back().loss));
  EXPECT_EQ(staged_validation[0], cpu_validation[0]);
  EXPECT_EQ(staged_sample[0], cpu_sample[0]);
  EXPECT_GT(staging.allocations(), 0);
  EXPECT_GT(staging.copies(), 0);
  EXPECT_EQ(staging.live_bytes(), 0) << "device memory leaked after the trainers ended";
}

// precision bf16 on a device whose memory is not host memory: the rounding
// runs through the device (Device::RoundToBFloat16), bit-identical to the
// CPU path, with the state on the device (world 1) and on the host (Gloo).
class StagingDeviceBf16Test : public ::testing::TestWithParam<Layout> {};

TEST_P(StagingDeviceBf16Test, BitIdenticalToCpuDevice) {
  TrainingOptions o = testing::SmallGptOptions(GetParam(), kSteps);
  o.parallel.precision = plan::Precision::kMixed;
  const std::vector<StepStats> cpu = testing::Train(o, kSteps);
  StagingDevice staging;
  o.device = &staging;
  const std::vector<StepStats> staged = testing::Train(o, kSteps);
  ASSERT_EQ(staged.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(cpu.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(cpu.back().loss, cpu.front().loss) << "did not learn";
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(staged[s].loss, cpu[s].loss) << "step " << s;
    EXPECT_EQ(staged[s].grad_norm, cpu[s].grad_norm) << "step " << s;
  }
  EXPECT_EQ(staging.live_bytes(), 0) << "device memory leaked after the trainers ended";
}

INSTANTIATE_TEST_SUITE_P(Layouts, StagingDeviceBf16Test,
                         ::testing::Values(Layout{}, Layout{.tp = 2, .pp = 2}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return info.param.Name();
                         });

using plan::ScheduleKind;

INSTANTIATE_TEST_SUITE_P(
    Layouts, StagingDeviceTrainerTest,
    ::testing::Values(
        Layout{},
        Layout{.tp = 2},
        Layout{.pp = 2, .vpp = 2, .schedule = ScheduleKind::kInterleaved},
        Layout{.dp = 2, .zero = 3},
        Layout{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .schedule = ScheduleKind::kOneFOneB,
               .micro_batch_size = 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.Name(); });

}  // namespace
}  // namespace shardline::worker::train

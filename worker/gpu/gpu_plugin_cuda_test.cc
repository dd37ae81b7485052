// Loads the real plugin built against /usr/local/cuda. Versions are checked
// on every machine with the CUDA libraries; device checks run only where a
// GPU is present and are skipped (with the CUDA error as the reason) elsewhere.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gtest/gtest.h"
#include "worker/gpu/gpu_plugin.h"

namespace shardline::worker {
namespace {

constexpr char kPlugin[] = "worker/gpu/libshardline_gpu.so";  // runfiles-relative

TEST(GpuPluginCudaTest, ReportsTheVersionsItWasBuiltWith) {
  const auto plugin = GpuPlugin::Load(kPlugin);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  const GpuInfo v = plugin->Versions();
  EXPECT_EQ(v.cuda_runtime_version, CUDART_VERSION);
  EXPECT_EQ(v.nccl_version, NCCL_VERSION_CODE);
  EXPECT_TRUE(v.devices.empty());
}

TEST(GpuPluginCudaTest, ProbesDevicesWhereAGpuExists) {
  const auto plugin = GpuPlugin::Load(kPlugin);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  const auto info = plugin->Probe();
  if (absl::IsUnavailable(info.status())) GTEST_SKIP() << info.status().message();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GE(info->devices.size(), 1u);
  EXPECT_GT(info->cuda_driver_version, 0);
  for (size_t i = 0; i < info->devices.size(); ++i) {
    const GpuDevice& d = info->devices[i];
    EXPECT_EQ(d.index, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, uint64_t{1} << 30);  // every supported GPU has > 1 GiB
    EXPECT_GE(d.compute_capability_major, 7);            // CUDA 13 supports Volta and newer
  }
}

}  // namespace
}  // namespace shardline::worker

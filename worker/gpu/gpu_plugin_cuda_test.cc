// Loads the real plugin built against /usr/local/cuda. Versions are checked
// on every machine with the CUDA libraries; device checks run only where a
// GPU is present and are skipped (with the CUDA error as the reason) elsewhere.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

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

TEST(GpuPluginCudaTest, HasTheNcclTableOfThisAbi) {
  const auto plugin = GpuPlugin::Load(kPlugin);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  const ShardlineGpuApi& api = plugin->api();
  EXPECT_EQ(api.abi_version, SHARDLINE_GPU_ABI_VERSION);
  EXPECT_EQ(SHARDLINE_NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_BYTES);
  const void* fns[] = {reinterpret_cast<const void*>(api.device_count),
                       reinterpret_cast<const void*>(api.comm_init),
                       reinterpret_cast<const void*>(api.comm_abort),
                       reinterpret_cast<const void*>(api.all_to_all),
                       reinterpret_cast<const void*>(api.event_query),
                       reinterpret_cast<const void*>(api.copy_to_host)};
  for (const void* f : fns) EXPECT_NE(f, nullptr);
}

TEST(GpuPluginCudaTest, CommInitWithoutAGpuIsUnavailableNamingCuda) {
  const auto plugin = GpuPlugin::Load(kPlugin);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  if (plugin->Probe().ok()) GTEST_SKIP() << "this machine has a GPU; this checks the no-GPU path";
  const ShardlineGpuApi& api = plugin->api();
  char error[512] = {0};
  int32_t count = -1;
  EXPECT_EQ(api.device_count(&count, error, sizeof(error)), SHARDLINE_GPU_UNAVAILABLE);
  EXPECT_EQ(count, 0);
  EXPECT_NE(std::string(error).find("cudaGetDeviceCount"), std::string::npos) << error;
  uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES] = {0};
  ShardlineNcclComm* comm = nullptr;
  error[0] = '\0';
  EXPECT_EQ(api.comm_init(id, 1, 0, 0, 1000, &comm, error, sizeof(error)),
            SHARDLINE_GPU_UNAVAILABLE);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(error).find("cudaGetDeviceCount"), std::string::npos) << error;
  error[0] = '\0';
  EXPECT_EQ(api.comm_init(id, 2, 2, 0, 1000, &comm, error, sizeof(error)),
            SHARDLINE_GPU_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error).find("rank=2"), std::string::npos) << error;
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

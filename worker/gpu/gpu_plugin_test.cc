// The loader's error paths; runs on every machine (no CUDA needed).
#include "worker/gpu/gpu_plugin.h"

#include "worker/gpu/gpu_ops.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

using ::testing::HasSubstr;

// Unavailable naming the path and dlopen's reason; what follows (no GPU
// path: exit, or Gloo where the caller can fall back) is the caller's to say.
TEST(GpuPluginTest, MissingPluginIsUnavailableNamingThePath) {
  const auto plugin = GpuPlugin::Load("/nonexistent/libshardline_gpu.so");
  EXPECT_EQ(plugin.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(plugin.status().message()), HasSubstr("/nonexistent/libshardline_gpu.so"));
  EXPECT_THAT(std::string(plugin.status().message()), HasSubstr("No such file"));
  EXPECT_THAT(std::string(plugin.status().message()), ::testing::Not(HasSubstr("Gloo is used")));
}

TEST(GpuPluginTest, ALibraryThatIsNotAPluginIsRejected) {
  const auto plugin = GpuPlugin::Load("libm.so.6");
  EXPECT_EQ(plugin.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plugin.status().message()), HasSubstr("shardline_gpu_probe"));
}

TEST(GpuPluginTest, LoadsAPluginOfThisAbiAndItsNcclTable) {
  const auto plugin = GpuPlugin::Load("worker/gpu/libshardline_gpu_fake.so");  // runfiles
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  EXPECT_EQ(plugin->api().abi_version, SHARDLINE_GPU_ABI_VERSION);
  const auto info = plugin->Probe();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->devices.size(), 1u);
  EXPECT_EQ(info->devices[0].name, "fake GPU");
}

TEST(GpuPluginTest, APluginWithoutTrainingMathGivesUnavailableGpuOps) {
  const auto plugin = GpuPlugin::Load("worker/gpu/libshardline_gpu_fake.so");  // runfiles
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  EXPECT_EQ(plugin->train_api(), nullptr);
  const auto ops = GpuOps::Create(*plugin, 0);
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(ops.status().message()), HasSubstr("shardline_gpu_train_api"));
}

TEST(GpuPluginTest, DefaultPathIsNextToTheExecutable) {
  EXPECT_THAT(GpuPlugin::DefaultPath(), HasSubstr("/worker/gpu/libshardline_gpu.so"));
}

}  // namespace
}  // namespace shardline::worker

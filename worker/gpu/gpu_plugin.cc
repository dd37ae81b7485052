#include "worker/gpu/gpu_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "worker/gpu/plugin_abi.h"

namespace shardline::worker {
namespace {

// Runs the plugin's probe; returns its code and fills `info` / `error`.
int RunProbe(int (*probe)(void*, char*, size_t), ShardlineGpuInfo& info, std::string& error) {
  char buffer[512] = {0};
  const int code = probe(&info, buffer, sizeof(buffer));
  error = buffer;
  return code;
}

GpuInfo Convert(const ShardlineGpuInfo& raw) {
  GpuInfo info;
  info.cuda_runtime_version = raw.cuda_runtime_version;
  info.cuda_driver_version = raw.cuda_driver_version;
  info.nccl_version = raw.nccl_version;
  for (int i = 0; i < raw.device_count && i < SHARDLINE_GPU_MAX_DEVICES; ++i) {
    const ShardlineGpuDevice& d = raw.devices[i];
    info.devices.push_back({d.index, d.name, d.total_memory_bytes, d.compute_capability_major,
                            d.compute_capability_minor});
  }
  return info;
}

}  // namespace

std::string GpuPlugin::DefaultPath() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "libshardline_gpu.so";
  std::string dir(exe, n);
  dir.resize(dir.rfind('/') + 1);
  return dir + "libshardline_gpu.so";
}

absl::StatusOr<GpuPlugin> GpuPlugin::Load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat("cannot load GPU plugin '", path, "': ",
                                               why ? why : "unknown dlopen error"));
  }
  auto probe = reinterpret_cast<ProbeFn>(dlsym(handle, SHARDLINE_GPU_PROBE_SYMBOL));
  if (probe == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path, "' is not a Shardline GPU plugin: no symbol ", SHARDLINE_GPU_PROBE_SYMBOL));
  }
  auto raw = std::make_unique<ShardlineGpuInfo>();
  std::string error;
  RunProbe(probe, *raw, error);
  if (raw->abi_version != SHARDLINE_GPU_ABI_VERSION) {
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat("GPU plugin '", path, "' has ABI version ", raw->abi_version,
                     " but this worker needs ", SHARDLINE_GPU_ABI_VERSION,
                     "; rebuild both from the same tree"));
  }
  auto api_fn = reinterpret_cast<ShardlineGpuApiFn>(dlsym(handle, SHARDLINE_GPU_API_SYMBOL));
  const ShardlineGpuApi* api = api_fn != nullptr ? api_fn() : nullptr;
  if (api == nullptr || api->abi_version != SHARDLINE_GPU_ABI_VERSION) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU plugin '", path, "' has no ", SHARDLINE_GPU_API_SYMBOL, " table of ABI version ",
        SHARDLINE_GPU_ABI_VERSION, "; rebuild both from the same tree"));
  }
  // Optional: a plugin without training math (the fake) has no such symbol.
  auto train_fn =
      reinterpret_cast<ShardlineGpuTrainApiFn>(dlsym(handle, SHARDLINE_GPU_TRAIN_API_SYMBOL));
  const ShardlineGpuTrainApi* train_api = train_fn != nullptr ? train_fn() : nullptr;
  if (train_api != nullptr && train_api->abi_version != SHARDLINE_GPU_ABI_VERSION) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU plugin '", path, "' has a ", SHARDLINE_GPU_TRAIN_API_SYMBOL, " table of ABI version ",
        train_api->abi_version, " but this worker needs ", SHARDLINE_GPU_ABI_VERSION,
        "; rebuild both from the same tree"));
  }
  // The handle is intentionally kept open for the process lifetime.
  return GpuPlugin(probe, api, train_api);
}

absl::StatusOr<GpuInfo> GpuPlugin::Probe() const {
  auto raw = std::make_unique<ShardlineGpuInfo>();
  std::string error;
  const int code = RunProbe(probe_, *raw, error);
  if (code == SHARDLINE_GPU_UNAVAILABLE) return absl::UnavailableError(error);
  if (code != SHARDLINE_GPU_OK) return absl::InternalError(error);
  return Convert(*raw);
}

GpuInfo GpuPlugin::Versions() const {
  auto raw = std::make_unique<ShardlineGpuInfo>();
  std::string error;
  RunProbe(probe_, *raw, error);
  GpuInfo info = Convert(*raw);
  info.devices.clear();
  return info;
}

}  // namespace shardline::worker

#include "worker/gpu/gpu_compute_device.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace shardline::worker {
namespace {

// GpuPlugin::DefaultPath() (next to the executable) when the file is there,
// else the copy in the executable's Bazel runfiles (bazel run, bazel-bin/),
// else DefaultPath() again so that the error names the install location.
std::string DefaultPluginPath() {
  const std::string next_to_exe = GpuPlugin::DefaultPath();
  if (access(next_to_exe.c_str(), F_OK) == 0) return next_to_exe;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string runfiles = std::string(exe, static_cast<size_t>(n)) +
                                 ".runfiles/shardline/worker/gpu/libshardline_gpu.so";
    if (access(runfiles.c_str(), F_OK) == 0) return runfiles;
  }
  return next_to_exe;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuComputeDevice>> GpuComputeDevice::Create(
    const GpuPlugin& plugin, int device) {
  absl::StatusOr<std::unique_ptr<GpuOps>> ops = GpuOps::Create(plugin, device);
  if (!ops.ok()) return ops.status();
  return std::unique_ptr<GpuComputeDevice>(new GpuComputeDevice(*std::move(ops)));
}

absl::StatusOr<int> GpuComputeDevice::Ordinal(const std::string& device_name) {
  absl::string_view rest = device_name;
  int ordinal = 0;
  // Digits only after "cuda:" (SimpleAtoi alone would take " 0", "+0").
  const auto digits = [](absl::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!absl::ConsumePrefix(&rest, "cuda") ||
      (!rest.empty() && (!absl::ConsumePrefix(&rest, ":") || !digits(rest) ||
                         !absl::SimpleAtoi(rest, &ordinal) || ordinal < 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device '", device_name, "' is not a GPU device name; use cuda or cuda:N (N >= 0), or cpu for no GPU"));
  }
  return ordinal;
}

absl::StatusOr<std::unique_ptr<GpuComputeDevice>> GpuComputeDevice::FromName(
    const std::string& device_name, const std::string& plugin_path) {
  absl::StatusOr<int> ordinal = Ordinal(device_name);
  if (!ordinal.ok()) return ordinal.status();
  absl::StatusOr<GpuPlugin> plugin =
      GpuPlugin::Load(plugin_path.empty() ? DefaultPluginPath() : plugin_path);
  if (!plugin.ok()) return plugin.status();
  return Create(*plugin, *ordinal);
}

std::string GpuComputeDevice::name() const { return absl::StrCat("cuda:", ops_->device()); }

GpuComputeDevice::~GpuComputeDevice() { ReleaseCachedMemory(); }

void GpuComputeDevice::ReleaseCachedMemory() {
  for (void* p : pool_.TakeIdle()) ops_->Free(p);
}

namespace {
// train::HostCopies over the plugin's event.
class RecordedHostCopies final : public train::HostCopies {
 public:
  explicit RecordedHostCopies(std::shared_ptr<GpuHostCopies> copies)
      : copies_(std::move(copies)) {}
  absl::Status Wait() override { return copies_->Wait(); }

 private:
  const std::shared_ptr<GpuHostCopies> copies_;
};
}  // namespace

absl::StatusOr<std::shared_ptr<train::HostCopies>> GpuComputeDevice::RecordHostCopies() {
  absl::StatusOr<std::shared_ptr<GpuHostCopies>> copies = ops_->RecordHostCopies();
  if (!copies.ok()) return copies.status();
  return std::make_shared<RecordedHostCopies>(*std::move(copies));
}

absl::StatusOr<void*> GpuComputeDevice::AllocBytes(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (void* reused = pool_.Reuse(bytes); reused != nullptr) return reused;
  absl::StatusOr<void*> p = ops_->AllocBytes(bytes);
  if (absl::IsResourceExhausted(p.status())) {
    for (void* idle : pool_.TakeIdle()) ops_->Free(idle);
    p = ops_->AllocBytes(bytes);
  }
  if (p.ok()) pool_.Track(*p, bytes);
  return p;
}

void GpuComputeDevice::Free(void* ptr) {
  if (ptr == nullptr) return;
  if (!pool_.Release(ptr)) ops_->Free(ptr);
}

absl::Status GpuComputeDevice::AdamWStep(const train::AdamWConfig& config, float lr, int64_t t,
                                         float* param, const float* grad, float* exp_avg,
                                         float* exp_avg_sq, const uint8_t* decay_mask,
                                         int64_t n) {
  const train::AdamWScalars k = train::AdamWScalarsFor(config, lr, t);
  const ShardlineAdamWScalars scalars{k.step_size,    k.inv_sqrt_bc2, k.b1,  k.b2,
                                      k.one_minus_b1, k.one_minus_b2, k.eps, k.decay};
  return ops_->AdamWStep(scalars, param, grad, exp_avg, exp_avg_sq, decay_mask, n);
}

absl::Status GpuComputeDevice::AccumulateMaskedSumsOfSquares(
    const std::vector<MaskedPiece>& pieces, double* sum) {
  std::vector<const float*> x;
  std::vector<const uint8_t*> mask;
  std::vector<int64_t> n;
  for (const MaskedPiece& p : pieces) {
    x.push_back(p.x);
    mask.push_back(p.mask);
    n.push_back(p.n);
  }
  return ops_->AccumulateMaskedSumsOfSquares(static_cast<int64_t>(pieces.size()), x.data(),
                                             mask.data(), n.data(), sum);
}

}  // namespace shardline::worker

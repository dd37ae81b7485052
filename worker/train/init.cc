#include "worker/train/init.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace shardline::worker::train {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr double kPi = 3.14159265358979323846;

// SplitMix64 (Steele, Lea, Flood, OOPSLA'14): one step's output for `state`.
uint64_t SplitMix64(uint64_t state) {
  uint64_t z = state + kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The top 53 bits of `bits` as a double in the open interval (0, 1).
double OpenUniform(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// Standard deviation of the normal weights of `name`, or a negative value for
// constants (then `*constant` is set).
double StdOrConstant(absl::string_view name, int64_t num_layers, float* constant) {
  if (absl::EndsWith(name, ".bias")) {
    *constant = 0.0f;
    return -1.0;
  }
  if (absl::EndsWith(name, "layernorm.weight")) {
    *constant = 1.0f;
    return -1.0;
  }
  if (absl::EndsWith(name, "attention.dense.weight") || absl::EndsWith(name, "mlp.fc2.weight")) {
    return 0.02 / std::sqrt(2.0 * static_cast<double>(num_layers));
  }
  return 0.02;
}

// N(0, 1) for element `index` of the tensor whose key is `key`.
double StandardNormal(uint64_t key, int64_t index) {
  const uint64_t u = static_cast<uint64_t>(index);
  const double u1 = OpenUniform(SplitMix64(key ^ SplitMix64(2 * u)));
  const double u2 = OpenUniform(SplitMix64(key ^ SplitMix64(2 * u + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

uint64_t TensorKey(uint64_t seed, const plan::ParameterSpec& spec) {
  return SplitMix64(SplitMix64(seed) ^ Fnv1a64(spec.name));
}

}  // namespace

float InitialValue(uint64_t seed, const plan::ParameterSpec& spec, int64_t num_layers,
                   int64_t index) {
  float constant = 0.0f;
  const double std_dev = StdOrConstant(spec.name, num_layers, &constant);
  if (std_dev < 0) return constant;
  return static_cast<float>(std_dev * StandardNormal(TensorKey(seed, spec), index));
}

void InitializeLocalSlice(uint64_t seed, const plan::ParameterSpec& spec, int64_t num_layers,
                          int tp, int tp_rank, float* out) {
  const int64_t n = spec.local_numel(tp);
  float constant = 0.0f;
  const double std_dev = StdOrConstant(spec.name, num_layers, &constant);
  if (std_dev < 0) {
    for (int64_t k = 0; k < n; ++k) out[k] = constant;
    return;
  }
  const uint64_t key = TensorKey(seed, spec);
  for (int64_t k = 0; k < n; ++k) {
    out[k] = static_cast<float>(
        std_dev * StandardNormal(key, spec.global_index(tp, tp_rank, k)));
  }
}

}  // namespace shardline::worker::train

#include "worker/train/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/train/vector_clones.h"

namespace shardline::worker::train {

// Vectorised per target (vector_clones.h); every lane does the scalar
// float arithmetic below, so the clones agree bit for bit.
SL_VECTOR_CLONES void AdamWStep(const AdamWConfig& config, float lr, int64_t t,
                                float* __restrict param, const float* __restrict grad,
                                float* __restrict exp_avg, float* __restrict exp_avg_sq,
                                const uint8_t* __restrict decay_mask, int64_t n) {
  const AdamWScalars k = AdamWScalarsFor(config, lr, t);
  const float step_size = k.step_size, inv_sqrt_bc2 = k.inv_sqrt_bc2, b1 = k.b1, b2 = k.b2,
              one_minus_b1 = k.one_minus_b1, one_minus_b2 = k.one_minus_b2, eps = k.eps;
  const float no_mask_decay = k.decay;
  for (int64_t i = 0; i < n; ++i) {
    const float d = decay_mask == nullptr ? no_mask_decay
                                          : (decay_mask[i] != 0 ? no_mask_decay : 1.0f);
    const float p = param[i] * d;
    const float g = grad[i];
    const float m = b1 * exp_avg[i] + one_minus_b1 * g;
    const float v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - step_size * m / (std::sqrt(v) * inv_sqrt_bc2 + eps);
  }
}

AdamWScalars AdamWScalarsFor(const AdamWConfig& config, float lr, int64_t t) {
  const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(t));
  // As torch.optim.AdamW (single-tensor path): step_size = lr / bc1,
  // denom = sqrt(v) / sqrt(bc2) + eps.
  AdamWScalars k;
  k.step_size = static_cast<float>(static_cast<double>(lr) / bias_correction1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  k.b1 = static_cast<float>(config.beta1);
  k.b2 = static_cast<float>(config.beta2);
  k.one_minus_b1 = static_cast<float>(1.0 - config.beta1);
  k.one_minus_b2 = static_cast<float>(1.0 - config.beta2);
  k.eps = static_cast<float>(config.epsilon);
  // p * 1.0f == p exactly, so elements without decay can take the same path.
  k.decay = config.weight_decay != 0.0
                ? static_cast<float>(1.0 - static_cast<double>(lr) * config.weight_decay)
                : 1.0f;
  return k;
}

double LearningRate(int64_t step, const LearningRateSchedule& schedule) {
  const double lr = schedule.learning_rate;
  const double min_lr = schedule.min_learning_rate;
  if (step < schedule.warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(schedule.warmup_steps);
  }
  const int64_t decay_steps = schedule.total_steps - schedule.warmup_steps;
  if (decay_steps <= 0) return min_lr;  // no room for a cosine: past its end
  const double r = std::clamp(
      static_cast<double>(step - schedule.warmup_steps) / static_cast<double>(decay_steps), 0.0,
      1.0);
  constexpr double kPi = 3.14159265358979323846;
  return min_lr + 0.5 * (1.0 + std::cos(kPi * r)) * (lr - min_lr);
}

double SumOfSquares(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

}  // namespace shardline::worker::train

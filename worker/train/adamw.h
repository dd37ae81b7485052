// AdamW and the learning-rate schedule.
//
//   AdamWConfig c{.beta1 = 0.9, .beta2 = 0.99, .epsilon = 1e-8, .weight_decay = 0.1};
//   float lr = LearningRate(step, schedule);
//   AdamWStep(c, lr, /*step=*/t, param, grad, exp_avg, exp_avg_sq, decay_mask, n);
//
// Pure functions over caller-owned buffers; thread-safe on disjoint buffers.
#ifndef SHARDLINE_WORKER_TRAIN_ADAMW_H_
#define SHARDLINE_WORKER_TRAIN_ADAMW_H_

#include <cstdint>

namespace shardline::worker::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.0;  // decoupled; applied only where decay_mask is 1
};

// One AdamW update (Loshchilov & Hutter, "Decoupled Weight Decay
// Regularization", ICLR'19, Algorithm 2, with Adam's bias correction, Kingma &
// Ba 2015, Algorithm 1), elementwise over n elements, as torch.optim.AdamW:
//   p -= lr * weight_decay * p                      (where decay_mask[i] != 0)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
// `t` is the 1-based count of updates so far including this one. decay_mask
// may be null (decay everywhere). Arithmetic in fp32 except the bias
// corrections (double).
void AdamWStep(const AdamWConfig& config, float lr, int64_t t, float* param, const float* grad,
               float* exp_avg, float* exp_avg_sq, const uint8_t* decay_mask, int64_t n);

// The per-step constants of AdamWStep (computed in double, rounded to float
// once), so a device kernel does the same float arithmetic per element:
//   d = decay_mask[i] ? decay : 1;  p = param[i] * d;
//   m = b1 * exp_avg[i] + one_minus_b1 * g;  v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
//   param[i] = p - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
struct AdamWScalars {
  float step_size = 0;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^t)
  float b1 = 0, b2 = 0, one_minus_b1 = 0, one_minus_b2 = 0, eps = 0;
  float decay = 1;         // 1 - lr * weight_decay (1 without weight decay)
};
AdamWScalars AdamWScalarsFor(const AdamWConfig& config, float lr, int64_t t);

struct LearningRateSchedule {
  double learning_rate = 1e-3;      // peak
  double min_learning_rate = 0.0;   // floor of the cosine
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;          // the cosine reaches min at this step
};

// Linear warmup then cosine decay (Loshchilov & Hutter, SGDR, ICLR'17, Eq. 5
// without restarts), as nanoGPT: for step < warmup_steps,
// lr * (step + 1) / warmup_steps; then min + 0.5 (1 + cos(pi r)) (lr - min) with
// r = (step - warmup) / (total - warmup) clamped to [0, 1]. `step` is 0-based.
// When total_steps <= warmup_steps there is no cosine: steps from warmup_steps
// on get min_learning_rate.
double LearningRate(int64_t step, const LearningRateSchedule& schedule);

// sqrt(sum of squares) helpers for clipping live in the trainer (they need
// the cross-rank reduction); this returns the local sum of squares of
// x[0..n) in double.
double SumOfSquares(const float* x, int64_t n);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_ADAMW_H_

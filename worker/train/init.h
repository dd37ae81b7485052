// Deterministic initial weights: every element's value is a pure function of
// (seed, parameter name, element index in the global unsplit tensor), so every
// parallel layout (tp, pp, dp, zero_stage) starts from the same model
// (docs/ARCHITECTURE.md "Numbers that are contracts").
//
//   std::vector<float> w(spec.local_numel(tp));
//   InitializeLocalSlice(/*seed=*/1234, spec, /*num_layers=*/4, tp, tp_rank, w.data());
//
// Rule (GPT-2, Radford et al. 2019, Section 2.3; nanoGPT):
//   *.bias                           0
//   *layernorm.weight                1
//   attention.dense.weight,
//   mlp.fc2.weight                   N(0, (0.02 / sqrt(2 * num_layers))^2)
//   every other weight (qkv, fc1,
//   word/position embeddings)        N(0, 0.02^2)
// Normal values come from a counter-based generator, never from a sequential
// stream, so any slice can be made without making the rest. Exactly, with
// S(x) the SplitMix64 output for state x (z = x + 0x9e3779b97f4a7c15, then
// the usual xor-shift-multiply finalizer), F the FNV-1a-64 of the name's bytes
// and all arithmetic mod 2^64:
//   key = S(S(seed) ^ F(name))
//   u1  = ((S(key ^ S(2 index))     >> 11) + 0.5) / 2^53      in (0, 1)
//   u2  = ((S(key ^ S(2 index + 1)) >> 11) + 0.5) / 2^53
//   value = float(std * sqrt(-2 ln u1) * cos(2 pi u2))       (double inside)
// The key depends on the name only, not the shape.
// Pure functions; thread-safe.
#ifndef SHARDLINE_WORKER_TRAIN_INIT_H_
#define SHARDLINE_WORKER_TRAIN_INIT_H_

#include <cstdint>

#include "plan/model.h"

namespace shardline::worker::train {

// Element `index` (row-major over spec.shape, the GLOBAL unsplit tensor) of
// parameter `spec`. Precondition: 0 <= index < spec.numel().
float InitialValue(uint64_t seed, const plan::ParameterSpec& spec, int64_t num_layers,
                   int64_t index);

// Fills out[0 .. spec.local_numel(tp)) with tp rank `tp_rank`'s slice, in the
// row-major order of spec.local_shape(tp): for tp_split_dim 0 the rows
// [tp_rank * rows/tp, (tp_rank+1) * rows/tp); for dim 1 those columns of every
// row; unsplit parameters whole. Equal to InitialValue at the matching global
// index. Preconditions: 1 <= tp, 0 <= tp_rank < tp, tp divides the split dim.
void InitializeLocalSlice(uint64_t seed, const plan::ParameterSpec& spec, int64_t num_layers,
                          int tp, int tp_rank, float* out);

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_INIT_H_

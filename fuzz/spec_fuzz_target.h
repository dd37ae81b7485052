// Fuzz targets' entry points, one per target, so that one binary can run
// several of them (fuzz/corpus_replay_test.cc) while each fuzzer binary
// defines libFuzzer's LLVMFuzzerTestOneInput over exactly one.
//
// Each returns 0 and aborts (std::abort via CheckOrDie) when an invariant
// fails, which libFuzzer reports as a crash with the input that caused it.
// Thread-safety: not thread-safe (libFuzzer calls them from one thread).
#ifndef SHARDLINE_FUZZ_SPEC_FUZZ_TARGET_H_
#define SHARDLINE_FUZZ_SPEC_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>

namespace shardline::fuzz {

// The job spec parser (spec/spec_file.h) and validation (spec/job_spec.h).
// Input: one format byte (0: auto, 1: YAML, 2: JSON; taken modulo 3), then
// the spec text. Invariants checked on every accepted spec:
//   * ResolveJobSpec is idempotent: resolving a resolved spec changes nothing;
//   * the resolved spec printed as proto3 JSON parses back to itself;
//   * a resolved spec can be planned at the dp ChooseDp picks (or ChooseDp
//     says no dp fits), without crashing.
int FuzzJobSpec(const uint8_t* data, size_t size);

}  // namespace shardline::fuzz

#endif  // SHARDLINE_FUZZ_SPEC_FUZZ_TARGET_H_

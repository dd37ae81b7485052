// libFuzzer's entry point for the job spec target (fuzz/spec_fuzz_target.h).
#include "fuzz/spec_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return shardline::fuzz::FuzzJobSpec(data, size);
}

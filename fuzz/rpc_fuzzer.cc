// libFuzzer's entry point for the coordinator RPC target
// (fuzz/rpc_fuzz_target.h).
#include "fuzz/rpc_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return shardline::fuzz::FuzzCoordinatorRpcs(data, size);
}

// The coordinator's request validation, fuzzed through its real gRPC API:
// every unary RPC and the first messages of both streams, sent by a real
// client over loopback to a real in-process CoordinatorServer (memory state
// store, real clock; testing/worker_harness.h), fresh for every input so a
// crash reproduces from its input alone.
//
// Input: a sequence of calls, each
//   byte 0     method (modulo the number of methods, fuzz/rpc_fuzz_target.cc
//              kMethods) and, in byte 0 / kMethods % 4, the credential: the
//              admin token, none, an unknown token, a malformed header;
//   bytes 1-2  n, little-endian: the length of the request;
//   n bytes    the request message (protobuf binary; one that does not parse
//              is skipped).
// At most kMaxCallsPerInput calls; each has a 200 ms deadline.
// A spec's checkpoint.directory is pointed into a private temporary folder
// before CreateJob is sent, so that fuzzed jobs never write elsewhere.
//
// Invariants: no crash, no sanitizer report, every call answers within its
// deadline (plus slack), and every non-OK status has a message.
// Thread-safety: not thread-safe.
#ifndef SHARDLINE_FUZZ_RPC_FUZZ_TARGET_H_
#define SHARDLINE_FUZZ_RPC_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardline::fuzz {

inline constexpr int kMaxCallsPerInput = 16;

int FuzzCoordinatorRpcs(const uint8_t* data, size_t size);

// Encodes one call in the input format above (for the seed corpus).
std::string EncodeCall(int method, int credential, const std::string& request);

// The method index of a full method name such as "JobService/CreateJob";
// -1 for none.
int MethodIndex(const std::string& name);

}  // namespace shardline::fuzz

#endif  // SHARDLINE_FUZZ_RPC_FUZZ_TARGET_H_

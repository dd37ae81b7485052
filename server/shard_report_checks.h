// The checks of ReportShard content that need no registry state, for
// server/checkpoint_registry.cc: one rank's report in itself
// (ValidateShardReport) and, at commit, the exact cover of a tensor by every
// rank's pieces (CheckExactCover, declared in server/checkpoint_registry.h).
// Pure functions; thread-safe. Internal to the checkpoint_registry library.
#ifndef SHARDLINE_SERVER_SHARD_REPORT_CHECKS_H_
#define SHARDLINE_SERVER_SHARD_REPORT_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"
#include "shardline/v1/checkpoint.pb.h"

namespace shardline::server {

// Checks one report in itself. Errors: InvalidArgument naming the tensor or
// file and the field (see CheckpointRegistry::ReportShard): a file path
// empty, absolute, containing "..", or repeated; a tensor name empty or
// repeated; dtype unspecified or unknown; global_shape overflowing uint64; a
// piece whose file is not in `files`, whose slice has the wrong number of
// dims or leaves global_shape, whose range is empty or leaves its slice,
// whose byte_length is not numel * dtype size, or whose bytes leave its
// file; rng_state over kMaxRngStateBytes.
absl::Status ValidateShardReport(const shardline::v1::ReportShardRequest& r);

// "[d0,d1,...]" for messages.
std::string ShapeString(const google::protobuf::RepeatedField<uint64_t>& shape);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_SHARD_REPORT_CHECKS_H_

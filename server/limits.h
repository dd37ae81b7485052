// What any client may send: the one table of limits on every string, bytes
// and repeated field of a request message of proto/shardline/v1/ (the
// proto comments name the same constants), and the check every RPC adapter
// (server/rpc/) runs on its request before anything else.
//
//   if (absl::Status s = CheckRequestLimits(*req); !s.ok()) return s;
//   // INVALID_ARGUMENT "host is 15728640 bytes; at most 255 (kMaxHostBytes)"
//
// Limits are lengths in bytes (strings, bytes) or entries (repeated fields;
// a nested repeated field is limited per parent entry). They are public
// and cost nothing to check, so they come before authentication: an
// oversized request is refused before any lookup is made for it. The
// checks of content (a job_id's characters, a path's "..", a spec's
// ranges) stay with the components (coordinator_validation.h,
// checkpoint/geometry.h, spec/job_spec.h); the rendezvous and JobSpec
// limits are theirs (server/rendezvous.h, spec/job_spec.h), referenced here.
//
// Thread-safety: pure functions of their arguments; thread-safe.
#ifndef SHARDLINE_SERVER_LIMITS_H_
#define SHARDLINE_SERVER_LIMITS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace shardline::server {

// Identities.
inline constexpr size_t kMaxJobIdBytes = 63;      // a valid job id (coordinator_validation.h)
inline constexpr size_t kMaxWorkerIdBytes = 128;  // as ValidIdentity (coordinator_validation.h)
// Where a worker runs.
inline constexpr size_t kMaxHostBytes = 255;   // a DNS name (<= 253) or an address
inline constexpr size_t kMaxDeviceBytes = 64;  // "cuda:0", "cpu"
// Free text.
// LeaveJob, CompleteJob, AbortCheckpoint, CancelJob, DrainWorker.
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kMaxErrorMessageBytes = 4096;  // ReportError.message
inline constexpr size_t kMaxOperationBytes = 256;      // ReportError.operation
// Checkpoints.
inline constexpr size_t kMaxCheckpointIdBytes = 128;
inline constexpr size_t kMaxTensorNameBytes = 512;     // "<parameter>/exp_avg_sq", a parameter
inline constexpr size_t kMaxShardPathBytes = 1024;     // ShardFile.path, SavedPiece.file
inline constexpr size_t kMaxFilesPerReport = 4096;     // ReportShardRequest.files
inline constexpr size_t kMaxTensorsPerReport = 65536;  // ReportShardRequest.tensors
inline constexpr size_t kMaxTensorDims = 16;           // global_shape, TensorSlice.dims
inline constexpr size_t kMaxTensorsPerManifestRequest = 65536;  // GetManifestRequest.tensors
// Progress reports (HeartbeatRequest.progress, progress.proto).
inline constexpr size_t kMaxProgressGroups = 64;       // RankProgress.collectives
inline constexpr size_t kMaxGroupNameBytes = 64;       // CollectiveProgress.group, "dp/0"
inline constexpr size_t kMaxCollectiveNameBytes = 32;  // CollectiveProgress.operation
inline constexpr size_t kMaxDTypeNameBytes = 16;       // CollectiveProgress.dtype
// What-if queries.
inline constexpr size_t kMaxWhatIfWorkers = 1024;  // WhatIfRequest.lose_worker_ids
// Listing.
inline constexpr size_t kMaxPageTokenBytes = 256;
inline constexpr size_t kMaxPhasesPerListRequest = 16;  // ListJobsRequest.phases
// A string or repeated field of a request that the table does not list (a
// field added without a limit; server/rpc/bounds_test.cc fails for it).
inline constexpr size_t kMaxUnlistedFieldSize = 1024;

// The limit of `field` (a string, bytes or repeated field of a message
// reachable from a request), or nullopt when the table has none.
std::optional<size_t> FieldLimit(const google::protobuf::FieldDescriptor& field);

// Every string, bytes and repeated field of `message` and of the messages
// it holds is within its limit; a JobSpec's contents are left to
// spec::ResolveJobSpec (same limits, its own messages). InvalidArgument naming the field by its
// path in the request ("fence.worker.worker_id", "tensors[3].pieces") with
// its size, the limit and the constant's name. Unknown fields are not
// looked at.
absl::Status CheckRequestLimits(const google::protobuf::Message& message);

// The four v1 services (JobService, WorkerService, RendezvousService,
// CheckpointService), for the test that every field reachable from their
// requests has a limit.
std::vector<const google::protobuf::ServiceDescriptor*> Services();

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LIMITS_H_

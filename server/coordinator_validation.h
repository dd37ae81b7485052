// The coordinator's checks of what callers send it (job ids, worker
// identities, devices and backends) and its fresh worker tokens. Internal
// to the coordinator (Bazel visibility: this package).
//
//   if (absl::Status s = ValidJobId(request.job_id()); !s.ok()) return s;
//   absl::StatusOr<v1::Backend> b = ResolveBackend("cuda:0", v1::BACKEND_UNSPECIFIED);  // NCCL
//
// Thread-safety: thread-safe (no state).
#ifndef SHARDLINE_SERVER_COORDINATOR_VALIDATION_H_
#define SHARDLINE_SERVER_COORDINATOR_VALIDATION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shardline/v1/common.pb.h"

namespace shardline::server {

// InvalidArgument unless `id` is 1..63 characters of [a-z0-9-], starting
// with a letter and not ending with '-'; the message shows the value
// (abbreviated) and an example.
absl::Status ValidJobId(const std::string& id);

// InvalidArgument, naming `field` (e.g. "fence.worker"), unless `w` has a
// job_id, a worker_id of 1..128 printable ASCII characters without spaces,
// and a non-zero incarnation.
absl::Status ValidIdentity(const v1::WorkerIdentity& w, absl::string_view field);

// The backend of a worker on `device` ("cpu" or "cuda:<index>") that asked
// for `backend`: UNSPECIFIED becomes NCCL on CUDA and GLOO on the CPU.
// InvalidArgument: another device, a `backend` that is not a Backend value
// (the message lists the valid names), or NCCL without a CUDA device.
absl::StatusOr<v1::Backend> ResolveBackend(const std::string& device, v1::Backend backend);

// A fresh worker token: 32 lowercase hex digits from std::random_device.
std::string NewToken();

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_VALIDATION_H_

// Marks of checkpoints a restore found corrupt ("unusable"): the narrow view
// the Coordinator has of them.
//
// A checkpoint whose restore failed its checksums (a DATA_LOSS ReportError
// naming the generation's restore point, see Coordinator::ReportError)
// stays COMMITTED and listed, but is never restored again. The marks have
// one owner, the CheckpointRegistry (server/checkpoint_registry.h): it keeps
// them durably (StateStore kind kCheckpointUnusableKind), skips them in
// Latest() and retention, and shows their reasons in List and GetManifest.
// The Coordinator's restore fallback adds and reads marks through this
// interface only, so it holds no copy of them.
//
//   // Coordinator::ReportError, with its lock held:
//   marks->MarkUnusable(job_id, restore_point_id, what);   // durable first
//   if (!marks->UnusableReason(job_id, candidate_id)) { ... restore candidate ... }
//
// Thread-safety: implementations are thread-safe. The Coordinator calls
// them with its own lock held, so an implementation must never call into
// the Coordinator (lock order: the Coordinator's lock, then the marks').
#ifndef SHARDLINE_SERVER_UNUSABLE_MARKS_H_
#define SHARDLINE_SERVER_UNUSABLE_MARKS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardline::server {

class UnusableCheckpointMarks {
 public:
  virtual ~UnusableCheckpointMarks() = default;

  // Marks `checkpoint_id` of `job_id` unusable with `reason` (why, shown as
  // unusable_reason); durable when it returns OK. Idempotent: a repeat keeps
  // the first reason and writes nothing. An id the owner does not know is
  // remembered. Errors: InvalidArgument: job_id, checkpoint_id or reason
  // empty; Unavailable: the mark could not be written (it holds in memory
  // until a restart).
  virtual absl::Status MarkUnusable(absl::string_view job_id, absl::string_view checkpoint_id,
                                    absl::string_view reason) = 0;

  // The reason `checkpoint_id` of `job_id` was marked unusable; nullopt when
  // it is not marked (or the job is unknown).
  virtual std::optional<std::string> UnusableReason(absl::string_view job_id,
                                                    absl::string_view checkpoint_id) const = 0;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_UNUSABLE_MARKS_H_

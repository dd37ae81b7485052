// Marks of checkpoints a restore found corrupt ("unusable"): the narrow view
// the Coordinator has of them.
//
// A checkpoint a restore found unusable (a ReportError about the
// generation's restore point that RestoreFailureMarksUnusable accepts, see
// Coordinator::ReportError) stays COMMITTED and listed, but is never
// restored again. The marks have one owner, the CheckpointRegistry (server/checkpoint_registry.h): it keeps
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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardline::server {

// Whether a failure with `code` can say that a checkpoint is unusable:
// DATA_LOSS (corrupt, missing or short files, a gap), NOT_FOUND (a tensor or
// the manifest missing), INVALID_ARGUMENT / OUT_OF_RANGE (a malformed
// manifest or piece), FAILED_PRECONDITION (e.g. a shard through a
// symlink), UNIMPLEMENTED (a dtype the reader cannot restore) and
// PERMISSION_DENIED (files it cannot read). Not the codes of a passing
// condition (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED for a generation that
// ended, CANCELLED, RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN): those restart
// from the same restore point.
inline bool UnusableCheckpointCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
      return true;
    default:
      return false;
  }
}

// Whether a ReportError (`code`, `message`, `operation`) says that the
// restore of `restore_point` (non-empty) found it unusable, so that the
// coordinator falls back to an older checkpoint: a DATA_LOSS whose message
// or operation names the restore point (as since the first version), or
// another UnusableCheckpointCode whose message holds "restoring
// <restore_point>" (worker/checkpointer.cc prefixes every restore error so;
// a save error may name the restore point too, e.g. a step not above it,
// and must not mark it).
inline bool RestoreFailureMarksUnusable(absl::StatusCode code, absl::string_view message,
                                        absl::string_view operation,
                                        absl::string_view restore_point) {
  if (restore_point.empty() || !UnusableCheckpointCode(code)) return false;
  if (code == absl::StatusCode::kDataLoss) {
    return absl::StrContains(message, restore_point) ||
           absl::StrContains(operation, restore_point);
  }
  return absl::StrContains(message, absl::StrCat("restoring ", restore_point));
}

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

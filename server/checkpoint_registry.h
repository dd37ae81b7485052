// CheckpointRegistry: the coordinator's side of the two-phase checkpoint
// protocol of proto/shardline/v1/checkpoint.proto — which checkpoints exist,
// which ranks reported what, the exact-cover check, the commit into the
// durable StateStore, retention, and recovery after a coordinator restart.
// No gRPC, no fences, no filesystem: the coordinator validates fences and
// passes job_id, generation, world_size and the caller's rank, and does the
// file work (verifying shard files, writing the manifest next to the shards,
// moving LATEST, deleting expired directories) around these calls.
//
//   absl::StatusOr<std::unique_ptr<CheckpointRegistry>> reg =
//       CheckpointRegistry::Create(store, &clock);
//   auto begun = (*reg)->Begin(params);               // every rank; same id
//   auto report = (*reg)->ReportShard(job, gen, shard);  // last one commits
//
// Lifecycle of one checkpoint (`phase` is internal, `state` is the proto's):
//
//   Begin (first rank)
//     │
//     ▼
//   OPENING ──PENDING record write fails──▶ forgotten (Begin: UNAVAILABLE)
//     │ PENDING record durable
//     ▼
//   PENDING ──Abort / AbortPending / Commit with ranks missing / newer generation──▶ ABORTED
//     │ last rank reports                                                             ▲
//     ▼                                                                               │
//   COMMITTING ──no/missing/extra tensor, gap, overlap, verify_files, store write fails┘
//     │ batch durable
//     ▼
//   COMMITTED
//
// OPENING and COMMITTING show as PENDING to callers. Only COMMITTED
// checkpoints are restorable (Latest, GetManifest("")).
//
// Checkpoint ids: "ckpt-step<step, 12 digits>-gen<generation>", e.g.
// "ckpt-step000000000010-gen3" — a pure function of (generation, step), so
// every rank of a generation gets the same id, and a save of the same step in
// a later generation gets another id and another directory
// (<directory>/<id>), so its files never mix with a dead attempt's (case C10).
//
// Durable records (StateStore):
//   kind "checkpoint",        key "<job_id>/<checkpoint_id>": a v1.Manifest.
//       Written PENDING (no ranks, no tensors) when opened; COMMITTED (the
//       full manifest) at commit; ABORTED (header and reason only) on abort.
//   kind "checkpoint_latest", key "<job_id>": a v1.CheckpointRef of the
//       newest COMMITTED checkpoint not marked unusable.
//   kind "checkpoint_unusable", key "<job_id>/<checkpoint_id>": the reason
//       a restore found that checkpoint corrupt (MarkUnusable). The
//       previous version's Coordinator wrote these records in the same
//       format, so its state files load unchanged.
// The commit is one atomic batch: the COMMITTED manifest, the moved
// "checkpoint_latest" pointer, and the deletion of the records of the
// committed checkpoints it pushes beyond keep_last. A crash at any point
// leaves either the old or the new state.
//
// Decisions where the proto is silent:
//   * Model, parallel config, dp, seed, the job's checkpoint directory,
//     keep_last and (optionally) the expected tensor names come from the
//     coordinator at Begin (it knows them from the job spec and the plan);
//     the data cursor comes from the reports (every rank must report the
//     same value).
//   * Restart: Create() loads every COMMITTED checkpoint and the latest
//     pointer; PENDING records (a save the previous coordinator never
//     finished) become ABORTED with reason "coordinator restarted while the
//     checkpoint was pending" and are rewritten so. ABORTED records are kept,
//     so a (generation, step) aborted before a restart stays aborted after it
//     and its id is never reused.
//   * An abort is applied in memory first and then written best effort: if
//     that write fails, the store still holds PENDING, which recovery turns
//     into ABORTED — the same outcome.
//   * A PENDING checkpoint of an older generation is aborted by the Begin of
//     a newer generation ("superseded by generation N"), in case the
//     coordinator did not call AbortPending when the old generation ended.
//   * An identical repeat of a report that was recorded returns the current
//     summary whatever the state (it is a retry after a lost answer); a new
//     report to a checkpoint that is not PENDING is FAILED_PRECONDITION. The
//     raw reports of a committed checkpoint are dropped once a newer one
//     commits or the coordinator restarts; a repeat is then still answered
//     with the summary when the manifest records the same files (path, size,
//     CRC-32C) for that rank, and gets FAILED_PRECONDITION ("already
//     committed") otherwise.
//   * Pieces outside their tensor or file are rejected at ReportShard with
//     INVALID_ARGUMENT (the rank may fix and re-report); gaps and overlaps
//     between ranks can only be seen at commit and abort the checkpoint with
//     a DATA_LOSS reason.
//   * Retention: after a commit, committed checkpoints beyond the newest
//     keep_last (by step) are removed from the registry and from the store in
//     the commit batch, and returned in ReportShardResult::expired so the
//     coordinator deletes their directories (crash-safe: tombstones and the
//     start-up clean-up of server/checkpoint_flow.h). The newest is always kept.
//     Directories of ABORTED checkpoints are deleted by the coordinator when
//     they abort and again at its start (server/checkpoint_flow.h,
//     checkpoint/checkpoint_files.h).
//   * Unusable marks (server/unusable_marks.h): the registry is their single
//     owner. A mark and the latest pointer it moves are one atomic batch;
//     marks are never deleted (also not when retention expires the
//     checkpoint: its id is never reused).
//   * AbortPending / Abort / Commit on a checkpoint whose commit is in flight
//     wait (for the duration of one store write) for its outcome; a commit
//     whose batch is durable stands: every rank reported it.
//
// Thread-safety: all methods are thread-safe. One mutex guards all state; it
// is never held across a StateStore call or the verify_files hook (those run
// in the OPENING / COMMITTING phases, which other callers wait out on a
// condition variable).
#ifndef SHARDLINE_SERVER_CHECKPOINT_REGISTRY_H_
#define SHARDLINE_SERVER_CHECKPOINT_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/geometry.h"
#include "common/clock.h"
#include "server/state_store.h"
#include "server/unusable_marks.h"
#include "shardline/v1/checkpoint.pb.h"
#include "shardline/v1/common.pb.h"

namespace shardline::server {

// StateStore kinds the registry owns.
inline constexpr absl::string_view kCheckpointKind = "checkpoint";
inline constexpr absl::string_view kCheckpointLatestKind = "checkpoint_latest";
inline constexpr absl::string_view kCheckpointUnusableKind = "checkpoint_unusable";

// What the coordinator knows when a rank calls BeginCheckpoint (after it
// checked the fence, that the caller holds a rank, that the job is RUNNING
// and that step <= train_steps).
struct CheckpointBeginParams {
  std::string job_id;       // non-empty
  uint64_t generation = 0;  // the caller's (current) generation, >= 1
  uint32_t world_size = 0;  // ranks that must report, >= 1
  uint64_t step = 0;        // optimizer steps completed
  // CheckpointConfig.directory (absolute); the checkpoint's files go to
  // <directory>/<checkpoint_id>.
  std::string directory;
  // CheckpointConfig.keep_last: keep the newest K committed; 0 keeps all.
  uint32_t keep_last = 0;
  // Recorded in the manifest.
  shardline::v1::ModelConfig model;
  shardline::v1::ParallelConfig parallel;
  uint32_t dp = 0;
  uint64_t seed = 0;
  // Names of every tensor the plan saves (checkpoint::CheckpointTensors;
  // server/checkpoint_flow.cc sets them at every Begin); when non-empty, a
  // commit whose reports lack one of them or hold another aborts with
  // DATA_LOSS. Empty: the names are not checked. Either way a commit with
  // no tensor at all aborts with DATA_LOSS, and every reported tensor must
  // be covered exactly once.
  std::vector<std::string> expected_tensors;
};

// One rank's ReportShard, after the coordinator checked its fence.
struct ShardReport {
  uint32_t rank = 0;                       // the caller's rank in `generation`
  shardline::v1::Coordinates coordinates;  // its coordinates (for the manifest)
  std::string worker_id;                   // fence.worker.worker_id
  // checkpoint_id, files, tensors, rng_state, data_cursor are used; the
  // fence is ignored; SavedPiece.rank is ignored (set to `rank`).
  shardline::v1::ReportShardRequest request;
};

// A committed checkpoint removed by retention: delete `directory`.
struct ExpiredCheckpoint {
  shardline::v1::CheckpointRef ref;
  std::string directory;
};

struct ReportShardResult {
  // The checkpoint after this report: PENDING, COMMITTED, or ABORTED (with
  // abort_reason) when the commit this report triggered failed.
  shardline::v1::CheckpointSummary checkpoint;
  // Set only in the one call whose report committed the checkpoint: the
  // durable manifest, for the coordinator to write next to the shards
  // (atomically) before moving LATEST.
  std::shared_ptr<const shardline::v1::Manifest> committed_manifest;
  // Set only in that call: committed checkpoints this commit pushed beyond
  // keep_last; already gone from the registry and the store.
  std::vector<ExpiredCheckpoint> expired;
};

struct CheckpointRegistryOptions {
  // Called at commit, without the registry's lock, with the complete
  // manifest (state still PENDING) before it is made durable; returns
  // DATA_LOSS (or any error) when a reported file is missing or has another
  // size. Unset: files are not checked here. The error aborts the checkpoint
  // and becomes its abort_reason.
  std::function<absl::Status(const shardline::v1::Manifest&)> verify_files;
};

// Coordinator-side state of every job's checkpoints. Lives as long as the
// coordinator process; created from the store on start (Create).
// Thread-safe (see the file comment).
class CheckpointRegistry final : public UnusableCheckpointMarks {
 public:
  // Loads every job's checkpoints and unusable marks from `store` (see
  // "Restart" above); a latest pointer that names a marked checkpoint (a
  // pointer write that failed after its mark) is moved to the newest usable
  // one and rewritten. `store` and `clock` are not owned and must outlive
  // the registry.
  // Errors:
  //   Unavailable: the store could not be read, or the rewrite of pending
  //     records as ABORTED failed (retry the start).
  //   DataLoss: a record does not parse, its key disagrees with its content,
  //     or "checkpoint_latest" names a checkpoint that is not COMMITTED.
  static absl::StatusOr<std::unique_ptr<CheckpointRegistry>> Create(
      StateStore* store, const Clock* clock, CheckpointRegistryOptions options = {});

  CheckpointRegistry(const CheckpointRegistry&) = delete;
  CheckpointRegistry& operator=(const CheckpointRegistry&) = delete;

  // Opens the checkpoint of (job, generation, step), or joins it: every
  // caller gets the same id and directory. The first call makes a PENDING
  // record durable before returning; concurrent callers wait for it.
  // Errors:
  //   InvalidArgument: job_id or directory empty, generation or world_size 0.
  //   FailedPrecondition: step <= the newest committed step (names both);
  //     another step's checkpoint is PENDING (names it; wait for it);
  //     this (generation, step) was already aborted (gives the reason; save a
  //     later step); it is already COMMITTED; world_size differs from the
  //     open checkpoint's; a PENDING checkpoint of a newer generation exists.
  //   Unavailable: the PENDING record could not be written; nothing is open.
  absl::StatusOr<shardline::v1::BeginCheckpointResponse> Begin(const CheckpointBeginParams& params)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records one rank's report; the report that completes ranks
  // 0..world_size-1 commits (see the file comment) and returns after the
  // commit is durable or the checkpoint aborted. Errors:
  //   InvalidArgument: (names the tensor / file and the field) a file path
  //     empty, absolute, containing "..", or repeated; a tensor name empty
  //     or repeated; dtype unspecified or unknown; global_shape overflowing
  //     uint64; a piece whose file is not in `files`, whose slice has the
  //     wrong number of dims or leaves global_shape, whose range is empty or
  //     leaves its slice, whose byte_length is not numel * dtype size, or
  //     whose bytes leave its file; dtype or global_shape disagreeing with
  //     another rank's report of the tensor; data_cursor disagreeing with
  //     other ranks; rng_state over 1 MiB.
  //   NotFound: no checkpoint request.checkpoint_id in the job.
  //   FailedPrecondition: the checkpoint belongs to another generation; rank
  //     >= its world_size; it is not PENDING (ABORTED: gives the reason;
  //     COMMITTED) and this is not an identical repeat.
  //   AlreadyExists: this rank already reported different content.
  // A failed commit is not an error: the result shows ABORTED and why
  // (DATA_LOSS reasons start with "DATA_LOSS:").
  absl::StatusOr<ReportShardResult> ReportShard(absl::string_view job_id, uint64_t generation,
                                                const ShardReport& report) ABSL_LOCKS_EXCLUDED(mu_);

  // CommitCheckpoint (admin): COMMITTED → returned unchanged; a commit in
  // flight → waits for it. Errors:
  //   NotFound: no such checkpoint.
  //   FailedPrecondition: ranks missing (lists them; the checkpoint is now
  //     ABORTED); already ABORTED (gives the reason).
  //   DataLoss: the commit's checks failed; the checkpoint is now ABORTED.
  absl::StatusOr<shardline::v1::CheckpointSummary> Commit(absl::string_view job_id,
                                                          absl::string_view checkpoint_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Aborts a PENDING checkpoint; an ABORTED one is returned unchanged.
  // Errors: NotFound: no such checkpoint. FailedPrecondition: COMMITTED
  // (also when a commit in flight succeeds first).
  absl::StatusOr<shardline::v1::CheckpointSummary> Abort(absl::string_view job_id,
                                                         absl::string_view checkpoint_id,
                                                         absl::string_view reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For the coordinator when a generation ends or the job stops: aborts the
  // job's PENDING checkpoint, if any, and returns it (ABORTED); nullopt when
  // none was pending, or when a commit in flight succeeded first. Never fails.
  std::optional<shardline::v1::CheckpointSummary> AbortPending(absl::string_view job_id,
                                                               absl::string_view reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ListCheckpoints: newest step first, then newest generation. page_size 0
  // means 50, above 1000 means 1000. An unknown job lists nothing. A
  // checkpoint marked unusable carries the mark's reason (unusable_reason).
  // Errors: InvalidArgument: page_token malformed or from a call with
  // another include_aborted.
  absl::StatusOr<shardline::v1::ListCheckpointsResponse> List(absl::string_view job_id,
                                                              bool include_aborted,
                                                              uint32_t page_size,
                                                              absl::string_view page_token) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // GetManifest: checkpoint_id empty means the newest COMMITTED. A PENDING
  // (or ABORTED) checkpoint's manifest holds the ranks that reported and
  // their tensors. `tensors` non-empty keeps only those (in manifest order).
  // unusable_reason is the mark's reason, or empty.
  // Errors: NotFound: no such checkpoint; empty id and nothing committed; a
  // name in `tensors` not in the checkpoint (names it).
  absl::StatusOr<shardline::v1::Manifest> GetManifest(
      absl::string_view job_id, absl::string_view checkpoint_id,
      const std::vector<std::string>& tensors = {}) const ABSL_LOCKS_EXCLUDED(mu_);

  // UnusableCheckpointMarks (server/unusable_marks.h): a restore found the
  // checkpoint corrupt (DATA_LOSS) and the coordinator fell back from it. It
  // stays COMMITTED, so its files can be inspected, but it is no longer the
  // job's latest: if it was, Latest() (and GetManifest with an empty id)
  // move to the newest committed checkpoint not marked, or to none; the mark
  // and that pointer are written in one batch. Begin then accepts any step
  // above the new latest (the job re-trains the lost steps and must be able
  // to save them). Retention expires marked checkpoints before usable ones.
  // Idempotent (the first reason stands); an unknown id is remembered.
  // Errors: InvalidArgument: job_id, checkpoint_id or reason empty;
  // Unavailable: the batch could not be written (memory has the mark and
  // the pointer; a restart without them restores neither).
  absl::Status MarkUnusable(absl::string_view job_id, absl::string_view checkpoint_id,
                            absl::string_view reason) override ABSL_LOCKS_EXCLUDED(mu_);

  // The reason of the mark on `checkpoint_id`, or nullopt.
  std::optional<std::string> UnusableReason(absl::string_view job_id,
                                            absl::string_view checkpoint_id) const override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every mark of the job: checkpoint id -> reason. Empty for an unknown job.
  std::map<std::string, std::string> UnusableCheckpoints(absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The newest COMMITTED checkpoint not marked unusable (Assignment.restore),
  // or nullopt.
  std::optional<shardline::v1::CheckpointRef> Latest(absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Committed checkpoints beyond the newest `keep_last` (0: none), oldest
  // first, without removing them; for a cleanup sweep after restart.
  std::vector<ExpiredCheckpoint> BeyondRetention(absl::string_view job_id, uint32_t keep_last) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Finished-job retention (Coordinator::FinishedJobsToPrune): forgets
  // every checkpoint record of `job_id` (entries, latest pointer, unusable
  // marks) in memory and in the store, in one batch. The checkpoint
  // directories and LATEST on disk are not touched. An unknown job is OK.
  // Errors: FailedPrecondition: a checkpoint of the job is OPENING or
  // COMMITTING (retry later); Unavailable: the store write failed (nothing
  // is forgotten).
  absl::Status ForgetJob(absl::string_view job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Deterministic id of (generation, step).
  static std::string CheckpointId(uint64_t generation, uint64_t step);
  // The (step, generation) of an id CheckpointId makes; nullopt for any
  // other name.
  static std::optional<std::pair<uint64_t, uint64_t>> ParseCheckpointId(absl::string_view id);

 private:
  enum class Phase { kOpening, kPending, kCommitting, kCommitted, kAborted };

  struct TensorMeta {
    shardline::v1::DType dtype;
    std::vector<uint64_t> global_shape;
    uint32_t first_rank;
  };

  struct Entry {
    Phase phase = Phase::kOpening;
    // Header fields always set (id, job, step, generation, directory, model,
    // parallel, dp, world_size, seed, create_time; state/commit_time/
    // abort_reason follow the phase). When COMMITTED: the full manifest.
    std::shared_ptr<const shardline::v1::Manifest> manifest;
    uint32_t keep_last = 0;
    std::vector<std::string> expected_tensors;
    // index = rank; set when that rank reported (this generation only).
    std::vector<std::optional<ShardReport>> reports;
    std::map<std::string, TensorMeta> tensor_meta;
    std::optional<uint64_t> data_cursor;
    uint64_t total_bytes = 0;
    uint32_t reported = 0;
    size_t pieces = 0;  // in `reports`, at most checkpoint::kMaxPiecesPerCheckpoint
  };

  struct JobCheckpoints {
    std::map<std::string, Entry> entries;  // by checkpoint_id
    std::string active_id;                 // OPENING/PENDING/COMMITTING one, or ""
    std::string latest_id;                 // newest COMMITTED not unusable, or ""
    std::map<std::string, std::string> unusable;  // MarkUnusable: id -> reason
    // The id of the newest (by step) COMMITTED entry not in `unusable`, or "".
    std::string NewestUsableCommitted() const;
  };

  CheckpointRegistry(StateStore* store, const Clock* clock, CheckpointRegistryOptions options)
      : store_(store), clock_(clock), options_(std::move(options)) {}

  // Waits (releasing mu_) until `id` of `job_id` is gone or neither OPENING
  // nor COMMITTING; returns it, or nullptr if gone.
  Entry* WaitSettledLocked(const std::string& job_id, const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(absl::string_view job_id, absl::string_view id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* FindLocked(absl::string_view job_id, absl::string_view id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a PENDING entry to ABORTED; returns the record to write.
  Mutation AbortLocked(JobCheckpoints& job, Entry& e, absl::string_view reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  shardline::v1::CheckpointSummary SummaryLocked(const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The manifest of a non-COMMITTED entry built from its reports.
  shardline::v1::Manifest BuildManifestLocked(const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the commit of an entry whose ranks all reported: cover checks,
  // verify hook and store write with mu_ released (the entry is COMMITTING
  // meanwhile). Fills `result` (summary always; manifest and expired on
  // success). Returns why the commit failed (the entry is then ABORTED).
  absl::Status CommitLocked(const std::string& job_id, const std::string& id,
                            ReportShardResult* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteBestEffort(const std::vector<Mutation>& mutations) ABSL_LOCKS_EXCLUDED(mu_);
  // The store record of `job`'s latest pointer (a delete when it has none).
  Mutation LatestPointerLocked(const std::string& job_id, const JobCheckpoints& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StateStore* const store_;   // Not owned.
  const Clock* const clock_;  // Not owned.
  const CheckpointRegistryOptions options_;

  mutable absl::Mutex mu_;
  // Signalled on every phase change out of OPENING / COMMITTING.
  absl::CondVar settled_;
  std::map<std::string, JobCheckpoints, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_CHECKPOINT_REGISTRY_H_

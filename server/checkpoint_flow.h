// The checkpoint commit workflow: what the coordinator does around the
// CheckpointRegistry's bookkeeping when checkpoints are begun, reported,
// committed, aborted and found corrupt — the business rules of
// CheckpointService, the checkpoint files on disk, and the notes to the
// Coordinator. No gRPC: server/rpc/checkpoint_service.h (and the JobService
// and WorkerService adapters for CreateJob and ReportError) authenticate,
// check fences and call this; the unit test drives it with a FakeClock, a
// memory store and a temp directory.
//
//   CheckpointFlow flow(&coordinator, registry.get(),
//                       [&](const std::vector<GenerationEnded>& ended) { server.PassOn(ended); });
//   flow.RecoverCheckpointFiles();                    // at start, before serving
//   auto begun = flow.Begin(fenced_worker, /*step=*/10);
//   auto summary = flow.ReportShard(fenced_worker, report);  // the last one commits
//
// Checkpoint files (checkpoint/checkpoint_files.h), under the job's
// checkpoint root <spec.checkpoint.directory>/<job_id> (JobCheckpointRoot):
//   * Commit order: the registry makes the manifest durable in the store
//     (and runs its verify_files hook, which server/main.cc sets to
//     VerifyShardFiles); then the committing ReportShard writes
//     <checkpoint dir>/manifest.json atomically, then moves <root>/LATEST
//     (only while the registry still names that checkpoint the newest), then
//     deletes the directories of the checkpoints retention expired — all
//     before it returns COMMITTED (WriteCommittedFiles).
//   * A failed file write does not undo the commit (the store decides;
//     GetManifest and Assignment.restore serve it): the failure is logged,
//     the sequence stops there — after a failed manifest.json LATEST stays
//     where it was and expired directories are kept (LATEST may name one);
//     after a failed LATEST the expired directories are kept — and the next
//     start repairs manifest.json and LATEST (RecoverCheckpointFiles).
//   * Every abort (Abort, a failed commit, Commit with ranks missing, a
//     generation ending or CancelJob: AbortPendingCheckpoint) deletes the
//     aborted checkpoint's directory. At start, before serving, the
//     directories of every ABORTED checkpoint are deleted (so a save that
//     was PENDING when the previous coordinator died leaves nothing) and
//     manifest.json / LATEST of each job's newest usable committed
//     checkpoint are rewritten when missing or behind. Two jobs never share
//     a root (it ends in the job id).
//   * Confinement: every read, write, rename and delete below
//     spec.checkpoint.directory — the job root, LATEST, manifest.json, the
//     checkpoint directories and the shard files the commit checks — is
//     resolved without following symlinks (checkpoint/checkpoint_files.h,
//     checkpoint/confined_dir.h): workers can write there, so a link one of
//     them plants (<dir>/<job> -> /victim, sub -> /etc) is refused and named
//     (a commit through it aborts), never followed.
//   * Retention is crash-safe: the commit batch forgets the expired
//     checkpoints in the store, then each directory is renamed to the
//     tombstone <root>/.deleting-<id> and deleted. A crash in between leaves
//     a directory the registry no longer knows, or a tombstone; the next
//     start removes, before serving (RemoveLeftovers): every tombstone,
//     every stray temp file of an atomic write (.LATEST.tmp-*,
//     <id>/.manifest.json.tmp-*: nothing writes while it runs), and every
//     orphan: a directory named like a checkpoint id (CheckpointRegistry::
//     ParseCheckpointId) that the registry has NO record of (in any state)
//     and whose (step, generation) is below the job's newest usable
//     committed checkpoint (Latest). That rule never deletes a checkpoint
//     the registry knows, nor one being written: every save has a durable
//     PENDING record before any rank learns its directory, and a new save's
//     step is always above Latest's (CheckpointRegistry::Begin). With no
//     usable committed checkpoint nothing is deleted as an orphan.
//   * A checkpoint a restore found corrupt (ReportError with DATA_LOSS
//     naming the restore point) is marked unusable in the registry by the
//     Coordinator's fallback (server/unusable_marks.h; the registry is the
//     marks' only owner and keeps them durably), and LATEST moves back to
//     the newest usable committed checkpoint at once, or is removed when
//     none is left. List and GetManifest carry the mark's reason.
//
// The Coordinator is told of every commit (NoteCheckpointCommitted: the
// next generation's restore point; a commit may grow the job or finish a
// drain, and the generations that ends are passed on at once) and every
// abort (NoteCheckpointAborted: the event log).
//
// Logging: one line per commit, abort, file repair or failed file step
// (common/log.h).
//
// Thread-safety: thread-safe. The file steps of all jobs are serialized by
// one mutex (two writers of LATEST would race); it is never held while
// calling the Coordinator or `pass_on`.
#ifndef SHARDLINE_SERVER_CHECKPOINT_FLOW_H_
#define SHARDLINE_SERVER_CHECKPOINT_FLOW_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::server {

class CheckpointFlow {
 public:
  // Receives generations that ended inside the flow (a commit that grew the
  // job or finished a drain; a ReportError), outside every lock; the server
  // passes them to the rendezvous and to AbortPendingCheckpoint
  // (CoordinatorServer::PassOn).
  using PassOnFn = std::function<void(const std::vector<GenerationEnded>&)>;

  // Not owned; both must outlive the flow. `pass_on` is required.
  CheckpointFlow(Coordinator* coordinator, CheckpointRegistry* registry, PassOnFn pass_on);
  CheckpointFlow(const CheckpointFlow&) = delete;
  CheckpointFlow& operator=(const CheckpointFlow&) = delete;

  // At start, before serving (see the file comment): deletes the
  // directories of every job's ABORTED checkpoints and repairs its
  // manifest.json and LATEST (RepairLatestFiles). Failures are logged.
  void RecoverCheckpointFiles();

  // JobService.CreateJob's checkpoint part: a spec that is invalid
  // (spec::ResolveJobSpec) creates nothing; an absolute
  // spec.checkpoint.directory is created before the job (a bad one would
  // fail every save); then Coordinator::CreateJob. Errors: InvalidArgument:
  // the spec (ResolveJobSpec's message), or the directory cannot be created
  // (names it and why); then Coordinator::CreateJob's.
  absl::StatusOr<v1::CreateJobResponse> CreateJob(const v1::CreateJobRequest& request);

  // CheckpointService.BeginCheckpoint for `caller` (a fence the Coordinator
  // accepted), at `step`. Errors, in this order:
  //   NotFound: the job is gone.
  //   InvalidArgument: step is beyond spec.training.train_steps.
  //   FailedPrecondition: the caller holds no rank in this generation; the
  //     job is not RUNNING; the job has no spec.checkpoint.directory; the
  //     job's plan is not of the caller's generation.
  //   then CheckpointRegistry::Begin's, with expected_tensors the plan's
  //   (checkpoint::CheckpointTensors): the commit needs exactly those.
  // An external job (spec.external): FailedPrecondition, NoPlanOfExternalJob.
  absl::StatusOr<v1::BeginCheckpointResponse> Begin(const FencedWorker& caller, uint64_t step);

  // CheckpointService.ReportShard for `caller`: records the report (the
  // caller's rank and coordinates from the fence and the job's tp and dp).
  // The report that commits writes the files and notes the commit before
  // returning (see the file comment); a commit that failed is noted as
  // aborted and its directory deleted. Returns the checkpoint after the
  // report (PENDING, COMMITTED, or ABORTED with abort_reason). Errors:
  //   FailedPrecondition: the caller holds no rank in this generation.
  //   NotFound: the job is gone.
  //   then CheckpointRegistry::ReportShard's.
  absl::StatusOr<v1::CheckpointSummary> ReportShard(const FencedWorker& caller,
                                                    const v1::ReportShardRequest& request);

  // CheckpointService.CommitCheckpoint (admin). A commit it completes is
  // noted; a checkpoint it aborted (ranks missing, the commit's checks
  // failed) is noted as aborted and its directory deleted. Errors:
  //   InvalidArgument: job_id empty. NotFound: no such job;
  //   then CheckpointRegistry::Commit's.
  absl::StatusOr<v1::CheckpointSummary> Commit(const std::string& job_id,
                                               const std::string& checkpoint_id);

  // CheckpointService.AbortCheckpoint, after the caller's rights and fence
  // were checked. `reason` empty: "aborted by request". A checkpoint this
  // call aborted is noted and its directory deleted. Errors:
  //   InvalidArgument: job_id empty. NotFound: no such job;
  //   then CheckpointRegistry::Abort's.
  absl::StatusOr<v1::CheckpointSummary> Abort(const std::string& job_id,
                                              const std::string& checkpoint_id,
                                              const std::string& reason);

  // CheckpointService.ListCheckpoints (with unusable_reason). Errors:
  //   InvalidArgument: job_id empty. NotFound: no such job;
  //   then CheckpointRegistry::List's.
  absl::StatusOr<v1::ListCheckpointsResponse> List(const v1::ListCheckpointsRequest& request);

  // CheckpointService.GetManifest (with unusable_reason). Errors:
  //   InvalidArgument: job_id empty. NotFound: no such job;
  //   then CheckpointRegistry::GetManifest's.
  absl::StatusOr<v1::Manifest> GetManifest(const v1::GetManifestRequest& request);

  // WorkerService.ReportError with the restore fallback wired: a DATA_LOSS
  // report is given the job's committed checkpoints and the registry as
  // the unusable marks' owner (Coordinator::ReportError); the report is
  // logged, the generations it ended are passed on, and after a DATA_LOSS
  // LATEST moves to the newest usable committed checkpoint
  // (RepairLatestFiles). Errors: Coordinator::ReportError's.
  absl::StatusOr<v1::ReportErrorResponse> ReportError(const v1::ReportErrorRequest& request);

  // A generation of `job_id` ended or the job was cancelled: aborts its
  // PENDING checkpoint, if any (CheckpointRegistry::AbortPending), notes it
  // and deletes its directory. Never fails.
  void AbortPendingCheckpoint(const std::string& job_id, const std::string& reason);

  // Makes <root>/LATEST name the registry's Latest() (the newest committed
  // checkpoint not marked unusable) with its manifest.json in place, or
  // removes LATEST when there is none: a reader of LATEST is never sent to
  // a checkpoint known to be corrupt, nor left behind the store. Failures
  // are logged. A job without a checkpoint directory: nothing.
  void RepairLatestFiles(const std::string& job_id);

  // After the registry made `manifest` durable: manifest.json, then LATEST,
  // then the `expired` directories, with the failure semantics of the file
  // comment. Failures are logged.
  void WriteCommittedFiles(const std::string& job_id, const v1::Manifest& manifest,
                           const std::vector<ExpiredCheckpoint>& expired);

  // The job's COMMITTED checkpoints (every page; marked ones included), for
  // the restore fallback.
  std::vector<v1::CheckpointRef> CommittedCheckpoints(const std::string& job_id) const;

  // The job's checkpoint root: <spec.checkpoint.directory>/<job_id>, so
  // that jobs sharing a directory (one spec file created twice) never
  // overwrite each other's checkpoints or LATEST; "" without a directory.
  static std::string JobCheckpointRoot(const v1::Job& job);

 private:
  // JobCheckpointRoot of the job, or "" when it is unknown.
  std::string CheckpointRoot(const std::string& job_id) const;
  // InvalidArgument for an empty job_id, NotFound for an unknown job.
  absl::Status RequireJob(const std::string& job_id) const;
  // The state of `checkpoint_id` in the registry; nullopt for none.
  std::optional<v1::CheckpointState> StateOf(const std::string& job_id,
                                             const std::string& checkpoint_id) const;
  // Logs and notes a checkpoint that aborted, and deletes its directory.
  void NoteAborted(const std::string& job_id, const v1::CheckpointSummary& summary,
                   const std::string& reason);
  // Tells the Coordinator of a commit (the new restore point; it may grow
  // the job or finish a drain: the generations that ends are passed on).
  void NoteCommitted(const std::string& job_id, const v1::CheckpointSummary& summary);
  // At start: CleanUpCheckpointRoot of `root` with the orphan rule of the
  // file comment; `known`: every checkpoint id the registry has a record
  // of. Logs what it removed.
  void RemoveLeftovers(const std::string& job_id, const std::string& root,
                       const std::set<std::string>& known);
  // Deletes the directory of an ABORTED checkpoint under `root` (nothing
  // when `root` or `directory` is empty or it does not exist).
  void RemoveAbortedDirectory(const std::string& job_id, const std::string& root,
                              const std::string& checkpoint_id, const std::string& directory);

  Coordinator* const coordinator_;
  CheckpointRegistry* const registry_;
  const PassOnFn pass_on_;
  // Serializes the file steps (LATEST writers race otherwise).
  absl::Mutex files_mu_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_CHECKPOINT_FLOW_H_

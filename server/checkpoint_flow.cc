#include "server/checkpoint_flow.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/checkpoint_files.h"
#include "checkpoint/geometry.h"
#include "common/log.h"
#include "common/text.h"
#include "server/all_jobs.h"
#include "spec/job_spec.h"

namespace shardline::server {
namespace {

v1::Coordinates CoordinatesOf(uint32_t rank, uint32_t tp, uint32_t dp) {
  tp = std::max<uint32_t>(tp, 1);
  dp = std::max<uint32_t>(dp, 1);
  v1::Coordinates c;
  c.set_tp_rank(rank % tp);
  c.set_dp_rank((rank / tp) % dp);
  c.set_pp_rank(rank / (tp * dp));
  return c;
}

void LogAborted(const std::string& job_id, const v1::CheckpointSummary& summary,
                const std::string& reason) {
  LogLine(absl::StrCat("checkpoint aborted job=", job_id, " generation=", summary.generation(),
                   " checkpoint=", summary.checkpoint_id(), " reason=\"", reason, "\""));
}

}  // namespace

CheckpointFlow::CheckpointFlow(Coordinator* coordinator, CheckpointRegistry* registry,
                               PassOnFn pass_on)
    : coordinator_(coordinator), registry_(registry), pass_on_(std::move(pass_on)) {}

std::string CheckpointFlow::JobCheckpointRoot(const v1::Job& job) {
  const std::string& dir = job.spec().checkpoint().directory();
  if (dir.empty()) return std::string();
  return absl::StrCat(absl::StripSuffix(dir, "/"), "/", job.job_id());
}

std::string CheckpointFlow::CheckpointRoot(const std::string& job_id) const {
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(job_id);
  return job.ok() ? JobCheckpointRoot(*job) : std::string();
}

absl::Status CheckpointFlow::RequireJob(const std::string& job_id) const {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id must be non-empty");
  return coordinator_->GetJob(job_id).status();
}

std::optional<v1::CheckpointState> CheckpointFlow::StateOf(
    const std::string& job_id, const std::string& checkpoint_id) const {
  if (checkpoint_id.empty()) return std::nullopt;
  absl::StatusOr<v1::Manifest> m = registry_->GetManifest(job_id, checkpoint_id, {});
  if (!m.ok()) return std::nullopt;
  return m->state();
}

// ---------------------------------------------------------------------------
// At start.

void CheckpointFlow::RecoverCheckpointFiles() {
  for (const v1::Job& job : AllJobs(*coordinator_)) {
    const std::string root = JobCheckpointRoot(job);
    if (root.empty()) continue;
    std::set<std::string> known;  // every checkpoint the registry has a record of
    std::string token;
    for (int pages = 0; pages < 1000; ++pages) {
      absl::StatusOr<v1::ListCheckpointsResponse> page =
          registry_->List(job.job_id(), /*include_aborted=*/true, 1000, token);
      if (!page.ok()) break;
      for (const v1::CheckpointSummary& c : page->checkpoints()) {
        known.insert(c.checkpoint_id());
        if (c.state() == v1::CHECKPOINT_STATE_ABORTED) {
          RemoveAbortedDirectory(job.job_id(), root, c.checkpoint_id(), c.directory());
        }
      }
      token = page->next_page_token();
      if (token.empty()) break;
    }
    RemoveLeftovers(job.job_id(), root, known);
    RepairLatestFiles(job.job_id());
  }
}

void CheckpointFlow::RemoveLeftovers(const std::string& job_id, const std::string& root,
                                     const std::set<std::string>& known) {
  // The orphan rule (see the file comment): a checkpoint id the registry
  // has no record of, older than its newest usable committed checkpoint.
  const std::optional<v1::CheckpointRef> latest = registry_->Latest(job_id);
  std::optional<std::pair<uint64_t, uint64_t>> newest;
  if (latest) newest = CheckpointRegistry::ParseCheckpointId(latest->checkpoint_id());
  auto is_orphan = [&](const std::string& name) {
    const std::optional<std::pair<uint64_t, uint64_t>> id =
        CheckpointRegistry::ParseCheckpointId(name);
    return id && newest && known.count(name) == 0 && *id < *newest;
  };
  absl::MutexLock lock(&files_mu_);
  absl::StatusOr<std::vector<std::string>> removed =
      checkpoint::CleanUpCheckpointRoot(root, is_orphan);
  if (!removed.ok()) {
    LogLine(absl::StrCat("checkpoint leftovers not removed job=", job_id, " root=", root,
                         " status=\"", removed.status().ToString(), "\""));
    return;
  }
  for (const std::string& name : *removed) {
    LogLine(absl::StrCat("checkpoint leftover removed job=", job_id, " path=", root, "/", name,
                         " (left by an interrupted coordinator)"));
  }
}

// ---------------------------------------------------------------------------
// JobService.CreateJob.

absl::StatusOr<v1::CreateJobResponse> CheckpointFlow::CreateJob(
    const v1::CreateJobRequest& request) {
  // A spec that is invalid anyway creates no directory (and a directory
  // with '..' is refused before anything is created).
  if (absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(request.spec()); !spec.ok()) {
    return spec.status();
  }
  // The checkpoint directory must be usable before any worker trains (a bad
  // one would fail every save); it is created now.
  if (const std::string& dir = request.spec().checkpoint().directory();
      !dir.empty() && dir.front() == '/') {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir)) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.checkpoint.directory='", AbbreviateValue(dir),
                       "' cannot be created by the coordinator: ",
                       ec ? ec.message() : "not a directory",
                       "; give a directory the coordinator and the workers can write"));
    }
  }
  return coordinator_->CreateJob(request);
}

// ---------------------------------------------------------------------------
// CheckpointService.

absl::StatusOr<v1::BeginCheckpointResponse> CheckpointFlow::Begin(const FencedWorker& caller,
                                                                  uint64_t step) {
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(caller.job_id);
  if (!job.ok()) return job.status();
  const v1::JobSpec& spec = job->spec();
  // An external workload saves by itself: there is no plan to check a save
  // against (job.proto ExternalWorkload).
  if (spec::IsExternalJob(spec)) return NoPlanOfExternalJob(caller.job_id);
  if (step > spec.training().train_steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step=", step, " is beyond spec.training.train_steps=", spec.training().train_steps()));
  }
  if (!caller.active) {
    return absl::FailedPreconditionError(
        "the caller holds no rank in this generation (a spare, or not yet assigned); only "
        "ranks save checkpoints");
  }
  if (job->phase() != v1::JOB_PHASE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", caller.job_id, "' is ", v1::JobPhase_Name(job->phase()),
                     ", not RUNNING; checkpoints are saved while running"));
  }
  if (spec.checkpoint().directory().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", caller.job_id, "' has no checkpoint directory (spec.checkpoint.directory)"));
  }
  // A commit needs exactly the tensors of this generation's plan, each
  // covered exactly once (CheckpointRegistry's commit checks).
  absl::StatusOr<v1::Plan> plan = coordinator_->GetPlan(caller.job_id);
  if (!plan.ok()) return plan.status();
  if (plan->generation() != caller.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", caller.job_id, "' runs the plan of generation ", plan->generation(),
        ", not the caller's generation ", caller.generation));
  }
  CheckpointBeginParams params;
  for (const checkpoint::PlannedTensor& t : checkpoint::CheckpointTensors(*plan)) {
    params.expected_tensors.push_back(t.name);
  }
  params.job_id = caller.job_id;
  params.generation = caller.generation;
  params.world_size = static_cast<uint32_t>(caller.world_size);
  params.step = step;
  params.directory = JobCheckpointRoot(*job);
  params.keep_last = spec.checkpoint().keep_last();
  params.model = spec.model();
  params.parallel = spec.parallel();
  params.dp = job->dp();
  params.seed = spec.training().seed();
  return registry_->Begin(params);
}

absl::StatusOr<v1::CheckpointSummary> CheckpointFlow::ReportShard(
    const FencedWorker& caller, const v1::ReportShardRequest& request) {
  if (!caller.active) {
    return absl::FailedPreconditionError(
        "the caller holds no rank in this generation; only ranks report shards");
  }
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(caller.job_id);
  if (!job.ok()) return job.status();
  ShardReport report;
  report.rank = static_cast<uint32_t>(caller.rank);
  report.coordinates = CoordinatesOf(report.rank, job->spec().parallel().tp(), job->dp());
  report.worker_id = caller.worker_id;
  report.request = request;
  absl::StatusOr<ReportShardResult> r =
      registry_->ReportShard(caller.job_id, caller.generation, report);
  if (!r.ok()) return r.status();
  const v1::CheckpointSummary& summary = r->checkpoint;
  if (r->committed_manifest != nullptr) {
    // Files before the answer: a rank told COMMITTED finds manifest.json and
    // LATEST in place.
    WriteCommittedFiles(caller.job_id, *r->committed_manifest, r->expired);
    NoteCommitted(caller.job_id, summary);
  } else if (summary.state() == v1::CHECKPOINT_STATE_ABORTED &&
             summary.reported_ranks() == summary.world_size()) {
    // The commit this report triggered failed.
    LogAborted(caller.job_id, summary, summary.abort_reason());
    coordinator_->NoteCheckpointAborted(caller.job_id, summary.checkpoint_id(), summary.step(),
                                        summary.abort_reason());
    RemoveAbortedDirectory(caller.job_id, CheckpointRoot(caller.job_id),
                           summary.checkpoint_id(), summary.directory());
  }
  return summary;
}

absl::StatusOr<v1::CheckpointSummary> CheckpointFlow::Commit(const std::string& job_id,
                                                             const std::string& checkpoint_id) {
  if (absl::Status st = RequireJob(job_id); !st.ok()) return st;
  const std::optional<v1::CheckpointState> before = StateOf(job_id, checkpoint_id);
  absl::StatusOr<v1::CheckpointSummary> r = registry_->Commit(job_id, checkpoint_id);
  if (!r.ok()) {
    const std::optional<v1::CheckpointState> after = StateOf(job_id, checkpoint_id);
    if (before != after && after == v1::CHECKPOINT_STATE_ABORTED) {
      absl::StatusOr<v1::Manifest> m = registry_->GetManifest(job_id, checkpoint_id);
      coordinator_->NoteCheckpointAborted(job_id, checkpoint_id, m.ok() ? m->step() : 0,
                                          std::string(r.status().message()));
      if (m.ok()) {
        RemoveAbortedDirectory(job_id, CheckpointRoot(job_id), checkpoint_id, m->directory());
      }
    }
    return r.status();
  }
  if (before != v1::CHECKPOINT_STATE_COMMITTED && r->state() == v1::CHECKPOINT_STATE_COMMITTED) {
    NoteCommitted(job_id, *r);
  }
  return r;
}

absl::StatusOr<v1::CheckpointSummary> CheckpointFlow::Abort(const std::string& job_id,
                                                            const std::string& checkpoint_id,
                                                            const std::string& reason_in) {
  if (absl::Status st = RequireJob(job_id); !st.ok()) return st;
  const std::optional<v1::CheckpointState> before = StateOf(job_id, checkpoint_id);
  const std::string reason = reason_in.empty() ? std::string("aborted by request") : reason_in;
  absl::StatusOr<v1::CheckpointSummary> r = registry_->Abort(job_id, checkpoint_id, reason);
  if (!r.ok()) return r.status();
  if (before != v1::CHECKPOINT_STATE_ABORTED && r->state() == v1::CHECKPOINT_STATE_ABORTED) {
    LogAborted(job_id, *r, reason);
    coordinator_->NoteCheckpointAborted(job_id, r->checkpoint_id(), r->step(), reason);
    RemoveAbortedDirectory(job_id, CheckpointRoot(job_id), r->checkpoint_id(), r->directory());
  }
  return r;
}

absl::StatusOr<v1::ListCheckpointsResponse> CheckpointFlow::List(
    const v1::ListCheckpointsRequest& request) {
  if (absl::Status st = RequireJob(request.job_id()); !st.ok()) return st;
  return registry_->List(request.job_id(), request.include_aborted(), request.page_size(),
                         request.page_token());
}

absl::StatusOr<v1::Manifest> CheckpointFlow::GetManifest(const v1::GetManifestRequest& request) {
  if (absl::Status st = RequireJob(request.job_id()); !st.ok()) return st;
  const std::vector<std::string> tensors(request.tensors().begin(), request.tensors().end());
  return registry_->GetManifest(request.job_id(), request.checkpoint_id(), tensors);
}

// ---------------------------------------------------------------------------
// WorkerService.ReportError and generation ends.

absl::StatusOr<v1::ReportErrorResponse> CheckpointFlow::ReportError(
    const v1::ReportErrorRequest& request) {
  const v1::Fence& fence = request.fence();
  const std::string& job_id = fence.worker().job_id();
  // A DataLoss (or another code that can say a checkpoint is unusable,
  // UnusableCheckpointCode) may be an unusable restore point: the
  // coordinator then falls back to an older committed checkpoint and marks
  // that one in the registry (Coordinator::ReportError).
  const bool data_loss = UnusableCheckpointCode(static_cast<absl::StatusCode>(request.code()));
  std::vector<v1::CheckpointRef> committed;
  if (data_loss) committed = CommittedCheckpoints(job_id);
  std::vector<GenerationEnded> ended;
  absl::StatusOr<v1::ReportErrorResponse> r =
      coordinator_->ReportError(request, &ended, committed, registry_);
  if (r.ok()) {
    LogLine(absl::StrCat("error reported job=", job_id, " worker=", fence.worker().worker_id(),
                     " incarnation=", fence.worker().incarnation(),
                     " generation=", fence.generation(), " code=", request.code(),
                     " operation=\"", request.operation(), "\" message=\"", request.message(),
                     "\""));
  }
  pass_on_(ended);
  if (r.ok() && data_loss) RepairLatestFiles(job_id);
  return r;
}

void CheckpointFlow::AbortPendingCheckpoint(const std::string& job_id,
                                            const std::string& reason) {
  std::optional<v1::CheckpointSummary> aborted = registry_->AbortPending(job_id, reason);
  if (!aborted) return;
  LogAborted(job_id, *aborted, reason);
  coordinator_->NoteCheckpointAborted(job_id, aborted->checkpoint_id(), aborted->step(), reason);
  RemoveAbortedDirectory(job_id, CheckpointRoot(job_id), aborted->checkpoint_id(),
                         aborted->directory());
}

std::vector<v1::CheckpointRef> CheckpointFlow::CommittedCheckpoints(
    const std::string& job_id) const {
  std::vector<v1::CheckpointRef> committed;
  std::string token;
  for (int pages = 0; pages < 1000; ++pages) {
    absl::StatusOr<v1::ListCheckpointsResponse> page =
        registry_->List(job_id, /*include_aborted=*/false, 1000, token);
    if (!page.ok()) break;
    for (const v1::CheckpointSummary& c : page->checkpoints()) {
      if (c.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
      v1::CheckpointRef ref;
      ref.set_checkpoint_id(c.checkpoint_id());
      ref.set_step(c.step());
      committed.push_back(std::move(ref));
    }
    token = page->next_page_token();
    if (token.empty()) break;
  }
  return committed;
}

void CheckpointFlow::NoteCommitted(const std::string& job_id,
                                   const v1::CheckpointSummary& summary) {
  v1::CheckpointRef ref;
  ref.set_checkpoint_id(summary.checkpoint_id());
  ref.set_step(summary.step());
  LogLine(absl::StrCat("checkpoint committed job=", job_id, " generation=", summary.generation(),
                   " checkpoint=", summary.checkpoint_id(), " step=", summary.step(),
                   " bytes=", summary.total_bytes()));
  // A commit may grow the job or finish a drain
  // (Coordinator::NoteCheckpointCommitted): the generation it ends is passed
  // on at once.
  std::vector<GenerationEnded> ended;
  absl::Status s =
      coordinator_->NoteCheckpointCommitted(job_id, ref, summary.total_bytes(), &ended, registry_);
  if (!s.ok()) {
    LogLine(absl::StrCat("note checkpoint committed failed job=", job_id, " status=\"",
                     s.ToString(), "\""));
  }
  pass_on_(ended);
}

// ---------------------------------------------------------------------------
// The file steps (checkpoint/checkpoint_files.h).

void CheckpointFlow::RepairLatestFiles(const std::string& job_id) {
  const std::string root = CheckpointRoot(job_id);
  if (root.empty()) return;
  std::optional<v1::CheckpointRef> latest = registry_->Latest(job_id);
  absl::StatusOr<std::string> on_disk = checkpoint::ReadLatestFile(root);
  if (!latest) {
    if (!on_disk.ok()) return;
    absl::MutexLock lock(&files_mu_);
    const absl::Status removed = checkpoint::RemoveLatestFile(root);
    LogLine(absl::StrCat("checkpoint LATEST removed job=", job_id, " (it named ", *on_disk,
                     "; no committed checkpoint is usable)",
                     removed.ok() ? std::string()
                                  : absl::StrCat(" status=\"", removed.ToString(), "\"")));
    return;
  }
  absl::StatusOr<v1::Manifest> manifest = registry_->GetManifest(job_id, latest->checkpoint_id());
  if (!manifest.ok()) return;
  const bool latest_right = on_disk.ok() && *on_disk == latest->checkpoint_id();
  if (latest_right && checkpoint::ReadManifestFile(root, manifest->directory()).ok()) return;
  LogLine(latest_right
          ? absl::StrCat("checkpoint files repaired job=", job_id, " checkpoint=",
                         latest->checkpoint_id(), " (manifest.json was missing)")
          : absl::StrCat("checkpoint LATEST moved job=", job_id, " checkpoint=",
                         latest->checkpoint_id(), " (it named ",
                         on_disk.ok() ? *on_disk : std::string("nothing"),
                         "; the newest committed checkpoint not marked unusable)"));
  WriteCommittedFiles(job_id, *manifest, {});
}

void CheckpointFlow::WriteCommittedFiles(const std::string& job_id, const v1::Manifest& manifest,
                                         const std::vector<ExpiredCheckpoint>& expired) {
  const std::string root = CheckpointRoot(job_id);
  const std::string& id = manifest.checkpoint_id();
  absl::MutexLock lock(&files_mu_);
  absl::Status s = checkpoint::WriteManifestFile(root, manifest);
  if (!s.ok()) {
    LogLine(absl::StrCat("checkpoint manifest.json not written job=", job_id, " checkpoint=", id,
                     " status=\"", s.ToString(),
                     "\" (the checkpoint is committed; LATEST not moved)"));
    return;
  }
  std::optional<v1::CheckpointRef> latest = registry_->Latest(job_id);
  if (!latest || latest->checkpoint_id() != id) {
    LogLine(absl::StrCat("checkpoint LATEST not moved job=", job_id, " checkpoint=", id,
                     " (no longer the newest committed)"));
  } else if (s = checkpoint::WriteLatestFile(root, id); !s.ok()) {
    LogLine(absl::StrCat("checkpoint LATEST not moved job=", job_id, " checkpoint=", id,
                     " status=\"", s.ToString(), "\" (the checkpoint is committed)"));
    return;
  }
  for (const ExpiredCheckpoint& x : expired) {
    absl::Status removed = checkpoint::RemoveCheckpointDirectory(root, x.directory);
    LogLine(absl::StrCat("checkpoint expired job=", job_id, " checkpoint=", x.ref.checkpoint_id(),
                     " directory=", x.directory,
                     removed.ok() ? std::string(" (deleted)")
                                  : absl::StrCat(" status=\"", removed.ToString(),
                                                 "\" (not deleted; delete it by hand)")));
  }
}

// Nothing of a dead attempt lingers (case C10). A rank still writing may
// re-create the directory; the next start deletes it again, and its id is
// never reused anyway.
void CheckpointFlow::RemoveAbortedDirectory(const std::string& job_id, const std::string& root,
                                            const std::string& checkpoint_id,
                                            const std::string& directory) {
  if (root.empty() || directory.empty()) return;
  absl::MutexLock lock(&files_mu_);
  bool existed = false;
  absl::Status removed = checkpoint::RemoveCheckpointDirectory(root, directory, &existed);
  if (removed.ok() && !existed) return;  // nothing written, or already gone
  LogLine(absl::StrCat("checkpoint directory of aborted checkpoint job=", job_id,
                   " checkpoint=", checkpoint_id, " directory=", directory,
                   removed.ok() ? std::string(" (deleted)")
                                : absl::StrCat(" status=\"", removed.ToString(),
                                               "\" (not deleted)")));
}

}  // namespace shardline::server

// Coordinator: failure detection and policy. A member is lost when its
// session stream breaks (CloseSession), when it misses heartbeats (Tick) or
// when a peer reports it (ReportError); a worker whose own error reports
// keep ending generations is excluded (kMaxConsecutiveErrorGenerations).
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "server/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/coordinator_records.h"
#include "server/progress_monitor.h"
#include "spec/job_spec.h"

namespace shardline::server {

void Coordinator::LoseMemberLocked(JobRecord& job, MemberRecord& m, v1::LossReason reason,
                                   const std::string& detail,
                                   std::vector<GenerationEnded>* ended) {
  const v1::MemberState was = m.member.state();
  if (!IsLive(was)) return;
  std::optional<uint32_t> rank;
  if (m.member.has_rank()) rank = m.member.rank();
  job.UncountSpare(was);
  m.member.set_state(v1::MEMBER_STATE_LOST);
  m.member.set_loss_reason(reason);
  m.member.set_detail(detail);
  m.member.clear_rank();
  m.member.clear_progress();
  // If the process is still there (a SIGSTOP'd worker keeps its TCP stream),
  // it learns on waking that it must re-join; a hung one, excluded, that it
  // must exit.
  v1::SessionMessage msg;
  if (reason == v1::LOSS_REASON_HUNG) {
    *msg.mutable_directive() = Stop(job.job.phase(), absl::StrCat("excluded: ", detail));
  } else {
    *msg.mutable_directive() =
        Restart(job.job.generation() + (was == v1::MEMBER_STATE_ACTIVE ? 1 : 0),
                absl::StrCat("this worker was declared lost: ", detail));
  }
  m.outbox.Push(std::move(msg));

  v1::JobEvent e;
  v1::WorkerLost* lost = e.mutable_worker_lost();
  lost->set_worker_id(m.member.worker_id());
  lost->set_incarnation(m.member.incarnation());
  if (rank.has_value()) lost->set_rank(*rank);
  lost->set_reason(reason);
  lost->set_detail(detail);
  EmitLocked(job, std::move(e));
  LogLine(absl::StrFormat("job %s generation %d: worker %s%s lost: %s",
               job.job.job_id(), job.job.generation(),
               m.member.worker_id(),
               rank.has_value() ? absl::StrCat(" (rank ", *rank, ")") : "",
               detail));

  if (was == v1::MEMBER_STATE_ACTIVE && job.job.phase() == v1::JOB_PHASE_RUNNING) {
    EndGenerationLocked(job,
                        reason == v1::LOSS_REASON_HUNG ? v1::FORMATION_REASON_HANG
                        : reason == v1::LOSS_REASON_ERROR_REPORTED ||
                                reason == v1::LOSS_REASON_REPEATED_ERRORS
                            ? v1::FORMATION_REASON_ERROR_REPORTED
                            : v1::FORMATION_REASON_WORKER_LOST,
                        absl::StrCat("rank ", rank.value_or(0), " (", m.member.worker_id(),
                                     ") lost: ", detail),
                        ended);
  } else {
    PersistLocked(job, {&m}).IgnoreError();
  }
}

void Coordinator::ExcludeMemberLocked(JobRecord& job, MemberRecord& m,
                                      std::vector<GenerationEnded>* ended) {
  const std::string worker_id = m.member.worker_id();
  const std::string detail = absl::StrCat(
      "excluded: its own error reports ended ", m.error_streak,
      " consecutive generations with no success in between; last: ", m.last_error);
  LoseMemberLocked(job, m, v1::LOSS_REASON_REPEATED_ERRORS, detail, ended);
  // Would the others still form a generation? Survivors are FENCED now and
  // re-join; JOINING and SPARE members count too.
  int others = 0;
  for (const auto& [id, other] : job.members) {
    if (id != worker_id && IsLive(other.member.state())) ++others;
  }
  if (!spec::ChooseWorldSize(job.job.spec(), others).has_value()) {
    SetPhaseLocked(job, v1::JOB_PHASE_FAILED,
                   absl::StrCat("worker '", worker_id, "' was ", detail, "; the other ", others,
                                " workers are fewer than the job needs (min_workers=",
                                job.job.spec().elastic().min_workers(),
                                spec::IsExternalJob(job.job.spec())
                                    ? ")"
                                    : ", tp*pp and a dp dividing the global batch)"));
    StopAllLocked(job);
    PersistAllMembersLocked(job).IgnoreError();
  }
}

std::vector<GenerationEnded> Coordinator::CloseSession(const v1::WorkerIdentity& w,
                                                       uint64_t session_id) {
  std::vector<GenerationEnded> ended;
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return ended;
  auto it = job->members.find(w.worker_id());
  if (it == job->members.end()) return ended;
  MemberRecord& m = it->second;
  // A late close of an older session or incarnation changes nothing.
  if (m.member.incarnation() != w.incarnation() || !m.outbox.IsCurrent(session_id)) {
    return ended;
  }
  m.outbox.End();
  if (!IsTerminal(job->job.phase())) {
    LoseMemberLocked(*job, m, v1::LOSS_REASON_STREAM_BROKEN, "its session stream broke", &ended);
    MaybeFormLocked(*job, &ended);
  }
  return ended;
}

absl::StatusOr<v1::ReportErrorResponse> Coordinator::ReportError(
    const v1::ReportErrorRequest& request, std::vector<GenerationEnded>* ended,
    const std::vector<v1::CheckpointRef>& committed, UnusableCheckpointMarks* marks) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = nullptr;
  if (std::optional<v1::Directive> stop = ExcludedStopLocked(request.fence()); stop.has_value()) {
    v1::ReportErrorResponse response;
    *response.mutable_directive() = *std::move(stop);
    return response;
  }
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(request.fence(), &job);
  if (!m.ok()) return m.status();
  if (request.code() <= 0 || request.code() > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "code=", request.code(), " is not a failure; give a canonical status code in 1..16"));
  }
  if ((*m)->member.state() != v1::MEMBER_STATE_ACTIVE) {
    return absl::FailedPreconditionError(
        "only a rank of the current generation reports errors; a spare or joining worker has "
        "no communicators to fail");
  }
  if (request.has_peer_rank() && request.peer_rank() >= job->job.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("peer_rank=", request.peer_rank(),
                                                   " is not a rank; world_size is ",
                                                   job->job.world_size()));
  }
  const std::string reporter = (*m)->member.worker_id();
  std::string what = absl::StrCat(
      "rank ", (*m)->member.has_rank() ? absl::StrCat((*m)->member.rank()) : "?", " (", reporter,
      ") reported ", absl::StatusCodeToString(static_cast<absl::StatusCode>(request.code())),
      request.operation().empty() ? "" : absl::StrCat(" in ", request.operation()), ": ",
      request.message());
  // The report ends the generation: name the ranks the others waited for.
  // Those frozen whole (no heartbeat either) are lost: the next generation
  // forms without waiting for them (they may re-join once they run again).
  // Those whose heartbeats go on while their training thread is behind are
  // hung (a collective_timeout shorter than progress_timeout ends the wait
  // first): evicted as a stall would be, unless hang_policy is REPORT, or
  // they would re-join and hold up every generation after this one too.
  std::vector<MemberRecord*> frozen, stuck;
  if (job->job.phase() == v1::JOB_PHASE_RUNNING &&
      job->job.generation() == request.fence().generation()) {
    what += NameHoldersUpLocked(*job, clock_->Now(), &frozen, &stuck);
  }
  for (MemberRecord* culprit : frozen) {
    if (culprit->member.state() == v1::MEMBER_STATE_ACTIVE && culprit != *m) {
      LoseMemberLocked(*job, *culprit, v1::LOSS_REASON_ERROR_REPORTED,
                       absl::StrCat("held up the job and sends no heartbeats: ", what), ended);
    }
  }
  for (MemberRecord* culprit : stuck) {
    if (culprit->member.state() == v1::MEMBER_STATE_ACTIVE && culprit != *m) {
      LoseMemberLocked(*job, *culprit, v1::LOSS_REASON_HUNG,
                       absl::StrCat("held up the job (its heartbeats go on, its training does "
                                    "not): ", what),
                       ended);
    }
  }
  if (request.has_peer_rank()) {
    // Declare the peer lost only if it also looks dead from here.
    const absl::Duration grace =
        2 * FromProto(job->job.spec().elastic().heartbeat_interval());
    for (auto& [id, peer] : job->members) {
      if (peer.member.state() == v1::MEMBER_STATE_ACTIVE && peer.member.has_rank() &&
          peer.member.rank() == request.peer_rank() && id != reporter &&
          (!peer.outbox.is_open() || clock_->Now() - peer.last_heartbeat > grace)) {
        LoseMemberLocked(*job, peer, v1::LOSS_REASON_ERROR_REPORTED, what, ended);
        break;
      }
    }
  }
  if (job->job.phase() == v1::JOB_PHASE_RUNNING &&
      job->job.generation() == request.fence().generation()) {
    MemberRecord& reporter_record = **m;
    const std::string& restoring = job->job.last_checkpoint().checkpoint_id();
    if (RestoreFailureMarksUnusable(static_cast<absl::StatusCode>(request.code()),
                                    request.message(), request.operation(), restoring)) {
      // The restore point is corrupt, not this worker: no error streak.
      FallBackFromRestorePointLocked(*job, what, committed, marks, ended);
      MaybeFormLocked(*job, ended);
      v1::ReportErrorResponse response;
      if (IsTerminal(job->job.phase())) {
        *response.mutable_directive() = Stop(job->job.phase(), job->job.phase_reason());
      } else {
        *response.mutable_directive() = Restart(job->job.generation(), job->job.phase_reason());
      }
      return response;
    }
    ++reporter_record.error_streak;
    reporter_record.last_error = what;
    if (reporter_record.error_streak >= kMaxConsecutiveErrorGenerations) {
      ExcludeMemberLocked(*job, reporter_record, ended);
    } else {
      EndGenerationLocked(*job, v1::FORMATION_REASON_ERROR_REPORTED, what, ended);
    }
  }
  MaybeFormLocked(*job, ended);
  v1::ReportErrorResponse response;
  const v1::Member& reporter_member = (*m)->member;
  if (IsTerminal(job->job.phase())) {
    *response.mutable_directive() = Stop(job->job.phase(), job->job.phase_reason());
  } else if (reporter_member.state() == v1::MEMBER_STATE_LOST &&
             reporter_member.loss_reason() == v1::LOSS_REASON_REPEATED_ERRORS) {
    // Excluded: this process must not re-join.
    *response.mutable_directive() = Stop(job->job.phase(), reporter_member.detail());
  } else {
    *response.mutable_directive() = Restart(job->job.generation(), what);
  }
  return response;
}

std::vector<GenerationEnded> Coordinator::Tick() {
  std::vector<GenerationEnded> ended;
  absl::MutexLock lock(&mu_);
  ended.swap(pending_ended_);
  const absl::Time now = clock_->Now();
  for (auto& [id, job] : jobs_) {
    if (IsTerminal(job->job.phase())) continue;
    const absl::Duration timeout = FromProto(job->job.spec().elastic().heartbeat_timeout());
    // No live member's timeout can have passed before next_timeout_scan
    // (JobRecord): at 100k members a scan every tick held the lock for
    // milliseconds that heartbeats waited on.
    const bool scan = now >= job->next_timeout_scan;
    if (scan) job->next_timeout_scan = absl::InfiniteFuture();
    for (auto& [worker_id, m] : job->members) {
      if (!scan) break;
      if (IsLive(m.member.state()) && now - m.last_heartbeat <= timeout) {
        job->next_timeout_scan = std::min(job->next_timeout_scan, m.last_heartbeat + timeout);
      }
      if (IsLive(m.member.state()) && now - m.last_heartbeat > timeout) {
        // What it said it was doing (a progress report), for the others'
        // sake: a rank stopped in compute holds up every collective.
        const std::string doing =
            m.member.has_progress()
                ? absl::StrCat("; its last report: ", DescribeActivity(&m.member.progress()))
                : "";
        LoseMemberLocked(*job, m, v1::LOSS_REASON_HEARTBEAT_TIMEOUT,
                         absl::StrCat("no heartbeat for ",
                                      absl::FormatDuration(absl::Trunc(
                                          now - m.last_heartbeat, absl::Milliseconds(1))),
                                      " (heartbeat_timeout ", absl::FormatDuration(timeout), ")",
                                      doing),
                         &ended);
      }
    }
    DetectHangLocked(*job, now, &ended);
    UpdateStragglersLocked(*job);
    MaybeFormLocked(*job, &ended);
  }
  return ended;
}

}  // namespace shardline::server

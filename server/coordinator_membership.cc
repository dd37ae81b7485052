// Coordinator: joining, leaving and draining (member-state transitions a
// worker or an operator asks for).
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
#include "absl/time/time.h"
#include "common/text.h"
#include "server/coordinator_records.h"
#include "server/coordinator_validation.h"
#include "spec/job_spec.h"

namespace shardline::server {

absl::StatusOr<v1::JoinJobResponse> Coordinator::JoinJob(const v1::JoinJobRequest& request,
                                                         JoinedBy by) {
  if (absl::Status s = ValidIdentity(request.worker(), "worker"); !s.ok()) return s;
  const std::string device = request.device().empty() ? "cpu" : request.device();
  absl::StatusOr<v1::Backend> backend = ResolveBackend(device, request.backend());
  if (!backend.ok()) return backend.status();
  const v1::WorkerIdentity& w = request.worker();

  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", w.job_id(), "'"));
  if (IsTerminal(job->job.phase())) {
    return absl::FailedPreconditionError(absl::StrCat("job '", w.job_id(), "' is ",
                                                      PhaseName(job->job.phase()), ": ",
                                                      job->job.phase_reason()));
  }
  if (job->live_backend != *backend) {  // else known: every live member uses *backend
    for (const auto& [id, other] : job->members) {
      if (id != w.worker_id() && IsLive(other.member.state()) &&
          other.member.backend() != *backend) {
        return absl::FailedPreconditionError(absl::StrCat(
            "backend ", v1::Backend_Name(*backend), " differs from worker '", id, "' (",
            v1::Backend_Name(other.member.backend()),
            "); every worker of a job uses one backend"));
      }
    }
  }
  const absl::Time now = clock_->Now();
  std::vector<GenerationEnded> ended;
  if (job->members.size() >= kMaxMembersPerJob && !job->members.count(w.worker_id())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", w.job_id(), "' already has ", kMaxMembersPerJob, " worker_ids"));
  }
  auto [it, inserted] = job->members.try_emplace(w.worker_id());
  MemberRecord& m = it->second;
  bool rejoined = !inserted;
  // Counted in job->joining_count already (a repeated join, below).
  const bool was_joining = !inserted && m.member.state() == v1::MEMBER_STATE_JOINING &&
                           m.member.generation() == job->job.generation();
  if (by == JoinedBy::kJobToken && !inserted && m.member.incarnation() == w.incarnation() &&
      !m.token_hash.empty()) {
    // Anyone with the job token sees incarnations in ListMembers: acting as
    // one that holds a member token is that member's own business. (One
    // without a token, joined by the admin or whose join was not recorded,
    // gets one below: the job token may replace it anyway.)
    return absl::PermissionDeniedError(absl::StrCat(
        "worker '", w.worker_id(), "' (incarnation ", w.incarnation(), ") already joined job '",
        w.job_id(), "'; re-join with this incarnation's member token (the member_token its "
        "first JoinJob returned), or start a new process (a new incarnation) with the job "
        "token"));
  }
  const bool new_incarnation = inserted || m.member.incarnation() != w.incarnation();
  if (!inserted && m.member.incarnation() == w.incarnation() &&
      m.member.state() == v1::MEMBER_STATE_LOST &&
      (m.member.loss_reason() == v1::LOSS_REASON_REPEATED_ERRORS ||
       m.member.loss_reason() == v1::LOSS_REASON_HUNG)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", w.worker_id(), "' (incarnation ", w.incarnation(),
        ") is excluded from job '", w.job_id(), "': ", m.member.detail(),
        ". Fix the cause and start a new process; it may join again"));
  }
  if (!inserted && m.member.incarnation() == w.incarnation() &&
      m.member.state() == v1::MEMBER_STATE_LEFT &&
      absl::StartsWith(m.member.detail(), "drained: ")) {
    // A drained process that missed its STOP must not come back in.
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", w.worker_id(), "' (incarnation ", w.incarnation(), ") was ",
        m.member.detail(), "; start a new process to join job '", w.job_id(), "' again"));
  }
  if (!inserted && m.member.incarnation() == w.incarnation()) {
    const v1::MemberState s = m.member.state();
    if ((s == v1::MEMBER_STATE_JOINING || s == v1::MEMBER_STATE_ACTIVE ||
         s == v1::MEMBER_STATE_SPARE) &&
        m.member.generation() == job->job.generation()) {
      m.compact_groups = request.compact_groups();
      // A repeated join of the current generation: nothing changes, except
      // that a holder of the job token whose earlier join was not recorded
      // (no member token yet) gets its member token now.
      v1::JoinJobResponse response;
      if (by == JoinedBy::kJobToken && creds_ != nullptr && creds_->enabled() &&
          m.token_hash.empty()) {
        const std::string token = NewSecret();
        m.token_hash = Sha256Hex(token);
        absl::Status st = PersistLocked(
            *job, {&m},
            {Mutation::Put(kMemberTokenKind, absl::StrCat(w.job_id(), "/", w.worker_id()),
                           absl::StrCat(w.incarnation(), " ", m.token_hash))});
        if (!st.ok()) {
          m.token_hash.clear();
          return absl::UnavailableError(
              absl::StrCat("join not recorded, state store: ", st.message()));
        }
        creds_->SetMemberToken({w.job_id(), w.worker_id(), w.incarnation()}, m.token_hash);
        response.set_member_token(token);
      }
      response.set_generation(job->job.generation());
      response.set_state(s);
      *response.mutable_spec() = job->job.spec();
      response.set_phase(job->job.phase());
      return response;
    }
  } else if (!inserted && m.retired_incarnations.count(w.incarnation()) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incarnation ", w.incarnation(), " of worker '", w.worker_id(),
        "' was replaced by a newer process (incarnation ", m.member.incarnation(),
        "); this process must exit. Two processes with one --worker-id? Give each its own"));
  } else if (!inserted) {
    // A new process for this slot replaces the old one, which is fenced off.
    m.retired_incarnations.insert(m.member.incarnation());
    if (IsLive(m.member.state())) {
      LoseMemberLocked(*job, m, v1::LOSS_REASON_STREAM_BROKEN,
                       absl::StrCat("replaced by a new process (incarnation ", w.incarnation(), ")"),
                       &ended);
    }
    m.outbox.End();
    m.previous_rank = -1;
    m.error_streak = 0;
    m.last_error.clear();
    // A drain applied to the process it was asked of: a new process of the
    // slot (a supervisor's restart) joins normally.
    m.member.clear_drain_reason();
    m.member.clear_drain_after_step();
    m.member.clear_loss_reason();
    rejoined = false;
  }
  if (inserted || m.member.incarnation() != w.incarnation()) {
    *m.member.mutable_join_time() = ToProto(now);
  }
  m.member.set_worker_id(w.worker_id());
  m.member.set_incarnation(w.incarnation());
  m.member.set_host(request.host());
  m.compact_groups = request.compact_groups();
  m.member.set_device(device);
  m.member.set_backend(*backend);
  m.member.clear_rank();
  m.member.set_detail("");
  m.member.set_generation(job->job.generation());
  m.last_heartbeat = now;  // a fresh heartbeat clock
  // It is live from now on: its timeout may fall before the next scan Tick
  // planned when it was not (JobRecord::next_timeout_scan).
  job->next_timeout_scan =
      std::min(job->next_timeout_scan,
               now + FromProto(job->job.spec().elastic().heartbeat_timeout()));
  const v1::ElasticPolicy& elastic = job->job.spec().elastic();
  if (job->job.phase() == v1::JOB_PHASE_RUNNING && spec::IsExternalJob(job->job.spec()) &&
      job->job.world_size() < elastic.max_workers()) {
    // An external job grows at once (job.proto ExternalWorkload): the
    // newcomer joins the next generation, which the others re-join.
    const uint32_t world = job->job.world_size();
    EndGenerationLocked(
        *job, v1::FORMATION_REASON_GROW,
        absl::StrCat("grow: '", w.worker_id(), "' joined; world ", world, " -> ", world + 1),
        &ended);
    m.member.set_generation(job->job.generation());
    m.member.set_state(v1::MEMBER_STATE_JOINING);
  } else if (job->job.phase() == v1::JOB_PHASE_RUNNING) {
    // The world is formed: a newcomer waits as a spare; a GPT job grows at
    // the next committed checkpoint (NoteCheckpointCommitted), an external
    // one at max_workers stays as it is.
    m.member.set_state(v1::MEMBER_STATE_SPARE);
    job->job.set_num_spares(job->job.num_spares() + 1);
  } else {
    m.member.set_state(v1::MEMBER_STATE_JOINING);
    if (!was_joining && job->joining_count_valid &&
        job->joining_count_generation == job->job.generation()) {
      ++job->joining_count;
    }
  }
  // Every live member now uses *backend (checked above).
  job->live_backend = *backend;
  // A new incarnation's own credential (only its hash is kept); a re-join
  // keeps the one it has.
  std::string member_token;
  std::vector<Mutation> extra;
  if (new_incarnation) m.token_hash.clear();
  // Issued to a holder of the job token; the admin token keeps every right
  // and needs none.
  const bool issue = by == JoinedBy::kJobToken && creds_ != nullptr && creds_->enabled() &&
                     m.token_hash.empty();
  if (issue) {
    member_token = NewSecret();
    m.token_hash = Sha256Hex(member_token);
  }
  const bool token_changed = new_incarnation || issue;
  if (token_changed) {
    const std::string key = absl::StrCat(w.job_id(), "/", w.worker_id());
    extra.push_back(m.token_hash.empty()
                        ? Mutation::Delete(kMemberTokenKind, key)
                        : Mutation::Put(kMemberTokenKind, key,
                                        absl::StrCat(w.incarnation(), " ", m.token_hash)));
  }
  if (absl::Status s = PersistLocked(*job, {&m}, std::move(extra)); !s.ok()) {
    if (issue) m.token_hash.clear();  // not handed out: a retry gets one
    return absl::UnavailableError(absl::StrCat("join not recorded, state store: ", s.message()));
  }
  if (token_changed && creds_ != nullptr) {  // a replaced incarnation's token stops working
    creds_->SetMemberToken({w.job_id(), w.worker_id(), w.incarnation()}, m.token_hash);
  }
  v1::JobEvent e;
  v1::WorkerJoined* joined = e.mutable_worker_joined();
  joined->set_worker_id(w.worker_id());
  joined->set_incarnation(w.incarnation());
  joined->set_host(request.host());
  joined->set_device(device);
  joined->set_rejoined(rejoined);
  EmitLocked(*job, std::move(e));
  if (m.member.state() == v1::MEMBER_STATE_SPARE) {
    v1::SessionMessage msg;
    absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(*job, m);
    if (a.ok()) *msg.mutable_assignment() = *std::move(a);
    m.outbox.Push(std::move(msg));
  }
  // A waiting GetAssignment of this worker (a re-join) may be answered now.
  if (!inserted) WakeAssignmentWaitersLocked(*job, &m);
  MaybeFormLocked(*job, &ended);
  pending_ended_.insert(pending_ended_.end(), ended.begin(), ended.end());
  v1::JoinJobResponse response;
  response.set_generation(job->job.generation());
  response.set_state(m.member.state());
  *response.mutable_spec() = job->job.spec();
  response.set_phase(job->job.phase());
  response.set_member_token(member_token);
  return response;
}

absl::StatusOr<v1::Member> Coordinator::DrainWorker(const std::string& job_id,
                                                    const std::string& worker_id,
                                                    const std::string& reason, bool force,
                                                    std::vector<GenerationEnded>* ended) {
  // The reason goes into the member's detail and events that shardctl prints.
  if (absl::Status s = CheckText("reason", reason, spec::kMaxReasonBytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (IsTerminal(job->job.phase())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' is ", PhaseName(job->job.phase()), "; nothing to drain"));
  }
  auto it = job->members.find(worker_id);
  if (it == job->members.end()) {
    return absl::NotFoundError(
        absl::StrCat("no worker '", worker_id, "' in job '", job_id, "' (see shardctl members)"));
  }
  MemberRecord& m = it->second;
  if (!IsLive(m.member.state())) {
    return absl::FailedPreconditionError(absl::StrCat("worker '", worker_id, "' is ",
                                                      MemberStateName(m.member.state()),
                                                      "; only live workers can be drained"));
  }
  if (!force) {
    // Live workers that stay: neither this one nor one already draining.
    uint32_t staying = 0;
    for (const auto& [id, other] : job->members) {
      staying += id != worker_id && IsLive(other.member.state()) && !other.draining();
    }
    const uint32_t min_workers = job->job.spec().elastic().min_workers();
    if (staying < min_workers) {
      return absl::FailedPreconditionError(absl::StrCat(
          "draining '", worker_id, "' would leave ", staying, " live worker",
          staying == 1 ? "" : "s", ", fewer than min_workers=", min_workers,
          ": the job would stop until others join (and fail after join_timeout ",
          absl::FormatDuration(FromProto(job->job.spec().elastic().join_timeout())),
          "); start another worker first, or force it: shardctl drain ", job_id, " ", worker_id,
          " --force"));
    }
  }
  m.member.set_drain_reason(reason.empty() ? std::string("operator request") : reason);
  // An external job saves by itself (no BeginCheckpoint): drained at once.
  const bool graceful =
      m.member.state() == v1::MEMBER_STATE_ACTIVE && job->job.phase() == v1::JOB_PHASE_RUNNING &&
      !spec::IsExternalJob(job->job.spec()) && !job->job.spec().checkpoint().directory().empty();
  if (!graceful) {
    RemoveDrainedLocked(*job, m, ended);
    MaybeFormLocked(*job, ended);
    return m.member;
  }
  StartGracefulDrainLocked(*job, m, m.member.drain_reason());
  return m.member;
}

void Coordinator::StartGracefulDrainLocked(JobRecord& job, MemberRecord& m,
                                           const std::string& reason) {
  m.member.set_drain_reason(reason);
  // Save first: every rank is asked for a checkpoint after its next step
  // (the ranks agree on which step through their own all-reduce); the
  // commit takes the member out (NoteCheckpointCommitted).
  m.member.set_drain_after_step(job.job.step());
  m.member.set_detail(absl::StrCat("draining (", m.member.drain_reason(),
                                   "): leaves after the next checkpoint commits"));
  if (absl::Status s = PersistLocked(job, {&m}); !s.ok()) {
    // Kept in memory: the drain still happens unless this coordinator
    // restarts before the checkpoint commits.
    LogLine(absl::StrFormat("job %s: drain of %s not saved: %s", job.job.job_id(),
                            m.member.worker_id(), s.message()));
  }
  for (auto& [id, other] : job.members) {
    if (other.member.state() != v1::MEMBER_STATE_ACTIVE) continue;
    v1::SessionMessage msg;
    msg.mutable_directive()->mutable_checkpoint()->set_step(job.job.step() + 1);
    other.outbox.Push(std::move(msg));
  }
}

void Coordinator::RemoveDrainedLocked(JobRecord& job, MemberRecord& m,
                                      std::vector<GenerationEnded>* ended) {
  const v1::MemberState was = m.member.state();
  std::optional<uint32_t> rank;
  if (m.member.has_rank()) rank = m.member.rank();
  const std::string why = absl::StrCat("drained: ", m.member.drain_reason());
  // STOP goes out on its session before the member stops being live.
  v1::SessionMessage msg;
  *msg.mutable_directive() = Stop(job.job.phase(), why);
  m.outbox.Push(std::move(msg));
  m.member.clear_drain_reason();
  m.member.clear_drain_after_step();
  m.member.set_state(v1::MEMBER_STATE_LEFT);
  m.member.set_detail(why);
  m.member.clear_rank();
  v1::JobEvent e;
  v1::WorkerLeft* left = e.mutable_worker_left();
  left->set_worker_id(m.member.worker_id());
  left->set_incarnation(m.member.incarnation());
  if (rank.has_value()) left->set_rank(*rank);
  left->set_reason(why);
  EmitLocked(job, std::move(e));
  job.UncountSpare(was);
  if (was == v1::MEMBER_STATE_ACTIVE && job.job.phase() == v1::JOB_PHASE_RUNNING) {
    EndGenerationLocked(job, v1::FORMATION_REASON_WORKER_LEFT,
                        absl::StrCat("rank ", rank.value_or(0), " (", m.member.worker_id(), ") ",
                                     why),
                        ended);
  } else {
    PersistLocked(job, {&m}).IgnoreError();
  }
}

absl::Status Coordinator::LeaveJob(const v1::LeaveJobRequest& request,
                                   std::vector<GenerationEnded>* ended) {
  const v1::WorkerIdentity& w = request.fence().worker();
  if (absl::Status s = ValidIdentity(w, "fence.worker"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", w.job_id(), "'"));
  auto it = job->members.find(w.worker_id());
  if (it == job->members.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", w.worker_id(), "' never joined"));
  }
  MemberRecord& m = it->second;
  if (m.member.incarnation() != w.incarnation()) {
    return absl::AbortedError("this incarnation was replaced; nothing to leave");
  }
  const v1::MemberState was = m.member.state();
  if (was == v1::MEMBER_STATE_LEFT || was == v1::MEMBER_STATE_LOST) return absl::OkStatus();
  std::optional<uint32_t> rank;
  if (m.member.has_rank()) rank = m.member.rank();
  m.member.set_state(v1::MEMBER_STATE_LEFT);
  m.member.set_detail(request.reason());
  m.member.clear_rank();
  m.outbox.End();
  v1::JobEvent e;
  v1::WorkerLeft* left = e.mutable_worker_left();
  left->set_worker_id(w.worker_id());
  left->set_incarnation(w.incarnation());
  if (rank.has_value()) left->set_rank(*rank);
  left->set_reason(request.reason());
  EmitLocked(*job, std::move(e));
  job->UncountSpare(was);
  if (was == v1::MEMBER_STATE_ACTIVE && job->job.phase() == v1::JOB_PHASE_RUNNING &&
      spec::IsExternalJob(job->job.spec())) {
    // The workload ended on this node; the others go on. When the last
    // rank of the generation has left, the workload ended everywhere.
    bool ranks_left = false;
    for (const auto& [id, other] : job->members) {
      ranks_left |= other.member.state() == v1::MEMBER_STATE_ACTIVE &&
                    other.member.generation() == job->job.generation();
    }
    if (ranks_left) {
      PersistLocked(*job, {&m}).IgnoreError();
    } else {
      SetPhaseLocked(*job, v1::JOB_PHASE_COMPLETED,
                     absl::StrCat("all ", job->job.world_size(), " ranks of generation ",
                                  job->job.generation(), " left"));
      StopAllLocked(*job);
      PersistAllMembersLocked(*job).IgnoreError();
      // Rendezvous calls still blocked on the generation end (ABORTED).
      if (ended != nullptr) {
        ended->push_back({job->job.job_id(), job->job.generation(), job->job.phase_reason()});
      }
    }
  } else if (was == v1::MEMBER_STATE_ACTIVE && job->job.phase() == v1::JOB_PHASE_RUNNING) {
    EndGenerationLocked(*job, v1::FORMATION_REASON_WORKER_LEFT,
                        absl::StrCat("rank ", rank.value_or(0), " (", w.worker_id(), ") left: ",
                                     request.reason()),
                        ended);
  } else {
    PersistLocked(*job, {&m}).IgnoreError();
  }
  MaybeFormLocked(*job, ended);
  return absl::OkStatus();
}

}  // namespace shardline::server

namespace shardline::server {

absl::StatusOr<v1::Job> Coordinator::CompleteJob(const v1::CompleteJobRequest& request,
                                                 std::vector<GenerationEnded>* ended) {
  const v1::WorkerIdentity& w = request.fence().worker();
  if (absl::Status s = ValidIdentity(w, "fence.worker"); !s.ok()) return s;
  // The reason becomes phase_reason, which `job get` and every STOP print.
  if (absl::Status s = CheckText("reason", request.reason(), spec::kMaxReasonBytes); !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", w.job_id(), "'"));
  if (!spec::IsExternalJob(job->job.spec())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", w.job_id(),
        "' is a GPT training job: it completes when its ranks finish "
        "spec.training.train_steps; CompleteJob is for external jobs (spec.external)"));
  }
  auto it = job->members.find(w.worker_id());
  if (it == job->members.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", w.worker_id(), "' never joined job '",
                                            w.job_id(), "'; call JoinJob first"));
  }
  MemberRecord& m = it->second;
  if (m.member.incarnation() != w.incarnation()) {
    return IncarnationMismatch(w.job_id(), w.worker_id(), w.incarnation(),
                               m.member.incarnation());
  }
  const v1::JobPhase phase = job->job.phase();
  if (phase == v1::JOB_PHASE_COMPLETED) return job->job;  // unchanged
  if (IsTerminal(phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", w.job_id(), "' is already ", PhaseName(phase), " (",
                     job->job.phase_reason(), "); it cannot complete"));
  }
  const v1::MemberState state = m.member.state();
  if (state == v1::MEMBER_STATE_LOST || state == v1::MEMBER_STATE_LEFT) {
    return absl::AbortedError(absl::StrCat(
        "worker '", w.worker_id(), "' is ", MemberStateName(state),
        state == v1::MEMBER_STATE_LOST ? absl::StrCat(" (", m.member.detail(), ")") : "",
        "; only a member of the job can complete it (re-join with JoinJob)"));
  }
  m.last_heartbeat = clock_->Now();
  SetPhaseLocked(*job, v1::JOB_PHASE_COMPLETED,
                 absl::StrCat("completed by '", w.worker_id(), "'",
                              request.reason().empty() ? "" : ": ", request.reason()));
  StopAllLocked(*job);
  PersistAllMembersLocked(*job).IgnoreError();
  // Rendezvous calls still blocked on the generation end (ABORTED).
  if (ended != nullptr) {
    ended->push_back({job->job.job_id(), job->job.generation(), job->job.phase_reason()});
  }
  return job->job;
}

}  // namespace shardline::server

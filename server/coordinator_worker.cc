// Coordinator: the calls of a joined worker: its Session stream, fences,
// assignments and heartbeats.
#include "server/coordinator.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/coordinator_records.h"
#include "server/coordinator_validation.h"
#include "server/progress_monitor.h"
#include "spec/job_spec.h"

namespace shardline::server {

absl::StatusOr<Coordinator::MemberRecord*> Coordinator::CheckFenceLocked(const v1::Fence& fence,
                                                                         JobRecord** job_out) {
  if (!fence.has_worker()) {
    return absl::InvalidArgumentError("fence is missing; every worker call carries one");
  }
  if (absl::Status s = ValidIdentity(fence.worker(), "fence.worker"); !s.ok()) return s;
  if (fence.generation() == 0) {
    return absl::InvalidArgumentError(
        "fence.generation must be the generation JoinJob returned (>= 1)");
  }
  JobRecord* job = FindJobLocked(fence.worker().job_id());
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", fence.worker().job_id(), "'"));
  }
  *job_out = job;
  if (IsTerminal(job->job.phase())) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job->job.job_id(), "' is ",
                                                      PhaseName(job->job.phase()), ": stop (",
                                                      job->job.phase_reason(), ")"));
  }
  auto it = job->members.find(fence.worker().worker_id());
  if (it == job->members.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", fence.worker().worker_id(),
                                            "' never joined job '", job->job.job_id(),
                                            "'; call JoinJob first"));
  }
  MemberRecord& m = it->second;
  if (m.member.incarnation() != fence.worker().incarnation()) {
    return IncarnationMismatch(job->job.job_id(), m.member.worker_id(),
                               fence.worker().incarnation(), m.member.incarnation());
  }
  const v1::MemberState state = m.member.state();
  if (state == v1::MEMBER_STATE_LOST || state == v1::MEMBER_STATE_LEFT) {
    return absl::AbortedError(absl::StrCat(
        "worker '", m.member.worker_id(), "' was declared ",
        state == v1::MEMBER_STATE_LOST ? "lost (" + m.member.detail() + ")" : "gone (it left)",
        "; re-join with JoinJob"));
  }
  // Any fenced call proves the process is alive, even a stale one.
  m.last_heartbeat = clock_->Now();
  if (fence.generation() > job->job.generation()) {
    // Only a coordinator whose state is older than the worker's (restored
    // from an old copy) can see this; re-joining is still the way back.
    return absl::AbortedError(absl::StrCat(
        "generation ", fence.generation(), " does not exist (job '", job->job.job_id(),
        "' is at generation ", job->job.generation(),
        "); abort communicators and re-join with JoinJob"));
  }
  if (state == v1::MEMBER_STATE_FENCED || fence.generation() != job->job.generation()) {
    return absl::AbortedError(absl::StrCat(
        "generation ", fence.generation(), " is over (current ", job->job.generation(), "): ",
        job->job.phase_reason(), "; abort communicators and re-join with JoinJob"));
  }
  return &m;
}

std::optional<v1::Directive> Coordinator::ExcludedStopLocked(const v1::Fence& fence) const {
  const JobRecord* job = FindJobLocked(fence.worker().job_id());
  if (job == nullptr) return std::nullopt;
  auto it = job->members.find(fence.worker().worker_id());
  if (it == job->members.end()) return std::nullopt;
  const v1::Member& m = it->second.member;
  if (m.incarnation() != fence.worker().incarnation() || m.state() != v1::MEMBER_STATE_LOST ||
      (m.loss_reason() != v1::LOSS_REASON_REPEATED_ERRORS &&
       m.loss_reason() != v1::LOSS_REASON_HUNG)) {
    return std::nullopt;
  }
  return Stop(job->job.phase(), absl::StrCat("this process is excluded from job '",
                                             job->job.job_id(), "': ", m.detail()));
}

absl::StatusOr<uint64_t> Coordinator::OpenSession(const v1::WorkerIdentity& w,
                                                  SessionWaker waker) {
  if (absl::Status s = ValidIdentity(w, "worker"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", w.job_id(), "'"));
  auto it = job->members.find(w.worker_id());
  if (it == job->members.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", w.worker_id(), "' never joined job '",
                                            w.job_id(), "'; call JoinJob first"));
  }
  MemberRecord& m = it->second;
  if (m.member.incarnation() != w.incarnation()) {
    return absl::AbortedError(absl::StrCat("incarnation ", w.incarnation(), " of worker '",
                                           w.worker_id(), "' was replaced; re-join"));
  }
  if (!IsLive(m.member.state())) {
    return absl::AbortedError(absl::StrCat("worker '", w.worker_id(), "' is ",
                                           MemberStateName(m.member.state()),
                                           "; re-join with JoinJob"));
  }
  const uint64_t session_id = next_session_id_++;
  m.outbox.Open(session_id, std::move(waker));  // an older stream of this incarnation ends
  m.last_heartbeat = clock_->Now();
  v1::SessionMessage opened;
  opened.mutable_opened()->set_generation(job->job.generation());
  opened.mutable_opened()->set_state(m.member.state());
  m.outbox.Push(std::move(opened));
  if (absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(*job, m); a.ok()) {
    v1::SessionMessage msg;
    *msg.mutable_assignment() = *std::move(a);
    m.outbox.Push(std::move(msg));
  } else if (m.member.state() == v1::MEMBER_STATE_FENCED) {
    v1::SessionMessage msg;
    *msg.mutable_directive() = Restart(job->job.generation(), job->job.phase_reason());
    m.outbox.Push(std::move(msg));
  }
  return session_id;
}

absl::StatusOr<std::optional<v1::SessionMessage>> Coordinator::NextSessionMessage(
    const v1::WorkerIdentity& w, uint64_t session_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", w.job_id(), "'"));
  auto it = job->members.find(w.worker_id());
  if (it == job->members.end()) return absl::NotFoundError("unknown worker");
  MemberRecord* m = &it->second;
  {
    WaitGuard waiting(*job);
    m->outbox.Wait(&mu_, session_id, deadline);
  }
  if (!m->outbox.IsCurrent(session_id) || m->member.incarnation() != w.incarnation()) {
    return absl::AbortedError("this session was replaced or closed");
  }
  return m->outbox.Pop();
}

absl::StatusOr<FencedWorker> Coordinator::CheckFence(const v1::Fence& fence) {
  absl::MutexLock lock(&mu_);
  return FenceLocked(fence);
}

std::optional<absl::StatusOr<FencedWorker>> Coordinator::TryCheckFence(const v1::Fence& fence) {
  if (!mu_.TryLock()) return std::nullopt;
  absl::StatusOr<FencedWorker> out = FenceLocked(fence);
  mu_.Unlock();
  return out;
}

absl::StatusOr<FencedWorker> Coordinator::FenceLocked(const v1::Fence& fence) {
  JobRecord* job = nullptr;
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(fence, &job);
  if (!m.ok()) return m.status();
  FencedWorker out;
  out.job_id = job->job.job_id();
  out.worker_id = (*m)->member.worker_id();
  out.incarnation = (*m)->member.incarnation();
  out.generation = job->job.generation();
  out.active = (*m)->member.state() == v1::MEMBER_STATE_ACTIVE;
  out.rank = out.active ? static_cast<int>((*m)->member.rank()) : -1;
  out.world_size = static_cast<int>(job->job.world_size());
  return out;
}

bool Coordinator::AssignmentSettledLocked(const JobRecord& job, const MemberRecord& member,
                                          uint64_t generation, uint64_t incarnation) const {
  const v1::MemberState s = member.member.state();
  return job.job.generation() != generation || IsTerminal(job.job.phase()) ||
         member.member.incarnation() != incarnation ||
         (job.formed() && (s == v1::MEMBER_STATE_ACTIVE || s == v1::MEMBER_STATE_SPARE)) ||
         !IsLive(s);
}

uint64_t Coordinator::AddAssignmentWakerLocked(JobRecord& job, MemberRecord& member,
                                               std::function<void()> waker) {
  const uint64_t id = next_assignment_waker_++;
  member.assignment_wakers.emplace(id, std::move(waker));
  job.assignment_waiting.insert(&member);
  return id;
}

void Coordinator::RemoveAssignmentWakerLocked(JobRecord& job, MemberRecord& member, uint64_t id) {
  member.assignment_wakers.erase(id);
  if (member.assignment_wakers.empty()) job.assignment_waiting.erase(&member);
}

void Coordinator::WakeAssignmentWaitersLocked(JobRecord& job, MemberRecord* member) {
  if (member != nullptr) {
    for (const auto& [id, wake] : member->assignment_wakers) wake();
    return;
  }
  for (MemberRecord* m : job.assignment_waiting) {
    for (const auto& [id, wake] : m->assignment_wakers) wake();
  }
}

absl::StatusOr<v1::Assignment> Coordinator::GetAssignment(const v1::Fence& fence, bool wait,
                                                          absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = nullptr;
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(fence, &job);
  if (!m.ok()) return m.status();
  const uint64_t generation = fence.generation();
  MemberRecord* member = *m;
  const uint64_t incarnation = member->member.incarnation();
  if (wait && !AssignmentSettledLocked(*job, *member, generation, incarnation)) {
    // Woken only by this member's changes and job-wide events (see
    // MemberRecord::assignment_wakers), not by every other worker's join.
    absl::CondVar changed;
    const uint64_t id = AddAssignmentWakerLocked(*job, *member, [&changed] { changed.Signal(); });
    {
      WaitGuard waiting(*job);
      while (!AssignmentSettledLocked(*job, *member, generation, incarnation) &&
             !changed.WaitWithDeadline(&mu_, deadline)) {
      }
    }
    RemoveAssignmentWakerLocked(*job, *member, id);
  }
  absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(*job, *member);
  if (a.ok() && member->member.incarnation() == incarnation) return a;
  // Re-check the fence: the generation may have ended while waiting.
  m = CheckFenceLocked(fence, &job);
  if (!m.ok()) return m.status();
  if (!wait) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", generation, " has not formed yet (", job->job.phase_reason(),
        "); call again with wait=true"));
  }
  return absl::DeadlineExceededError(absl::StrCat("generation ", generation,
                                                  " did not form before the deadline (",
                                                  job->job.phase_reason(), ")"));
}

absl::StatusOr<std::optional<v1::Assignment>> Coordinator::PollAssignment(
    const v1::Fence& fence, std::function<void()> waker, uint64_t* waker_id) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = nullptr;
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(fence, &job);
  if (!m.ok()) {
    // Replaced, lost or gone: this call ends; so does its waker.
    if (*waker_id != 0 && job != nullptr) {
      auto it = job->members.find(fence.worker().worker_id());
      if (it != job->members.end()) RemoveAssignmentWakerLocked(*job, it->second, *waker_id);
      *waker_id = 0;
    }
    return m.status();
  }
  MemberRecord* member = *m;
  if (!AssignmentSettledLocked(*job, *member, fence.generation(), fence.worker().incarnation())) {
    if (*waker_id == 0) *waker_id = AddAssignmentWakerLocked(*job, *member, std::move(waker));
    return std::optional<v1::Assignment>();
  }
  if (*waker_id != 0) {
    RemoveAssignmentWakerLocked(*job, *member, *waker_id);
    *waker_id = 0;
  }
  absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(*job, *member);
  if (a.ok()) return std::optional<v1::Assignment>(*std::move(a));
  // Settled without an assignment: the generation ended, or the job
  // finished (CheckFence above saw it before the change: ask again).
  m = CheckFenceLocked(fence, &job);
  if (!m.ok()) return m.status();
  return absl::AbortedError(absl::StrCat("generation ", fence.generation(),
                                         " ended before it formed (", job->job.phase_reason(),
                                         "); re-join"));
}

void Coordinator::RemoveAssignmentWaker(const v1::WorkerIdentity& worker, uint64_t waker_id) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(worker.job_id());
  if (job == nullptr) return;
  auto it = job->members.find(worker.worker_id());
  if (it != job->members.end()) RemoveAssignmentWakerLocked(*job, it->second, waker_id);
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  return HeartbeatLocked(request);
}

std::optional<absl::StatusOr<v1::HeartbeatResponse>> Coordinator::TryHeartbeat(
    const v1::HeartbeatRequest& request) {
  if (!mu_.TryLock()) return std::nullopt;
  absl::StatusOr<v1::HeartbeatResponse> out = HeartbeatLocked(request);
  mu_.Unlock();
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::HeartbeatLocked(
    const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  if (JobRecord* job = FindJobLocked(request.fence().worker().job_id());
      job != nullptr && IsTerminal(job->job.phase())) {
    auto it = job->members.find(request.fence().worker().worker_id());
    if (it != job->members.end() &&
        it->second.member.incarnation() == request.fence().worker().incarnation()) {
      *response.mutable_directive() = Stop(job->job.phase(), job->job.phase_reason());
      return response;
    }
  }
  if (std::optional<v1::Directive> stop = ExcludedStopLocked(request.fence()); stop.has_value()) {
    *response.mutable_directive() = *std::move(stop);
    return response;
  }
  JobRecord* job = nullptr;
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(request.fence(), &job);
  if (!m.ok()) return m.status();
  if (request.state() == v1::WORKER_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError("state is UNSPECIFIED; say what the worker is doing");
  }
  // An external job has no train_steps: its step is progress for listings.
  const bool external = spec::IsExternalJob(job->job.spec());
  const uint64_t steps = job->job.spec().training().train_steps();
  if (!external && (request.step() > steps || request.metrics().step() > steps)) {
    return absl::InvalidArgumentError(absl::StrCat("step=", request.step(), " (metrics.step=",
                                                   request.metrics().step(),
                                                   ") is beyond train_steps=", steps));
  }
  if (request.has_progress()) {
    if (absl::Status s = ValidateProgress(request.progress(), job->job.world_size(),
                                          external ? 0 : steps);
        !s.ok()) {
      return s;
    }
  }
  v1::Member& member = (*m)->member;
  member.set_step(std::max(member.step(), request.step()));
  member.set_worker_state(request.state());
  *member.mutable_last_heartbeat_time() = ToProto(clock_->Now());
  NoteProgressLocked(*job, **m, request);
  // Success is a step done in this generation: states such as READY come
  // before the parts that can fail every time (opening the data, restoring),
  // and a heartbeat racing the worker's error report must not reset it.
  // An external workload's steps mean nothing here: any heartbeat of a rank
  // in its generation (the fence checked it) counts as its success.
  if (member.state() == v1::MEMBER_STATE_ACTIVE &&
      (external || request.step() > (*m)->generation_start_step)) {
    (*m)->error_streak = 0;
  }
  if (member.state() == v1::MEMBER_STATE_ACTIVE) {
    job->job.set_step(std::max(job->job.step(), request.step()));
    if (request.has_metrics() && request.metrics().step() > job->progress_step &&
        request.metrics().has_loss()) {
      job->progress_step = request.metrics().step();
      v1::JobEvent e;
      v1::StepProgress* p = e.mutable_step_progress();
      p->set_step(request.metrics().step());
      p->set_loss(request.metrics().loss());
      if (request.metrics().has_tokens_per_second()) {
        p->set_tokens_per_second(request.metrics().tokens_per_second());
      }
      EmitLocked(*job, std::move(e));
    }
  }
  // The job completes when every rank has finished its steps. Only a rank
  // that says DONE can complete it: the O(members) check stays off the
  // ordinary heartbeat's path.
  // An external job completes by CompleteJob or when its ranks leave.
  bool all_done = !external && job->job.phase() == v1::JOB_PHASE_RUNNING &&
                  member.state() == v1::MEMBER_STATE_ACTIVE &&
                  member.worker_state() == v1::WORKER_STATE_DONE;
  if (all_done) {
    for (const auto& [id, other] : job->members) {
      if (other.member.state() == v1::MEMBER_STATE_ACTIVE &&
          other.member.worker_state() != v1::WORKER_STATE_DONE) {
        all_done = false;
        break;
      }
    }
  }
  if (all_done) {
    SetPhaseLocked(*job, v1::JOB_PHASE_COMPLETED,
                   absl::StrCat("all ", job->job.world_size(), " ranks finished ",
                                job->job.spec().training().train_steps(), " steps"));
    StopAllLocked(*job);
    PersistAllMembersLocked(*job).IgnoreError();
    *response.mutable_directive() = Stop(job->job.phase(), job->job.phase_reason());
    return response;
  }
  response.mutable_directive()->mutable_continue_training();
  return response;
}

}  // namespace shardline::server

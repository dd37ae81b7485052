// Internal to the Coordinator: its records of jobs and members, and small
// helpers its .cc files share. Included only by the coordinator's own .cc
// files (coordinator*.cc; a srcs header of //server:coordinator, so no other
// target can include it).
//
// Thread-safety: every record is reached through Coordinator::jobs_ and is
// guarded by Coordinator::mu_, as are the EventLog and SessionOutbox they
// hold.
#ifndef SHARDLINE_SERVER_COORDINATOR_RECORDS_H_
#define SHARDLINE_SERVER_COORDINATOR_RECORDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/util/time_util.h"
#include "plan/plan.h"
#include "server/coordinator.h"
#include "server/event_log.h"
#include "server/formation.h"
#include "server/progress_monitor.h"
#include "server/session_outbox.h"
#include "server/state_store.h"
#include "shardline/v1/events.pb.h"
#include "shardline/v1/job.pb.h"
#include "shardline/v1/session.pb.h"
#include "spec/job_spec.h"
#include "spec/plan_proto.h"

namespace shardline::server {

inline constexpr size_t kMaxMembersPerJob = 131072;  // coordinator.proto

// StateStore record kinds of credentials (only hashes, server/auth.h
// Sha256Hex): a job's worker token by job_id; a member token by
// "<job_id>/<worker_id>", value "<incarnation> <hash>". kPlainTokenKind is
// the plain-text worker token of older versions, migrated by Recover.
inline constexpr char kTokenHashKind[] = "token_sha256";
inline constexpr char kMemberTokenKind[] = "member_token";
inline constexpr char kPlainTokenKind[] = "token";

inline google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}
inline absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(google::protobuf::util::TimeUtil::TimestampToNanoseconds(t));
}
inline absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Nanoseconds(google::protobuf::util::TimeUtil::DurationToNanoseconds(d));
}

inline bool IsTerminal(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_COMPLETED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

// Members that count as alive: they hold (or wait for) a place in the job.
inline bool IsLive(v1::MemberState s) {
  return s == v1::MEMBER_STATE_JOINING || s == v1::MEMBER_STATE_ACTIVE ||
         s == v1::MEMBER_STATE_SPARE || s == v1::MEMBER_STATE_FENCED;
}

// "RUNNING", "FAILED", ... for messages people read.
inline std::string PhaseName(v1::JobPhase phase) {
  std::string name = v1::JobPhase_Name(phase);
  return name.substr(std::string("JOB_PHASE_").size());
}

// The answer to a call of incarnation `called` of `worker_id` whose member
// is incarnation `member` (they differ): ABORTED either way, so that the
// process re-joins (coordinator.proto, Fencing), with a message that says
// which case it is: an older incarnation was replaced; a newer one is not
// the member this coordinator knows (it never joined here, or the
// coordinator's state is older than the worker's).
inline absl::Status IncarnationMismatch(const std::string& job_id, const std::string& worker_id,
                                        uint64_t called, uint64_t member) {
  if (called < member) {
    return absl::AbortedError(absl::StrCat("incarnation ", called, " of worker '", worker_id,
                                           "' was replaced by incarnation ", member,
                                           "; this process is fenced off"));
  }
  return absl::AbortedError(absl::StrCat("incarnation ", called, " of worker '", worker_id,
                                         "' is not the member of job '", job_id,
                                         "' this coordinator knows (incarnation ", member,
                                         "); re-join with JoinJob"));
}

// "LOST", "LEFT", ... for messages people read.
inline std::string MemberStateName(v1::MemberState state) {
  std::string name = v1::MemberState_Name(state);
  return name.substr(std::string("MEMBER_STATE_").size());
}

inline v1::Directive Restart(uint64_t generation, const std::string& reason) {
  v1::Directive d;
  d.mutable_restart_at_generation()->set_generation(generation);
  d.mutable_restart_at_generation()->set_reason(reason);
  return d;
}

inline v1::Directive Stop(v1::JobPhase phase, const std::string& reason) {
  v1::Directive d;
  d.mutable_stop()->set_phase(phase);
  d.mutable_stop()->set_reason(reason);
  return d;
}

struct Coordinator::MemberRecord {
  v1::Member member;  // persisted
  absl::Time last_heartbeat;
  // Its Session stream: at most one open session and its queued messages.
  SessionOutbox outbox;
  int previous_rank = -1;  // rank in the last generation it was ACTIVE in
  // Incarnations this slot has had before the current one: a process that
  // was replaced must not come back and replace its successor (two
  // processes with one worker_id would otherwise take turns forever).
  std::set<uint64_t> retired_incarnations;
  // Consecutive generations of this incarnation that its own ReportError
  // ended, with no success (a heartbeat reporting a step done in the
  // generation) in between; and the
  // last such report. In memory only: a coordinator restart forgives.
  int error_streak = 0;
  std::string last_error;
  // The step its generation started from (the restore point's, or 0): a
  // heartbeat reporting a later step means it trained in this generation.
  uint64_t generation_start_step = 0;
  // SHA-256 (hex) of this incarnation's member token; empty when none was
  // issued (authentication off). Persisted as a "member_token" record.
  std::string token_hash;
  // The wakers of GetAssignment calls waiting for this member's assignment
  // (Coordinator::AddAssignmentWakerLocked), by id: each is called (mu_
  // held, so it only queues work or signals) when the answer may have
  // changed. Only this member's own changes and job-wide events wake them:
  // another worker's join does not (at N workers, waking every waiter on
  // every join made a rendezvous O(N^2)).
  std::map<uint64_t, std::function<void()>> assignment_wakers;
  // JoinJobRequest.compact_groups of its last join: its assignments use
  // compact process groups. In memory only (a restart lists every rank).
  bool compact_groups = false;
  // An operator asked to drain it: member.drain_reason() is set (durable).
  bool draining() const { return !member.drain_reason().empty(); }

  // The rank it carries into the next formation: the one it holds now (a
  // generation's end keeps it as previous_rank, EndGenerationLocked), else
  // the last one it held.
  int carried_rank() const {
    return member.has_rank() ? static_cast<int>(member.rank()) : previous_rank;
  }
  // It as a candidate of the next formation (FormGenerationLocked, and
  // WhatIf's prediction of it).
  FormationCandidate AsCandidate() const {
    return {member.worker_id(), carried_rank(), FromProto(member.join_time())};
  }
};

// Members a generation's end fences (EndGenerationLocked): they are told
// RESTART_AT_GENERATION, re-join and are the next formation's candidates.
// WhatIf (coordinator_whatif.cc) predicts the next generation from the same
// set.
inline bool RejoinsAfterGenerationEnd(v1::MemberState s) {
  return s == v1::MEMBER_STATE_ACTIVE || s == v1::MEMBER_STATE_SPARE ||
         s == v1::MEMBER_STATE_JOINING;
}

// The step a generation formed now starts from: its restore point's
// (job.last_checkpoint), or 0 (from the seed) when none is committed.
inline uint64_t RestoreStep(const v1::Job& job) {
  return job.has_last_checkpoint() ? job.last_checkpoint().step() : 0;
}

struct Coordinator::JobRecord {
  // `store` (not owned) keeps the event log; `max_events`: its retention.
  JobRecord(StateStore* store, int max_events) : events(store, max_events) {}

  v1::Job job;  // persisted
  std::string worker_token_hash;  // SHA-256 (hex) of the worker token; persisted
  std::map<std::string, MemberRecord> members;  // by worker_id; never erased
  std::optional<plan::Plan> plan;               // the current generation, once formed
  spec::PlanGroups plan_groups;                       // spec::GroupsOfPlan(*plan) while plan is set
  // Sets (or, with nullopt, clears) the plan and the groups derived from it.
  void SetPlan(std::optional<plan::Plan> p) {
    plan = std::move(p);
    plan_groups = plan.has_value() ? spec::GroupsOfPlan(*plan) : spec::PlanGroups{};
  }
  // A generation is formed (RUNNING, or a COMPLETED job's last one): a GPT
  // job has its plan; an external job has none and its world_size says so.
  bool formed() const {
    return plan.has_value() || (spec::IsExternalJob(job.spec()) && job.world_size() > 0);
  }
  // A member that was a SPARE no longer is one.
  void UncountSpare(v1::MemberState was) {
    if (was == v1::MEMBER_STATE_SPARE && job.num_spares() > 0) {
      job.set_num_spares(job.num_spares() - 1);
    }
  }
  // The current generation's restore point, fixed when it formed
  // (FormGenerationLocked): every rank's assignment names the same one even
  // when job.last_checkpoint moves on after the formation (an older
  // generation's checkpoint commits late when its last shard report raced
  // the generation's end; ranks that asked at different moments restored
  // different steps and paired collectives of different steps). Not
  // persisted: after a restart, last_checkpoint as loaded.
  bool restore_fixed = false;
  std::optional<v1::CheckpointRef> restore;  // nullopt: from the seed
  // The restore point assignments of the current generation name.
  std::optional<v1::CheckpointRef> RestorePoint() const {
    if (restore_fixed) return restore;
    if (job.has_last_checkpoint()) return job.last_checkpoint();
    return std::nullopt;
  }
  absl::Time waiting_since;                     // entered PENDING / RECOVERING
  std::string last_end_reason;                  // why the last generation ended (not persisted)
  std::optional<absl::Time> last_call_deadline;
  v1::FormationReason pending_reason = v1::FORMATION_REASON_INITIAL;
  // The job's events (durable, see EventLog). Its changed() CondVar is
  // signalled at every event (EmitLocked): every change that GetAssignment
  // and WaitEvents wait for (formation, a generation's end, a phase, a
  // member joining, leaving or lost) emits one.
  EventLog events;
  // Members with assignment_wakers: every event but WorkerJoined wakes
  // them (WakeAssignmentWaitersLocked), O(waiting members) per event.
  // Members are never erased, so the pointers stay valid.
  std::set<MemberRecord*> assignment_waiting;
  // How many members are JOINING in generation joining_count_generation,
  // kept by JoinJob between MaybeFormLocked's scans of the members, so that
  // a join that cannot form a generation costs O(1), not O(members). Valid
  // only while joining_count_valid; every event other than WorkerJoined (a
  // member lost, left, a phase change...) clears it, so it never counts
  // fewer than there are.
  bool joining_count_valid = false;
  uint64_t joining_count_generation = 0;
  int joining_count = 0;
  // Set when every live member is known to use this backend (JoinJob's
  // check). Only a join makes a member live with a backend, so it stays
  // true while members leave; JoinJob scans the members only for another
  // backend.
  std::optional<v1::Backend> live_backend;
  // Tick scans the members for heartbeat timeouts only once now reaches
  // this: the earliest last_heartbeat + heartbeat_timeout among the live
  // members at the last scan, lowered by every JoinJob to the joiner's
  // now + heartbeat_timeout (a member not live at the scan, or none at
  // all, was not counted). A live member's last_heartbeat only moves
  // later, so no timeout falls before it. Loading state leaves it in the
  // past: the first Tick scans.
  absl::Time next_timeout_scan = absl::InfinitePast();
  uint64_t progress_step = 0;  // last StepProgress emitted
  // Hangs and stragglers (coordinator_progress.cc); in memory only.
  // The last time any rank of the current generation made progress
  // (progress_monitor.h MadeProgress; formation counts).
  absl::Time last_progress;
  // This stall was reported already: reported again only after progress.
  bool hang_reported = false;
  uint64_t hangs_detected = 0;  // HangDetected events emitted, all generations, this process
  // The current generation's ranks (index = rank; set at formation, never
  // erased: check the member is still ACTIVE) and its straggler windows.
  std::vector<MemberRecord*> by_rank;
  StragglerTracker stragglers;
  // Calls blocked on this record with the lock released (WaitGuard): while
  // any is, PruneJob must not destroy it.
  mutable int waiters = 0;
};

// Counts a blocking call as a waiter on `job` for its scope. Construct and
// destroy it with Coordinator::mu_ held (declare it after the MutexLock).
class Coordinator::WaitGuard {
 public:
  explicit WaitGuard(const JobRecord& job) : job_(job) { ++job_.waiters; }
  WaitGuard(const WaitGuard&) = delete;
  WaitGuard& operator=(const WaitGuard&) = delete;
  ~WaitGuard() { --job_.waiters; }

 private:
  const JobRecord& job_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_RECORDS_H_

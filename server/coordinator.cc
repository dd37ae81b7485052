#include "server/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "plan/zero.h"
#include "spec/job_spec.h"
#include "spec/plan_proto.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;

constexpr size_t kMaxOutbox = 256;  // session messages waiting for a slow stream
constexpr size_t kMaxMembersPerJob = 65536;  // coordinator.proto


google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}
absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(t));
}
absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Nanoseconds(TimeUtil::DurationToNanoseconds(d));
}

bool IsTerminal(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_COMPLETED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

// Members that count as alive: they hold (or wait for) a place in the job.
bool IsLive(v1::MemberState s) {
  return s == v1::MEMBER_STATE_JOINING || s == v1::MEMBER_STATE_ACTIVE ||
         s == v1::MEMBER_STATE_SPARE || s == v1::MEMBER_STATE_FENCED;
}

std::string PhaseName(v1::JobPhase phase) {
  std::string name = v1::JobPhase_Name(phase);
  return name.substr(std::string("JOB_PHASE_").size());
}

// "LOST", "LEFT", ... for messages people read.
std::string MemberStateName(v1::MemberState state) {
  std::string name = v1::MemberState_Name(state);
  return name.substr(std::string("MEMBER_STATE_").size());
}

absl::Status ValidJobId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 63 && absl::ascii_islower(id[0]) && id.back() != '-';
  for (char c : id) ok = ok && (absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job_id='", AbbreviateValue(id),
      "' is invalid; use 1..63 characters of a-z, 0-9 and '-', starting with a letter and not "
      "ending with '-' (e.g. 'shakespeare-1')"));
}

absl::Status ValidIdentity(const v1::WorkerIdentity& w, absl::string_view field) {
  if (w.job_id().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".job_id is empty; name the job"));
  }
  bool printable = !w.worker_id().empty() && w.worker_id().size() <= 128;
  for (char c : w.worker_id()) printable = printable && c > ' ' && c < 127;
  if (!printable) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".worker_id='", AbbreviateValue(w.worker_id()),
        "' is invalid; use 1..128 printable ASCII characters without spaces, e.g. 'node3:cuda:1'"));
  }
  if (w.incarnation() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".incarnation must be non-zero; use a random 64-bit number per process start"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Backend> ResolveBackend(const std::string& device, v1::Backend backend) {
  const bool cuda = absl::StartsWith(device, "cuda:");
  int index = 0;
  if (!(device == "cpu" || (cuda && absl::SimpleAtoi(device.substr(5), &index) && index >= 0))) {
    return absl::InvalidArgumentError(absl::StrCat("device='", device,
                                                   "' is invalid; use \"cpu\" or \"cuda:<index>\""));
  }
  if (backend == v1::BACKEND_UNSPECIFIED) return cuda ? v1::BACKEND_NCCL : v1::BACKEND_GLOO;
  if (backend == v1::BACKEND_NCCL && !cuda) {
    return absl::InvalidArgumentError("backend=NCCL needs a device \"cuda:<index>\"");
  }
  return backend;
}

std::string NewToken() {
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(rd(), absl::kZeroPad8));
  return token;
}

std::string MemberKey(const std::string& job_id, const std::string& worker_id) {
  return absl::StrCat(job_id, "/", worker_id);
}

// "<job>/<sequence, 20 digits>": keys sort by job, then sequence.
std::string EventKey(const std::string& job_id, uint64_t sequence) {
  return absl::StrCat(job_id, "/", absl::Dec(sequence, absl::kZeroPad20));
}

v1::Directive Restart(uint64_t generation, const std::string& reason) {
  v1::Directive d;
  d.mutable_restart_at_generation()->set_generation(generation);
  d.mutable_restart_at_generation()->set_reason(reason);
  return d;
}

v1::Directive Stop(v1::JobPhase phase, const std::string& reason) {
  v1::Directive d;
  d.mutable_stop()->set_phase(phase);
  d.mutable_stop()->set_reason(reason);
  return d;
}

}  // namespace

struct Coordinator::Session {
  uint64_t id = 0;
  std::deque<v1::SessionMessage> outbox;
  SessionWaker waker;  // may be empty (a stream that waits on session_cv)
};

struct Coordinator::MemberRecord {
  v1::Member member;  // persisted
  absl::Time last_heartbeat;
  std::optional<Session> session;
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
  // An operator asked to drain it: member.drain_reason() is set (durable).
  bool draining() const { return !member.drain_reason().empty(); }
  // Wakes the thread streaming this member's session (NextSessionMessage)
  // when its outbox gets a message or the session changes. One per member
  // rather than an absl::Condition on mu_, whose waiters would all be
  // re-evaluated at every unlock: with thousands of open sessions that
  // made every heartbeat cost O(members). Shared so MemberRecord stays
  // movable; members are never erased, so the CondVar outlives its waiters.
  std::shared_ptr<absl::CondVar> session_cv = std::make_shared<absl::CondVar>();
};

struct Coordinator::JobRecord {
  v1::Job job;  // persisted
  std::string worker_token;  // persisted
  std::map<std::string, MemberRecord> members;  // by worker_id; never erased
  std::optional<plan::Plan> plan;               // the current generation, once formed
  spec::PlanGroups plan_groups;                       // spec::GroupsOfPlan(*plan) while plan is set
  // Sets (or, with nullopt, clears) the plan and the groups derived from it.
  void SetPlan(std::optional<plan::Plan> p) {
    plan = std::move(p);
    plan_groups = plan.has_value() ? spec::GroupsOfPlan(*plan) : spec::PlanGroups{};
  }
  // A member that was a SPARE no longer is one.
  void UncountSpare(v1::MemberState was) {
    if (was == v1::MEMBER_STATE_SPARE && job.num_spares() > 0) {
      job.set_num_spares(job.num_spares() - 1);
    }
  }
  absl::Time waiting_since;                     // entered PENDING / RECOVERING
  std::string last_end_reason;                  // why the last generation ended (not persisted)
  std::optional<absl::Time> last_call_deadline;
  v1::FormationReason pending_reason = v1::FORMATION_REASON_INITIAL;
  std::deque<v1::JobEvent> events;
  uint64_t next_sequence = 1;
  uint64_t progress_step = 0;  // last StepProgress emitted
  // Signalled at every event (EmitLocked). Every change that GetAssignment
  // and WaitEvents wait for (formation, a generation's end, a phase, a
  // member joining, leaving or lost) emits one. A CondVar rather than an
  // absl::Condition on mu_: with thousands of workers waiting in
  // GetAssignment, every unlock of mu_ re-evaluated every waiter, so each
  // join cost O(waiters). Shared so a waiter keeps it alive.
  std::shared_ptr<absl::CondVar> changed = std::make_shared<absl::CondVar>();
};

Coordinator::Coordinator(Clock* clock, StateStore* store, CoordinatorOptions options)
    : clock_(clock), store_(store), options_(options) {}

Coordinator::~Coordinator() = default;

// ---------------------------------------------------------------------------
// Persistence and recovery.

absl::Status Coordinator::PersistLocked(const JobRecord& job,
                                        const std::vector<const MemberRecord*>& members) {
  std::vector<Mutation> batch;
  batch.push_back(Mutation::Put("job", job.job.job_id(), job.job.SerializeAsString()));
  for (const MemberRecord* m : members) {
    batch.push_back(Mutation::Put("member", MemberKey(job.job.job_id(), m->member.worker_id()),
                                  m->member.SerializeAsString()));
  }
  absl::Status s = store_->Write(batch);
  if (!s.ok()) {
    std::fprintf(stderr, "coordinator: job %s generation %llu: state not saved: %s\n",
                 job.job.job_id().c_str(), static_cast<unsigned long long>(job.job.generation()),
                 std::string(s.message()).c_str());
  }
  return s;
}

absl::Status Coordinator::PersistAllMembersLocked(const JobRecord& job) {
  std::vector<const MemberRecord*> all;
  for (const auto& [id, m] : job.members) all.push_back(&m);
  return PersistLocked(job, all);
}

absl::Status Coordinator::Recover() {
  absl::StatusOr<std::vector<Record>> jobs = store_->Scan("job");
  if (!jobs.ok()) return jobs.status();
  absl::StatusOr<std::vector<Record>> tokens = store_->Scan("token");
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<Record>> members = store_->Scan("member");
  if (!members.ok()) return members.status();
  absl::StatusOr<std::vector<Record>> events = store_->Scan("event");
  if (!events.ok()) return events.status();

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const Record& r : *jobs) {
    auto record = std::make_unique<JobRecord>();
    if (!record->job.ParseFromString(r.value)) {
      return absl::DataLossError(absl::StrCat("stored job '", r.key, "' cannot be parsed"));
    }
    record->waiting_since = now;
    jobs_[r.key] = std::move(record);
  }
  for (const Record& r : *tokens) {
    if (auto it = jobs_.find(r.key); it != jobs_.end()) it->second->worker_token = r.value;
  }
  for (const Record& r : *members) {
    const size_t slash = r.key.find('/');
    auto it = jobs_.find(r.key.substr(0, slash));
    if (slash == std::string::npos || it == jobs_.end()) continue;
    MemberRecord m;
    if (!m.member.ParseFromString(r.value)) {
      return absl::DataLossError(absl::StrCat("stored member '", r.key, "' cannot be parsed"));
    }
    m.last_heartbeat = now;  // a fresh heartbeat clock after a restart
    if (m.member.has_rank()) m.previous_rank = static_cast<int>(m.member.rank());
    it->second->members[m.member.worker_id()] = std::move(m);
  }
  for (const Record& r : *events) {  // in key order: by job, then sequence
    auto it = jobs_.find(r.key.substr(0, r.key.rfind('/')));
    if (it == jobs_.end()) continue;
    v1::JobEvent e;
    if (!e.ParseFromString(r.value)) {
      return absl::DataLossError(absl::StrCat("stored event '", r.key, "' cannot be parsed"));
    }
    JobRecord& job = *it->second;
    job.next_sequence = std::max(job.next_sequence, e.sequence() + 1);
    job.events.push_back(std::move(e));
    if (job.events.size() > static_cast<size_t>(options_.max_events_per_job)) job.events.pop_front();
  }
  for (auto& [id, job] : jobs_) {
    // RUNNING, and COMPLETED (which only a RUNNING job becomes): the plan of
    // the last formed generation, so topology and shard-owner queries keep
    // answering after a restart.
    if (job->job.phase() == v1::JOB_PHASE_RUNNING ||
        (job->job.phase() == v1::JOB_PHASE_COMPLETED && job->job.dp() > 0)) {
      absl::StatusOr<plan::Plan> p = spec::PlanGeneration(job->job.spec(), job->job.dp());
      if (!p.ok()) {
        return absl::DataLossError(absl::StrCat("stored job '", id,
                                                "' cannot be planned again: ", p.status().message()));
      }
      job->SetPlan(*std::move(p));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Helpers under the lock.

Coordinator::JobRecord* Coordinator::FindJobLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const Coordinator::JobRecord* Coordinator::FindJobLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void Coordinator::EmitLocked(JobRecord& job, v1::JobEvent event) {
  job.changed->SignalAll();
  event.set_sequence(job.next_sequence++);
  *event.mutable_time() = ToProto(clock_->Now());
  event.set_job_id(job.job.job_id());
  event.set_generation(job.job.generation());
  // The log is durable so that sequence numbers survive a restart without
  // gaps or repeats (events.proto); an event whose write fails is logged and
  // kept in memory only.
  std::vector<Mutation> batch = {
      Mutation::Put("event", EventKey(job.job.job_id(), event.sequence()), event.SerializeAsString())};
  if (event.sequence() > static_cast<uint64_t>(options_.max_events_per_job)) {
    batch.push_back(Mutation::Delete(
        "event", EventKey(job.job.job_id(), event.sequence() - options_.max_events_per_job)));
  }
  if (absl::Status s = store_->Write(batch); !s.ok()) {
    std::fprintf(stderr, "coordinator: job %s: event %llu not saved: %s\n",
                 job.job.job_id().c_str(), static_cast<unsigned long long>(event.sequence()),
                 std::string(s.message()).c_str());
  }
  job.events.push_back(std::move(event));
  while (job.events.size() > static_cast<size_t>(options_.max_events_per_job)) {
    job.events.pop_front();
  }
}

void Coordinator::SetPhaseLocked(JobRecord& job, v1::JobPhase phase, const std::string& reason) {
  const v1::JobPhase old = job.job.phase();
  job.job.set_phase(phase);
  job.job.set_phase_reason(reason);
  *job.job.mutable_update_time() = ToProto(clock_->Now());
  if (old == phase) return;
  v1::JobEvent e;
  e.mutable_phase_changed()->set_old_phase(old);
  e.mutable_phase_changed()->set_new_phase(phase);
  e.mutable_phase_changed()->set_reason(reason);
  EmitLocked(job, std::move(e));
  std::fprintf(stderr, "coordinator: job %s generation %llu: %s -> %s%s%s\n",
               job.job.job_id().c_str(), static_cast<unsigned long long>(job.job.generation()),
               PhaseName(old).c_str(), PhaseName(phase).c_str(), reason.empty() ? "" : ": ",
               reason.c_str());
}

void Coordinator::PushLocked(MemberRecord& member, v1::SessionMessage message) {
  if (!member.session.has_value()) return;
  auto& outbox = member.session->outbox;
  if (outbox.size() >= kMaxOutbox) outbox.pop_front();  // a stuck stream loses the oldest
  outbox.push_back(std::move(message));
  WakeSessionLocked(member);
}

void Coordinator::WakeSessionLocked(MemberRecord& member) {
  member.session_cv->SignalAll();
  if (member.session.has_value() && member.session->waker) member.session->waker();
}

void Coordinator::EndSessionLocked(MemberRecord& member) {
  if (!member.session.has_value()) return;
  SessionWaker waker = std::move(member.session->waker);
  member.session.reset();
  member.session_cv->SignalAll();
  if (waker) waker();
}

void Coordinator::StopAllLocked(JobRecord& job) {
  for (auto& [id, m] : job.members) {
    if (!IsLive(m.member.state())) continue;
    v1::SessionMessage msg;
    *msg.mutable_directive() = Stop(job.job.phase(), job.job.phase_reason());
    PushLocked(m, std::move(msg));
  }
}

void Coordinator::EndGenerationLocked(JobRecord& job, v1::FormationReason reason,
                                      const std::string& why,
                                      std::vector<GenerationEnded>* ended) {
  const uint64_t old_generation = job.job.generation();
  if (ended != nullptr) ended->push_back({job.job.job_id(), old_generation, why});
  job.last_end_reason = why;
  job.job.set_generation(old_generation + 1);
  job.SetPlan(std::nullopt);
  job.last_call_deadline.reset();
  job.waiting_since = clock_->Now();
  job.pending_reason = reason;
  job.job.set_world_size(0);
  job.job.set_dp(0);
  job.job.set_num_spares(0);
  for (auto& [id, m] : job.members) {
    const v1::MemberState s = m.member.state();
    if (s != v1::MEMBER_STATE_ACTIVE && s != v1::MEMBER_STATE_SPARE &&
        s != v1::MEMBER_STATE_JOINING) {
      continue;
    }
    if (m.member.has_rank()) m.previous_rank = static_cast<int>(m.member.rank());
    m.member.clear_rank();
    m.member.set_state(v1::MEMBER_STATE_FENCED);
    v1::SessionMessage msg;
    *msg.mutable_directive() = Restart(job.job.generation(), why);
    PushLocked(m, std::move(msg));
  }
  SetPhaseLocked(job, v1::JOB_PHASE_RECOVERING, why);
  PersistAllMembersLocked(job).IgnoreError();  // logged inside
}

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
  // If the process is still there (a SIGSTOP'd worker keeps its TCP stream),
  // it learns on waking that it must re-join.
  v1::SessionMessage msg;
  *msg.mutable_directive() = Restart(job.job.generation() + (was == v1::MEMBER_STATE_ACTIVE ? 1 : 0),
                                     absl::StrCat("this worker was declared lost: ", detail));
  PushLocked(m, std::move(msg));

  v1::JobEvent e;
  v1::WorkerLost* lost = e.mutable_worker_lost();
  lost->set_worker_id(m.member.worker_id());
  lost->set_incarnation(m.member.incarnation());
  if (rank.has_value()) lost->set_rank(*rank);
  lost->set_reason(reason);
  lost->set_detail(detail);
  EmitLocked(job, std::move(e));
  std::fprintf(stderr, "coordinator: job %s generation %llu: worker %s%s lost: %s\n",
               job.job.job_id().c_str(), static_cast<unsigned long long>(job.job.generation()),
               m.member.worker_id().c_str(),
               rank.has_value() ? absl::StrCat(" (rank ", *rank, ")").c_str() : "",
               detail.c_str());

  if (was == v1::MEMBER_STATE_ACTIVE && job.job.phase() == v1::JOB_PHASE_RUNNING) {
    EndGenerationLocked(job,
                        reason == v1::LOSS_REASON_ERROR_REPORTED ||
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
  if (!spec::ChooseDp(job.job.spec(), others).has_value()) {
    SetPhaseLocked(job, v1::JOB_PHASE_FAILED,
                   absl::StrCat("worker '", worker_id, "' was ", detail, "; the other ", others,
                                " workers are fewer than the job needs (min_workers=",
                                job.job.spec().elastic().min_workers(),
                                ", tp*pp and a dp dividing the global batch)"));
    StopAllLocked(job);
    PersistAllMembersLocked(job).IgnoreError();
  }
}

void Coordinator::MaybeFormLocked(JobRecord& job, std::vector<GenerationEnded>* ended) {
  const v1::JobPhase phase = job.job.phase();
  if (phase != v1::JOB_PHASE_PENDING && phase != v1::JOB_PHASE_RECOVERING) return;
  const v1::ElasticPolicy& elastic = job.job.spec().elastic();
  const absl::Time now = clock_->Now();
  std::vector<MemberRecord*> candidates;
  bool anyone_fenced = false;
  for (auto& [id, m] : job.members) {
    if (m.member.state() == v1::MEMBER_STATE_JOINING &&
        m.member.generation() == job.job.generation()) {
      candidates.push_back(&m);
    }
    anyone_fenced |= m.member.state() == v1::MEMBER_STATE_FENCED;
  }
  const int count = static_cast<int>(candidates.size());
  const std::optional<int> dp = spec::ChooseDp(job.job.spec(), count);
  if (dp.has_value()) {
    if (!job.last_call_deadline.has_value()) {
      job.last_call_deadline = now + FromProto(elastic.last_call());
    }
    // Initial formation waits for max_workers or the last call; a recovery
    // also forms as soon as every survivor has re-joined.
    const bool ready = count >= static_cast<int>(elastic.max_workers()) ||
                       (phase == v1::JOB_PHASE_RECOVERING && !anyone_fenced) ||
                       now >= *job.last_call_deadline;
    if (ready) FormGenerationLocked(job, *dp, std::move(candidates));
    return;
  }
  job.last_call_deadline.reset();
  if (now - job.waiting_since > FromProto(elastic.join_timeout())) {
    const uint32_t model_parallel = job.job.spec().parallel().tp() * job.job.spec().parallel().pp();
    SetPhaseLocked(
        job, v1::JOB_PHASE_FAILED,
        absl::StrCat("only ", count, " workers joined within join_timeout ",
                     TimeUtil::ToString(elastic.join_timeout()), "; the job needs min_workers=",
                     elastic.min_workers(), " (tp*pp=", model_parallel,
                     ", and a dp dividing the global batch)",
                     // What emptied it: e.g. a worker that left because its
                     // host could not hold its rank.
                     phase == v1::JOB_PHASE_RECOVERING && !job.last_end_reason.empty()
                         ? absl::StrCat("; generation ", job.job.generation() - 1,
                                        " had ended: ", job.last_end_reason)
                         : ""));
    StopAllLocked(job);
    PersistAllMembersLocked(job).IgnoreError();
    (void)ended;
  }
}

void Coordinator::FormGenerationLocked(JobRecord& job, int dp,
                                       std::vector<MemberRecord*> candidates) {
  absl::StatusOr<plan::Plan> p = spec::PlanGeneration(job.job.spec(), dp);
  if (!p.ok()) {  // spec::ChooseDp checked this; an error here is a broken invariant.
    SetPhaseLocked(job, v1::JOB_PHASE_FAILED,
                   absl::StrCat("internal: cannot plan dp=", dp, ": ", p.status().message()));
    StopAllLocked(job);
    PersistAllMembersLocked(job).IgnoreError();
    return;
  }
  // Survivors keep their relative order (their previous ranks), then the
  // others in the order they joined.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const MemberRecord* a, const MemberRecord* b) {
                     const bool ar = a->previous_rank >= 0, br = b->previous_rank >= 0;
                     if (ar != br) return ar;
                     if (ar) return a->previous_rank < b->previous_rank;
                     const absl::Time ta = FromProto(a->member.join_time());
                     const absl::Time tb = FromProto(b->member.join_time());
                     if (ta != tb) return ta < tb;
                     return a->member.worker_id() < b->member.worker_id();
                   });
  const int world = p->parallel.world_size();
  job.SetPlan(*std::move(p));
  job.job.set_world_size(world);
  job.job.set_dp(dp);
  job.job.set_num_spares(static_cast<uint32_t>(candidates.size()) - world);
  job.last_call_deadline.reset();

  v1::JobEvent e;
  v1::GenerationFormed* formed = e.mutable_generation_formed();
  formed->set_generation(job.job.generation());
  formed->set_reason(job.pending_reason);
  formed->set_world_size(world);
  formed->set_dp(dp);
  if (job.job.has_last_checkpoint()) *formed->mutable_restore() = job.job.last_checkpoint();
  for (size_t i = 0; i < candidates.size(); ++i) {
    v1::Member& m = candidates[i]->member;
    if (static_cast<int>(i) < world) {
      m.set_state(v1::MEMBER_STATE_ACTIVE);
      m.set_rank(static_cast<uint32_t>(i));
      candidates[i]->generation_start_step =
          job.job.has_last_checkpoint() ? job.job.last_checkpoint().step() : 0;
      candidates[i]->previous_rank = static_cast<int>(i);
      formed->add_worker_ids(m.worker_id());
    } else {
      m.set_state(v1::MEMBER_STATE_SPARE);
      m.clear_rank();
      formed->add_spares(m.worker_id());
    }
  }
  SetPhaseLocked(job, v1::JOB_PHASE_RUNNING,
                 absl::StrCat("generation ", job.job.generation(), " formed: world ", world,
                              ", dp ", dp, ", ", job.job.num_spares(), " spares"));
  EmitLocked(job, std::move(e));
  for (MemberRecord* m : candidates) {
    v1::SessionMessage msg;
    absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(job, *m);
    if (a.ok()) *msg.mutable_assignment() = *std::move(a);
    PushLocked(*m, std::move(msg));
  }
  PersistAllMembersLocked(job).IgnoreError();
  // Forming counts as a sign of life for every member of the generation:
  // its heartbeats may have waited on this lock while a large generation
  // was planned, assigned and written, and the coordinator's own delay must
  // not get them declared lost.
  const absl::Time now = clock_->Now();
  for (MemberRecord* m : candidates) m->last_heartbeat = std::max(m->last_heartbeat, now);
}

absl::StatusOr<v1::Assignment> Coordinator::GetAssignmentLocked(const JobRecord& job,
                                                                const MemberRecord& m) const {
  if (!job.plan.has_value() || m.member.generation() != job.job.generation() ||
      (m.member.state() != v1::MEMBER_STATE_ACTIVE && m.member.state() != v1::MEMBER_STATE_SPARE)) {
    return absl::FailedPreconditionError("no assignment yet");
  }
  v1::Assignment a;
  const v1::JobSpec& spec = job.job.spec();
  if (m.member.state() == v1::MEMBER_STATE_ACTIVE) {
    a = spec::AssignmentFor(*job.plan, job.plan_groups, static_cast<int>(m.member.rank()));
    if (job.job.has_last_checkpoint()) *a.mutable_restore() = job.job.last_checkpoint();
    const uint64_t start = job.job.has_last_checkpoint() ? job.job.last_checkpoint().step() : 0;
    a.set_start_step(start);
    a.set_data_cursor(start * spec.training().global_batch());
  } else {
    a.set_spare(true);
    a.set_world_size(job.plan->parallel.world_size());
    a.set_dp(job.plan->parallel.dp);
    *a.mutable_parallel() = spec::ParallelToProto(job.plan->parallel);
  }
  a.set_generation(job.job.generation());
  return a;
}

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
    return absl::AbortedError(absl::StrCat(
        "incarnation ", fence.worker().incarnation(), " of worker '", m.member.worker_id(),
        "' was replaced by incarnation ", m.member.incarnation(), "; this process is fenced off"));
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
  if (state == v1::MEMBER_STATE_FENCED || fence.generation() != job->job.generation()) {
    return absl::AbortedError(absl::StrCat(
        "generation ", fence.generation(), " is over (current ", job->job.generation(), "): ",
        job->job.phase_reason(), "; abort communicators and re-join with JoinJob"));
  }
  return &m;
}

// ---------------------------------------------------------------------------
// JobService.

absl::StatusOr<v1::CreateJobResponse> Coordinator::CreateJob(const v1::CreateJobRequest& in) {
  v1::CreateJobRequest request = in;
  if (!request.job_id().empty()) {
    if (absl::Status s = ValidJobId(request.job_id()); !s.ok()) return s;
  }
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(request.spec());
  if (!spec.ok()) return spec.status();
  absl::MutexLock lock(&mu_);
  if (request.job_id().empty()) {  // the coordinator picks a fresh id
    std::random_device rd;
    do {
      request.set_job_id(absl::StrCat("job-", absl::Hex(rd(), absl::kZeroPad8)));
    } while (jobs_.count(request.job_id()) > 0);
  }
  if (JobRecord* existing = FindJobLocked(request.job_id())) {
    if (!google::protobuf::util::MessageDifferencer::Equals(existing->job.spec(), *spec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", request.job_id(), "' exists with a different spec; choose another job_id"));
    }
    v1::CreateJobResponse response;
    *response.mutable_job() = existing->job;
    response.set_worker_token(existing->worker_token);
    return response;
  }
  // Finished jobs stay queryable but do not count against the limit.
  size_t live_jobs = 0;
  for (const auto& [id, j] : jobs_) live_jobs += !IsTerminal(j->job.phase());
  if (live_jobs >= static_cast<size_t>(options_.max_jobs)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator runs its maximum of ", options_.max_jobs,
                     " unfinished jobs; cancel ones you no longer need"));
  }
  auto job = std::make_unique<JobRecord>();
  const absl::Time now = clock_->Now();
  job->job.set_job_id(request.job_id());
  *job->job.mutable_spec() = *spec;
  job->job.set_phase(v1::JOB_PHASE_PENDING);
  job->job.set_phase_reason("waiting for workers");
  job->job.set_generation(1);
  *job->job.mutable_create_time() = ToProto(now);
  *job->job.mutable_update_time() = ToProto(now);
  job->worker_token = NewToken();
  job->waiting_since = now;
  std::vector<Mutation> batch = {
      Mutation::Put("job", request.job_id(), job->job.SerializeAsString()),
      Mutation::Put("token", request.job_id(), job->worker_token)};
  if (absl::Status s = store_->Write(batch); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("job not created, state store: ", s.message()));
  }
  v1::JobEvent e;
  e.mutable_phase_changed()->set_new_phase(v1::JOB_PHASE_PENDING);
  e.mutable_phase_changed()->set_reason("created");
  EmitLocked(*job, std::move(e));
  v1::CreateJobResponse response;
  *response.mutable_job() = job->job;
  response.set_worker_token(job->worker_token);
  jobs_[request.job_id()] = std::move(job);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) const {
  if (request.page_size() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("page_size=", request.page_size(),
                                                   " is too large; use at most 1000"));
  }
  const size_t page_size = request.page_size() == 0 ? 100 : request.page_size();
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse response;
  // The page token is the last job_id of the previous page (ids sort).
  for (auto it = jobs_.upper_bound(request.page_token()); it != jobs_.end(); ++it) {
    const v1::Job& job = it->second->job;
    if (!request.phases().empty() &&
        std::find(request.phases().begin(), request.phases().end(), job.phase()) ==
            request.phases().end()) {
      continue;
    }
    if (static_cast<size_t>(response.jobs_size()) == page_size) {
      response.set_next_page_token(response.jobs(response.jobs_size() - 1).job_id());
      break;
    }
    *response.add_jobs() = job;
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const v1::CancelJobRequest& request) {
  // The reason becomes phase_reason, which `job get` and every STOP print.
  if (absl::Status s = CheckText("reason", request.reason(), spec::kMaxReasonBytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(request.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", request.job_id(), "'"));
  const v1::JobPhase phase = job->job.phase();
  if (phase == v1::JOB_PHASE_CANCELLED) return job->job;
  if (IsTerminal(phase)) {
    return absl::FailedPreconditionError(absl::StrCat("job '", request.job_id(), "' already ",
                                                      PhaseName(phase), "; nothing to cancel"));
  }
  SetPhaseLocked(*job, v1::JOB_PHASE_CANCELLED,
                 request.reason().empty() ? "cancelled" : absl::StrCat("cancelled: ", request.reason()));
  StopAllLocked(*job);
  PersistLocked(*job, {}).IgnoreError();
  return job->job;
}

absl::StatusOr<v1::ListMembersResponse> Coordinator::ListMembers(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  std::vector<const v1::Member*> active, others;
  for (const auto& [id, m] : job->members) {
    (m.member.state() == v1::MEMBER_STATE_ACTIVE && m.member.has_rank() ? active : others)
        .push_back(&m.member);
  }
  std::sort(active.begin(), active.end(),
            [](const v1::Member* a, const v1::Member* b) { return a->rank() < b->rank(); });
  v1::ListMembersResponse response;
  response.set_generation(job->job.generation());
  for (const auto* list : {&active, &others}) {
    for (const v1::Member* m : *list) *response.add_members() = *m;
  }
  return response;
}

absl::StatusOr<v1::Plan> Coordinator::GetPlan(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (!job->plan.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' has no formed generation (phase ", PhaseName(job->job.phase()),
        ", generation ", job->job.generation(), "): ", job->job.phase_reason()));
  }
  return spec::PlanToProto(*job->plan, job_id, job->job.generation());
}

absl::StatusOr<v1::GetShardOwnerResponse> Coordinator::GetShardOwner(
    const v1::GetShardOwnerRequest& request) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(request.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", request.job_id(), "'"));
  if (!job->plan.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", request.job_id(), "' has no formed generation yet; shard owners exist once it runs"));
  }
  const plan::Plan& p = *job->plan;
  std::optional<int64_t> element;
  if (request.has_element_index()) {
    if (request.element_index() > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError("element_index is out of range");
    }
    element = static_cast<int64_t>(request.element_index());
  }
  absl::StatusOr<std::vector<plan::Holder>> holders =
      plan::FindOwners(p.zero, p.topology, p.parameters, request.parameter(), element);
  if (!holders.ok()) return holders.status();
  const plan::ParameterSpec* spec = nullptr;
  for (const plan::ParameterSpec& s : p.parameters) {
    if (s.name == request.parameter()) spec = &s;
  }
  v1::GetShardOwnerResponse response;
  response.set_parameter(request.parameter());
  for (int64_t d : spec->shape) response.add_global_shape(d);
  response.set_numel(spec->numel());
  response.set_zero_stage(p.parallel.zero_stage);
  response.set_generation(job->job.generation());
  for (const plan::Holder& h : *holders) {
    *response.add_holders() = spec::HolderToProto(h, *spec, p.parallel.tp);
  }
  return response;
}

absl::StatusOr<std::vector<v1::JobEvent>> Coordinator::WaitEvents(
    const std::string& job_id, std::optional<uint64_t> after, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const uint64_t from = after.value_or(0);
  const std::shared_ptr<absl::CondVar> changed = job->changed;
  while (job->next_sequence <= from + 1 && !changed->WaitWithDeadline(&mu_, deadline)) {
  }
  std::vector<v1::JobEvent> out;
  for (const v1::JobEvent& e : job->events) {
    if (e.sequence() > from) out.push_back(e);
  }
  return out;
}

absl::StatusOr<std::string> Coordinator::WorkerToken(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->worker_token;
}

// ---------------------------------------------------------------------------
// WorkerService.

absl::StatusOr<v1::JoinJobResponse> Coordinator::JoinJob(const v1::JoinJobRequest& request) {
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
  for (const auto& [id, other] : job->members) {
    if (id != w.worker_id() && IsLive(other.member.state()) && other.member.backend() != *backend) {
      return absl::FailedPreconditionError(absl::StrCat(
          "backend ", v1::Backend_Name(*backend), " differs from worker '", id, "' (",
          v1::Backend_Name(other.member.backend()), "); every worker of a job uses one backend"));
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
  if (!inserted && m.member.incarnation() == w.incarnation() &&
      m.member.state() == v1::MEMBER_STATE_LOST &&
      m.member.loss_reason() == v1::LOSS_REASON_REPEATED_ERRORS) {
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
      // A repeated join of the current generation: nothing changes.
      v1::JoinJobResponse response;
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
    EndSessionLocked(m);
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
  m.member.set_device(device);
  m.member.set_backend(*backend);
  m.member.clear_rank();
  m.member.set_detail("");
  m.member.set_generation(job->job.generation());
  m.last_heartbeat = now;  // a fresh heartbeat clock
  if (job->job.phase() == v1::JOB_PHASE_RUNNING) {
    // The world is formed: a newcomer waits as a spare; the job grows at
    // the next committed checkpoint (NoteCheckpointCommitted).
    m.member.set_state(v1::MEMBER_STATE_SPARE);
    job->job.set_num_spares(job->job.num_spares() + 1);
  } else {
    m.member.set_state(v1::MEMBER_STATE_JOINING);
  }
  if (absl::Status s = PersistLocked(*job, {&m}); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("join not recorded, state store: ", s.message()));
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
    PushLocked(m, std::move(msg));
  }
  MaybeFormLocked(*job, &ended);
  pending_ended_.insert(pending_ended_.end(), ended.begin(), ended.end());
  v1::JoinJobResponse response;
  response.set_generation(job->job.generation());
  response.set_state(m.member.state());
  *response.mutable_spec() = job->job.spec();
  response.set_phase(job->job.phase());
  return response;
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
  EndSessionLocked(m);  // an older stream of this incarnation ends
  m.session = Session{next_session_id_++, {}, std::move(waker)};
  m.last_heartbeat = clock_->Now();
  v1::SessionMessage opened;
  opened.mutable_opened()->set_generation(job->job.generation());
  opened.mutable_opened()->set_state(m.member.state());
  PushLocked(m, std::move(opened));
  if (absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(*job, m); a.ok()) {
    v1::SessionMessage msg;
    *msg.mutable_assignment() = *std::move(a);
    PushLocked(m, std::move(msg));
  } else if (m.member.state() == v1::MEMBER_STATE_FENCED) {
    v1::SessionMessage msg;
    *msg.mutable_directive() = Restart(job->job.generation(), job->job.phase_reason());
    PushLocked(m, std::move(msg));
  }
  return m.session->id;
}

absl::StatusOr<std::optional<v1::SessionMessage>> Coordinator::NextSessionMessage(
    const v1::WorkerIdentity& w, uint64_t session_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(w.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", w.job_id(), "'"));
  auto it = job->members.find(w.worker_id());
  if (it == job->members.end()) return absl::NotFoundError("unknown worker");
  MemberRecord* m = &it->second;
  auto ready = [m, session_id]() {
    return !m->session.has_value() || m->session->id != session_id || !m->session->outbox.empty();
  };
  // Keep our own reference: the CondVar must outlive this wait.
  const std::shared_ptr<absl::CondVar> cv = m->session_cv;
  while (!ready() && !cv->WaitWithDeadline(&mu_, deadline)) {
  }
  if (!m->session.has_value() || m->session->id != session_id ||
      m->member.incarnation() != w.incarnation()) {
    return absl::AbortedError("this session was replaced or closed");
  }
  if (m->session->outbox.empty()) return std::optional<v1::SessionMessage>();
  v1::SessionMessage msg = std::move(m->session->outbox.front());
  m->session->outbox.pop_front();
  return std::optional<v1::SessionMessage>(std::move(msg));
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
  if (m.member.incarnation() != w.incarnation() || !m.session.has_value() ||
      m.session->id != session_id) {
    return ended;
  }
  EndSessionLocked(m);
  if (!IsTerminal(job->job.phase())) {
    LoseMemberLocked(*job, m, v1::LOSS_REASON_STREAM_BROKEN, "its session stream broke", &ended);
    MaybeFormLocked(*job, &ended);
  }
  return ended;
}

absl::StatusOr<FencedWorker> Coordinator::CheckFence(const v1::Fence& fence) {
  absl::MutexLock lock(&mu_);
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

absl::StatusOr<v1::Assignment> Coordinator::GetAssignment(const v1::Fence& fence, bool wait,
                                                          absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = nullptr;
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(fence, &job);
  if (!m.ok()) return m.status();
  const uint64_t generation = fence.generation();
  MemberRecord* member = *m;
  const uint64_t incarnation = member->member.incarnation();
  auto settled = [job, member, generation, incarnation]() {
    const v1::MemberState s = member->member.state();
    return job->job.generation() != generation || IsTerminal(job->job.phase()) ||
           member->member.incarnation() != incarnation ||
           (job->plan.has_value() &&
            (s == v1::MEMBER_STATE_ACTIVE || s == v1::MEMBER_STATE_SPARE)) ||
           !IsLive(s);
  };
  const std::shared_ptr<absl::CondVar> changed = job->changed;
  while (wait && !settled() && !changed->WaitWithDeadline(&mu_, deadline)) {
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

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
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
  JobRecord* job = nullptr;
  absl::StatusOr<MemberRecord*> m = CheckFenceLocked(request.fence(), &job);
  if (!m.ok()) return m.status();
  if (request.state() == v1::WORKER_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError("state is UNSPECIFIED; say what the worker is doing");
  }
  const uint64_t steps = job->job.spec().training().train_steps();
  if (request.step() > steps || request.metrics().step() > steps) {
    return absl::InvalidArgumentError(absl::StrCat("step=", request.step(), " (metrics.step=",
                                                   request.metrics().step(),
                                                   ") is beyond train_steps=", steps));
  }
  v1::Member& member = (*m)->member;
  member.set_step(std::max(member.step(), request.step()));
  member.set_worker_state(request.state());
  *member.mutable_last_heartbeat_time() = ToProto(clock_->Now());
  // Success is a step done in this generation: states such as READY come
  // before the parts that can fail every time (opening the data, restoring),
  // and a heartbeat racing the worker's error report must not reset it.
  if (member.state() == v1::MEMBER_STATE_ACTIVE && request.step() > (*m)->generation_start_step) {
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
  bool all_done = job->job.phase() == v1::JOB_PHASE_RUNNING &&
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

absl::StatusOr<v1::ReportErrorResponse> Coordinator::ReportError(
    const v1::ReportErrorRequest& request, std::vector<GenerationEnded>* ended,
    const std::vector<v1::CheckpointRef>& committed, UnusableCheckpointMarks* marks) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = nullptr;
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
  const std::string what = absl::StrCat(
      "rank ", (*m)->member.has_rank() ? absl::StrCat((*m)->member.rank()) : "?", " (", reporter,
      ") reported ", absl::StatusCodeToString(static_cast<absl::StatusCode>(request.code())),
      request.operation().empty() ? "" : absl::StrCat(" in ", request.operation()), ": ",
      request.message());
  if (request.has_peer_rank()) {
    // Declare the peer lost only if it also looks dead from here.
    const absl::Duration grace =
        2 * FromProto(job->job.spec().elastic().heartbeat_interval());
    for (auto& [id, peer] : job->members) {
      if (peer.member.state() == v1::MEMBER_STATE_ACTIVE && peer.member.has_rank() &&
          peer.member.rank() == request.peer_rank() && id != reporter &&
          (!peer.session.has_value() || clock_->Now() - peer.last_heartbeat > grace)) {
        LoseMemberLocked(*job, peer, v1::LOSS_REASON_ERROR_REPORTED, what, ended);
        break;
      }
    }
  }
  if (job->job.phase() == v1::JOB_PHASE_RUNNING &&
      job->job.generation() == request.fence().generation()) {
    MemberRecord& reporter_record = **m;
    const std::string& restoring = job->job.last_checkpoint().checkpoint_id();
    if (request.code() == static_cast<int>(absl::StatusCode::kDataLoss) && !restoring.empty() &&
        (absl::StrContains(request.message(), restoring) ||
         absl::StrContains(request.operation(), restoring))) {
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
  const bool graceful = m.member.state() == v1::MEMBER_STATE_ACTIVE &&
                        job->job.phase() == v1::JOB_PHASE_RUNNING &&
                        !job->job.spec().checkpoint().directory().empty();
  if (!graceful) {
    RemoveDrainedLocked(*job, m, ended);
    MaybeFormLocked(*job, ended);
    return m.member;
  }
  // Save first: every rank is asked for a checkpoint after its next step
  // (the ranks agree on which step through their own all-reduce); the
  // commit takes the member out (NoteCheckpointCommitted).
  m.member.set_drain_after_step(job->job.step());
  m.member.set_detail(absl::StrCat("draining (", m.member.drain_reason(),
                                   "): leaves after the next checkpoint commits"));
  if (absl::Status s = PersistLocked(*job, {&m}); !s.ok()) {
    // Kept in memory: the drain still happens unless this coordinator
    // restarts before the checkpoint commits.
    std::fprintf(stderr, "coordinator: job %s: drain of %s not saved: %s\n", job_id.c_str(),
                 worker_id.c_str(), std::string(s.message()).c_str());
  }
  for (auto& [id, other] : job->members) {
    if (other.member.state() != v1::MEMBER_STATE_ACTIVE) continue;
    v1::SessionMessage msg;
    msg.mutable_directive()->mutable_checkpoint()->set_step(job->job.step() + 1);
    PushLocked(other, std::move(msg));
  }
  return m.member;
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
  PushLocked(m, std::move(msg));
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
  EndSessionLocked(m);
  v1::JobEvent e;
  v1::WorkerLeft* left = e.mutable_worker_left();
  left->set_worker_id(w.worker_id());
  left->set_incarnation(w.incarnation());
  if (rank.has_value()) left->set_rank(*rank);
  left->set_reason(request.reason());
  EmitLocked(*job, std::move(e));
  job->UncountSpare(was);
  if (was == v1::MEMBER_STATE_ACTIVE && job->job.phase() == v1::JOB_PHASE_RUNNING) {
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

std::vector<GenerationEnded> Coordinator::Tick() {
  std::vector<GenerationEnded> ended;
  absl::MutexLock lock(&mu_);
  ended.swap(pending_ended_);
  const absl::Time now = clock_->Now();
  for (auto& [id, job] : jobs_) {
    if (IsTerminal(job->job.phase())) continue;
    const absl::Duration timeout = FromProto(job->job.spec().elastic().heartbeat_timeout());
    for (auto& [worker_id, m] : job->members) {
      if (IsLive(m.member.state()) && now - m.last_heartbeat > timeout) {
        LoseMemberLocked(*job, m, v1::LOSS_REASON_HEARTBEAT_TIMEOUT,
                         absl::StrCat("no heartbeat for ",
                                      absl::FormatDuration(absl::Trunc(
                                          now - m.last_heartbeat, absl::Milliseconds(1))),
                                      " (heartbeat_timeout ", absl::FormatDuration(timeout), ")"),
                         &ended);
      }
    }
    MaybeFormLocked(*job, &ended);
  }
  return ended;
}

absl::Status Coordinator::NoteCheckpointCommitted(const std::string& job_id,
                                                  const v1::CheckpointRef& ref,
                                                  uint64_t total_bytes,
                                                  std::vector<GenerationEnded>* ended,
                                                  const UnusableCheckpointMarks* marks) {
  const bool unusable =
      marks != nullptr && marks->UnusableReason(job_id, ref.checkpoint_id()).has_value();
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if ((!job->job.has_last_checkpoint() || ref.step() >= job->job.last_checkpoint().step()) &&
      !unusable) {
    *job->job.mutable_last_checkpoint() = ref;
  }
  v1::JobEvent e;
  e.mutable_checkpoint_committed()->set_checkpoint_id(ref.checkpoint_id());
  e.mutable_checkpoint_committed()->set_step(ref.step());
  e.mutable_checkpoint_committed()->set_total_bytes(total_bytes);
  EmitLocked(*job, std::move(e));
  absl::Status persisted = PersistLocked(*job, {});
  // Drains waiting for this checkpoint: the members leave now and the job
  // re-forms without them from `ref`.
  bool drained = false;
  if (persisted.ok() && job->job.phase() == v1::JOB_PHASE_RUNNING &&
      job->job.has_last_checkpoint() &&
      job->job.last_checkpoint().checkpoint_id() == ref.checkpoint_id()) {
    std::vector<GenerationEnded>& out = ended != nullptr ? *ended : pending_ended_;
    for (auto& [id, m] : job->members) {
      if (m.draining() && IsLive(m.member.state()) && ref.step() > m.member.drain_after_step()) {
        RemoveDrainedLocked(*job, m, &out);
        drained = true;
      }
    }
    if (drained) MaybeFormLocked(*job, &out);
  }
  // Grow only from a restore point that is durable and is `ref` itself (not
  // an older or unusable checkpoint committed late).
  if (!drained && persisted.ok() && job->job.has_last_checkpoint() &&
      job->job.last_checkpoint().checkpoint_id() == ref.checkpoint_id()) {
    std::vector<GenerationEnded> grown;
    MaybeGrowLocked(*job, ref, &grown);
    std::vector<GenerationEnded>& out = ended != nullptr ? *ended : pending_ended_;
    out.insert(out.end(), grown.begin(), grown.end());
  }
  return persisted;
}

void Coordinator::MaybeGrowLocked(JobRecord& job, const v1::CheckpointRef& ref,
                                  std::vector<GenerationEnded>* ended) {
  if (job.job.phase() != v1::JOB_PHASE_RUNNING) return;
  // The last step: the ranks are about to finish; a restart would only redo it.
  if (ref.step() >= job.job.spec().training().train_steps()) return;
  int ranks = 0;
  int spares = 0;  // healthy: of this generation, with a live session stream
  for (const auto& [id, m] : job.members) {
    if (m.member.generation() != job.job.generation()) continue;
    if (m.member.state() == v1::MEMBER_STATE_ACTIVE) ++ranks;
    if (m.member.state() == v1::MEMBER_STATE_SPARE && m.session.has_value()) ++spares;
  }
  if (spares == 0) return;
  const std::optional<int> dp = spec::ChooseDp(job.job.spec(), ranks + spares);
  if (!dp.has_value() || *dp <= static_cast<int>(job.job.dp())) return;
  const uint64_t model_parallel =
      uint64_t{job.job.spec().parallel().tp()} * job.job.spec().parallel().pp();
  EndGenerationLocked(job, v1::FORMATION_REASON_GROW,
                      absl::StrCat("grow: ", spares, " spares joined; world ",
                                   job.job.world_size(), " -> ", *dp * model_parallel,
                                   " at checkpoint step ", ref.step()),
                      ended);
}

void Coordinator::NoteCheckpointAborted(const std::string& job_id,
                                        const std::string& checkpoint_id, uint64_t step,
                                        const std::string& reason) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return;
  v1::JobEvent e;
  e.mutable_checkpoint_aborted()->set_checkpoint_id(checkpoint_id);
  e.mutable_checkpoint_aborted()->set_step(step);
  e.mutable_checkpoint_aborted()->set_reason(reason);
  EmitLocked(*job, std::move(e));
}

void Coordinator::FallBackFromRestorePointLocked(JobRecord& job, const std::string& what,
                                                 const std::vector<v1::CheckpointRef>& committed,
                                                 UnusableCheckpointMarks* marks,
                                                 std::vector<GenerationEnded>* ended) {
  const v1::CheckpointRef bad = job.job.last_checkpoint();
  // The mark first, so that a crash cannot restore the corrupt one again
  // (the job record with the new restore point follows in
  // EndGenerationLocked's write).
  if (marks != nullptr) {
    absl::Status s = marks->MarkUnusable(job.job.job_id(), bad.checkpoint_id(), what);
    if (!s.ok()) {
      std::fprintf(stderr, "coordinator: job %s: unusable mark of %s not saved: %s\n",
                   job.job.job_id().c_str(), bad.checkpoint_id().c_str(),
                   std::string(s.message()).c_str());
    }
  }
  // The previous usable one: the newest committed strictly older than the
  // corrupt one (a newer one would have been the restore point already).
  const v1::CheckpointRef* previous = nullptr;
  for (const v1::CheckpointRef& c : committed) {
    if (c.step() >= bad.step() || c.checkpoint_id().empty() ||
        (marks != nullptr && marks->UnusableReason(job.job.job_id(), c.checkpoint_id()))) {
      continue;
    }
    if (previous == nullptr || c.step() > previous->step()) previous = &c;
  }
  std::string why = absl::StrCat("restore point ", bad.checkpoint_id(), " (step ", bad.step(),
                                 ") is unusable (", what, "); ");
  if (previous != nullptr) {
    absl::StrAppend(&why, "falling back to the previous committed checkpoint ",
                    previous->checkpoint_id(), " (step ", previous->step(), ")");
    *job.job.mutable_last_checkpoint() = *previous;
  } else {
    absl::StrAppend(&why, "no earlier committed checkpoint is usable: restarting from step 0");
    job.job.clear_last_checkpoint();
  }
  std::fprintf(stderr, "coordinator: job %s: %s\n", job.job.job_id().c_str(), why.c_str());
  v1::JobEvent e;
  e.mutable_checkpoint_aborted()->set_checkpoint_id(bad.checkpoint_id());
  e.mutable_checkpoint_aborted()->set_step(bad.step());
  e.mutable_checkpoint_aborted()->set_reason(
      absl::StrCat("not restorable (still listed as committed): ", what));
  EmitLocked(job, std::move(e));
  EndGenerationLocked(job, v1::FORMATION_REASON_ERROR_REPORTED, why, ended);
}

}  // namespace shardline::server

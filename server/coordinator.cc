// The coordinator's core: construction and recovery, the helpers every
// part uses under the lock (jobs, events, phases), the JobService calls, and
// what the checkpoint component reports (committed, aborted, a corrupt
// restore point).
// The other parts of the class are defined in coordinator_formation.cc,
// coordinator_membership.cc, coordinator_failure.cc, coordinator_worker.cc
// and coordinator_persistence.cc; its records are in coordinator_records.h.
#include "server/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "plan/zero.h"
#include "server/coordinator_records.h"
#include "server/coordinator_validation.h"
#include "server/event_log.h"
#include "spec/job_spec.h"
#include "spec/plan_proto.h"

namespace shardline::server {
Coordinator::Coordinator(Clock* clock, StateStore* store, CoordinatorOptions options)
    : clock_(clock), store_(store), options_(options) {}

Coordinator::~Coordinator() = default;

void Coordinator::RestartHeartbeatClocks() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [id, job] : jobs_) {
    for (auto& [worker_id, m] : job->members) m.last_heartbeat = now;
    // Progress reports were refused as well: the stall clock restarts too,
    // or the first Tick would judge the pause a hang.
    job->last_progress = now;
    job->hang_reported = false;
  }
}

absl::Status Coordinator::Recover() {
  absl::StatusOr<std::vector<Record>> jobs = store_->Scan("job");
  if (!jobs.ok()) return jobs.status();
  // Worker tokens: their hashes; plain text from an older version is
  // hashed and deleted first (the coordinator keeps no token).
  absl::StatusOr<std::vector<Record>> plain_tokens = store_->Scan(kPlainTokenKind);
  if (!plain_tokens.ok()) return plain_tokens.status();
  if (!plain_tokens->empty()) {
    std::vector<Mutation> migrate;
    for (const Record& r : *plain_tokens) {
      migrate.push_back(Mutation::Put(kTokenHashKind, r.key, Sha256Hex(r.value)));
      migrate.push_back(Mutation::Delete(kPlainTokenKind, r.key));
    }
    if (absl::Status s = store_->Write(migrate); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot replace the plain-text worker tokens of an older state file by "
                       "their hashes: ",
                       s.message()));
    }
    LogLine(absl::StrCat("state: replaced ", plain_tokens->size(),
                         " plain-text worker token(s) by their SHA-256 hashes"));
  }
  absl::StatusOr<std::vector<Record>> tokens = store_->Scan(kTokenHashKind);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<Record>> member_tokens = store_->Scan(kMemberTokenKind);
  if (!member_tokens.ok()) return member_tokens.status();
  absl::StatusOr<std::vector<Record>> members = store_->Scan("member");
  if (!members.ok()) return members.status();
  absl::StatusOr<std::vector<Record>> events = store_->Scan(EventLog::kStoreKind);
  if (!events.ok()) return events.status();

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const Record& r : *jobs) {
    auto record = std::make_unique<JobRecord>(store_, options_.max_events_per_job);
    if (!record->job.ParseFromString(r.value)) {
      return absl::DataLossError(absl::StrCat("stored job '", r.key, "' cannot be parsed"));
    }
    record->waiting_since = now;
    jobs_[r.key] = std::move(record);
  }
  for (const Record& r : *tokens) {
    if (!IsSha256Hex(r.value)) {
      return absl::DataLossError(
          absl::StrCat("stored worker token hash of job '", r.key, "' is not SHA-256 hex"));
    }
    if (auto it = jobs_.find(r.key); it != jobs_.end()) it->second->worker_token_hash = r.value;
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
    it->second->events.Restore(std::move(e));
  }
  for (const Record& r : *member_tokens) {  // "<incarnation> <sha256 hex>"
    const size_t slash = r.key.find('/');
    const size_t space = r.value.find(' ');
    uint64_t incarnation = 0;
    if (slash == std::string::npos || space == std::string::npos ||
        !absl::SimpleAtoi(r.value.substr(0, space), &incarnation) ||
        !IsSha256Hex(r.value.substr(space + 1))) {
      return absl::DataLossError(absl::StrCat("stored member token '", r.key, "' is malformed"));
    }
    auto job = jobs_.find(r.key.substr(0, slash));
    if (job == jobs_.end()) continue;
    auto m = job->second->members.find(r.key.substr(slash + 1));
    // Only the current incarnation's token counts.
    if (m == job->second->members.end() || m->second.member.incarnation() != incarnation) {
      continue;
    }
    m->second.token_hash = r.value.substr(space + 1);
  }
  for (auto& [id, job] : jobs_) {
    // RUNNING, and COMPLETED (which only a RUNNING job becomes): the plan of
    // the last formed generation, so topology and shard-owner queries keep
    // answering after a restart.
    // An external job has no plan: its stored world_size is its formation.
    if (spec::IsExternalJob(job->job.spec())) continue;
    if (job->job.phase() == v1::JOB_PHASE_RUNNING ||
        (job->job.phase() == v1::JOB_PHASE_COMPLETED && job->job.dp() > 0)) {
      absl::StatusOr<plan::Plan> p = spec::PlanGeneration(job->job.spec(), job->job.dp());
      if (!p.ok()) {
        return absl::DataLossError(absl::StrCat("stored job '", id,
                                                "' cannot be planned again: ", p.status().message()));
      }
      job->SetPlan(*std::move(p));
      // The ranks, a fresh stall clock and empty straggler windows, as at
      // formation (progress is in memory only).
      if (job->job.phase() == v1::JOB_PHASE_RUNNING) ProgressGenerationFormedLocked(*job);
    }
  }
  RegisterCredentialsLocked();
  return absl::OkStatus();
}

void Coordinator::UseCredentials(Authenticator* auth) {
  absl::MutexLock lock(&mu_);
  creds_ = auth;
  RegisterCredentialsLocked();
}

void Coordinator::RegisterCredentialsLocked() {
  if (creds_ == nullptr) return;
  for (const auto& [id, job] : jobs_) {
    if (!job->worker_token_hash.empty()) creds_->SetJobToken(id, job->worker_token_hash);
    for (const auto& [worker_id, m] : job->members) {
      if (m.token_hash.empty()) continue;
      creds_->SetMemberToken({id, worker_id, m.member.incarnation()}, m.token_hash);
    }
  }
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
  // Every change a waiting GetAssignment or a formation count depends on
  // emits an event (JobRecord::events). Another worker's join changes
  // neither a waiting member's answer nor lowers the JOINING count.
  const bool joined = event.has_worker_joined();
  job.events.Append(job.job.job_id(), job.job.generation(), clock_->Now(), std::move(event));
  if (!joined) {
    job.joining_count_valid = false;
    WakeAssignmentWaitersLocked(job, nullptr);
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
  LogLine(absl::StrFormat("job %s generation %d: %s -> %s%s%s",
               job.job.job_id(), job.job.generation(),
               PhaseName(old), PhaseName(phase), reason.empty() ? "" : ": ",
               reason));
}

void Coordinator::StopAllLocked(JobRecord& job) {
  for (auto& [id, m] : job.members) {
    if (!IsLive(m.member.state())) continue;
    v1::SessionMessage msg;
    *msg.mutable_directive() = Stop(job.job.phase(), job.job.phase_reason());
    m.outbox.Push(std::move(msg));
  }
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
    // Only its hash is kept: the token was shown at creation only.
    v1::CreateJobResponse response;
    *response.mutable_job() = existing->job;
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
  auto job = std::make_unique<JobRecord>(store_, options_.max_events_per_job);
  const absl::Time now = clock_->Now();
  job->job.set_job_id(request.job_id());
  *job->job.mutable_spec() = *spec;
  job->job.set_phase(v1::JOB_PHASE_PENDING);
  job->job.set_phase_reason("waiting for workers");
  job->job.set_generation(1);
  *job->job.mutable_create_time() = ToProto(now);
  *job->job.mutable_update_time() = ToProto(now);
  const std::string worker_token = NewToken();
  job->worker_token_hash = Sha256Hex(worker_token);
  job->waiting_since = now;
  std::vector<Mutation> batch = {
      Mutation::Put("job", request.job_id(), job->job.SerializeAsString()),
      Mutation::Put(kTokenHashKind, request.job_id(), job->worker_token_hash)};
  if (absl::Status s = store_->Write(batch); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("job not created, state store: ", s.message()));
  }
  v1::JobEvent e;
  e.mutable_phase_changed()->set_new_phase(v1::JOB_PHASE_PENDING);
  e.mutable_phase_changed()->set_reason("created");
  EmitLocked(*job, std::move(e));
  v1::CreateJobResponse response;
  *response.mutable_job() = job->job;
  response.set_worker_token(worker_token);
  if (creds_ != nullptr) creds_->SetJobToken(request.job_id(), job->worker_token_hash);
  jobs_[request.job_id()] = std::move(job);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->job;
}

namespace {

// ListJobs pages (job.proto ListJobsRequest): newest create_time first,
// ties by job_id descending. The page token is "<create_time, Unix ns>/
// <the request's phases, sorted, comma-separated>/<job_id>" of the last job
// of the previous page: a position, so it stays valid when jobs come or go.
struct ListCursor {
  int64_t create_nanos = 0;
  std::string job_id;
};

std::string PhasesKey(const v1::ListJobsRequest& request) {
  std::vector<int> phases(request.phases().begin(), request.phases().end());
  std::sort(phases.begin(), phases.end());
  phases.erase(std::unique(phases.begin(), phases.end()), phases.end());
  return absl::StrJoin(phases, ",");
}

int64_t CreateNanos(const v1::Job& job) {
  return google::protobuf::util::TimeUtil::TimestampToNanoseconds(job.create_time());
}

absl::StatusOr<std::optional<ListCursor>> ParseListToken(const v1::ListJobsRequest& request) {
  if (request.page_token().empty()) return std::optional<ListCursor>();
  const std::vector<std::string> parts = absl::StrSplit(request.page_token(), '/');
  ListCursor cursor;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &cursor.create_nanos) ||
      !ValidJobId(parts[2]).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token \"", absl::CHexEscape(request.page_token().substr(0, 64)),
                     "\" is malformed; pass the next_page_token of the previous page "
                     "unchanged, or leave it empty for the first page"));
  }
  if (parts[1] != PhasesKey(request)) {
    return absl::InvalidArgumentError(
        "page_token is from a call with other phases; pass the same phases as for the "
        "first page, or start again with an empty page_token");
  }
  cursor.job_id = parts[2];
  return std::optional<ListCursor>(std::move(cursor));
}

}  // namespace

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(
    const v1::ListJobsRequest& request) const {
  // job.proto: 0 means 50; above 1000 is treated as 1000.
  const size_t page_size =
      request.page_size() == 0 ? 50 : std::min<size_t>(request.page_size(), 1000);
  absl::StatusOr<std::optional<ListCursor>> cursor = ParseListToken(request);
  if (!cursor.ok()) return cursor.status();
  const std::string phases_key = PhasesKey(request);
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, const v1::Job*>> matching;
  for (const auto& [id, record] : jobs_) {
    const v1::Job& job = record->job;
    if (!request.phases().empty() &&
        std::find(request.phases().begin(), request.phases().end(), job.phase()) ==
            request.phases().end()) {
      continue;
    }
    const int64_t nanos = CreateNanos(job);
    // Strictly after the cursor in (create_time, job_id) descending order.
    if (cursor->has_value() &&
        (nanos > (*cursor)->create_nanos ||
         (nanos == (*cursor)->create_nanos && job.job_id() >= (*cursor)->job_id))) {
      continue;
    }
    matching.emplace_back(nanos, &job);
  }
  std::sort(matching.begin(), matching.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return a.second->job_id() > b.second->job_id();
  });
  v1::ListJobsResponse response;
  for (size_t i = 0; i < matching.size() && i < page_size; ++i) {
    *response.add_jobs() = *matching[i].second;
  }
  if (matching.size() > page_size) {
    const auto& last = matching[page_size - 1];
    response.set_next_page_token(
        absl::StrCat(last.first, "/", phases_key, "/", last.second->job_id()));
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

absl::StatusOr<uint64_t> Coordinator::HangsDetected(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->hangs_detected;
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

absl::Status NoPlanOfExternalJob(const std::string& job_id) {
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job_id,
                   " is an external job (spec.external): it has no plan; its ranks are "
                   "0..world_size-1 of the workload's own (see shardctl members ",
                   job_id, ")"));
}

absl::StatusOr<v1::Plan> Coordinator::GetPlan(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (spec::IsExternalJob(job->job.spec())) return NoPlanOfExternalJob(job_id);
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
  if (spec::IsExternalJob(job->job.spec())) return NoPlanOfExternalJob(request.job_id());
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
  WaitGuard waiting(*job);
  return job->events.WaitAfter(&mu_, after.value_or(0), deadline);
}

absl::StatusOr<uint64_t> Coordinator::AddEventWaker(const std::string& job_id,
                                                    std::function<void()> waker) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->events.AddWaker(std::move(waker));
}

void Coordinator::RemoveEventWaker(const std::string& job_id, uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (JobRecord* job = FindJobLocked(job_id); job != nullptr) job->events.RemoveWaker(id);
}

absl::StatusOr<std::string> Coordinator::WorkerTokenHash(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return job->worker_token_hash;
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
      LogLine(absl::StrFormat("job %s: unusable mark of %s not saved: %s", job.job.job_id(),
                              bad.checkpoint_id(), s.message()));
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
  LogLine(absl::StrFormat("job %s: %s", job.job.job_id(), why));
  v1::JobEvent e;
  e.mutable_checkpoint_aborted()->set_checkpoint_id(bad.checkpoint_id());
  e.mutable_checkpoint_aborted()->set_step(bad.step());
  e.mutable_checkpoint_aborted()->set_reason(
      absl::StrCat("not restorable (still listed as committed): ", what));
  EmitLocked(job, std::move(e));
  EndGenerationLocked(job, v1::FORMATION_REASON_ERROR_REPORTED, why, ended);
}

}  // namespace shardline::server

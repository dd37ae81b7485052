// Coordinator: writing job and member records to the StateStore, and
// forgetting finished jobs (retention). Recover (reading them back) is in
// coordinator.cc.
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "server/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/coordinator_records.h"
#include "server/event_log.h"
#include "server/state_store.h"

namespace shardline::server {
namespace {

// Record kinds and keys in the StateStore: "job" and kTokenHashKind by job_id
// (see CreateJob), "member" and kMemberTokenKind by MemberKey, "event"
// (EventLog::Key). The unusable
// checkpoints' marks are the CheckpointRegistry's (server/unusable_marks.h).
std::string MemberKey(const std::string& job_id, const std::string& worker_id) {
  return absl::StrCat(job_id, "/", worker_id);
}

}  // namespace

absl::Status Coordinator::PersistLocked(const JobRecord& job,
                                        const std::vector<const MemberRecord*>& members,
                                        std::vector<Mutation> extra) {
  std::vector<Mutation> batch = std::move(extra);
  // Not durable (job.proto, session.proto): hang reports, stragglers and
  // progress reports are left out of the records.
  if (job.job.has_last_hang() || job.job.stragglers_size() > 0 || job.job.num_stragglers() > 0) {
    v1::Job durable = job.job;
    durable.clear_last_hang();
    durable.clear_stragglers();
    durable.clear_num_stragglers();
    batch.push_back(Mutation::Put("job", job.job.job_id(), durable.SerializeAsString()));
  } else {
    batch.push_back(Mutation::Put("job", job.job.job_id(), job.job.SerializeAsString()));
  }
  for (const MemberRecord* m : members) {
    std::string value;
    if (m->member.has_progress() || m->member.has_straggler()) {
      v1::Member durable = m->member;
      durable.clear_progress();
      durable.clear_straggler();
      value = durable.SerializeAsString();
    } else {
      value = m->member.SerializeAsString();
    }
    batch.push_back(Mutation::Put("member", MemberKey(job.job.job_id(), m->member.worker_id()),
                                  std::move(value)));
  }
  absl::Status s = store_->Write(batch);
  if (!s.ok()) {
    LogLine(absl::StrFormat("job %s generation %d: state not saved: %s",
                 job.job.job_id(), job.job.generation(),
                 s.message()));
  }
  return s;
}

absl::Status Coordinator::PersistAllMembersLocked(const JobRecord& job) {
  std::vector<const MemberRecord*> all;
  for (const auto& [id, m] : job.members) all.push_back(&m);
  return PersistLocked(job, all);
}

std::vector<std::string> Coordinator::FinishedJobsToPrune() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  // (finished at, id) of every finished job, oldest first.
  std::vector<std::pair<absl::Time, std::string>> finished;
  for (const auto& [id, job] : jobs_) {
    if (IsTerminal(job->job.phase())) finished.emplace_back(FromProto(job->job.update_time()), id);
  }
  std::sort(finished.begin(), finished.end());
  std::vector<std::string> out;
  const size_t keep = options_.max_finished_jobs > 0 ? static_cast<size_t>(options_.max_finished_jobs)
                                                     : finished.size();
  for (size_t i = 0; i < finished.size(); ++i) {
    const bool too_many = finished.size() - i > keep;
    const bool too_old = options_.finished_job_retention > absl::ZeroDuration() &&
                         now - finished[i].first > options_.finished_job_retention;
    if (too_many || too_old) out.push_back(finished[i].second);
  }
  return out;
}

absl::Status Coordinator::PruneJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  JobRecord& job = *it->second;
  if (job.waiters > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has ", job.waiters, " calls waiting on it; pruned at a later tick"));
  }
  if (!IsTerminal(job.job.phase())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", PhaseName(job.job.phase()), "; only finished jobs are pruned"));
  }
  std::vector<Mutation> batch = {Mutation::Delete("job", job_id),
                                 Mutation::Delete(kTokenHashKind, job_id)};
  std::vector<std::string> worker_ids;
  for (const auto& [worker_id, m] : job.members) {
    batch.push_back(Mutation::Delete("member", MemberKey(job_id, worker_id)));
    batch.push_back(Mutation::Delete(kMemberTokenKind, MemberKey(job_id, worker_id)));
    worker_ids.push_back(worker_id);
  }
  for (const v1::JobEvent& e : job.events.After(0)) {
    batch.push_back(Mutation::Delete(EventLog::kStoreKind, EventLog::Key(job_id, e.sequence())));
  }
  if (absl::Status s = store_->Write(batch); !s.ok()) {
    LogLine(absl::StrCat("job ", job_id, ": not pruned: ", s.message()));
    return s;
  }
  LogLine(absl::StrCat("job ", job_id, ": pruned (", PhaseName(job.job.phase()), " since ",
                       absl::FormatTime(FromProto(job.job.update_time())), ", ",
                       job.members.size(), " members, ", job.events.size(), " events)"));
  // Its tokens authenticate nothing from now on.
  if (creds_ != nullptr) creds_->ForgetJob(job_id, worker_ids);
  // Open session streams end (their next pull finds no job).
  for (auto& [worker_id, m] : job.members) m.outbox.End();
  jobs_.erase(it);
  return absl::OkStatus();
}

}  // namespace shardline::server

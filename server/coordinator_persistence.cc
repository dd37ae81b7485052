// Coordinator: writing job and member records to the StateStore. Recover
// (reading them back) is in coordinator.cc.
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "server/coordinator.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/coordinator_records.h"
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
  batch.push_back(Mutation::Put("job", job.job.job_id(), job.job.SerializeAsString()));
  for (const MemberRecord* m : members) {
    batch.push_back(Mutation::Put("member", MemberKey(job.job.job_id(), m->member.worker_id()),
                                  m->member.SerializeAsString()));
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

}  // namespace shardline::server

// Coordinator: forming generations (formation.h chooses the world), ending
// them, the assignments of a formed generation, and growing at a committed
// checkpoint.
#include "server/coordinator.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "server/coordinator_records.h"
#include "server/formation.h"
#include "spec/job_spec.h"
#include "spec/plan_proto.h"

namespace shardline::server {

using google::protobuf::util::TimeUtil;

void Coordinator::EndGenerationLocked(JobRecord& job, v1::FormationReason reason,
                                      const std::string& why,
                                      std::vector<GenerationEnded>* ended) {
  const uint64_t old_generation = job.job.generation();
  ProgressGenerationEndedLocked(job);
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
    if (!RejoinsAfterGenerationEnd(m.member.state())) continue;
    m.previous_rank = m.carried_rank();
    m.member.clear_rank();
    m.member.set_state(v1::MEMBER_STATE_FENCED);
    v1::SessionMessage msg;
    *msg.mutable_directive() = Restart(job.job.generation(), why);
    m.outbox.Push(std::move(msg));
  }
  SetPhaseLocked(job, v1::JOB_PHASE_RECOVERING, why);
  PersistAllMembersLocked(job).IgnoreError();  // logged inside
}

void Coordinator::MaybeFormLocked(JobRecord& job, std::vector<GenerationEnded>* ended) {
  const v1::JobPhase phase = job.job.phase();
  if (phase != v1::JOB_PHASE_PENDING && phase != v1::JOB_PHASE_RECOVERING) return;
  const v1::ElasticPolicy& elastic = job.job.spec().elastic();
  const absl::Time now = clock_->Now();
  if (phase == v1::JOB_PHASE_PENDING && job.joining_count_valid &&
      job.joining_count_generation == job.job.generation()) {
    // O(1) when nothing can happen: joining_count is never below the
    // number of candidates, and a world that does not fit them does not fit
    // fewer. The scan below runs when a world may fit and be ready.
    const int upper = job.joining_count;
    const bool fits = spec::ChooseWorldSize(job.job.spec(), upper).has_value();
    if (!fits && now - job.waiting_since <= FromProto(elastic.join_timeout())) {
      job.last_call_deadline.reset();
      return;
    }
    if (fits && job.last_call_deadline.has_value() &&
        upper < static_cast<int>(elastic.max_workers()) && now < *job.last_call_deadline) {
      return;
    }
  }
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
  job.joining_count_valid = true;
  job.joining_count_generation = job.job.generation();
  job.joining_count = count;
  const std::optional<int> world = spec::ChooseWorldSize(job.job.spec(), count);
  if (world.has_value()) {
    if (!job.last_call_deadline.has_value()) {
      job.last_call_deadline = now + FromProto(elastic.last_call());
    }
    // Initial formation waits for max_workers or the last call; a recovery
    // also forms as soon as every survivor has re-joined.
    const bool ready = count >= static_cast<int>(elastic.max_workers()) ||
                       (phase == v1::JOB_PHASE_RECOVERING && !anyone_fenced) ||
                       now >= *job.last_call_deadline;
    if (ready) FormGenerationLocked(job, std::move(candidates));
    return;
  }
  job.last_call_deadline.reset();
  if (now - job.waiting_since > FromProto(elastic.join_timeout())) {
    const uint32_t model_parallel = job.job.spec().parallel().tp() * job.job.spec().parallel().pp();
    const bool external = spec::IsExternalJob(job.job.spec());
    SetPhaseLocked(
        job, v1::JOB_PHASE_FAILED,
        absl::StrCat("only ", count, external ? " nodes" : " workers",
                     " joined within join_timeout ", TimeUtil::ToString(elastic.join_timeout()),
                     "; the job needs min_workers=", elastic.min_workers(),
                     external ? " (nodes of the external job)"
                              : absl::StrCat(" (tp*pp=", model_parallel,
                                             ", and a dp dividing the global batch)"),
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

void Coordinator::FormGenerationLocked(JobRecord& job, std::vector<MemberRecord*> candidates) {
  std::vector<FormationCandidate> in;
  in.reserve(candidates.size());
  for (const MemberRecord* m : candidates) in.push_back(m->AsCandidate());
  absl::StatusOr<std::optional<Formation>> formation = FormWorld(job.job.spec(), in);
  if (!formation.ok() || !formation->has_value()) {
    // MaybeFormLocked checked that a dp fits; an error here is a broken invariant.
    SetPhaseLocked(job, v1::JOB_PHASE_FAILED,
                   absl::StrCat("internal: ", formation.ok()
                                                  ? absl::StrCat("no dp fits ", candidates.size(),
                                                                 " workers")
                                                  : std::string(formation.status().message())));
    StopAllLocked(job);
    PersistAllMembersLocked(job).IgnoreError();
    return;
  }
  Formation& f = **formation;
  // Ranks 0..world-1 in order, then the spares (formation.h).
  std::vector<MemberRecord*> ordered;
  ordered.reserve(candidates.size());
  for (size_t i : f.ranks) ordered.push_back(candidates[i]);
  for (size_t i : f.spares) ordered.push_back(candidates[i]);
  candidates = std::move(ordered);
  const int dp = f.dp;
  const int world = f.world_size;
  job.SetPlan(std::move(f.plan));
  job.job.set_world_size(world);
  job.job.set_dp(dp);
  job.job.set_num_spares(static_cast<uint32_t>(candidates.size()) - world);
  job.last_call_deadline.reset();

  job.restore_fixed = true;
  job.restore.reset();
  if (job.job.has_last_checkpoint()) job.restore = job.job.last_checkpoint();

  v1::JobEvent e;
  v1::GenerationFormed* formed = e.mutable_generation_formed();
  formed->set_generation(job.job.generation());
  formed->set_reason(job.pending_reason);
  formed->set_world_size(world);
  formed->set_dp(dp);
  if (job.restore.has_value()) *formed->mutable_restore() = *job.restore;
  for (size_t i = 0; i < candidates.size(); ++i) {
    v1::Member& m = candidates[i]->member;
    if (static_cast<int>(i) < world) {
      m.set_state(v1::MEMBER_STATE_ACTIVE);
      m.set_rank(static_cast<uint32_t>(i));
      candidates[i]->generation_start_step = RestoreStep(job.job);
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
                              job.plan.has_value() ? absl::StrCat(", dp ", dp) : "", ", ",
                              job.job.num_spares(),
                              job.job.num_spares() == 1 ? " spare" : " spares"));
  EmitLocked(job, std::move(e));
  for (MemberRecord* m : candidates) {
    v1::SessionMessage msg;
    absl::StatusOr<v1::Assignment> a = GetAssignmentLocked(job, *m);
    if (a.ok()) *msg.mutable_assignment() = *std::move(a);
    m->outbox.Push(std::move(msg));
  }
  PersistAllMembersLocked(job).IgnoreError();
  // Forming counts as a sign of life for every member of the generation:
  // its heartbeats may have waited on this lock while a large generation
  // was planned, assigned and written, and the coordinator's own delay must
  // not get them declared lost.
  const absl::Time now = clock_->Now();
  for (MemberRecord* m : candidates) m->last_heartbeat = std::max(m->last_heartbeat, now);
  ProgressGenerationFormedLocked(job);
}

absl::StatusOr<v1::Assignment> Coordinator::GetAssignmentLocked(const JobRecord& job,
                                                                const MemberRecord& m) const {
  if (!job.formed() || m.member.generation() != job.job.generation() ||
      (m.member.state() != v1::MEMBER_STATE_ACTIVE && m.member.state() != v1::MEMBER_STATE_SPARE)) {
    return absl::FailedPreconditionError("no assignment yet");
  }
  v1::Assignment a;
  if (!job.plan.has_value()) {  // an external job: generation, rank, world_size
    if (m.member.state() == v1::MEMBER_STATE_ACTIVE) {
      a.set_rank(m.member.rank());
    } else {
      a.set_spare(true);
    }
    a.set_world_size(job.job.world_size());
    a.set_generation(job.job.generation());
    return a;
  }
  const v1::JobSpec& spec = job.job.spec();
  if (m.member.state() == v1::MEMBER_STATE_ACTIVE) {
    a = spec::AssignmentFor(*job.plan, job.plan_groups, static_cast<int>(m.member.rank()),
                            m.compact_groups);
    const std::optional<v1::CheckpointRef> restore = job.RestorePoint();
    if (restore.has_value()) *a.mutable_restore() = *restore;
    const uint64_t start = restore.has_value() ? restore->step() : 0;
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

void Coordinator::MaybeGrowLocked(JobRecord& job, const v1::CheckpointRef& ref,
                                  std::vector<GenerationEnded>* ended) {
  // An external job grows when a member joins (JoinJob), not here.
  if (job.job.phase() != v1::JOB_PHASE_RUNNING || !job.plan.has_value()) return;
  // The last step: the ranks are about to finish; a restart would only redo it.
  if (ref.step() >= job.job.spec().training().train_steps()) return;
  int ranks = 0;
  int spares = 0;  // healthy: of this generation, with a live session stream
  for (const auto& [id, m] : job.members) {
    if (m.member.generation() != job.job.generation()) continue;
    if (m.member.state() == v1::MEMBER_STATE_ACTIVE) ++ranks;
    if (m.member.state() == v1::MEMBER_STATE_SPARE && m.outbox.is_open()) ++spares;
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

}  // namespace shardline::server

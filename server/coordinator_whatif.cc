// Coordinator::WhatIf: what losing some workers at once would do to a job,
// answered from the coordinator's state without changing it. The decision
// is the real one: the same loss rule as LoseMemberLocked
// (coordinator_failure.cc), the same candidates and carried ranks as
// EndGenerationLocked and FormGenerationLocked (coordinator_records.h
// RejoinsAfterGenerationEnd, MemberRecord::AsCandidate), the same
// FormWorld (formation.h: spec::ChooseDp, spare order, the plan), the same
// restore point (RestoreStep) and the same per-rank ZeRO shards as the
// assignments (spec::AssignmentFor).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/time_util.h"
#include "common/text.h"
#include "server/coordinator.h"
#include "server/coordinator_records.h"
#include "server/formation.h"
#include "spec/job_spec.h"
#include "spec/plan_proto.h"

namespace shardline::server {
namespace {

// Names listed in a summary before "and N more".
constexpr size_t kMaxNamesInSummary = 8;

std::string Count(uint64_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

// "w1, w2 and w3"; past kMaxNamesInSummary "w1, ..., w8 and 5 more".
std::string Names(const std::vector<std::string>& names) {
  return JoinForPeople(names, kMaxNamesInSummary);
}

// The summary's first sentence: what is lost.
std::string LossesSentence(const v1::WhatIfResponse& r) {
  std::vector<std::string> ranks, spares, rankless, gone;
  for (const v1::WhatIfLoss& l : r.losses()) {
    if (l.has_rank()) {
      ranks.push_back(absl::StrCat("rank ", l.rank(), " (", l.worker_id(), ")"));
    } else if (l.state() == v1::MEMBER_STATE_SPARE) {
      spares.push_back(l.worker_id());
    } else {
      (IsLive(l.state()) ? rankless : gone)
          .push_back(absl::StrCat(l.worker_id(), " (", MemberStateName(l.state()), ")"));
    }
  }
  std::vector<std::string> parts = ranks;
  for (const std::string& s : spares) parts.push_back(absl::StrCat("spare ", s));
  std::string out = parts.empty() ? std::string("Losing no rank or spare")
                                  : absl::StrCat("Losing ", Names(parts));
  if (r.generation_ends()) {
    absl::StrAppend(&out, " ends generation ", r.generation(), ".");
  } else {
    absl::StrAppend(&out, parts.empty() ? "" : " ends nothing", ": generation ", r.generation(),
                    " runs on (world ", r.world_size(), ", dp ", r.dp(), ").");
  }
  if (!rankless.empty()) {
    absl::StrAppend(&out, " ", Names(rankless), rankless.size() == 1 ? " holds" : " hold",
                    " no rank in it: no change.");
  }
  if (!gone.empty()) {  // LOST or LEFT
    absl::StrAppend(&out, " ", Names(gone), gone.size() == 1 ? " is" : " are",
                    " not live: losing ", gone.size() == 1 ? "it" : "them", " changes nothing.");
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::WhatIfResponse> Coordinator::WhatIf(const v1::WhatIfRequest& request) const {
  const std::string& job_id = request.job_id();
  if (request.lose_worker_ids().empty()) {
    return absl::InvalidArgumentError(
        "lose_worker_ids is empty; name the workers to suppose lost (worker_ids, see shardctl "
        "members JOB)");
  }
  std::map<std::string, int> seen;  // worker_id -> its first index
  for (int i = 0; i < request.lose_worker_ids_size(); ++i) {
    const std::string& id = request.lose_worker_ids(i);
    auto [it, inserted] = seen.emplace(id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("lose_worker_ids[", i, "]='", id,
                                                     "' repeats lose_worker_ids[", it->second,
                                                     "]; name each worker once"));
    }
  }
  absl::MutexLock lock(&mu_);
  const JobRecord* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const v1::Job& j = job->job;
  if (IsTerminal(j.phase())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is ", PhaseName(j.phase()), "; no loss would change it"));
  }
  if (spec::IsExternalJob(j.spec())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id,
                     " is an external job (spec.external): it has no plan to re-form by; "
                     "the workload decides its own ranks"));
  }
  if (!job->plan.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' has no formed generation (phase ", PhaseName(j.phase()),
                     ", generation ", j.generation(), "); ask again once it is RUNNING"));
  }
  const plan::Plan& plan = *job->plan;

  v1::WhatIfResponse r;
  r.set_generation(j.generation());
  r.set_world_size(j.world_size());
  r.set_dp(j.dp());
  std::set<std::string> lost;  // the live ones among them
  uint32_t lost_shards = 0;
  uint64_t lost_elements = 0;
  for (const std::string& id : request.lose_worker_ids()) {
    auto it = job->members.find(id);
    if (it == job->members.end()) {
      return absl::NotFoundError(absl::StrCat("no worker '", id, "' in job '", job_id,
                                              "' (see shardctl members ", job_id, ")"));
    }
    const v1::Member& m = it->second.member;
    v1::WhatIfLoss* loss = r.add_losses();
    loss->set_worker_id(id);
    loss->set_state(m.state());
    if (IsLive(m.state())) lost.insert(id);
    if (m.state() != v1::MEMBER_STATE_ACTIVE || !m.has_rank()) continue;
    // LoseMemberLocked: the loss of a rank of a RUNNING job ends the
    // generation. (The plan is set only while RUNNING.)
    if (j.phase() == v1::JOB_PHASE_RUNNING) r.set_generation_ends(true);
    loss->set_rank(m.rank());
    const v1::Assignment a =
        spec::AssignmentFor(plan, job->plan_groups, static_cast<int>(m.rank()));
    *loss->mutable_coordinates() = a.coordinates();
    if (plan.parallel.zero_stage == 0) continue;  // every dp rank holds whole states
    for (const v1::ZeroShard& z : a.zero_shards()) {
      if (z.owned().end() <= z.owned().begin()) continue;  // all padding
      loss->set_num_zero_shards(loss->num_zero_shards() + 1);
      loss->set_zero_shard_elements(loss->zero_shard_elements() + z.owned().end() -
                                    z.owned().begin());
    }
    lost_shards += loss->num_zero_shards();
    lost_elements += loss->zero_shard_elements();
  }

  std::string summary = LossesSentence(r);
  if (!r.generation_ends()) {
    uint32_t spares_left = 0;
    for (const auto& [id, m] : job->members) {
      spares_left += m.member.state() == v1::MEMBER_STATE_SPARE && lost.count(id) == 0;
    }
    absl::StrAppend(&summary, " ", Count(spares_left, "spare stays", "spares stay"), ".");
    r.set_summary(std::move(summary));
    return r;
  }

  // The generation ends: everyone else it fences re-joins, and the next
  // generation forms of them (EndGenerationLocked, FormGenerationLocked).
  std::vector<FormationCandidate> candidates;
  std::vector<const MemberRecord*> who;
  for (const auto& [id, m] : job->members) {
    if (!RejoinsAfterGenerationEnd(m.member.state()) || lost.count(id) > 0) continue;
    candidates.push_back(m.AsCandidate());
    who.push_back(&m);
  }
  absl::StatusOr<std::optional<Formation>> formed = FormWorld(j.spec(), candidates);
  if (!formed.ok()) return formed.status();  // Internal: the planner refused ChooseDp's dp
  const uint64_t restore_step = RestoreStep(j);
  if (j.has_last_checkpoint()) *r.mutable_restore() = j.last_checkpoint();
  r.set_steps_retrained(j.step() > restore_step ? j.step() - restore_step : 0);
  const uint32_t accumulation = static_cast<uint32_t>(plan.parallel.micro_batches);
  if (!formed->has_value()) {
    r.set_below_min_workers(true);
    const v1::ElasticPolicy& e = j.spec().elastic();
    absl::StrAppend(
        &summary, " The ", Count(candidates.size(), "live worker", "live workers"),
        " left would be fewer than the job needs (min_workers=", e.min_workers(),
        ", tp*pp=", j.spec().parallel().tp() * j.spec().parallel().pp(),
        ", and a dp dividing the global batch): it would wait in RECOVERING for workers to join "
        "and FAIL after join_timeout ",
        google::protobuf::util::TimeUtil::ToString(e.join_timeout()), ".");
  } else {
    const Formation& f = **formed;
    r.set_new_world_size(static_cast<uint32_t>(f.world_size));
    r.set_new_dp(static_cast<uint32_t>(f.dp));
    r.set_new_gradient_accumulation_steps(static_cast<uint32_t>(f.plan->parallel.micro_batches));
    for (size_t i : f.ranks) {
      const v1::Member& m = who[i]->member;
      r.add_new_worker_ids(m.worker_id());
      if (!m.has_rank()) r.add_spares_used(m.worker_id());  // a spare (or joining) takes a rank
    }
    std::vector<std::string> benched;  // ranks now that would wait as spares
    for (size_t i : f.spares) {
      if (who[i]->member.has_rank()) benched.push_back(who[i]->member.worker_id());
    }
    r.set_spares_cover(r.new_world_size() >= r.world_size());
    const std::vector<std::string> used(r.spares_used().begin(), r.spares_used().end());
    if (!used.empty()) {
      absl::StrAppend(&summary, " ", used.size() == 1 ? "Spare " : "Spares ", Names(used),
                      used.size() == 1 ? " takes a rank." : " take ranks.");
    } else {
      absl::StrAppend(&summary, " No spare covers the lost ranks.");
    }
    if (r.new_world_size() == r.world_size()) {
      absl::StrAppend(&summary, " World ", r.world_size(), " and dp ", r.dp(),
                      " stay as they are, ", accumulation, " micro-batches per dp rank per step.");
    } else {
      absl::StrAppend(&summary, " The world ",
                      r.new_world_size() > r.world_size() ? "grows" : "shrinks", ": world ",
                      r.world_size(), " -> ", r.new_world_size(), ", dp ", r.dp(), " -> ",
                      r.new_dp(), ", gradient accumulation ", accumulation, " -> ",
                      r.new_gradient_accumulation_steps(),
                      " micro-batches per dp rank per step (the global batch stays ",
                      j.spec().training().global_batch(), ").");
    }
    if (!benched.empty()) {
      absl::StrAppend(&summary, " ", Names(benched), " would wait as ",
                      benched.size() == 1 ? "a spare" : "spares", ".");
    }
  }
  if (j.has_last_checkpoint()) {
    absl::StrAppend(&summary, " It would restore checkpoint ", j.last_checkpoint().checkpoint_id(),
                    " (step ", restore_step, ") and train the ",
                    Count(r.steps_retrained(), "step", "steps"),
                    " since again (the job is at step ", j.step(), ").");
  } else {
    absl::StrAppend(&summary, " No checkpoint is committed: it would start from the seed and ",
                    "train all ", Count(r.steps_retrained(), "step", "steps"), " again.");
  }
  if (lost_elements > 0) {
    absl::StrAppend(&summary, " The lost ranks' ZeRO shards (", Count(lost_shards, "unit", "units"),
                    ", ", lost_elements, " elements) are held nowhere else and come back from ",
                    j.has_last_checkpoint() ? "that checkpoint." : "the seed.");
  }
  r.set_summary(std::move(summary));
  return r;
}

}  // namespace shardline::server

// Coordinator: hangs and stragglers from the ranks' progress reports
// (HeartbeatRequest.progress). The judgement is server/progress_monitor.h's;
// this file feeds it the job's state and acts on what it finds (see
// coordinator.h Tick, ReportError).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "google/protobuf/util/time_util.h"
#include "server/coordinator.h"
#include "server/coordinator_records.h"
#include "server/progress_monitor.h"
#include "spec/job_spec.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;

google::protobuf::Duration DurationProto(absl::Duration d) {
  return TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(d));
}

StragglerTracker::Options StragglerOptions(const v1::ElasticPolicy& e) {
  StragglerTracker::Options o;
  // A spec stored before these fields existed has zeros: the defaults.
  o.factor = e.straggler_factor() > 1 ? e.straggler_factor() : spec::kDefaultStragglerFactor;
  o.window_steps = e.straggler_window_steps() > 0 ? e.straggler_window_steps()
                                                  : spec::kDefaultStragglerWindowSteps;
  o.min_excess = e.has_straggler_min_excess()
                     ? absl::Seconds(e.straggler_min_excess().seconds()) +
                           absl::Nanoseconds(e.straggler_min_excess().nanos())
                     : spec::kDefaultStragglerMinExcess;
  return o;
}

// Hangs and stragglers are judged only in a RUNNING GPT job (an external
// job's agents send no progress).
template <typename Job>
bool Judged(const Job& job) {
  return job.job.phase() == v1::JOB_PHASE_RUNNING && job.plan.has_value() &&
         !spec::IsExternalJob(job.job.spec());
}

}  // namespace

void Coordinator::ProgressGenerationFormedLocked(JobRecord& job) {
  job.last_progress = clock_->Now();
  job.hang_reported = false;
  job.stragglers.Reset(StragglerOptions(job.job.spec().elastic()));
  job.by_rank.assign(job.job.world_size(), nullptr);
  for (auto& [id, m] : job.members) {
    if (m.member.state() == v1::MEMBER_STATE_ACTIVE && m.member.has_rank() &&
        m.member.rank() < job.by_rank.size()) {
      job.by_rank[m.member.rank()] = &m;
    }
  }
}

void Coordinator::ProgressGenerationEndedLocked(JobRecord& job) {
  for (auto& [id, m] : job.members) {
    m.member.clear_progress();
    if (!m.member.has_straggler()) continue;
    v1::JobEvent e;
    *e.mutable_straggler_changed()->mutable_straggler() = m.member.straggler();
    e.mutable_straggler_changed()->set_cleared(true);
    EmitLocked(job, std::move(e));
    m.member.clear_straggler();
  }
  job.job.clear_stragglers();
  job.job.set_num_stragglers(0);
  job.stragglers.Reset(StragglerOptions(job.job.spec().elastic()));
  job.by_rank.clear();
}

void Coordinator::NoteProgressLocked(JobRecord& job, MemberRecord& m,
                                     const v1::HeartbeatRequest& request) {
  v1::Member& member = m.member;
  if (member.state() != v1::MEMBER_STATE_ACTIVE) {
    member.clear_progress();
    return;
  }
  if (!request.has_progress()) return;
  const v1::RankProgress& p = request.progress();
  // A rank saving or restoring a checkpoint is working (a save may take
  // minutes); collective_timeout still ends a save that hangs.
  if (MadeProgress(member.has_progress() ? &member.progress() : nullptr, p) ||
      p.activity() == v1::ACTIVITY_CHECKPOINT) {
    job.last_progress = clock_->Now();
    job.hang_reported = false;
  }
  *member.mutable_progress() = p;
  if (Judged(job) && member.has_rank()) {
    job.stragglers.Record(member.rank(), p.step(), FromProto(p.compute_time()));
  }
}

std::optional<HangFinding> Coordinator::LocateHangLocked(const JobRecord& job, absl::Time now) const {
  std::vector<RankView> views;
  views.reserve(job.by_rank.size());
  for (const MemberRecord* m : job.by_rank) {
    if (m == nullptr || m->member.state() != v1::MEMBER_STATE_ACTIVE || !m->member.has_rank()) {
      continue;
    }
    RankView v;
    v.rank = m->member.rank();
    v.worker_id = m->member.worker_id();
    v.host = m->member.host();
    v.progress = m->member.has_progress() ? &m->member.progress() : nullptr;
    v.heartbeat_age = now - m->last_heartbeat;
    views.push_back(std::move(v));
  }
  return LocaliseHang(views, job.plan_groups.groups,
                      2 * FromProto(job.job.spec().elastic().heartbeat_interval()));
}

void Coordinator::PublishHangLocked(JobRecord& job, const v1::HangReport& report) {
  ++job.hangs_detected;
  *job.job.mutable_last_hang() = report;
  v1::JobEvent event;
  *event.mutable_hang_detected() = report;
  EmitLocked(job, std::move(event));
}

std::string Coordinator::NameHoldersUpLocked(JobRecord& job, absl::Time now,
                                             std::vector<MemberRecord*>* frozen,
                                             std::vector<MemberRecord*>* stuck) {
  if (!Judged(job)) return "";
  std::optional<HangFinding> f = LocateHangLocked(job, now);
  if (!f.has_value() || f->culprit_ranks.empty()) {
    // Say what each rank reported, so that an operator (or a test) can tell
    // why nobody was named.
    std::string ranks;
    int listed = 0;
    for (const MemberRecord* m : job.by_rank) {
      if (m == nullptr || !m->member.has_rank()) continue;
      if (++listed > 8) {
        absl::StrAppend(&ranks, "; ...");
        break;
      }
      absl::StrAppend(&ranks, listed > 1 ? "; " : "", "rank ", m->member.rank(), " (",
                      m->member.worker_id(), "): ",
                      DescribeActivity(m->member.has_progress() ? &m->member.progress() : nullptr),
                      ", last heartbeat ", Seconds1(now - m->last_heartbeat), " ago");
    }
    LogLine(absl::StrFormat("job %s generation %d: at an error report: no rank found holding the "
                            "others up (%s)",
                            job.job.job_id(), job.job.generation(), ranks));
    return "";
  }
  v1::HangReport& report = f->report;
  report.set_generation(job.job.generation());
  *report.mutable_stalled_for() = DurationProto(now - job.last_progress);
  // ReportError removes the culprits unless hang_policy is REPORT.
  const bool evict = job.job.spec().elastic().hang_policy() != v1::HANG_POLICY_REPORT;
  report.set_action(evict ? v1::HANG_POLICY_EVICT : v1::HANG_POLICY_REPORT);
  *report.mutable_time() = ToProto(now);
  const absl::Duration stale = 2 * FromProto(job.job.spec().elastic().heartbeat_interval());
  for (uint32_t rank : f->culprit_ranks) {
    MemberRecord* m = rank < job.by_rank.size() ? job.by_rank[rank] : nullptr;
    if (m == nullptr) continue;
    m->member.set_detail(absl::StrCat("held up the job: ", report.summary()));
    if (now - m->last_heartbeat > stale) {
      frozen->push_back(m);
    } else if (evict) {
      stuck->push_back(m);
    }
  }
  PublishHangLocked(job, report);
  LogLine(absl::StrFormat("job %s generation %d: at an error report: %s", job.job.job_id(),
                          job.job.generation(), report.summary()));
  return absl::StrCat("; held up by ", f->held_up_by);
}

void Coordinator::DetectHangLocked(JobRecord& job, absl::Time now,
                                   std::vector<GenerationEnded>* ended) {
  if (!Judged(job) || job.hang_reported) return;
  const v1::ElasticPolicy& e = job.job.spec().elastic();
  const absl::Duration stalled = now - job.last_progress;
  absl::Duration timeout;
  if (e.has_progress_timeout()) {
    timeout = FromProto(e.progress_timeout());
    if (timeout <= absl::ZeroDuration()) return;  // 0 s: off
    if (stalled < timeout) return;
  } else {
    if (stalled < kMinAutoProgressTimeout) return;  // before the O(ranks) median
    std::vector<const v1::RankProgress*> reports;
    reports.reserve(job.by_rank.size());
    for (const MemberRecord* m : job.by_rank) {
      if (m != nullptr && m->member.state() == v1::MEMBER_STATE_ACTIVE &&
          m->member.has_progress()) {
        reports.push_back(&m->member.progress());
      }
    }
    timeout = std::max(kMinAutoProgressTimeout, kAutoProgressStepFactor * MedianStepTime(reports));
    if (stalled < timeout) return;
  }
  std::optional<HangFinding> f = LocateHangLocked(job, now);
  if (!f.has_value()) return;  // nobody waits in a collective: not a hang
  const bool evict = e.hang_policy() != v1::HANG_POLICY_REPORT && !f->culprit_ranks.empty();
  v1::HangReport& report = f->report;
  report.set_generation(job.job.generation());
  *report.mutable_stalled_for() = DurationProto(stalled);
  *report.mutable_progress_timeout() = DurationProto(timeout);
  report.set_action(evict ? v1::HANG_POLICY_EVICT : v1::HANG_POLICY_REPORT);
  *report.mutable_time() = ToProto(now);
  report.set_summary(absl::StrCat("no progress for ", Seconds1(stalled), " (progress_timeout ",
                                  Seconds1(timeout), "): ", report.summary()));
  job.hang_reported = true;
  PublishHangLocked(job, report);
  LogLine(absl::StrFormat("job %s generation %d: hang: %s%s", job.job.job_id(),
                          job.job.generation(), report.summary(),
                          evict ? "; evicting" : " (hang_policy REPORT)"));
  if (!evict) return;
  // The culprits before any loss: the first one ends the generation (and
  // clears by_rank).
  std::vector<MemberRecord*> culprits;
  for (uint32_t rank : f->culprit_ranks) {
    if (rank < job.by_rank.size() && job.by_rank[rank] != nullptr) {
      culprits.push_back(job.by_rank[rank]);
    }
  }
  // Too few left to re-form: the job waits in RECOVERING for join_timeout,
  // as after any loss (a new process may take the evicted one's place; the
  // evicted incarnation itself may not re-join).
  for (MemberRecord* m : culprits) {
    LoseMemberLocked(job, *m, v1::LOSS_REASON_HUNG, report.summary(), ended);
  }
}

void Coordinator::UpdateStragglersLocked(JobRecord& job) {
  if (!Judged(job)) return;
  const std::vector<StragglerChange> changes = job.stragglers.Evaluate();
  if (changes.empty()) return;
  const v1::ElasticPolicy& e = job.job.spec().elastic();
  const StragglerTracker::Options& o = job.stragglers.options();
  auto member_of = [&job](uint32_t rank) -> MemberRecord* {
    MemberRecord* m = rank < job.by_rank.size() ? job.by_rank[rank] : nullptr;
    return m != nullptr && m->member.state() == v1::MEMBER_STATE_ACTIVE ? m : nullptr;
  };
  auto to_proto = [&](const StragglerChange& c, const MemberRecord& m) {
    v1::Straggler s;
    s.set_rank(c.rank);
    s.set_worker_id(m.member.worker_id());
    s.set_host(m.member.host());
    *s.mutable_compute_time() = DurationProto(c.compute_time);
    *s.mutable_median_compute_time() = DurationProto(c.median_compute_time);
    s.set_ratio(c.ratio);
    s.set_window_steps(o.window_steps);
    s.set_since_step(c.step);
    s.set_replacing(m.member.has_straggler() && m.member.straggler().replacing());
    return s;
  };
  // Healthy spares not yet promised to a drain.
  int spares = 0;
  if (e.straggler_policy() == v1::STRAGGLER_POLICY_REPLACE &&
      !job.job.spec().checkpoint().directory().empty()) {
    for (const auto& [id, m] : job.members) {
      if (m.member.generation() == job.job.generation() &&
          m.member.state() == v1::MEMBER_STATE_SPARE && m.outbox.is_open()) {
        ++spares;
      }
      if (m.member.state() == v1::MEMBER_STATE_ACTIVE && m.draining()) --spares;
    }
  }
  for (const StragglerChange& c : changes) {
    MemberRecord* m = member_of(c.rank);
    if (m == nullptr) continue;
    v1::Straggler s = to_proto(c, *m);
    const std::string line = absl::StrFormat(
        "rank %d (%s on %s): median compute %s over %d steps, %.2fx the generation's %s",
        c.rank, m->member.worker_id(), m->member.host(),
        absl::FormatDuration(absl::Trunc(c.compute_time, absl::Milliseconds(1))), o.window_steps,
        c.ratio, absl::FormatDuration(absl::Trunc(c.median_compute_time, absl::Milliseconds(1))));
    if (c.cleared) {
      m->member.clear_straggler();
    } else {
      if (spares > 0 && !m->draining()) {
        StartGracefulDrainLocked(job, *m, absl::StrCat("straggler: ", line));
        s.set_replacing(true);
        --spares;
      }
      *m->member.mutable_straggler() = s;
    }
    v1::JobEvent event;
    *event.mutable_straggler_changed()->mutable_straggler() = s;
    event.mutable_straggler_changed()->set_cleared(c.cleared);
    EmitLocked(job, std::move(event));
    LogLine(absl::StrFormat("job %s generation %d: straggler %s: %s%s", job.job.job_id(),
                            job.job.generation(), c.cleared ? "cleared" : "flagged", line,
                            s.replacing() && !c.cleared ? "; draining it for a spare" : ""));
  }
  // Job.stragglers: slowest first, at most kMaxStragglersListed.
  std::vector<v1::Straggler> all;
  for (const auto& [rank, c] : job.stragglers.flagged()) {
    MemberRecord* m = member_of(rank);
    if (m == nullptr) continue;
    v1::Straggler s = to_proto(c, *m);
    *m->member.mutable_straggler() = s;
    all.push_back(std::move(s));
  }
  std::sort(all.begin(), all.end(), [](const v1::Straggler& a, const v1::Straggler& b) {
    return a.ratio() != b.ratio() ? a.ratio() > b.ratio() : a.rank() < b.rank();
  });
  job.job.set_num_stragglers(static_cast<uint32_t>(all.size()));
  job.job.clear_stragglers();
  for (size_t i = 0; i < all.size() && i < kMaxStragglersListed; ++i) {
    *job.job.add_stragglers() = std::move(all[i]);
  }
}

}  // namespace shardline::server

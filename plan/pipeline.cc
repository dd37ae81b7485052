#include "plan/pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline::plan {
namespace {

using Kind = Action::Kind;

absl::Status CheckDegrees(int pp, int vpp, int micro_batches) {
  const std::pair<const char*, int> degrees[] = {
      {"pp", pp}, {"vpp", vpp}, {"micro_batches", micro_batches}};
  for (const auto& [field, value] : degrees) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "=", value, " is invalid; ", field, " must be >= 1"));
    }
  }
  if (int64_t{micro_batches} * vpp > kMaxActionsPerRank ||
      int64_t{pp} * vpp * micro_batches > kMaxScheduleActions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pp=", pp, ", vpp=", vpp, ", micro_batches=", micro_batches,
        " is too large to plan; the limits are micro_batches*vpp <= ", kMaxActionsPerRank,
        " and pp*vpp*micro_batches <= ", kMaxScheduleActions));
  }
  return absl::OkStatus();
}

// Appends warmup F, then F/B pairs, then the remaining B (the 1F1B shape that
// 1F1B and interleaved 1F1B share).
RankSchedule OneFOneBShape(const std::vector<Action>& forwards,
                           const std::vector<Action>& backwards, int warmup) {
  RankSchedule rs;
  rs.warmup = warmup;
  const int total = static_cast<int>(forwards.size());
  rs.actions.reserve(2 * total);
  for (int i = 0; i < warmup; ++i) rs.actions.push_back(forwards[i]);
  for (int i = 0; i < total - warmup; ++i) {
    rs.actions.push_back(forwards[warmup + i]);
    rs.actions.push_back(backwards[i]);
  }
  for (int i = total - warmup; i < total; ++i) rs.actions.push_back(backwards[i]);
  return rs;
}

RankSchedule GpipeRank(int r, int m) {
  RankSchedule rs;
  rs.warmup = m;
  for (int mb = 0; mb < m; ++mb) rs.actions.push_back({Kind::kForward, mb, r});
  for (int mb = 0; mb < m; ++mb) rs.actions.push_back({Kind::kBackward, mb, r});
  return rs;
}

RankSchedule OneFOneBRank(int r, int pp, int m) {
  std::vector<Action> f, b;
  for (int mb = 0; mb < m; ++mb) {
    f.push_back({Kind::kForward, mb, r});
    b.push_back({Kind::kBackward, mb, r});
  }
  return OneFOneBShape(f, b, std::min(pp - r - 1, m));
}

// Megatron-LM's interleaved order: micro-batches in groups of pp; each group
// runs through the rank's chunks in order for F, in reverse order for B. The
// last group is smaller when pp does not divide m.
RankSchedule InterleavedRank(int r, int pp, int vpp, int m) {
  std::vector<Action> f, b;
  for (int group = 0; group * pp < m; ++group) {
    const int first = group * pp, last = std::min(m, first + pp);
    for (int k = 0; k < vpp; ++k) {
      for (int mb = first; mb < last; ++mb) {
        f.push_back({Kind::kForward, mb, k * pp + r});
        b.push_back({Kind::kBackward, mb, (vpp - 1 - k) * pp + r});
      }
    }
  }
  const int total = m * vpp;
  const int warmup = m == pp ? total : std::min((pp - r - 1) * 2 + (vpp - 1) * pp, total);
  return OneFOneBShape(f, b, warmup);
}

// Checks that `ranks` holds, on each rank, exactly one F and one B of every
// (micro-batch, chunk) with chunk % pp == rank, and nothing else.
absl::Status CheckCoverage(const std::vector<RankSchedule>& ranks, int pp, int vpp, int m) {
  if (static_cast<int>(ranks.size()) != pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule has ", ranks.size(), " ranks; expected pp=", pp));
  }
  const int chunks = pp * vpp;
  for (int r = 0; r < pp; ++r) {
    // One slot per (kind, micro-batch, this rank's chunk k = chunk / pp).
    std::vector<char> seen(2 * m * vpp, 0);
    for (const Action& a : ranks[r].actions) {
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= chunks ||
          a.chunk % pp != r) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " has action ", a.ToString(), " it cannot run: micro_batch must be in [0, ",
            m, ") and chunk in [0, ", chunks, ") with chunk % pp == ", r));
      }
      const int slot = (a.kind == Kind::kForward ? 0 : m * vpp) + a.micro_batch * vpp + a.chunk / pp;
      if (seen[slot]++) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " runs ", a.ToString(), " more than once"));
      }
    }
    if (ranks[r].actions.size() != static_cast<size_t>(2 * m * vpp)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " has ", ranks[r].actions.size(),
                                                     " actions; expected 2*m*vpp=", 2 * m * vpp));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> PipelinePlan::ChunksOfRank(int pp_rank) const {
  std::vector<int> out;
  for (const Chunk& c : chunks) {
    if (c.pp_rank == pp_rank) out.push_back(c.index);
  }
  return out;
}

absl::StatusOr<PipelinePlan> PartitionLayers(int64_t num_layers, int pp, int vpp) {
  if (pp < 1 || vpp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pp=", pp, " and vpp=", vpp, " are invalid; both must be >= 1"));
  }
  const int64_t n = int64_t{pp} * vpp;
  if (num_layers < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_layers=", num_layers, " cannot fill pp*vpp=", n, " pipeline chunks (pp=", pp,
        ", vpp=", vpp, "); every chunk needs at least one layer: use pp*vpp <= ", num_layers));
  }
  PipelinePlan plan;
  plan.pp = pp;
  plan.vpp = vpp;
  const int64_t base = num_layers / n, extra = num_layers % n;
  int64_t next = 0;
  for (int c = 0; c < n; ++c) {
    const int64_t size = base + (c < extra ? 1 : 0);
    Chunk chunk;
    chunk.index = c;
    chunk.pp_rank = c % pp;
    chunk.first_layer = next;
    chunk.last_layer = next + size - 1;
    chunk.has_embedding = c == 0;
    chunk.has_head = c == n - 1;
    next += size;
    plan.chunks.push_back(chunk);
  }
  return plan;
}

std::string Action::ToString() const {
  return absl::StrCat(kind == Kind::kForward ? "F" : "B", micro_batch, ".", chunk);
}

absl::StatusOr<Simulation> Simulate(const std::vector<RankSchedule>& ranks, int pp, int vpp,
                                    int m, int64_t t_forward, int64_t t_backward) {
  if (absl::Status s = CheckDegrees(pp, vpp, m); !s.ok()) return s;
  if (t_forward < 1 || t_backward < 1) {
    return absl::InvalidArgumentError(absl::StrCat("t_forward=", t_forward, " and t_backward=",
                                                   t_backward, " must both be >= 1"));
  }
  if (absl::Status s = CheckCoverage(ranks, pp, vpp, m); !s.ok()) return s;
  const int chunks = pp * vpp;
  // End time of F / B of (mb, c), or -1 while it has not run.
  std::vector<int64_t> f_end(m * chunks, -1), b_end(m * chunks, -1);
  auto slot = [chunks](const Action& a) { return a.micro_batch * chunks + a.chunk; };

  Simulation sim;
  sim.t_forward = t_forward;
  sim.t_backward = t_backward;
  sim.timeline.assign(pp, {});
  std::vector<size_t> next(pp, 0);
  std::vector<int64_t> free_at(pp, 0);
  size_t remaining = 0;
  for (const RankSchedule& rs : ranks) remaining += rs.actions.size();

  // Fixed-order list scheduling: each rank runs its next action as soon as
  // the rank is free and the action's inputs exist; start times depend only
  // on end times already fixed, so the order ranks are visited in does not
  // change them. A rank that cannot proceed waits until an action it may
  // depend on finishes (F(mb, c) wakes the rank of chunk c + 1, B(mb, c) the
  // rank of chunk c - 1), so the whole run is O(actions).
  std::vector<int> ready_ranks;
  std::vector<char> queued(pp, 1);
  for (int r = pp - 1; r >= 0; --r) ready_ranks.push_back(r);
  auto wake = [&](int chunk) {
    const int r = chunk % pp;
    if (!queued[r]) {
      queued[r] = 1;
      ready_ranks.push_back(r);
    }
  };
  while (!ready_ranks.empty()) {
    const int r = ready_ranks.back();
    ready_ranks.pop_back();
    queued[r] = 0;
    while (next[r] < ranks[r].actions.size()) {
      const Action& a = ranks[r].actions[next[r]];
      int64_t ready = free_at[r];
      bool runnable = true;
      auto need = [&](int64_t end) {
        if (end < 0) runnable = false;
        ready = std::max(ready, end);
      };
      if (a.kind == Kind::kForward) {
        if (a.chunk > 0) need(f_end[slot(a) - 1]);
      } else {
        need(f_end[slot(a)]);
        if (a.chunk < chunks - 1) need(b_end[slot(a) + 1]);
      }
      if (!runnable) break;
      const int64_t end = ready + (a.kind == Kind::kForward ? t_forward : t_backward);
      (a.kind == Kind::kForward ? f_end : b_end)[slot(a)] = end;
      sim.timeline[r].push_back({a, ready, end});
      free_at[r] = end;
      sim.makespan = std::max(sim.makespan, end);
      ++next[r];
      --remaining;
      if (a.kind == Kind::kForward && a.chunk < chunks - 1) wake(a.chunk + 1);
      if (a.kind == Kind::kBackward && a.chunk > 0) wake(a.chunk - 1);
    }
  }
  if (remaining > 0) {
    std::vector<std::string> stuck;
    for (int r = 0; r < pp; ++r) {
      if (next[r] < ranks[r].actions.size()) {
        stuck.push_back(absl::StrCat("rank ", r, " at ", ranks[r].actions[next[r]].ToString()));
      }
      if (stuck.size() == 8 && r + 1 < pp) {
        stuck.push_back("...");
        break;
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat("pipeline schedule deadlocks: every rank waits on another (",
                     absl::StrJoin(stuck, ", "), ")"));
  }
  sim.ideal = int64_t{m} * vpp * (t_forward + t_backward);
  sim.bubble_ratio = static_cast<double>(sim.makespan - sim.ideal) / static_cast<double>(sim.ideal);
  return sim;
}

absl::StatusOr<PipelineSchedule> BuildSchedule(ScheduleKind kind, int pp, int vpp, int m) {
  if (absl::Status s = CheckDegrees(pp, vpp, m); !s.ok()) return s;
  if (vpp > 1 && kind != ScheduleKind::kInterleaved) {
    return absl::InvalidArgumentError(absl::StrCat("vpp=", vpp, " needs schedule=interleaved; ",
                                                   ScheduleName(kind), " runs vpp=1"));
  }
  PipelineSchedule schedule;
  schedule.kind = kind;
  schedule.pp = pp;
  schedule.vpp = vpp;
  schedule.micro_batches = m;
  for (int r = 0; r < pp; ++r) {
    switch (kind) {
      case ScheduleKind::kGpipe:
        schedule.ranks.push_back(GpipeRank(r, m));
        break;
      case ScheduleKind::kOneFOneB:
        schedule.ranks.push_back(OneFOneBRank(r, pp, m));
        break;
      case ScheduleKind::kInterleaved:
        schedule.ranks.push_back(InterleavedRank(r, pp, vpp, m));
        break;
    }
  }
  absl::StatusOr<Simulation> sim = Simulate(schedule.ranks, pp, vpp, m);
  if (sim.ok()) {
    schedule.simulation = *std::move(sim);
    return schedule;
  }
  if (kind == ScheduleKind::kInterleaved && absl::IsFailedPrecondition(sim.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule=interleaved cannot run micro_batches=", m, " on pp=", pp, " with vpp=", vpp,
        " without deadlock (", sim.status().message(),
        "); use micro_batches that are a multiple of pp (e.g. ", pp * ((m + pp - 1) / pp),
        ") or schedule=1f1b"));
  }
  return absl::InternalError(absl::StrCat("planner built an invalid ", ScheduleName(kind),
                                          " schedule: ", sim.status().message()));
}

}  // namespace shardline::plan

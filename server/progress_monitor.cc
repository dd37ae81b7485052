#include "server/progress_monitor.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/time_util.h"

namespace shardline::server {
namespace {

using google::protobuf::util::TimeUtil;

absl::Duration ToDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

bool IsP2p(const std::string& operation) { return operation == "send" || operation == "recv"; }

// The sequence of the last completed operation of an entry.
uint64_t Completed(const v1::CollectiveProgress& c) {
  return c.in_flight() ? (c.sequence() > 0 ? c.sequence() - 1 : 0) : c.sequence();
}

absl::Status CheckDuration(const google::protobuf::Duration& d, const std::string& field) {
  if (d.seconds() < 0 || d.nanos() < 0 || d.nanos() > 999999999 || d.seconds() > 315576000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "={seconds: ", d.seconds(), ", nanos: ", d.nanos(),
        "} is invalid; give a non-negative duration (seconds >= 0, nanos in 0..999999999)"));
  }
  return absl::OkStatus();
}

// A rank's non-p2p entry for `group` (the first), or null.
const v1::CollectiveProgress* CollectiveEntry(const v1::RankProgress& p, const std::string& group) {
  for (const v1::CollectiveProgress& c : p.collectives()) {
    if (c.group() == group && !IsP2p(c.operation())) return &c;
  }
  return nullptr;
}

// What a waiting rank waits in: a collective of a group (shared by its
// members at one sequence) or one rank's send / recv.
struct Candidate {
  std::string group;
  std::string operation;
  uint64_t sequence = 0;
  bool p2p = false;
  uint32_t rank = 0;  // p2p: the waiting rank
  uint32_t peer = 0;  // p2p: its peer
  bool has_peer = false;
  std::vector<uint32_t> waiters;
  absl::Duration wait;  // longest elapsed + heartbeat age
};

std::string CandidateText(const Candidate& c) {
  if (c.p2p) {
    return absl::StrCat(c.operation, c.operation == "send" ? " to" : " from", " rank ",
                        c.has_peer ? absl::StrCat(c.peer) : std::string("?"), " #", c.sequence,
                        " of ", c.group);
  }
  return absl::StrCat(c.operation, " #", c.sequence, " of ", c.group);
}

}  // namespace

std::string Seconds1(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

absl::Status ValidateProgress(const v1::RankProgress& progress, uint32_t world_size,
                              uint64_t max_step) {
  if (progress.activity() == v1::ACTIVITY_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "progress.activity is UNSPECIFIED; say what the training thread does (IDLE, COMPUTE, "
        "COLLECTIVE or CHECKPOINT), or leave progress unset");
  }
  if (!v1::Activity_IsValid(progress.activity())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "progress.activity=", progress.activity(),
        " is not an Activity; give IDLE, COMPUTE, COLLECTIVE or CHECKPOINT"));
  }
  if (max_step > 0 && progress.step() > max_step) {
    return absl::InvalidArgumentError(absl::StrCat("progress.step=", progress.step(),
                                                   " is beyond train_steps=", max_step));
  }
  if (absl::Status s = CheckDuration(progress.step_time(), "progress.step_time"); !s.ok()) return s;
  if (absl::Status s = CheckDuration(progress.compute_time(), "progress.compute_time"); !s.ok()) {
    return s;
  }
  if (ToDuration(progress.step_time()) > absl::ZeroDuration() &&
      ToDuration(progress.compute_time()) > ToDuration(progress.step_time())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "progress.compute_time=", TimeUtil::ToString(progress.compute_time()),
        " exceeds progress.step_time=", TimeUtil::ToString(progress.step_time()),
        "; compute_time is the part of the step not spent waiting on a communicator"));
  }
  for (int i = 0; i < progress.collectives_size(); ++i) {
    const v1::CollectiveProgress& c = progress.collectives(i);
    const std::string at = absl::StrCat("progress.collectives[", i, "]");
    if (c.has_peer_rank() && c.peer_rank() >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".peer_rank=", c.peer_rank(),
                                                     " is not a rank; world_size is ",
                                                     world_size));
    }
    if (absl::Status s = CheckDuration(c.elapsed(), at + ".elapsed"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool MadeProgress(const v1::RankProgress* before, const v1::RankProgress& after) {
  if (before == nullptr) return true;
  if (after.step() > before->step()) return true;
  for (const v1::CollectiveProgress& a : after.collectives()) {
    const bool p2p = IsP2p(a.operation());
    for (const v1::CollectiveProgress& b : before->collectives()) {
      if (b.group() != a.group() || IsP2p(b.operation()) != p2p) continue;
      if (Completed(a) > Completed(b)) return true;
      // A send / recv with another peer or direction is another count.
      if (p2p && (a.operation() != b.operation() || a.peer_rank() != b.peer_rank()) &&
          a.sequence() != b.sequence()) {
        return true;
      }
      break;
    }
  }
  return false;
}

absl::Duration MedianStepTime(const std::vector<const v1::RankProgress*>& reports) {
  std::vector<absl::Duration> times;
  times.reserve(reports.size());
  for (const v1::RankProgress* p : reports) {
    if (p == nullptr) continue;
    const absl::Duration t = ToDuration(p->step_time());
    if (t > absl::ZeroDuration()) times.push_back(t);
  }
  if (times.empty()) return absl::ZeroDuration();
  auto mid = times.begin() + (times.size() - 1) / 2;
  std::nth_element(times.begin(), mid, times.end());
  return *mid;
}

std::string DescribeActivity(const v1::RankProgress* p) {
  if (p == nullptr) return "no progress report";
  switch (p->activity()) {
    case v1::ACTIVITY_IDLE:
      return "idle";
    case v1::ACTIVITY_COMPUTE:
      return absl::StrCat("in compute at step ", p->step());
    case v1::ACTIVITY_CHECKPOINT:
      return absl::StrCat("in a checkpoint at step ", p->step());
    case v1::ACTIVITY_COLLECTIVE:
      for (const v1::CollectiveProgress& c : p->collectives()) {
        if (!c.in_flight()) continue;
        if (IsP2p(c.operation())) {
          return absl::StrCat("waiting in ", c.operation(),
                              c.operation() == "send" ? " to rank " : " from rank ",
                              c.has_peer_rank() ? absl::StrCat(c.peer_rank()) : "?", " of ",
                              c.group(), " at step ", p->step());
        }
        return absl::StrCat("waiting in ", c.operation(), " #", c.sequence(), " of ", c.group(),
                            " at step ", p->step());
      }
      return absl::StrCat("waiting in a collective at step ", p->step());
    default:
      return "doing nothing it reported";
  }
}

std::optional<HangFinding> LocaliseHang(const std::vector<RankView>& ranks,
                                        const std::vector<v1::ProcessGroup>& groups,
                                        absl::Duration stale_after) {
  std::unordered_map<uint32_t, const RankView*> by_rank;
  by_rank.reserve(ranks.size());
  for (const RankView& r : ranks) by_rank[r.rank] = &r;
  std::unordered_map<std::string, const v1::ProcessGroup*> by_name;
  for (const v1::ProcessGroup& g : groups) by_name[g.name()] = &g;
  auto fresh = [&](const RankView& r) { return r.heartbeat_age <= stale_after; };

  // Every in-flight operation of a waiting rank.
  std::vector<Candidate> candidates;
  std::map<std::tuple<std::string, std::string, uint64_t>, size_t> collective_index;
  for (const RankView& r : ranks) {
    if (r.progress == nullptr || r.progress->activity() != v1::ACTIVITY_COLLECTIVE) continue;
    for (const v1::CollectiveProgress& c : r.progress->collectives()) {
      if (!c.in_flight()) continue;
      const absl::Duration wait = ToDuration(c.elapsed()) + r.heartbeat_age;
      size_t index;
      if (IsP2p(c.operation())) {
        index = candidates.size();
        candidates.emplace_back();
        Candidate& p = candidates.back();
        p.group = c.group();
        p.operation = c.operation();
        p.sequence = c.sequence();
        p.p2p = true;
        p.rank = r.rank;
        p.has_peer = c.has_peer_rank();
        p.peer = c.peer_rank();
        p.wait = wait;
      } else {
        auto [it, inserted] = collective_index.try_emplace(
            std::make_tuple(c.group(), c.operation(), c.sequence()), candidates.size());
        if (inserted) {
          candidates.emplace_back();
          candidates.back().group = c.group();
          candidates.back().operation = c.operation();
          candidates.back().sequence = c.sequence();
          candidates.back().wait = wait;
        }
        index = it->second;
      }
      Candidate& cand = candidates[index];
      cand.waiters.push_back(r.rank);
      cand.wait = std::max(cand.wait, wait);
    }
  }
  if (candidates.empty()) return std::nullopt;
  auto better = [](const Candidate& a, const Candidate& b) {
    if (a.wait != b.wait) return a.wait > b.wait;
    if (a.waiters.size() != b.waiters.size()) return a.waiters.size() > b.waiters.size();
    if (a.sequence != b.sequence) return a.sequence < b.sequence;
    return a.group < b.group;
  };

  // The ranks that hold `c` up.
  auto culprits_of = [&](const Candidate& c) {
    std::vector<uint32_t> out;
    if (c.p2p) {
      if (!c.has_peer) return out;
      auto it = by_rank.find(c.peer);
      if (it == by_rank.end() || it->second->progress == nullptr) return out;
      const RankView& peer = *it->second;
      bool matching = false;
      const std::string counterpart = c.operation == "send" ? "recv" : "send";
      for (const v1::CollectiveProgress& e : peer.progress->collectives()) {
        matching |= e.in_flight() && e.operation() == counterpart && e.group() == c.group &&
                    e.has_peer_rank() && e.peer_rank() == c.rank;
      }
      if (!matching || !fresh(peer)) out.push_back(c.peer);
      return out;
    }
    std::vector<uint32_t> members;
    if (auto g = by_name.find(c.group); g != by_name.end()) {
      members.assign(g->second->ranks().begin(), g->second->ranks().end());
    } else {
      for (const RankView& r : ranks) members.push_back(r.rank);
    }
    for (uint32_t m : members) {
      auto it = by_rank.find(m);
      if (it == by_rank.end() || it->second->progress == nullptr) continue;
      const RankView& r = *it->second;
      const v1::CollectiveProgress* e = CollectiveEntry(*r.progress, c.group);
      const bool issued = e != nullptr && e->in_flight() && e->sequence() == c.sequence;
      const bool ahead = e != nullptr && Completed(*e) >= c.sequence;
      if (!fresh(r) || (!issued && !ahead)) out.push_back(m);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  // Whether rank `r` is itself waiting (fresh, in flight somewhere).
  auto waiting_elsewhere = [&](uint32_t r) {
    auto it = by_rank.find(r);
    if (it == by_rank.end() || it->second->progress == nullptr || !fresh(*it->second)) return false;
    return it->second->progress->activity() == v1::ACTIVITY_COLLECTIVE;
  };

  size_t chosen = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (better(candidates[i], candidates[chosen])) chosen = i;
  }
  std::vector<uint32_t> culprits = culprits_of(candidates[chosen]);
  std::set<size_t> visited = {chosen};
  // Follow a chain of waits to its root: while every culprit waits itself,
  // go to the longest wait among the culprits' own.
  for (size_t step = 0; step < ranks.size() && !culprits.empty(); ++step) {
    if (!std::all_of(culprits.begin(), culprits.end(), waiting_elsewhere)) break;
    std::optional<size_t> next;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (visited.count(i) > 0) continue;
      const std::vector<uint32_t>& w = candidates[i].waiters;
      const bool theirs = std::any_of(w.begin(), w.end(), [&](uint32_t r) {
        return std::binary_search(culprits.begin(), culprits.end(), r);
      });
      if (theirs && (!next.has_value() || better(candidates[i], candidates[*next]))) next = i;
    }
    if (!next.has_value()) break;
    std::vector<uint32_t> further = culprits_of(candidates[*next]);
    visited.insert(*next);
    if (further.empty()) break;  // they wait in a complete collective: stay
    chosen = *next;
    culprits = std::move(further);
  }

  const Candidate& c = candidates[chosen];
  HangFinding f;
  f.culprit_ranks = culprits;
  v1::HangReport& report = f.report;
  report.set_group(c.group);
  report.set_operation(c.operation);
  report.set_sequence(c.sequence);
  report.set_num_waiting(static_cast<uint32_t>(c.waiters.size()));
  report.set_num_culprits(static_cast<uint32_t>(culprits.size()));
  std::vector<std::string> texts;
  for (uint32_t rank : culprits) {
    if (report.culprits_size() >= static_cast<int>(kMaxHungRanks)) break;
    const RankView& r = *by_rank.at(rank);
    v1::HungRank* h = report.add_culprits();
    h->set_rank(rank);
    h->set_worker_id(r.worker_id);
    h->set_host(r.host);
    h->set_activity(r.progress->activity());
    h->set_step(r.progress->step());
    for (const v1::CollectiveProgress& e : r.progress->collectives()) {
      if (e.group() == c.group && IsP2p(e.operation()) == c.p2p) {
        *h->mutable_last_collective() = e;
        break;
      }
    }
    *h->mutable_heartbeat_age() =
        TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(r.heartbeat_age));
    texts.push_back(absl::StrCat("rank ", rank, " (", r.worker_id, " on ",
                                 r.host.empty() ? "?" : r.host,
                                 "): ", DescribeActivity(r.progress), ", last heartbeat ",
                                 Seconds1(r.heartbeat_age), " ago"));
  }
  f.held_up_by = absl::StrJoin(texts, "; ");
  if (culprits.size() > texts.size()) {
    absl::StrAppend(&f.held_up_by, "; and ", culprits.size() - texts.size(), " more");
  }
  const std::string waiting =
      absl::StrCat(c.waiters.size(), c.waiters.size() == 1 ? " rank waits" : " ranks wait",
                   " in ", CandidateText(c), " for ", Seconds1(c.wait));
  report.set_summary(culprits.empty()
                         ? absl::StrCat(waiting, "; every rank of ", c.group,
                                        " is in it (calls that do not match?)")
                         : absl::StrCat(waiting, ", held up by ", f.held_up_by));
  return f;
}

void StragglerTracker::Reset(Options options) {
  options_ = options;
  windows_.clear();
  flagged_.clear();
  dirty_ = false;
}

bool StragglerTracker::Record(uint32_t rank, uint64_t step, absl::Duration compute_time) {
  if (compute_time <= absl::ZeroDuration() || options_.window_steps == 0) return false;
  Window& w = windows_[rank];
  if (w.any && step <= w.last_step) return false;
  w.any = true;
  w.last_step = step;
  if (w.times.size() < options_.window_steps) {
    w.times.push_back(compute_time);
  } else {
    w.times[w.next] = compute_time;
    w.next = (w.next + 1) % w.times.size();
  }
  w.median_valid = false;
  dirty_ = true;
  return true;
}

void StragglerTracker::Forget(uint32_t rank) {
  windows_.erase(rank);
  flagged_.erase(rank);
  dirty_ = true;
}

std::vector<StragglerChange> StragglerTracker::Evaluate() {
  std::vector<StragglerChange> changes;
  if (!dirty_) return changes;
  dirty_ = false;
  std::vector<absl::Duration> medians;
  medians.reserve(windows_.size());
  for (auto& [rank, w] : windows_) {
    if (w.times.size() < options_.window_steps) continue;
    if (!w.median_valid) {
      std::vector<absl::Duration> t = w.times;
      auto mid = t.begin() + (t.size() - 1) / 2;
      std::nth_element(t.begin(), mid, t.end());
      w.median = *mid;
      w.median_valid = true;
    }
    medians.push_back(w.median);
  }
  if (medians.empty()) return changes;
  auto mid = medians.begin() + (medians.size() - 1) / 2;
  std::nth_element(medians.begin(), mid, medians.end());
  const absl::Duration generation_median = *mid;
  for (auto& [rank, w] : windows_) {
    if (w.times.size() < options_.window_steps) continue;
    const double ratio = absl::FDivDuration(w.median, generation_median);
    const absl::Duration excess = w.median - generation_median;
    auto it = flagged_.find(rank);
    // Flagged above factor and min_excess; cleared only at or under
    // clear_ratio() or half the min_excess.
    const bool slow = it == flagged_.end()
                          ? ratio > options_.factor && excess > options_.min_excess
                          : ratio > clear_ratio() && excess > options_.min_excess / 2;
    StragglerChange c;
    c.rank = rank;
    c.compute_time = w.median;
    c.median_compute_time = generation_median;
    c.ratio = ratio;
    c.step = w.last_step;
    if (slow && it == flagged_.end()) {
      flagged_[rank] = c;
      changes.push_back(c);
    } else if (slow) {
      c.step = it->second.step;  // flagged since
      it->second = c;
    } else if (it != flagged_.end()) {
      flagged_.erase(it);
      c.cleared = true;
      changes.push_back(c);
    }
  }
  return changes;
}

}  // namespace shardline::server

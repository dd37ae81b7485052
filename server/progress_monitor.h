// Hang localisation and straggler tracking from the ranks' progress reports
// (proto/shardline/v1/progress.proto). Pure logic, no transport and no
// clock of its own: the coordinator (server/coordinator_progress.cc) feeds
// it what heartbeats carried and acts on what it finds.
//
//   // Hangs: every rank's latest report, how old its heartbeat is, and the
//   // plan's groups (spec/plan_proto.h PlanGroups::groups).
//   std::vector<RankView> ranks = ...;
//   std::optional<HangFinding> f = LocaliseHang(ranks, groups, stale_after);
//   if (f.has_value()) ... f->report.summary() ...
//
//   // Stragglers: one tracker per job, reset at each generation.
//   StragglerTracker t({/*factor=*/1.5, /*window_steps=*/10,
//                       /*min_excess=*/absl::Milliseconds(5)});
//   t.Record(/*rank=*/3, /*step=*/17, absl::Milliseconds(210));
//   for (const StragglerChange& c : t.Evaluate()) ...
//
// Units: durations are absl::Duration (progress.proto's Durations
// converted); steps and sequence numbers as progress.proto defines them.
//
// Thread-safety: the free functions are pure and thread-safe; a
// StragglerTracker is not thread-safe (the coordinator uses it under its
// lock).
#ifndef SHARDLINE_SERVER_PROGRESS_MONITOR_H_
#define SHARDLINE_SERVER_PROGRESS_MONITOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "shardline/v1/plan.pb.h"
#include "shardline/v1/progress.pb.h"
#include "spec/job_spec.h"

namespace shardline::server {

// HangReport.culprits lists at most this many (num_culprits counts all);
// Job.stragglers lists at most kMaxStragglersListed (num_stragglers counts
// all). As progress.proto and job.proto say.
inline constexpr size_t kMaxHungRanks = 16;
inline constexpr size_t kMaxStragglersListed = 16;

// The automatic progress timeout (ElasticPolicy.progress_timeout unset):
// max(kMinAutoProgressTimeout, kAutoProgressStepFactor x the median of the
// ranks' latest step_time). Defined in spec/job_spec.h, which shardctl
// shares.
inline constexpr absl::Duration kMinAutoProgressTimeout = spec::kMinAutoProgressTimeout;
inline constexpr int kAutoProgressStepFactor = spec::kAutoProgressStepFactor;

// The content checks of a heartbeat's RankProgress (its sizes are
// server/limits.h's, checked by the RPC adapter). `world_size`: of the
// sender's generation (0: not formed, every peer_rank is refused);
// `max_step`: the job's train_steps (0: no bound, an external job).
// InvalidArgument naming the field ("progress.activity",
// "progress.collectives[2].peer_rank", ...) and what is valid, when:
// activity is UNSPECIFIED; a peer_rank >= world_size; step > max_step; a
// Duration (elapsed, step_time, compute_time) is negative or not a valid
// google.protobuf.Duration; compute_time exceeds a non-zero step_time.
absl::Status ValidateProgress(const v1::RankProgress& progress, uint32_t world_size,
                              uint64_t max_step);

// Whether `after` shows progress over `before` (the same rank's previous
// report in the same generation; null: none, which counts as progress):
// a later step, or a group whose completed sequence went up (completed:
// sequence when not in_flight, sequence - 1 when in_flight; collectives and
// point-to-point entries of a group counted apart).
bool MadeProgress(const v1::RankProgress* before, const v1::RankProgress& after);

// The median of the ranks' step_time (those reporting a positive one), or
// zero when none does. O(n).
absl::Duration MedianStepTime(const std::vector<const v1::RankProgress*>& reports);

// One rank of a generation as the coordinator sees it.
struct RankView {
  uint32_t rank = 0;
  std::string worker_id;
  std::string host;
  // Its latest report; null when it sent none (an external job's agent, an
  // older worker): such a rank is never named a culprit.
  const v1::RankProgress* progress = nullptr;
  // How long ago its last heartbeat arrived.
  absl::Duration heartbeat_age;
};

// What LocaliseHang found. `report` has culprits (at most kMaxHungRanks,
// lowest rank first), num_culprits, group, operation, sequence,
// num_waiting and summary set; the caller sets generation, stalled_for,
// progress_timeout, action and time. `culprit_ranks`: every culprit,
// ascending (for eviction beyond the listed ones). `held_up_by`: the
// culprits for a reason line, "rank 2 (w2 on host1): in compute at step
// 15, last heartbeat 6.1 s ago; rank 5 (...)" (empty when none).
struct HangFinding {
  v1::HangReport report;
  std::vector<uint32_t> culprit_ranks;
  std::string held_up_by;
};

// Finds who holds the waiting ranks up. `ranks`: every rank of the
// generation, any order (ranks unique). `groups`: the plan's groups (which
// global ranks each holds); a group a report names that is not among them
// counts as holding every rank. `stale_after`: a heartbeat older than this
// makes its rank a culprit of any collective it is a member of, whatever
// its last report said (a SIGSTOPped process).
//
// The collective the others wait in is the in-flight one that waiting
// ranks (activity COLLECTIVE) have waited in longest (elapsed + heartbeat
// age; ties: more waiters, then the lower sequence, then the group name).
// Its culprits are the members of its group that are not in flight in the
// same operation and sequence with a fresh heartbeat (behind: a lower
// completed sequence, not in flight, in compute or a checkpoint, idle),
// and for a send / recv the peer unless it is in flight in the matching
// recv / send to this rank. When every such rank is itself waiting in
// another collective, the search moves on to that one (up to one step per
// rank), so that the rank at the root of a chain of waits is named.
// nullopt when no rank waits in a collective. A finding may have no
// culprits (every member in the same collective: e.g. mismatched calls).
std::optional<HangFinding> LocaliseHang(const std::vector<RankView>& ranks,
                                        const std::vector<v1::ProcessGroup>& groups,
                                        absl::Duration stale_after);

// "in compute", "waiting in all_reduce #47 of dp/0", "idle", ... for
// messages people read; "no progress report" for null.
std::string DescribeActivity(const v1::RankProgress* progress);

// "6.1 s": one decimal, for messages.
std::string Seconds1(absl::Duration d);

// One change StragglerTracker::Evaluate found.
struct StragglerChange {
  uint32_t rank = 0;
  bool cleared = false;            // false: newly flagged
  absl::Duration compute_time;     // the rank's window median
  absl::Duration median_compute_time;  // the generation's median of medians
  double ratio = 0;                // compute_time / median_compute_time
  uint64_t step = 0;               // the rank's latest recorded step
};

// Per rank, a window of the compute_time of its last window_steps distinct
// steps; a rank whose window median exceeds factor x the generation median
// (the median of the window medians of the ranks whose windows are full;
// for an even count the lower middle one) and exceeds it by more than
// min_excess is flagged, and cleared only when it is back at or under
// clear_ratio() = 1 + (factor - 1) / 2 x that median (1.25x for the default
// 1.5x) or within min_excess / 2 of it: a rank hovering around either
// threshold on a noisy host is flagged once, not flagged and cleared at
// every report. min_excess keeps scheduler noise from flagging a rank whose
// steps compute for a millisecond (job.proto straggler_min_excess). Only
// ranks with full windows are judged.
class StragglerTracker {
 public:
  struct Options {
    double factor = spec::kDefaultStragglerFactor;              // > 1
    uint32_t window_steps = spec::kDefaultStragglerWindowSteps;  // >= 1
    absl::Duration min_excess = spec::kDefaultStragglerMinExcess;  // >= 0
  };
  StragglerTracker() = default;
  explicit StragglerTracker(Options options) : options_(options) {}

  // Forgets every window and flag (a new generation, or new options).
  void Reset(Options options);
  const Options& options() const { return options_; }
  // The ratio at or under which a flagged rank is cleared (see above).
  double clear_ratio() const { return 1 + (options_.factor - 1) / 2; }

  // Records `rank`'s compute time of `step`; a step not after the last one
  // recorded for the rank, or a non-positive compute_time, is ignored.
  // Returns whether it was recorded. O(1).
  bool Record(uint32_t rank, uint64_t step, absl::Duration compute_time);
  // Forgets one rank (it left the generation); a flag it had is dropped
  // without a change.
  void Forget(uint32_t rank);

  // Re-judges the ranks when something was recorded since the last call
  // (else returns nothing): the flag changes, in rank order. O(ranks x
  // window) at most.
  std::vector<StragglerChange> Evaluate();

  // The flagged ranks and their latest judgement, by rank.
  const std::map<uint32_t, StragglerChange>& flagged() const { return flagged_; }

 private:
  struct Window {
    std::vector<absl::Duration> times;  // ring buffer of at most window_steps
    size_t next = 0;
    uint64_t last_step = 0;
    bool any = false;
    absl::Duration median;
    bool median_valid = false;
  };
  Options options_;
  std::map<uint32_t, Window> windows_;
  std::map<uint32_t, StragglerChange> flagged_;
  bool dirty_ = false;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_PROGRESS_MONITOR_H_

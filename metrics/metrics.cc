#include "metrics/metrics.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::metrics {
namespace {

// Prometheus float text: the shortest of %.15g / %.17g that reads back as v.
std::string FormatDouble(double v) {
  std::string s = absl::StrFormat("%.15g", v);
  double back = 0;
  if (absl::SimpleAtod(s, &back) && back == v) return s;
  return absl::StrFormat("%.17g", v);
}

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);  // e.g. "DEADLINE_EXCEEDED"
  return name.empty() ? absl::StrCat(static_cast<int>(code)) : name;
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Metrics::Metrics(JobSnapshotFn jobs) : jobs_(std::move(jobs)) {}

void Metrics::ObserveRpc(absl::string_view method, absl::Duration latency, absl::StatusCode code) {
  const double seconds = absl::ToDoubleSeconds(latency);
  absl::MutexLock lock(&mu_);
  Histogram& h = latency_[std::string(method)];
  for (size_t i = 0; i < kRpcLatencyBuckets.size(); ++i) {
    if (seconds <= kRpcLatencyBuckets[i]) {
      ++h.buckets[i];
      break;
    }
  }
  ++h.count;
  h.sum_seconds += seconds;
  ++calls_[{std::string(method), code}];
}

std::string Metrics::Render() const {
  std::string out;
  absl::StrAppend(&out,
                  "# HELP shardline_joins_total Successful JoinJob calls.\n"
                  "# TYPE shardline_joins_total counter\n"
                  "shardline_joins_total ",
                  joins_.load(std::memory_order_relaxed), "\n",
                  "# HELP shardline_heartbeats_total Heartbeat calls answered OK.\n"
                  "# TYPE shardline_heartbeats_total counter\n"
                  "shardline_heartbeats_total ",
                  heartbeats_.load(std::memory_order_relaxed), "\n");

  // Called without mu_: the callback takes the coordinator's lock.
  std::vector<JobSnapshot> jobs = jobs_ ? jobs_() : std::vector<JobSnapshot>{};
  absl::StrAppend(&out,
                  "# HELP shardline_job_generation Current generation of the job.\n"
                  "# TYPE shardline_job_generation gauge\n");
  for (const JobSnapshot& job : jobs) {
    absl::StrAppend(&out, "shardline_job_generation{job=\"", EscapeLabelValue(job.job_id),
                    "\"} ", job.generation, "\n");
  }
  static const char* const kStates[] = {"joining", "active", "spare", "fenced", "lost", "left"};
  absl::StrAppend(&out,
                  "# HELP shardline_job_members Members of the job by state.\n"
                  "# TYPE shardline_job_members gauge\n");
  for (const JobSnapshot& job : jobs) {
    std::set<std::string> states(std::begin(kStates), std::end(kStates));
    for (const auto& [state, n] : job.members_by_state) states.insert(state);
    for (const std::string& state : states) {
      auto it = job.members_by_state.find(state);
      absl::StrAppend(&out, "shardline_job_members{job=\"", EscapeLabelValue(job.job_id),
                      "\",state=\"", EscapeLabelValue(state), "\"} ",
                      it == job.members_by_state.end() ? 0 : it->second, "\n");
    }
  }

  absl::StrAppend(&out,
                  "# HELP shardline_job_stragglers Ranks of the current generation flagged as "
                  "stragglers.\n"
                  "# TYPE shardline_job_stragglers gauge\n");
  for (const JobSnapshot& job : jobs) {
    absl::StrAppend(&out, "shardline_job_stragglers{job=\"", EscapeLabelValue(job.job_id),
                    "\"} ", job.stragglers, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP shardline_job_hangs_detected_total Hangs the coordinator found in the "
                  "job.\n"
                  "# TYPE shardline_job_hangs_detected_total counter\n");
  for (const JobSnapshot& job : jobs) {
    absl::StrAppend(&out, "shardline_job_hangs_detected_total{job=\"",
                    EscapeLabelValue(job.job_id), "\"} ", job.hangs_detected, "\n");
  }

  absl::MutexLock lock(&mu_);
  absl::StrAppend(&out,
                  "# HELP shardline_rpc_duration_seconds Time in the RPC handler (streams: "
                  "their lifetime).\n"
                  "# TYPE shardline_rpc_duration_seconds histogram\n");
  for (const auto& [method, h] : latency_) {
    const std::string m = EscapeLabelValue(method);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kRpcLatencyBuckets.size(); ++i) {
      cumulative += h.buckets[i];
      absl::StrAppend(&out, "shardline_rpc_duration_seconds_bucket{method=\"", m, "\",le=\"",
                      FormatDouble(kRpcLatencyBuckets[i]), "\"} ", cumulative, "\n");
    }
    absl::StrAppend(&out, "shardline_rpc_duration_seconds_bucket{method=\"", m,
                    "\",le=\"+Inf\"} ", h.count, "\n");
    absl::StrAppend(&out, "shardline_rpc_duration_seconds_sum{method=\"", m, "\"} ",
                    FormatDouble(h.sum_seconds), "\n");
    absl::StrAppend(&out, "shardline_rpc_duration_seconds_count{method=\"", m, "\"} ", h.count,
                    "\n");
  }
  absl::StrAppend(&out,
                  "# HELP shardline_rpcs_total RPCs by final status code.\n"
                  "# TYPE shardline_rpcs_total counter\n");
  for (const auto& [key, n] : calls_) {
    absl::StrAppend(&out, "shardline_rpcs_total{method=\"", EscapeLabelValue(key.first),
                    "\",code=\"", CodeName(key.second), "\"} ", n, "\n");
  }
  return out;
}

}  // namespace shardline::metrics

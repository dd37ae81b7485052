#include "worker/train/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "plan/plan.h"

namespace shardline::worker::train {
namespace {

// Marks a status as "this host has too little memory for this rank".
constexpr char kShortagePayload[] = "type.googleapis.com/shardline.worker.HostMemoryShortage";

absl::Status Shortage(std::string message) {
  absl::Status s = absl::ResourceExhaustedError(std::move(message));
  s.SetPayload(kShortagePayload, absl::Cord("1"));
  return s;
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// "Key:   123 kB" lines of /proc/meminfo and /proc/self/status, in bytes.
std::optional<int64_t> KiloBytesField(const std::string& text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, "kB");
    int64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kb)) return kb * 1024;
  }
  return std::nullopt;
}

// A cgroup file holding one number; nullopt for "max" (no limit) or absent.
std::optional<int64_t> CgroupNumber(const std::string& path) {
  std::optional<std::string> text = ReadFile(path);
  int64_t v = 0;
  if (!text.has_value() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v)) {
    return std::nullopt;
  }
  return v;
}

// limit - usage + inactive_file of the memory cgroup in `dir`, when it has a
// limit: the kernel reclaims inactive page cache before it OOM-kills.
std::optional<int64_t> CgroupHeadroom(const std::string& dir, bool v2) {
  std::optional<int64_t> limit =
      CgroupNumber(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  // v1 reports "no limit" as a huge page-aligned number.
  if (!limit.has_value() || *limit >= (int64_t{1} << 60)) return std::nullopt;
  std::optional<int64_t> usage =
      CgroupNumber(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
  if (!usage.has_value()) return std::nullopt;
  int64_t inactive = 0;
  if (std::optional<std::string> stat = ReadFile(dir + "/memory.stat")) {
    const absl::string_view key = v2 ? "inactive_file " : "total_inactive_file ";
    for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
      if (absl::ConsumePrefix(&line, key)) (void)absl::SimpleAtoi(line, &inactive);
    }
  }
  return std::max<int64_t>(0, *limit - *usage + inactive);
}

// The tightest cgroup limit of this process, v2 or v1, if any. The path in
// /proc/self/cgroup may not exist inside a container's cgroup namespace;
// the mount root is then the process's own cgroup.
std::optional<int64_t> CgroupAvailable() {
  std::optional<std::string> cgroups = ReadFile("/proc/self/cgroup");
  if (!cgroups.has_value()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const bool v2 = f[0] == "0" && f[1].empty();
    const bool v1 = absl::StrContains(absl::StrCat(",", f[1], ","), ",memory,");
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    for (const std::string& dir : {root + (f[2] == "/" ? "" : f[2]), root}) {
      if (std::optional<int64_t> h = CgroupHeadroom(dir, v2)) return h;
    }
  }
  return std::nullopt;
}


// What a user can change, in the job spec's terms.
std::string Advice(const plan::ParallelConfig& p) {
  return absl::StrCat(
      "spread the model over more ranks (raise spec.parallel.pp or spec.parallel.tp; now tp=", p.tp,
      " pp=", p.pp, "), shard model states over data-parallel ranks (spec.parallel.zero_stage up "
      "to 3 with more workers; now zero_stage=", p.zero_stage, " at dp=", p.dp,
      "), lower spec.training.micro_batch (now ", p.micro_batch_size,
      ") for activations, or run on a host with more memory");
}


// The trainer keeps fp32 weights, gradients and moments at every precision
// (bf16 is rounding on the way through the math, bf16_device.h), where the
// planner counts bf16 as ZeRO's 2 + 2 + 12 bytes per parameter: its
// memory is planned as fp32's.
plan::ParallelConfig AsTrained(plan::ParallelConfig parallel) {
  parallel.precision = plan::Precision::kFp32;
  return parallel;
}

}  // namespace

std::string BytesText(int64_t bytes) {
  return absl::StrCat(plan::HumanBytes(bytes), " (", bytes, " bytes)");
}

absl::StatusOr<HostMemory> ProbeHostMemory() {
  std::optional<std::string> meminfo = ReadFile("/proc/meminfo");
  std::optional<int64_t> mem_available =
      meminfo.has_value() ? KiloBytesField(*meminfo, "MemAvailable") : std::nullopt;
  if (!mem_available.has_value()) {
    return absl::UnavailableError("cannot read MemAvailable from /proc/meminfo");
  }
  HostMemory best{*mem_available, "MemAvailable"};
  auto consider = [&best](int64_t available, const char* limit) {
    if (available < best.available) best = {std::max<int64_t>(0, available), limit};
  };
  const std::string status = ReadFile("/proc/self/status").value_or("");
  const std::pair<int, std::pair<const char*, const char*>> rlimits[] = {
      {RLIMIT_AS, {"VmSize", "RLIMIT_AS headroom"}},
      {RLIMIT_DATA, {"VmData", "RLIMIT_DATA headroom"}}};
  for (const auto& [resource, names] : rlimits) {
    rlimit r{};
    if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) continue;
    const int64_t cap = r.rlim_cur > static_cast<rlim_t>(std::numeric_limits<int64_t>::max())
                            ? std::numeric_limits<int64_t>::max()
                            : static_cast<int64_t>(r.rlim_cur);
    consider(cap - KiloBytesField(status, names.first).value_or(0), names.second);
  }
  if (std::optional<int64_t> cgroup = CgroupAvailable()) {
    consider(*cgroup, "cgroup memory limit headroom");
  }
  return best;
}

absl::StatusOr<plan::MemoryEstimate> EstimateRankMemory(const plan::GptConfig& model,
                                                        const plan::ParallelConfig& parallel,
                                                        const plan::RankCoordinates& c) {
  absl::StatusOr<plan::Plan> p = plan::MakePlan(model, AsTrained(parallel));
  if (!p.ok()) return p.status();
  absl::StatusOr<int> rank = p->topology.CheckedRankOf(c);
  if (!rank.ok()) return rank.status();
  return p->memory[*rank];
}

absl::Status CheckHostMemory(const plan::GptConfig& model, const plan::ParallelConfig& parallel,
                             const std::vector<plan::RankCoordinates>& ranks,
                             const HostMemoryProbe& probe) {
  if (ranks.empty()) return absl::OkStatus();
  absl::StatusOr<plan::Plan> p = plan::MakePlan(model, AsTrained(parallel));
  if (!p.ok()) return p.status();
  int64_t need = 0;
  int largest = -1;
  for (const plan::RankCoordinates& c : ranks) {
    absl::StatusOr<int> rank = p->topology.CheckedRankOf(c);
    if (!rank.ok()) return rank.status();
    const int64_t total = p->memory[*rank].total();
    // Saturate: a process of many huge ranks need not fit in int64.
    need = total > std::numeric_limits<int64_t>::max() - need ? std::numeric_limits<int64_t>::max()
                                                              : need + total;
    if (largest < 0 || total > p->memory[largest].total()) largest = *rank;
  }
  absl::StatusOr<HostMemory> host = probe ? probe() : ProbeHostMemory();
  if (!host.ok() || need <= host->available) return absl::OkStatus();

  const plan::MemoryEstimate& m = p->memory[largest];
  const plan::RankCoordinates c = p->topology.CoordinatesOf(largest);
  const std::string kinds =
      absl::StrCat("params ", plan::HumanBytes(m.params), ", grads ", plan::HumanBytes(m.grads),
                   ", optimizer ", plan::HumanBytes(m.optimizer));
  const std::string who =
      ranks.size() == 1
          ? absl::StrCat("rank ", largest, " (tp_rank ", c.tp_rank, ", pp_rank ", c.pp_rank,
                         ", dp_rank ", c.dp_rank, ") needs ", BytesText(need),
                         " for its model states (", kinds)
          : absl::StrCat("the ", ranks.size(), " ranks of this process need ", BytesText(need),
                         " for their model states (largest rank ", largest, ": ", kinds);
  return Shortage(absl::StrCat("not enough host memory: ", who, "; fp32, ZeRO stage ",
                               parallel.zero_stage,
                               ", as `shardctl plan` counts them, activations "
                               "not included) but this process can get ",
                               plan::HumanBytes(host->available), " (", host->available, " bytes, ",
                               host->limit, "); to fit, ", Advice(parallel)));
}

absl::Status HostOutOfMemoryError(const std::string& what, const plan::GptConfig& model,
                                  const plan::ParallelConfig& parallel) {
  return Shortage(absl::StrCat("out of host memory (std::bad_alloc) while ", what, " for ",
                               model.num_layers, " layers of hidden_size ", model.hidden_size,
                               "; to fit, ", Advice(parallel)));
}

bool IsHostMemoryShortage(const absl::Status& status) {
  return absl::IsResourceExhausted(status) && status.GetPayload(kShortagePayload).has_value();
}

}  // namespace shardline::worker::train

#include "plan/config.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline::plan {
namespace {

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, "=", value, " is invalid; ", field, " must be >= 1"));
}

absl::Status AtMost(absl::string_view field, int64_t value, int64_t limit) {
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, "=", value, " is too large; the limit is ", limit));
}

}  // namespace

absl::string_view ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
  }
  return "unknown";
}

absl::StatusOr<ScheduleKind> ParseSchedule(absl::string_view name) {
  for (ScheduleKind kind :
       {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved}) {
    if (name == ScheduleName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "schedule='", name, "' is not a schedule; choose one of gpipe, 1f1b, interleaved"));
}

absl::string_view PrecisionName(Precision precision) {
  return precision == Precision::kFp32 ? "fp32" : "mixed";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16" || name == "mixed") return Precision::kMixed;
  return absl::InvalidArgumentError(
      absl::StrCat("precision='", name, "' is not a precision; choose fp32 or mixed (bf16 is another name for mixed)"));
}

absl::Status RenameFields(const absl::Status& status,
                          const std::vector<std::pair<std::string, std::string>>& names) {
  if (status.ok()) return status;
  const absl::string_view in = status.message();
  std::string out;
  for (size_t i = 0; i < in.size();) {
    const bool word_start = i == 0 || in[i - 1] == ' ' || in[i - 1] == '(';
    bool replaced = false;
    for (const auto& [from, to] : names) {
      if (word_start && in.substr(i, from.size()) == from) {
        out += to;
        i += from.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += in[i++];
  }
  return absl::Status(status.code(), out);
}

std::string DivisorsOf(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return absl::StrCat("{", absl::StrJoin(low, ", "), "}");
}

absl::Status ValidateGptConfig(const GptConfig& m) {
  struct Size {
    absl::string_view field;
    int64_t value;
    int64_t limit;
  };
  const Size sizes[] = {{"num_layers", m.num_layers, kMaxLayers},
                        {"hidden_size", m.hidden_size, kMaxWidth},
                        {"num_heads", m.num_heads, kMaxWidth},
                        {"vocab_size", m.vocab_size, kMaxVocab},
                        {"seq_length", m.seq_length, kMaxSeqLength}};
  for (const Size& size : sizes) {
    if (absl::Status s = Positive(size.field, size.value); !s.ok()) return s;
    if (absl::Status s = AtMost(size.field, size.value, size.limit); !s.ok()) return s;
  }
  if (m.ffn_hidden_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ffn_hidden_size=", m.ffn_hidden_size,
        " is invalid; use a positive width, or 0 for the default 4 * hidden_size"));
  }
  if (absl::Status s = AtMost("ffn_hidden_size", m.ffn(), kMaxWidth); !s.ok()) return s;
  // The parameter count, in 128-bit arithmetic so the check itself cannot
  // overflow; every later int64 product of sizes is below it.
  const __int128 h = m.hidden_size, f = m.ffn();
  const __int128 count = __int128{m.vocab_size} * h + __int128{m.seq_length} * h +
                         __int128{m.num_layers} * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h;
  if (count > kMaxParameters) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has more than ", kMaxParameters,
        " parameters (2^50); check num_layers, hidden_size, ffn_hidden_size and vocab_size"));
  }
  if (m.hidden_size % m.num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads=", m.num_heads, " does not divide hidden_size=", m.hidden_size,
                     "; choose num_heads in ", DivisorsOf(m.hidden_size)));
  }
  return absl::OkStatus();
}

absl::Status ValidateParallelConfig(const ParallelConfig& p) {
  const std::pair<absl::string_view, int64_t> degrees[] = {
      {"tp", p.tp},
      {"pp", p.pp},
      {"dp", p.dp},
      {"vpp", p.vpp},
      {"micro_batches", p.micro_batches},
      {"micro_batch_size", p.micro_batch_size},
      {"zero_alignment", p.zero_alignment}};
  for (const auto& [field, value] : degrees) {
    if (absl::Status s = Positive(field, value); !s.ok()) return s;
  }
  // World and micro-batch counts are bounded so every rank- and action-indexed
  // table stays small enough to build.
  if (int64_t{p.tp} * p.pp * p.dp > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size=tp*pp*dp=", int64_t{p.tp} * p.pp * p.dp,
                     " is too large; the planner supports up to ", kMaxWorldSize, " ranks"));
  }
  if (int64_t{p.micro_batches} * p.vpp > kMaxActionsPerRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches*vpp=", int64_t{p.micro_batches} * p.vpp,
                     " is too large; the planner supports up to ", kMaxActionsPerRank,
                     " forward passes per rank and iteration"));
  }
  if (int64_t{p.pp} * p.vpp * p.micro_batches > kMaxScheduleActions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pp*vpp*micro_batches=", int64_t{p.pp} * p.vpp * p.micro_batches,
        " is too large; the planner simulates up to ", kMaxScheduleActions,
        " forward passes per iteration"));
  }
  if (p.micro_batch_size > kMaxMicroBatchSize) {
    return absl::InvalidArgumentError(absl::StrCat("micro_batch_size=", p.micro_batch_size,
                                                   " is too large; the limit is ",
                                                   kMaxMicroBatchSize, " samples"));
  }
  if (p.zero_alignment > kMaxAlignment) {
    return absl::InvalidArgumentError(absl::StrCat("zero_alignment=", p.zero_alignment,
                                                   " is too large; the limit is ", kMaxAlignment,
                                                   " elements"));
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_stage=", p.zero_stage, " is invalid; choose zero_stage in {0, 1, 2, 3}"));
  }
  if (p.vpp > 1 && p.schedule != ScheduleKind::kInterleaved) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vpp=", p.vpp, " needs schedule=interleaved (schedule=", ScheduleName(p.schedule),
        " runs one chunk per pp rank); use vpp=1 or schedule=interleaved"));
  }
  if (p.vpp > 1 && p.pp == 1) {
    // Interleaving splits each stage's layers into chunks so that other
    // stages work while one waits; with one stage nobody waits, and the
    // chunks would only be a slower sequential pass.
    return absl::InvalidArgumentError(absl::StrCat(
        "vpp=", p.vpp, " with pp=1: an interleaved schedule needs two or more pipeline stages; use "
        "vpp=1, or pp=2 or more"));
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const GptConfig& m, const ParallelConfig& p) {
  if (absl::Status s = ValidateGptConfig(m); !s.ok()) return s;
  if (absl::Status s = ValidateParallelConfig(p); !s.ok()) return s;
  // Megatron-LM tensor parallelism: attention heads, the hidden and MLP widths
  // and the vocabulary (vocab-parallel embedding) are split evenly over tp.
  const int64_t all = std::gcd(std::gcd(m.num_heads, m.hidden_size),
                               std::gcd(m.ffn(), m.vocab_size));
  const std::pair<absl::string_view, int64_t> split[] = {{"num_heads", m.num_heads},
                                                         {"hidden_size", m.hidden_size},
                                                         {"ffn_hidden_size", m.ffn()},
                                                         {"vocab_size", m.vocab_size}};
  for (const auto& [field, value] : split) {
    if (value % p.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp=", p.tp, " does not divide ", field, "=", value, "; choose tp in ",
          DivisorsOf(all), " (tp must divide num_heads, hidden_size, ffn_hidden_size and ",
          "vocab_size)"));
    }
  }
  const int64_t shard_ranges = int64_t{p.tp} * p.dp * (m.num_layers + 2);
  if (shard_ranges > kMaxShardRanges) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan would list tp*dp*(num_layers+2)=", shard_ranges, " ZeRO shard ranges, more than ",
        kMaxShardRanges, "; plan a smaller layout, or estimate memory alone from the parameter "
        "count (shardctl plan --params)"));
  }
  const int64_t chunks = int64_t{p.pp} * p.vpp;
  if (m.num_layers < chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_layers=", m.num_layers, " is fewer than pp*vpp=", p.pp, "*", p.vpp, "=", chunks,
        " pipeline chunks; every chunk needs at least one layer, so use pp*vpp <= ",
        m.num_layers));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorldSize(int64_t world_size, const ParallelConfig& p) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size=", world_size,
                                                   " is invalid; choose world_size in [1, ",
                                                   kMaxWorldSize, "]"));
  }
  const int64_t expected = int64_t{p.tp} * p.pp * p.dp;
  if (world_size == expected) return absl::OkStatus();
  const int64_t model_parallel = int64_t{p.tp} * p.pp;
  std::string hint =
      world_size >= 1 && world_size % model_parallel == 0
          ? absl::StrCat("use dp=", world_size / model_parallel)
          : absl::StrCat("world_size must be a multiple of tp*pp=", model_parallel);
  return absl::InvalidArgumentError(absl::StrCat("world_size=", world_size, " != tp*pp*dp=", p.tp,
                                                 "*", p.pp, "*", p.dp, "=", expected, "; ", hint));
}

}  // namespace shardline::plan

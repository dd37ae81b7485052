#include "client/shardctl/plan_command.h"

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "client/shardctl/plan_json.h"
#include "plan/memory.h"
#include "plan/plan.h"
#include "plan/schedule_svg.h"

namespace shardline::shardctl {
namespace {

constexpr char kUsage[] =
    "Usage:\n"
    "  shardctl plan --layers L --hidden H --heads A --vocab V --seq S [--ffn F]\n"
    "                --tp T --pp P --dp D [--vpp V] [--zero Z] [--alignment A]\n"
    "                [--micro-batches M] [--micro-batch-size B] [--world N]\n"
    "                [--schedule gpipe|1f1b|interleaved] [--precision fp32|bf16]\n"
    "                [--json] [--schedule-svg FILE]\n"
    "  shardctl plan --params N --tp T --pp P --dp D [--zero Z] [--alignment A]\n"
    "                [--precision fp32|bf16] [--world N] [--json]\n"
    "  shardctl plan owner PARAMETER [--element I] <model and layout flags>\n";

// Larger schedules make SVGs of many megabytes that no viewer shows usefully.
constexpr int64_t kMaxSvgForwardPasses = 1 << 14;

struct Flags {
  int64_t layers = 0, hidden = 0, heads = 0, vocab = 0, seq = 0, ffn = 0;
  int64_t tp = 1, pp = 1, dp = 1, vpp = 1, zero = 0, alignment = 1;
  int64_t micro_batches = 1, micro_batch_size = 1, params = 0, world = 0, element = 0;
  std::string schedule, precision = "fp32", schedule_svg;
  bool json = false, help = false;
};

void Register(ArgParser& p, Flags& f) {
  p.AddInt("layers", &f.layers, "transformer layers");
  p.AddInt("hidden", &f.hidden, "hidden size (model width)");
  p.AddInt("heads", &f.heads, "attention heads; must divide --hidden");
  p.AddInt("vocab", &f.vocab, "vocabulary size in tokens (256 for bytes)");
  p.AddInt("seq", &f.seq, "sequence length in tokens");
  p.AddInt("ffn", &f.ffn, "MLP inner width (default 4 * hidden)");
  p.AddInt("tp", &f.tp, "tensor-parallel degree (default 1)");
  p.AddInt("pp", &f.pp, "pipeline-parallel degree (default 1)");
  p.AddInt("dp", &f.dp, "data-parallel degree (default 1)");
  p.AddInt("vpp", &f.vpp, "virtual chunks per pp rank (interleaved; default 1)");
  p.AddInt("zero", &f.zero, "ZeRO stage 0-3 (default 0)");
  p.AddInt("alignment", &f.alignment, "ZeRO shard alignment in elements (default 1)");
  p.AddInt("micro-batches", &f.micro_batches, "micro-batches per iteration (default 1)");
  p.AddInt("micro-batch-size", &f.micro_batch_size, "samples per micro-batch (default 1)");
  p.AddString("schedule", &f.schedule,
              "gpipe | 1f1b | interleaved (default 1f1b; interleaved when --vpp > 1)");
  p.AddString("precision", &f.precision,
              "fp32 | bf16 (also mixed: bf16 weights and gradients, fp32 master and moments, "
              "2 + 2 + 12 bytes per parameter as ZeRO counts them; default fp32)");
  p.AddInt("params", &f.params, "parameter count, for a memory-only estimate");
  p.AddInt("world", &f.world, "world size to check against tp*pp*dp");
  p.AddInt("element", &f.element, "plan owner: element index in the unsplit parameter");
  p.AddBool("json", &f.json, "print the full plan as JSON");
  p.AddString("schedule-svg", &f.schedule_svg, "write the pipeline timeline as SVG to FILE");
  p.AddBool("help", &f.help, "show this help");
}

// The planner names configuration fields (hidden_size=...); the user typed
// flags (--hidden).
absl::Status InFlagTerms(const absl::Status& s) {
  static const auto* const kNames = new std::vector<std::pair<std::string, std::string>>{
      {"num_layers=", "--layers="},       {"ffn_hidden_size=", "--ffn="},
      {"hidden_size=", "--hidden="},      {"num_heads=", "--heads="},
      {"vocab_size=", "--vocab="},        {"seq_length=", "--seq="},
      {"zero_stage=", "--zero="},         {"zero_alignment=", "--alignment="},
      {"micro_batch_size=", "--micro-batch-size="}, {"micro_batches=", "--micro-batches="},
      {"world_size=", "--world="},        {"tp=", "--tp="},
      {"pp=", "--pp="},                   {"dp=", "--dp="},
      {"vpp=", "--vpp="},                 {"schedule=", "--schedule="},
      {"precision=", "--precision="},     {"params=", "--params="},
      {"element=", "--element="}};
  return plan::RenameFields(s, *kNames);
}

absl::StatusOr<int> ToInt(const char* flag, int64_t v) {
  if (v < INT_MIN || v > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", v, " is out of range; it must fit a 32-bit integer"));
  }
  return static_cast<int>(v);
}

absl::StatusOr<plan::ParallelConfig> Parallel(const Flags& f, const ArgParser& parser) {
  const bool vpp_given = parser.WasSet("vpp");
  plan::ParallelConfig p;
  const std::pair<const char*, std::pair<int64_t, int*>> ints[] = {
      {"tp", {f.tp, &p.tp}},
      {"pp", {f.pp, &p.pp}},
      {"dp", {f.dp, &p.dp}},
      {"vpp", {f.vpp, &p.vpp}},
      {"zero", {f.zero, &p.zero_stage}},
      {"micro-batches", {f.micro_batches, &p.micro_batches}}};
  for (const auto& [flag, target] : ints) {
    absl::StatusOr<int> v = ToInt(flag, target.first);
    if (!v.ok()) return v.status();
    *target.second = *v;
  }
  p.micro_batch_size = f.micro_batch_size;
  p.zero_alignment = f.alignment;
  if (!f.schedule.empty()) {
    absl::StatusOr<plan::ScheduleKind> kind = plan::ParseSchedule(f.schedule);
    if (!kind.ok()) return kind.status();
    p.schedule = *kind;
  } else if (vpp_given && p.vpp > 1) {
    p.schedule = plan::ScheduleKind::kInterleaved;
  }
  absl::StatusOr<plan::Precision> precision = plan::ParsePrecision(f.precision);
  if (!precision.ok()) return precision.status();
  p.precision = *precision;
  if (absl::Status s = plan::ValidateParallelConfig(p); !s.ok()) return s;
  if (parser.WasSet("world")) {
    if (absl::Status s = plan::ValidateWorldSize(f.world, p); !s.ok()) return s;
  }
  return p;
}

std::string Count(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.2f %s", v, units[u]);
}

std::string HumanFlops(double flops) {
  const char* units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  int u = 0;
  while (flops >= 1000 && u < 6) {
    flops /= 1000;
    ++u;
  }
  return absl::StrFormat("%.3g %s", flops, units[u]);
}

std::string MemoryLine(const plan::MemoryEstimate& m) {
  return absl::StrCat("params ", HumanBytes(m.params), ", grads ", HumanBytes(m.grads),
                      ", optimizer ", HumanBytes(m.optimizer), "; total ", HumanBytes(m.total()),
                      " (", Count(m.total()), " bytes)");
}

// At most `limit` groups, then "… (N more)".
std::string GroupList(const std::vector<std::vector<int>>& groups, size_t limit = 8) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < groups.size() && i < limit; ++i) {
    parts.push_back(absl::StrCat("[", absl::StrJoin(groups[i], ","), "]"));
  }
  if (groups.size() > limit) parts.push_back(absl::StrCat("... (", groups.size() - limit, " more)"));
  return groups.empty() ? "(none)" : absl::StrJoin(parts, " ");
}

std::string Summary(const plan::Plan& p) {
  const plan::GptConfig& m = p.model;
  const plan::ParallelConfig& l = p.parallel;
  std::string out;
  absl::StrAppendFormat(&out, "Model      GPT: %d layers, hidden %d, %d heads, ffn %d, vocab %d, seq %d\n",
                        m.num_layers, m.hidden_size, m.num_heads, m.ffn(), m.vocab_size,
                        m.seq_length);
  absl::StrAppend(&out, "           ", Count(p.parameter_count), " parameters; ",
                  HumanFlops(p.flops_per_iteration), " per iteration of ", l.global_batch(),
                  " samples (", HumanFlops(p.flops_per_iteration_recompute),
                  " with activation recomputation)\n");
  absl::StrAppendFormat(&out,
                        "Layout     world %d = tp %d x pp %d x dp %d; vpp %d; ZeRO stage %d; %s; "
                        "%d micro-batches of %d\n",
                        l.world_size(), l.tp, l.pp, l.dp, l.vpp, l.zero_stage,
                        std::string(plan::PrecisionName(l.precision)), l.micro_batches,
                        l.micro_batch_size);
  for (int r = 0; r < p.pipeline.pp; ++r) {
    std::vector<std::string> chunks;
    for (int c : p.pipeline.ChunksOfRank(r)) {
      const plan::Chunk& ch = p.pipeline.chunks[c];
      chunks.push_back(absl::StrCat("chunk ", c, " layers ", ch.first_layer, "-", ch.last_layer,
                                    ch.has_embedding ? " +embedding" : "",
                                    ch.has_head ? " +head" : ""));
    }
    absl::StrAppend(&out, r == 0 ? "Pipeline   " : "           ", "stage ", r, ": ",
                    absl::StrJoin(chunks, "; "), "\n");
  }
  const plan::Simulation& sim = p.schedule.simulation;
  absl::StrAppendFormat(&out, "Schedule   %s: bubble ratio %.4f (makespan %d, ideal %d, t_F=1, t_B=2)\n",
                        std::string(plan::ScheduleName(p.schedule.kind)), sim.bubble_ratio,
                        sim.makespan, sim.ideal);
  if (p.schedule.kind == plan::ScheduleKind::kInterleaved && l.micro_batches % l.pp != 0) {
    const int m = (l.micro_batches + l.pp - 1) / l.pp * l.pp;
    absl::StrAppendFormat(&out,
                          "           note: micro-batches %d is not a multiple of pp %d; the "
                          "interleaved bubble (pp-1)/(vpp*m) holds for m = %d, %d, ...\n",
                          l.micro_batches, l.pp, m, m + l.pp);
  }
  for (int r = 0; r < p.schedule.pp && r < 8; ++r) {
    std::vector<std::string> actions;
    const auto& list = p.schedule.ranks[r].actions;
    for (size_t k = 0; k < list.size() && k < 16; ++k) actions.push_back(list[k].ToString());
    if (list.size() > 16) actions.push_back(absl::StrCat("... (", list.size() - 16, " more)"));
    absl::StrAppend(&out, "           stage ", r, " (warmup ", p.schedule.ranks[r].warmup, "): ",
                    absl::StrJoin(actions, " "), "\n");
  }
  const plan::Topology& t = p.topology;
  absl::StrAppend(&out, "Groups     tp: ", GroupList(t.tp_groups()), "\n");
  absl::StrAppend(&out, "           dp: ", GroupList(t.dp_groups()), "\n");
  absl::StrAppend(&out, "           pp: ", GroupList(t.pp_groups()), "\n");
  absl::StrAppend(&out, "ZeRO       stage ", p.zero.zero_stage, ", alignment ", p.zero.alignment,
                  " elements: ", p.zero.units.size(),
                  " units (embedding, one per layer, head; per tp rank), each sharded over dp=",
                  p.zero.dp, "\n");
  absl::StrAppend(&out, "Memory     per rank, largest (rank ", p.max_memory_rank, "): ",
                  MemoryLine(p.memory[p.max_memory_rank]), "\n");
  absl::StrAppend(&out, "           model states only (no activations); --json lists every rank\n");
  return out;
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file << content;
  if (!file || !file.flush()) {
    return absl::UnavailableError(absl::StrCat("cannot write --schedule-svg file '", path,
                                               "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::Status RunPlan(const std::vector<std::string>& args, std::ostream& out) {
  Flags f;
  ArgParser parser("shardctl plan");
  Register(parser, f);
  absl::StatusOr<std::vector<std::string>> positional = parser.Parse(args);
  if (!positional.ok()) return positional.status();
  if (f.help) {
    out << kUsage << "\n" << parser.Usage();
    return absl::OkStatus();
  }
  const bool owner = !positional->empty() && (*positional)[0] == "owner";
  if (!positional->empty() && !owner && (*positional)[0].size() > 1 && (*positional)[0][0] == '-') {
    return absl::InvalidArgumentError(absl::StrCat("unknown option '", (*positional)[0],
                                                   "'; flags take two dashes, e.g. --tp 2"));
  }
  if (!positional->empty() && !owner) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", (*positional)[0],
                                                   "'; the only plan subcommand is 'owner'\n",
                                                   kUsage));
  }
  if (owner && positional->size() != 2) {
    return absl::InvalidArgumentError(
        "plan owner takes exactly one parameter name, e.g. 'shardctl plan owner "
        "layers.0.mlp.fc1.weight --element 5 <model flags>'");
  }
  if (parser.WasSet("element") && !owner) {
    return absl::InvalidArgumentError("--element only applies to 'shardctl plan owner'");
  }

  if (parser.WasSet("schedule-svg") && (f.schedule_svg.empty() || f.schedule_svg == "-")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule-svg needs a file path to write (got '", f.schedule_svg, "')"));
  }
  if (parser.WasSet("schedule-svg") && owner) {
    return absl::InvalidArgumentError("--schedule-svg does not apply to 'shardctl plan owner'");
  }
  // Before the layout is checked: a pipeline flag with --params is the
  // mistake to name, not what the layout makes of it.
  if (parser.WasSet("params")) {
    for (const char* flag : {"vpp", "schedule", "micro-batches", "micro-batch-size"}) {
      if (parser.WasSet(flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, " does not apply to a memory-only estimate (--params); it needs the "
            "model flags"));
      }
    }
  }
  absl::StatusOr<plan::ParallelConfig> parallel = Parallel(f, parser);
  if (!parallel.ok()) return parallel.status();

  const char* model_flags[] = {"layers", "hidden", "heads", "vocab", "seq", "ffn"};
  bool any_model_flag = false;
  for (const char* flag : model_flags) any_model_flag |= parser.WasSet(flag);

  if (parser.WasSet("params")) {
    if (any_model_flag || owner || parser.WasSet("schedule-svg")) {
      return absl::InvalidArgumentError(
          "--params gives a memory-only estimate; drop it to plan a model from --layers, "
          "--hidden, --heads, --vocab and --seq (owner queries and --schedule-svg need the "
          "model)");
    }
    absl::StatusOr<plan::MemoryEstimate> m = plan::EstimateFromParameterCount(f.params, *parallel);
    if (!m.ok()) return m.status();
    if (f.json) {
      out << MemoryEstimateToJson(f.params, *parallel, *m);
    } else {
      out << "Memory estimate for " << Count(f.params) << " parameters, "
          << plan::PrecisionName(parallel->precision) << ", tp " << parallel->tp << " x pp "
          << parallel->pp << " x dp " << parallel->dp << ", ZeRO stage " << parallel->zero_stage
          << "\nper rank: " << MemoryLine(*m)
          << "\nmodel states only (no activations); parameters split evenly over tp*pp\n";
    }
    return absl::OkStatus();
  }

  for (const char* flag : {"layers", "hidden", "heads", "vocab", "seq"}) {
    if (!parser.WasSet(flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " is required: give --layers, --hidden, --heads, --vocab and --seq, or "
          "--params N for a memory-only estimate"));
    }
  }
  const plan::GptConfig model{f.layers, f.hidden, f.heads, f.ffn, f.vocab, f.seq};
  absl::StatusOr<plan::Plan> p = plan::MakePlan(model, *parallel);
  if (!p.ok()) return p.status();

  if (owner) {
    std::optional<int64_t> element;
    if (parser.WasSet("element")) element = f.element;
    absl::StatusOr<std::vector<plan::Holder>> holders =
        plan::FindOwners(p->zero, p->topology, p->parameters, (*positional)[1], element);
    if (!holders.ok()) return holders.status();
    if (f.json) {
      out << OwnersToJson((*positional)[1], element, parallel->zero_stage, *holders);
      return absl::OkStatus();
    }
    out << absl::StrFormat("%-10s %5s %4s %4s %4s  %-10s %-18s %s\n", "KIND", "RANK", "TP", "DP",
                           "PP", "UNIT", "UNIT RANGE", "ELEMENTS (tp-local)");
    for (const plan::Holder& h : *holders) {
      out << absl::StrFormat(
          "%-10s %5d %4d %4d %4d  %-10s %-18s %s%s\n", std::string(plan::StateKindName(h.kind)),
          h.rank, h.coordinates.tp_rank, h.coordinates.dp_rank, h.coordinates.pp_rank, h.unit,
          absl::StrCat("[", h.unit_range.begin, ",", h.unit_range.end, ")"),
          absl::StrCat("[", h.local_range.begin, ",", h.local_range.end, ")"),
          h.tied_copy ? "  (tied head copy)" : "");
    }
    if (holders->empty()) out << "(no holders: the parameter has no elements)\n";
    return absl::OkStatus();
  }

  if (!f.schedule_svg.empty()) {
    const int64_t actions = int64_t{p->parallel.pp} * p->parallel.vpp * p->parallel.micro_batches;
    if (actions > kMaxSvgForwardPasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--schedule-svg draws at most ", kMaxSvgForwardPasses,
          " forward passes (pp*vpp*micro_batches); this schedule has ", actions,
          ", too many to read in a picture: draw it with fewer --micro-batches"));
    }
    if (absl::Status s = WriteFile(f.schedule_svg, plan::ScheduleSvg(p->schedule)); !s.ok()) {
      return s;
    }
  }
  out << (f.json ? PlanToJson(*p) : Summary(*p));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPlanCommand(const std::vector<std::string>& args, std::ostream& out) {
  return InFlagTerms(RunPlan(args, out));
}

}  // namespace shardline::shardctl

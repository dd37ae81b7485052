#include "client/shardctl/job_format.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/shardctl/table.h"
#include "common/text.h"
#include "google/protobuf/util/json_util.h"
#include "spec/job_spec.h"

namespace shardline::shardctl {
namespace {

std::string Phase(v1::JobPhase p) { return EnumName(v1::JobPhase_descriptor(), p); }

std::string Duration(const google::protobuf::Duration& d) {
  if (d.seconds() == 0 && d.nanos() == 0) return "default";
  return absl::FormatDuration(absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos()));
}

std::string Range(const v1::ElementRange& r) { return absl::StrCat("[", r.begin(), ",", r.end(), ")"); }

std::string Slice(const v1::TensorSlice& s) {
  std::vector<std::string> dims;
  for (const v1::DimSlice& d : s.dims()) {
    dims.push_back(absl::StrCat(d.offset(), ":", d.offset() + d.length()));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string ScheduleName(v1::Schedule s) {
  switch (s) {
    case v1::SCHEDULE_GPIPE:
      return "gpipe";
    case v1::SCHEDULE_ONE_F_ONE_B:
      return "1f1b";
    case v1::SCHEDULE_INTERLEAVED:
      return "interleaved";
    default:
      return "default";
  }
}

std::string Optional(bool has, uint32_t v) { return has ? absl::StrCat(v) : "-"; }

absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

// Whether what the member said at its last heartbeat still describes it. A
// FENCED, LOST or LEFT member has no rank (RANK shows "-") and its last
// report belongs to a world it is no longer in, so its reported columns show
// "-" too; STATE and DETAIL say what happened.
bool Current(const v1::Member& m) {
  return m.state() == v1::MEMBER_STATE_JOINING || m.state() == v1::MEMBER_STATE_ACTIVE ||
         m.state() == v1::MEMBER_STATE_SPARE;
}

// The WORKER STATE column: Member.worker_state while current.
std::string WorkerStateCell(const v1::Member& m) {
  if (!Current(m) || m.worker_state() == v1::WORKER_STATE_UNSPECIFIED) return "-";
  return EnumName(v1::WorkerState_descriptor(), m.worker_state());
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

// A measured duration, short: "250ms", "3.1s".
std::string Elapsed(const google::protobuf::Duration& d) {
  const absl::Duration x = FromProto(d);
  if (x < absl::Seconds(1)) return absl::StrCat(absl::ToInt64Milliseconds(x), "ms");
  return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(x));
}

// Activity as the column shows it: "compute", "collective", "checkpoint",
// "idle"; "-" when unspecified.
std::string ActivityName(v1::Activity a) {
  if (a == v1::ACTIVITY_UNSPECIFIED) return "-";
  return absl::AsciiStrToLower(EnumName(v1::Activity_descriptor(), a));
}

// In flight: "all_reduce #66 dp/0 (waiting 3.1s)", "recv #3 pp/1 from rank
// 2 (waiting 250ms)"; the last one finished (none in flight): "last
// all_reduce #66 dp/0", so the two never read alike.
std::string CollectiveText(const v1::CollectiveProgress& c) {
  std::string out = absl::StrCat(c.in_flight() ? "" : "last ", Printable(c.operation(), 32), " #",
                                 c.sequence(), " ", Printable(c.group(), 64));
  if (c.has_peer_rank()) {
    absl::StrAppend(&out, c.operation() == "recv" ? " from rank " : " to rank ", c.peer_rank());
  }
  if (c.in_flight()) absl::StrAppend(&out, " (waiting ", Elapsed(c.elapsed()), ")");
  return out;
}

// The collective the COLLECTIVE column shows: the in-flight one that has
// waited longest; with none in flight, the completed one with the highest
// sequence (sequences count per group, so this is the busiest group's
// latest). Null when the rank reported none.
const v1::CollectiveProgress* ShownCollective(const v1::RankProgress& p) {
  const v1::CollectiveProgress* best = nullptr;
  for (const v1::CollectiveProgress& c : p.collectives()) {
    if (best == nullptr || (c.in_flight() && !best->in_flight())) {
      best = &c;
    } else if (c.in_flight() == best->in_flight() &&
               (c.in_flight() ? FromProto(c.elapsed()) > FromProto(best->elapsed())
                              : c.sequence() > best->sequence())) {
      best = &c;
    }
  }
  return best;
}

std::string ActivityCell(const v1::Member& m) {
  if (!Current(m) || !m.has_progress()) return "-";
  return ActivityName(m.progress().activity());
}

std::string CollectiveCell(const v1::Member& m) {
  if (!Current(m) || !m.has_progress()) return "-";
  const v1::CollectiveProgress* c = ShownCollective(m.progress());
  return c == nullptr ? "-" : CollectiveText(*c);
}

std::string StragglerCell(const v1::Member& m) {
  if (!Current(m) || !m.has_straggler()) return "-";
  return absl::StrFormat("%.1fx%s", m.straggler().ratio(),
                         m.straggler().replacing() ? " replacing" : "");
}

// "rank 3 (w3 on node1)".
std::string RankOf(uint32_t rank, const std::string& worker_id, const std::string& host) {
  return absl::StrCat("rank ", rank, " (", Printable(worker_id, 128),
                      host.empty() ? "" : absl::StrCat(" on ", Printable(host, 128)), ")");
}

// One straggler for `job get` and `watch`: "rank 3 (w3 on node1): compute
// 38ms per step, 1.90x the median 20ms, since step 40".
std::string StragglerText(const v1::Straggler& s) {
  return absl::StrCat(RankOf(s.rank(), s.worker_id(), s.host()), ": compute ",
                      Elapsed(s.compute_time()), " per step, ",
                      absl::StrFormat("%.2fx", s.ratio()), " the median ",
                      Elapsed(s.median_compute_time()), ", since step ", s.since_step(),
                      s.replacing() ? "; being replaced by a spare" : "");
}

// What the coordinator did about a hang (HangReport.action).
std::string HangAction(v1::HangPolicy action) {
  switch (action) {
    case v1::HANG_POLICY_EVICT:
      return "the culprits were evicted (hang_policy EVICT) and the job re-forms without them";
    case v1::HANG_POLICY_REPORT:
      return "reported only (hang_policy REPORT)";
    default:
      return absl::StrCat("action ", EnumName(v1::HangPolicy_descriptor(), action));
  }
}

// HangReport.summary, or (a report without one) what its fields say.
std::string HangSummary(const v1::HangReport& h) {
  if (!h.summary().empty()) return Printable(h.summary());
  std::string out = absl::StrCat(h.num_culprits(), h.num_culprits() == 1 ? " rank" : " ranks",
                                 " held the others up");
  if (!h.operation().empty()) {
    absl::StrAppend(&out, "; ", h.num_waiting(), " waiting in ", Printable(h.operation(), 32), " #",
                    h.sequence(), " of ", Printable(h.group(), 64));
  }
  return out;
}

// The "Last hang" and "Stragglers" lines of `job get`, when there is
// something to say.
void AddHangAndStragglers(const v1::Job& job,
                          std::vector<std::pair<std::string, std::string>>* lines) {
  if (job.has_last_hang()) {
    const v1::HangReport& h = job.last_hang();
    lines->emplace_back("Last hang",
                        absl::StrCat(HangSummary(h), "\ngeneration ", h.generation(), ", ",
                                     FormatTimestamp(h.time()), ": ", HangAction(h.action())));
  }
  if (job.num_stragglers() > 0 || !job.stragglers().empty()) {
    std::vector<std::string> rows;
    for (const v1::Straggler& s : job.stragglers()) rows.push_back(StragglerText(s));
    const int more = static_cast<int>(job.num_stragglers()) - job.stragglers_size();
    if (more > 0) rows.push_back(absl::StrCat("and ", more, " more"));
    lines->emplace_back("Stragglers", absl::StrJoin(rows, "\n"));
  }
}

// The spec's hang detection, as the coordinator applies it (job.proto
// ElasticPolicy, spec/job_spec.h): "progress_timeout auto (max(30s, 10x
// median step)), evict", "progress_timeout 5s, report", "off
// (progress_timeout 0s)".
std::string HangDetection(const v1::ElasticPolicy& e) {
  if (e.has_progress_timeout() && FromProto(e.progress_timeout()) == absl::ZeroDuration()) {
    return "off (progress_timeout 0s)";
  }
  const std::string timeout =
      e.has_progress_timeout()
          ? absl::FormatDuration(FromProto(e.progress_timeout()))
          : absl::StrCat("auto (max(", absl::FormatDuration(spec::kMinAutoProgressTimeout), ", ",
                         spec::kAutoProgressStepFactor, "x median step))");
  return absl::StrCat("progress_timeout ", timeout, ", ",
                      e.hang_policy() == v1::HANG_POLICY_REPORT ? "report" : "evict");
}

// The spec's straggler detection: "1.5x the median compute (and 5ms more)
// over 10 steps, report" or "..., replace by a spare" (defaults applied; no
// parenthesis when straggler_min_excess is 0 s).
std::string StragglerDetection(const v1::ElasticPolicy& e) {
  const double factor =
      e.straggler_factor() == 0 ? spec::kDefaultStragglerFactor : e.straggler_factor();
  const uint32_t window = e.straggler_window_steps() == 0 ? spec::kDefaultStragglerWindowSteps
                                                          : e.straggler_window_steps();
  const absl::Duration min_excess = e.has_straggler_min_excess()
                                        ? FromProto(e.straggler_min_excess())
                                        : spec::kDefaultStragglerMinExcess;
  return absl::StrCat(
      absl::StrFormat("%g", factor), "x the median compute",
      min_excess > absl::ZeroDuration()
          ? absl::StrCat(" (and ", absl::FormatDuration(min_excess), " more)")
          : "",
      " over ", window, " steps, ",
      e.straggler_policy() == v1::STRAGGLER_POLICY_REPLACE ? "replace by a spare" : "report");
}

// The World line of a job whose first generation has not formed. The
// coordinator forms it (Coordinator::MaybeFormLocked) once ChooseDp accepts
// the JOINING workers and either max_workers have joined or the last call
// (elastic.last_call from when enough had joined) has passed.
std::string NotFormed(const v1::Job& job, const v1::ListMembersResponse* members) {
  const v1::ElasticPolicy& e = job.spec().elastic();
  if (job.phase() == v1::JOB_PHASE_CANCELLED) return "none: cancelled before it formed";
  if (job.phase() == v1::JOB_PHASE_FAILED) return "none: failed before it formed";
  if (members == nullptr) {
    return absl::StrCat("not formed yet (needs ", e.min_workers(), " workers)");
  }
  std::vector<absl::Time> joined;  // join times of the workers waiting for this generation
  for (const v1::Member& m : members->members()) {
    if (m.state() == v1::MEMBER_STATE_JOINING && m.generation() == job.generation()) {
      joined.push_back(FromProto(m.join_time()));
    }
  }
  std::sort(joined.begin(), joined.end());
  const int n = static_cast<int>(joined.size());
  if (!spec::ChooseWorldSize(job.spec(), n).has_value()) {
    if (n < static_cast<int>(e.min_workers()) || spec::IsExternalJob(job.spec())) {
      return absl::StrCat("not formed yet; waiting for workers: ", n, " joined, needs at least ",
                          e.min_workers(), " (min_workers)");
    }
    return absl::StrCat("not formed yet; waiting for workers: ", n,
                        " joined, but no tp x pp x dp layout with dp dividing the global batch "
                        "fits them");
  }
  // The last call started when the first formable count had joined.
  int enough = 1;
  while (enough < n && !spec::ChooseWorldSize(job.spec(), enough).has_value()) ++enough;
  const absl::Time deadline =
      joined[enough - 1] + absl::Seconds(e.last_call().seconds()) +
      absl::Nanoseconds(e.last_call().nanos());
  return absl::StrCat("not formed yet; waiting for workers: ", n, " of ", e.max_workers(),
                      " joined (max_workers), last call until ",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", deadline, absl::UTCTimeZone()),
                      ", then it forms with those joined");
}


}  // namespace

std::string Printable(absl::string_view text, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    size_t n = 0;
    const std::string piece = DisplayCharacter(text, i, &n);
    if (max_bytes != std::string::npos && out.size() + piece.size() > max_bytes) {
      return out + "...";
    }
    out += piece;
    i += n;
  }
  return out;
}

absl::StatusOr<std::string> ProtoToJsonOr(const google::protobuf::Message& message,
                                          bool one_line) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = !one_line;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) return absl::InvalidArgumentError(status.message().as_string());
  // add_whitespace ends with a newline; keep exactly one at the call site.
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string ProtoToJson(const google::protobuf::Message& message, bool one_line) {
  absl::StatusOr<std::string> out = ProtoToJsonOr(message, one_line);
  if (!out.ok()) return absl::StrCat("{\"error\": \"", out.status().message(), "\"}");
  return *std::move(out);
}

std::string JobListJson(const v1::ListJobsResponse& all, std::vector<std::string>* unprintable) {
  v1::ListJobsResponse shown = all;
  shown.clear_jobs();
  for (const v1::Job& job : all.jobs()) {
    absl::StatusOr<std::string> one = ProtoToJsonOr(job, /*one_line=*/true);
    if (one.ok()) {
      *shown.add_jobs() = job;
    } else {
      unprintable->push_back(
          absl::StrCat(AbbreviateValue(job.job_id()), ": ", one.status().message()));
    }
  }
  return ProtoToJson(shown);
}

std::string EnumName(const google::protobuf::EnumDescriptor* type, int value) {
  const google::protobuf::EnumValueDescriptor* v = type->FindValueByNumber(value);
  if (v == nullptr) return absl::StrCat(value);
  std::string prefix;
  for (char c : type->name()) {
    if (absl::ascii_isupper(c) && !prefix.empty()) prefix += '_';
    prefix += absl::ascii_toupper(c);
  }
  prefix += '_';
  return absl::StartsWith(v->name(), prefix) ? v->name().substr(prefix.size()) : v->name();
}

std::string FormatTimestamp(const google::protobuf::Timestamp& t, bool millis) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  const absl::Time time = absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
  return absl::FormatTime(millis ? "%Y-%m-%dT%H:%M:%E3SZ" : "%Y-%m-%dT%H:%M:%SZ", time,
                          absl::UTCTimeZone());
}

// `job get` of an external job (job.proto ExternalWorkload): no model, plan
// or train_steps; its world is its nodes.
std::string FormatExternalJob(const v1::Job& job, const v1::ListMembersResponse* members) {
  const v1::JobSpec& s = job.spec();
  const v1::ElasticPolicy& e = s.elastic();
  std::vector<std::pair<std::string, std::string>> lines;
  lines.emplace_back("Job", job.job_id());
  if (!s.name().empty()) lines.emplace_back("Name", Printable(s.name()));
  lines.emplace_back(
      "Kind", absl::StrCat("external workload (framework ",
                           s.external().framework().empty() ? std::string("unnamed")
                                                            : Printable(s.external().framework()),
                           "): no plan; ranks are the workload's"));
  lines.emplace_back(
      "Phase", job.phase_reason().empty()
                   ? Phase(job.phase())
                   : absl::StrCat(Phase(job.phase()), " (", Printable(job.phase_reason()), ")"));
  lines.emplace_back("Generation", absl::StrCat(job.generation()));
  if (job.world_size() == 0) {
    lines.emplace_back("World", NotFormed(job, members));
  } else {
    lines.emplace_back(
        "World", absl::StrCat(job.world_size(), job.world_size() == 1 ? " rank; " : " ranks; ",
                              job.num_spares(), job.num_spares() == 1 ? " spare" : " spares"));
  }
  lines.emplace_back("Step", absl::StrCat(job.step(), " (as the workload reports it)"));
  AddHangAndStragglers(job, &lines);
  const v1::CheckpointConfig& c = s.checkpoint();
  lines.emplace_back("Checkpoints", c.directory().empty() ? "none (no directory)"
                                                          : absl::StrCat("by the workload into ",
                                                                         Printable(c.directory())));
  const bool capped =
      e.max_workers() != 0 && e.max_workers() < static_cast<uint32_t>(plan::kMaxWorldSize);
  lines.emplace_back(
      "Elastic",
      absl::StrCat(e.min_workers(), "..",
                   capped ? absl::StrCat(e.max_workers()) : std::string("any"),
                   " nodes, heartbeat ", Duration(e.heartbeat_interval()), ", timeout ",
                   Duration(e.heartbeat_timeout()), ", last call ", Duration(e.last_call())));
  lines.emplace_back("Created", FormatTimestamp(job.create_time()));
  lines.emplace_back("Updated", FormatTimestamp(job.update_time()));
  return KeyValueBlock(lines);
}

std::string FormatJob(const v1::Job& job, const v1::ListMembersResponse* members) {
  if (spec::IsExternalJob(job.spec())) return FormatExternalJob(job, members);
  const v1::JobSpec& s = job.spec();
  const v1::ModelConfig& m = s.model();
  const v1::ParallelConfig& p = s.parallel();
  const v1::TrainingConfig& t = s.training();
  const v1::ElasticPolicy& e = s.elastic();
  std::vector<std::pair<std::string, std::string>> lines;
  lines.emplace_back("Job", job.job_id());
  if (!s.name().empty()) lines.emplace_back("Name", Printable(s.name()));
  lines.emplace_back("Phase", job.phase_reason().empty()
                                  ? Phase(job.phase())
                                  : absl::StrCat(Phase(job.phase()), " (",
                                                 Printable(job.phase_reason()), ")"));
  lines.emplace_back("Generation", absl::StrCat(job.generation()));
  if (job.world_size() == 0) {
    lines.emplace_back("World", NotFormed(job, members));
  } else {
    lines.emplace_back("World", absl::StrCat(job.world_size(), " = tp ", p.tp(), " x pp ", p.pp(),
                                             " x dp ", job.dp(), "; ", job.num_spares(),
                                             job.num_spares() == 1 ? " spare" : " spares"));
  }
  lines.emplace_back("Step", absl::StrCat(job.step(), " / ", t.train_steps()));
  lines.emplace_back("Last checkpoint",
                     job.has_last_checkpoint()
                         ? absl::StrCat(job.last_checkpoint().checkpoint_id(), " (step ",
                                        job.last_checkpoint().step(), ")")
                         : "none");
  AddHangAndStragglers(job, &lines);
  lines.emplace_back(
      "Model", absl::StrCat("GPT ", m.num_layers(), " layers, hidden ", m.hidden_size(), ", ",
                            m.num_heads(), " heads, ffn ",
                            m.ffn_hidden_size() == 0 ? 4 * m.hidden_size() : m.ffn_hidden_size(),
                            ", vocab ", m.vocab_size(), ", seq ", m.seq_length()));
  lines.emplace_back("Parallel",
                     absl::StrCat("tp ", p.tp(), ", pp ", p.pp(), ", vpp ",
                                  p.vpp() == 0 ? 1 : p.vpp(), ", ZeRO stage ", p.zero_stage(),
                                  ", schedule ", ScheduleName(p.schedule())));
  lines.emplace_back(
      "Training",
      absl::StrCat("global batch ", t.global_batch(), ", micro-batch ", t.micro_batch(),
                   ", ", t.train_steps(), " steps, lr ", t.learning_rate(), ", ",
                   t.precision() == v1::PRECISION_MIXED ? "mixed precision" : "fp32"));
  lines.emplace_back("Data",
                     s.data().dataset_path().empty() ? "-" : Printable(s.data().dataset_path()));
  const v1::CheckpointConfig& c = s.checkpoint();
  lines.emplace_back(
      "Checkpoints",
      c.directory().empty()
          ? "none (no directory)"
          : absl::StrCat(c.interval_steps() == 0 ? "on demand"
                                                 : absl::StrCat("every ", c.interval_steps(),
                                                                " steps"),
                         " into ", Printable(c.directory()), ", keep ",
                         c.keep_last() == 0 ? "all" : absl::StrCat("last ", c.keep_last())));
  lines.emplace_back("Elastic", absl::StrCat(e.min_workers(), "..", e.max_workers(),
                                             " workers, heartbeat ",
                                             Duration(e.heartbeat_interval()), ", timeout ",
                                             Duration(e.heartbeat_timeout())));
  // The settings; "Stragglers" above lists the ranks flagged now. (Not for
  // an external job: it sends no progress reports, so is never judged.)
  lines.emplace_back("Hang detection", HangDetection(e));
  lines.emplace_back("Straggler check", StragglerDetection(e));
  lines.emplace_back("Created", FormatTimestamp(job.create_time()));
  lines.emplace_back("Updated", FormatTimestamp(job.update_time()));
  return KeyValueBlock(lines);
}

std::string FormatCreatedJob(const v1::CreateJobResponse& response, bool already_existed) {
  std::string out;
  if (already_existed) {
    absl::StrAppend(&out, "Job ", response.job().job_id(),
                    " already existed with this spec; nothing was created (job create is "
                    "idempotent). It is:\n\n");
  }
  out += FormatJob(response.job());
  out += "\n";
  if (response.worker_token().empty() && already_existed) {
    out += "Worker token: not shown (the token was shown only at creation: the coordinator keeps "
           "only its hash; it has none when it runs without authentication)\n";
  } else if (response.worker_token().empty()) {
    out += "Worker token: none (the coordinator runs without authentication)\n";
  } else if (already_existed) {
    // An older coordinator, which still kept the token.
    absl::StrAppend(&out, "Worker token (the one issued when the job was created; give it to ",
                    "this job's workers as SHARDLINE_TOKEN):\n  ", response.worker_token(), "\n");
  } else {
    absl::StrAppend(&out, "Worker token (shown only now; give it to this job's workers as ",
                    "SHARDLINE_TOKEN):\n  ", response.worker_token(), "\n");
  }
  return out;
}

std::string FormatJobList(const google::protobuf::RepeatedPtrField<v1::Job>& jobs) {
  if (jobs.empty()) return "no jobs\n";
  Table t({"JOB", "NAME", "PHASE", "GEN", "WORLD", "STEP", "CREATED"});
  t.AlignRight(3);
  t.AlignRight(4);
  t.AlignRight(5);
  for (const v1::Job& j : jobs) {
    // A name is at most 128 bytes (the coordinator refuses longer); cut it
    // anyway, so one job can never widen every row.
    t.AddRow({j.job_id(), Printable(j.spec().name(), 128), Phase(j.phase()),
              absl::StrCat(j.generation()),
              j.world_size() == 0 ? "-" : absl::StrCat(j.world_size()),
              spec::IsExternalJob(j.spec())
                  ? absl::StrCat(j.step())
                  : absl::StrCat(j.step(), "/", j.spec().training().train_steps()),
              FormatTimestamp(j.create_time())});
  }
  return t.Render();
}

std::string FormatMembers(const std::string& job_id, const v1::ListMembersResponse& response) {
  if (response.members().empty()) {
    return absl::StrCat("no workers have joined job ", job_id, " (generation ",
                        response.generation(), ")\n");
  }
  Table t({"WORKER", "INCARNATION", "STATE", "RANK", "GEN", "STEP", "WORKER STATE", "ACTIVITY",
           "COLLECTIVE", "STRAGGLER", "HOST", "DEVICE", "LAST HEARTBEAT", "DETAIL"});
  for (size_t c : {3, 4, 5}) t.AlignRight(c);
  for (const v1::Member& m : response.members()) {
    std::string detail;
    if (m.loss_reason() != v1::LOSS_REASON_UNSPECIFIED) {
      detail = absl::AsciiStrToLower(EnumName(v1::LossReason_descriptor(), m.loss_reason()));
    }
    if (!m.detail().empty()) {
      detail = detail.empty() ? Printable(m.detail()) : detail + ": " + Printable(m.detail());
    }
    t.AddRow({Printable(m.worker_id()), absl::StrCat(m.incarnation()),
              EnumName(v1::MemberState_descriptor(), m.state()), Optional(m.has_rank(), m.rank()),
              absl::StrCat(m.generation()), absl::StrCat(m.step()),
              WorkerStateCell(m), ActivityCell(m), CollectiveCell(m), StragglerCell(m),
              m.host().empty() ? "-" : Printable(m.host()),
              m.device().empty() ? "-" : Printable(m.device()),
              FormatTimestamp(m.last_heartbeat_time()), detail});
  }
  return absl::StrCat("Job ", job_id, ", generation ", response.generation(), "\n", t.Render());
}

namespace {


// The Generation line of a loss that ends nothing (no lost rank): what the
// losses are. Spares and joining workers only: "(only spares or joining
// workers)"; a LOST or LEFT worker is not live, and a FENCED one (or any
// other rankless state) holds no rank, so losing either changes nothing
// and the line says so, naming them with their state.
std::string GoesOn(const v1::WhatIfResponse& r) {
  std::vector<std::string> gone, rankless;
  bool spares = false;
  for (const v1::WhatIfLoss& l : r.losses()) {
    const std::string who = absl::StrCat(Printable(l.worker_id(), 128), " (",
                                         EnumName(v1::MemberState_descriptor(), l.state()), ")");
    if (l.state() == v1::MEMBER_STATE_SPARE || l.state() == v1::MEMBER_STATE_JOINING) {
      spares = true;
    } else if (l.state() == v1::MEMBER_STATE_LOST || l.state() == v1::MEMBER_STATE_LEFT) {
      gone.push_back(who);
    } else {
      rankless.push_back(who);
    }
  }
  if (gone.empty() && rankless.empty()) {
    return "goes on: no rank is among the losses (only spares or joining workers), nothing "
           "re-forms";
  }
  std::string out = "goes on: no rank is among the losses, nothing re-forms";
  if (!gone.empty()) {
    absl::StrAppend(&out, "; ", JoinForPeople(gone), gone.size() == 1 ? " is" : " are",
                    " not live: losing ", gone.size() == 1 ? "it" : "them", " changes nothing");
  }
  if (!rankless.empty()) {
    absl::StrAppend(&out, "; ", JoinForPeople(rankless), rankless.size() == 1 ? " holds" : " hold",
                    " no rank: losing ", rankless.size() == 1 ? "it" : "them",
                    " changes nothing");
  }
  if (spares) absl::StrAppend(&out, "; the others are spares or joining workers");
  return out;
}

}  // namespace

std::string FormatWhatIf(const v1::WhatIfResponse& r) {
  std::string out = absl::StrCat("Generation ", r.generation(), " now: world ", r.world_size(),
                                 ", dp ", r.dp(), "\n");
  Table t({"LOSE", "STATE", "RANK", "TP", "DP", "PP", "ZERO SHARDS", "ZERO ELEMENTS"});
  for (size_t c : {2, 3, 4, 5, 6, 7}) t.AlignRight(c);
  for (const v1::WhatIfLoss& l : r.losses()) {
    const v1::Coordinates& at = l.coordinates();
    t.AddRow({Printable(l.worker_id(), 128), EnumName(v1::MemberState_descriptor(), l.state()),
              Optional(l.has_rank(), l.rank()), Optional(l.has_rank(), at.tp_rank()),
              Optional(l.has_rank(), at.dp_rank()), Optional(l.has_rank(), at.pp_rank()),
              absl::StrCat(l.num_zero_shards()), absl::StrCat(l.zero_shard_elements())});
  }
  out += t.Render();
  out += "\n";

  std::vector<std::pair<std::string, std::string>> lines;
  std::vector<std::string> spares;
  for (const std::string& s : r.spares_used()) spares.push_back(Printable(s, 128));
  if (!r.generation_ends()) {
    lines.emplace_back("Generation", GoesOn(r));
    lines.emplace_back("Spares", "none needed");
    lines.emplace_back("New world", absl::StrCat("unchanged: world ", r.world_size(), ", dp ",
                                                 r.dp()));
  } else {
    lines.emplace_back("Generation", absl::StrCat("ends: generation ", r.generation(),
                                                  " stops and the job re-forms"));
    if (spares.empty()) {
      lines.emplace_back("Spares", "none to take the lost ranks");
    } else {
      lines.emplace_back(
          "Spares", absl::StrCat(absl::StrJoin(spares, ", "),
                                 r.spares_cover() ? ": they take every lost rank"
                                                  : ": not enough to take every lost rank"));
    }
    if (r.new_world_size() == 0) {
      lines.emplace_back("New world", "none: the live workers left cannot form a generation");
    } else {
      lines.emplace_back(
          "New world",
          absl::StrCat(r.new_world_size(), ", dp ", r.new_dp(), ", gradient accumulation ",
                       r.new_gradient_accumulation_steps(),
                       r.new_world_size() == r.world_size() && r.new_dp() == r.dp()
                           ? " (world and dp unchanged)"
                           : absl::StrCat(" (from world ", r.world_size(), ", dp ", r.dp(), ")")));
    }
    if (!r.new_worker_ids().empty()) {
      constexpr int kShownRanks = 32;
      std::vector<std::string> ranks;
      for (int i = 0; i < r.new_worker_ids_size() && i < kShownRanks; ++i) {
        ranks.push_back(absl::StrCat(i, " ", Printable(r.new_worker_ids(i), 128)));
      }
      std::string list = absl::StrJoin(ranks, ", ");
      if (r.new_worker_ids_size() > kShownRanks) {
        absl::StrAppend(&list, " and ", r.new_worker_ids_size() - kShownRanks,
                        " more (--json lists every rank)");
      }
      lines.emplace_back("New ranks", list);
    }
  }
  lines.emplace_back("Below min workers",
                     r.below_min_workers()
                         ? "yes: fewer live workers than the job needs; it would wait in "
                           "RECOVERING and fail after join_timeout unless workers join"
                         : "no");
  if (!r.generation_ends()) {
    lines.emplace_back("Restore", "nothing (the generation goes on)");
  } else {
    lines.emplace_back(
        "Restore",
        absl::StrCat(r.has_restore() ? absl::StrCat(r.restore().checkpoint_id(), " (step ",
                                                    r.restore().step(), ")")
                                     : std::string("from the seed (step 0)"),
                     "; ", r.steps_retrained(),
                     r.steps_retrained() == 1 ? " step" : " steps", " trained again"));
  }
  if (!r.summary().empty()) lines.emplace_back("Summary", Printable(r.summary()));
  return out + KeyValueBlock(lines);
}

std::string FormatTopology(const v1::Plan& plan) {
  const v1::ParallelConfig& p = plan.parallel();
  std::string out = absl::StrCat(
      "Job ", plan.job_id(), ", generation ", plan.generation(), ": world ", plan.world_size(),
      " = tp ", p.tp(), " x pp ", p.pp(), " x dp ", plan.dp(), "; vpp ", p.vpp(), ", ZeRO stage ",
      p.zero_stage(), ", ", ScheduleName(p.schedule()), "\n",
      plan.num_parameters(), " parameters; ", plan.gradient_accumulation_steps(),
      " micro-batches of ", plan.micro_batch(), " per dp rank per step");
  if (plan.has_schedule()) {
    absl::StrAppendFormat(&out, "; bubble ratio %.4f", plan.schedule().bubble_ratio());
  }
  out += "\n\nPipeline stages\n";
  Table stages({"PP RANK", "CHUNK", "LAYERS", "HOLDS"});
  stages.AlignRight(0);
  stages.AlignRight(1);
  for (const v1::PipelineStage& s : plan.stages()) {
    for (const v1::PipelineChunk& c : s.chunks()) {
      std::vector<std::string> holds;
      if (c.holds_embedding()) holds.push_back("embedding");
      if (c.holds_head()) holds.push_back("head");
      stages.AddRow({absl::StrCat(s.pp_rank()), absl::StrCat(c.chunk()),
                     absl::StrCat(c.first_layer(), "-", c.last_layer()), absl::StrJoin(holds, ", ")});
    }
  }
  out += stages.Render();
  out += "\nProcess groups (creation order)\n";
  Table groups({"#", "GROUP", "KIND", "RANKS"});
  groups.AlignRight(0);
  for (const v1::ProcessGroup& g : plan.groups()) {
    groups.AddRow({absl::StrCat(g.index()), g.name(),
                   absl::AsciiStrToLower(EnumName(v1::GroupKind_descriptor(), g.kind())),
                   absl::StrJoin(g.ranks(), ",")});
  }
  out += groups.Render();
  return out;
}

std::string FormatShardOwner(const v1::GetShardOwnerResponse& r) {
  std::string out = absl::StrCat(r.parameter(), ": shape [", absl::StrJoin(r.global_shape(), ", "),
                                 "], ", r.numel(), " elements; ZeRO stage ", r.zero_stage(),
                                 ", generation ", r.generation(), "\n");
  if (r.holders().empty()) return out + "(no holders: the parameter has no elements)\n";
  Table t({"KIND", "RANK", "TP", "DP", "PP", "UNIT", "UNIT RANGE", "SLICE", "SLICE RANGE"});
  for (size_t c : {1, 2, 3, 4}) t.AlignRight(c);
  for (const v1::ShardHolder& h : r.holders()) {
    t.AddRow({absl::AsciiStrToLower(EnumName(v1::HolderKind_descriptor(), h.kind())),
              absl::StrCat(h.rank()), absl::StrCat(h.tp_rank()), absl::StrCat(h.dp_rank()),
              absl::StrCat(h.pp_rank()), h.unit(), Range(h.unit_range()), Slice(h.slice()),
              Range(h.slice_range())});
  }
  return out + t.Render();
}

std::string FormatCheckpoints(
    const std::string& job_id,
    const google::protobuf::RepeatedPtrField<v1::CheckpointSummary>& list) {
  if (list.empty()) return absl::StrCat("no checkpoints of job ", job_id, "\n");
  Table t({"CHECKPOINT", "STEP", "GEN", "STATE", "RANKS", "SIZE", "COMMITTED", "NOTE"});
  for (size_t c : {1, 2, 4, 5}) t.AlignRight(c);
  for (const v1::CheckpointSummary& c : list) {
    t.AddRow({c.checkpoint_id(), absl::StrCat(c.step()), absl::StrCat(c.generation()),
              EnumName(v1::CheckpointState_descriptor(), c.state()),
              absl::StrCat(c.reported_ranks(), "/", c.world_size()), HumanBytes(c.total_bytes()),
              FormatTimestamp(c.commit_time()),
              c.unusable_reason().empty()
                  ? Printable(c.abort_reason())
                  : absl::StrCat("UNUSABLE: ", Printable(c.unusable_reason()))});
  }
  return t.Render();
}

std::string FormatManifest(const v1::Manifest& m, bool tensors) {
  const v1::ParallelConfig& p = m.parallel();
  const v1::ModelConfig& model = m.model();
  uint64_t files = 0, bytes = 0, pieces = 0;
  for (const v1::RankRecord& r : m.ranks()) {
    files += static_cast<uint64_t>(r.files_size());
    for (const v1::ShardFile& f : r.files()) bytes += f.size_bytes();
  }
  for (const v1::SavedTensor& t : m.tensors()) pieces += static_cast<uint64_t>(t.pieces_size());
  const std::string state = EnumName(v1::CheckpointState_descriptor(), m.state());
  std::vector<std::pair<std::string, std::string>> lines;
  lines.emplace_back("Checkpoint", m.checkpoint_id());
  lines.emplace_back("Job", m.job_id());
  lines.emplace_back("State", !m.unusable_reason().empty()
                                  ? absl::StrCat(state, ", UNUSABLE (",
                                                 Printable(m.unusable_reason()), ")")
                              : m.abort_reason().empty()
                                  ? state
                                  : absl::StrCat(state, " (", Printable(m.abort_reason()), ")"));
  lines.emplace_back("Step", absl::StrCat(m.step()));
  lines.emplace_back("Generation", absl::StrCat(m.generation()));
  lines.emplace_back("Directory", Printable(m.directory()));
  lines.emplace_back("Layout", absl::StrCat("world ", m.world_size(), " = tp ", p.tp(), " x pp ",
                                            p.pp(), " x dp ", m.dp(), "; vpp ",
                                            p.vpp() == 0 ? 1 : p.vpp(), ", ZeRO stage ",
                                            p.zero_stage(), ", schedule ",
                                            ScheduleName(p.schedule())));
  lines.emplace_back(
      "Model", absl::StrCat("GPT ", model.num_layers(), " layers, hidden ", model.hidden_size(),
                            ", ", model.num_heads(), " heads, vocab ", model.vocab_size(),
                            ", seq ", model.seq_length()));
  lines.emplace_back("Data cursor", absl::StrCat("sample ", m.data_cursor(), " (seed ",
                                                 m.seed(), ")"));
  lines.emplace_back("Ranks", absl::StrCat(m.ranks_size(), " of ", m.world_size(), ", ", files,
                                           files == 1 ? " file, " : " files, ",
                                           HumanBytes(bytes), " (", bytes, " bytes)"));
  lines.emplace_back("Tensors", absl::StrCat(m.tensors_size(), " (", pieces,
                                             pieces == 1 ? " piece)" : " pieces)"));
  lines.emplace_back("Created", FormatTimestamp(m.create_time()));
  lines.emplace_back("Committed", FormatTimestamp(m.commit_time()));
  std::string out = KeyValueBlock(lines);
  if (!tensors) return out;
  if (m.tensors().empty()) return out + "\nno tensors\n";
  Table t({"TENSOR", "DTYPE", "SHAPE", "PIECES", "SIZE"});
  for (size_t c : {3, 4}) t.AlignRight(c);
  for (const v1::SavedTensor& x : m.tensors()) {
    uint64_t saved = 0;
    for (const v1::SavedPiece& piece : x.pieces()) saved += piece.byte_length();
    std::string dtype = EnumName(v1::DType_descriptor(), x.dtype());
    if (absl::StartsWith(dtype, "DTYPE_")) dtype = dtype.substr(6);
    t.AddRow({x.name(), dtype,
              absl::StrCat("[", absl::StrJoin(x.global_shape(), ", "), "]"),
              absl::StrCat(x.pieces_size()), HumanBytes(saved)});
  }
  return absl::StrCat(out, "\n", t.Render());
}

std::string FormatEvent(const v1::JobEvent& e) {
  std::string what;
  switch (e.event_case()) {
    case v1::JobEvent::kPhaseChanged: {
      const v1::PhaseChanged& x = e.phase_changed();
      what = absl::StrCat("phase_changed ", Phase(x.old_phase()), " -> ", Phase(x.new_phase()),
                          x.reason().empty() ? "" : ": " + Printable(x.reason()));
      break;
    }
    case v1::JobEvent::kGenerationFormed: {
      const v1::GenerationFormed& x = e.generation_formed();
      what = absl::StrCat(
          "generation_formed ",
          absl::AsciiStrToLower(EnumName(v1::FormationReason_descriptor(), x.reason())), ": world ",
          x.world_size(),
          // An external job has no dp (0): its world is its nodes.
          x.dp() == 0 ? std::string() : absl::StrCat(" (dp ", x.dp(), ")"), ", ranks ",
          x.worker_ids().empty() ? "-" : Printable(absl::StrJoin(x.worker_ids(), " ")));
      if (!x.spares().empty()) {
        absl::StrAppend(&what, ", spares ", Printable(absl::StrJoin(x.spares(), " ")));
      }
      if (x.has_restore()) {
        absl::StrAppend(&what, ", restore ", x.restore().checkpoint_id(), " (step ",
                        x.restore().step(), ")");
      }
      break;
    }
    case v1::JobEvent::kWorkerJoined: {
      const v1::WorkerJoined& x = e.worker_joined();
      what = absl::StrCat(x.rejoined() ? "worker_rejoined " : "worker_joined ",
                          Printable(x.worker_id()), " incarnation ", x.incarnation(), " on ",
                          x.host().empty() ? "-" : Printable(x.host()), " ", Printable(x.device()));
      break;
    }
    case v1::JobEvent::kWorkerLeft: {
      const v1::WorkerLeft& x = e.worker_left();
      what = absl::StrCat("worker_left ", Printable(x.worker_id()), " incarnation ",
                          x.incarnation(), x.has_rank() ? absl::StrCat(" rank ", x.rank()) : "",
                          x.reason().empty() ? "" : ": " + Printable(x.reason()));
      break;
    }
    case v1::JobEvent::kWorkerLost: {
      const v1::WorkerLost& x = e.worker_lost();
      what = absl::StrCat(
          "worker_lost ", Printable(x.worker_id()), " incarnation ", x.incarnation(),
          x.has_rank() ? absl::StrCat(" rank ", x.rank()) : "", " (",
          absl::AsciiStrToLower(EnumName(v1::LossReason_descriptor(), x.reason())), ")",
          x.detail().empty() ? "" : ": " + Printable(x.detail()));
      break;
    }
    case v1::JobEvent::kCheckpointCommitted: {
      const v1::CheckpointCommitted& x = e.checkpoint_committed();
      what = absl::StrCat("checkpoint_committed ", x.checkpoint_id(), " step ", x.step(), ", ",
                          HumanBytes(x.total_bytes()));
      break;
    }
    case v1::JobEvent::kCheckpointAborted: {
      const v1::CheckpointAborted& x = e.checkpoint_aborted();
      what = absl::StrCat("checkpoint_aborted ", x.checkpoint_id(), " step ", x.step(),
                          x.reason().empty() ? "" : ": " + Printable(x.reason()));
      break;
    }
    case v1::JobEvent::kStepProgress: {
      const v1::StepProgress& x = e.step_progress();
      what = absl::StrCat("step ", x.step());
      if (x.has_loss()) absl::StrAppendFormat(&what, " loss %.4f", x.loss());
      if (x.has_tokens_per_second()) {
        absl::StrAppendFormat(&what, " %.0f tokens/s", x.tokens_per_second());
      }
      break;
    }
    case v1::JobEvent::kHangDetected: {
      const v1::HangReport& x = e.hang_detected();
      what = absl::StrCat("hang_detected ", HangSummary(x), "; ", HangAction(x.action()));
      break;
    }
    case v1::JobEvent::kStragglerChanged: {
      const v1::StragglerChanged& x = e.straggler_changed();
      what = x.cleared() ? absl::StrCat("straggler_changed ",
                                        RankOf(x.straggler().rank(), x.straggler().worker_id(),
                                               x.straggler().host()),
                                        " is no longer a straggler")
                         : absl::StrCat("straggler_changed ", StragglerText(x.straggler()));
      break;
    }
    case v1::JobEvent::EVENT_NOT_SET:
      what = "unknown event (newer coordinator? use --json)";
      break;
  }
  return absl::StrCat("#", e.sequence(), " ", FormatTimestamp(e.time(), /*millis=*/true), " g",
                      e.generation(), " ", what);
}

bool IsPrintableText(const std::string& value) {
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = value[i];
    if (c == '\t' || c == '\n') continue;
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x80) continue;
    // A well-formed UTF-8 sequence: a lead byte, then n continuation bytes.
    const size_t n = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 0;
    if (n == 0 || i + n >= value.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(value[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

std::string HexBytes(const std::string& value) {
  std::string hex;
  for (size_t i = 0; i < value.size(); ++i) {
    if (i > 0) hex += (i % 32 == 0) ? '\n' : ' ';
    absl::StrAppendFormat(&hex, "%02x", static_cast<unsigned char>(value[i]));
  }
  return hex;
}

}  // namespace shardline::shardctl

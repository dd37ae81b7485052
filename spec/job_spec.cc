#include "spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/time_util.h"

namespace shardline::spec {
namespace {

using google::protobuf::util::TimeUtil;

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

void SetIfUnset(google::protobuf::Duration* d, absl::Duration value) {
  if (d->seconds() == 0 && d->nanos() == 0) {
    *d = TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(value));
  }
}

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// google/protobuf/duration.proto's range.
constexpr int64_t kMaxProtoDurationSeconds = 315576000000;
constexpr int32_t kMaxProtoDurationNanos = 999999999;

bool IsValidProtoDuration(const google::protobuf::Duration& d) {
  if (d.seconds() < -kMaxProtoDurationSeconds || d.seconds() > kMaxProtoDurationSeconds) {
    return false;
  }
  if (d.nanos() < -kMaxProtoDurationNanos || d.nanos() > kMaxProtoDurationNanos) return false;
  return !((d.seconds() > 0 && d.nanos() < 0) || (d.seconds() < 0 && d.nanos() > 0));
}

// A duration as the messages show it; TimeUtil::ToString needs a valid one.
std::string DurationText(const google::protobuf::Duration& d) {
  if (IsValidProtoDuration(d)) return TimeUtil::ToString(d);
  return absl::StrCat("{seconds: ", d.seconds(), ", nanos: ", d.nanos(), "}");
}

// The shape of `m` (at `path`, e.g. "spec.elastic") and of every message in
// it: no unknown fields, enums of known values, valid Durations.
absl::Status CheckShape(const google::protobuf::Message& m, const std::string& path) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  if (!unknown.empty()) {
    std::vector<int> numbers;
    for (int i = 0; i < unknown.field_count(); ++i) numbers.push_back(unknown.field(i).number());
    std::string bytes;
    unknown.SerializeToString(&bytes);
    return Invalid(absl::StrCat(
        path, " has ", numbers.size() == 1 ? "an unknown field" : "unknown fields", " (number ",
        absl::StrJoin(numbers, ", "), "; ", bytes.size(), " bytes) that ",
        m.GetDescriptor()->full_name(),
        " does not define; the coordinator stores only what it can check: remove ",
        numbers.size() == 1 ? "it" : "them",
        " (a client built from a newer job.proto needs a newer coordinator)"));
  }
  if (m.GetDescriptor()->full_name() == "google.protobuf.Duration") {
    const auto& d = static_cast<const google::protobuf::Duration&>(m);
    if (IsValidProtoDuration(d)) return absl::OkStatus();
    return Invalid(absl::StrCat(
        path, "=", DurationText(d), " is not a valid google.protobuf.Duration (seconds within "
        "+-", kMaxProtoDurationSeconds, ", nanos within +-", kMaxProtoDurationNanos,
        " with the same sign); give e.g. \"10s\""));
  }
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string field = absl::StrCat(path, ".", f->name());
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string at = f->is_repeated() ? absl::StrCat(field, "[", i, "]") : field;
      absl::Status s;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
        s = CheckEnumValue(at, f->enum_type(),
                           f->is_repeated() ? r->GetRepeatedEnumValue(m, f, i)
                                            : r->GetEnumValue(m, f));
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        s = CheckShape(f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f),
                       at);
      }
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// -0.0 and 0.0 are one number to a spec, but not to protobuf: a proto3
// double holding -0.0 counts as set and prints as -0, which parses back as
// an unset 0, so a spec with `min_learning_rate: -0.0` did not survive its
// own JSON (found by fuzz/spec_fuzzer; fuzz/regressions/spec). Every -0.0 of
// `m` becomes 0.0.
void ZeroNegativeZeros(google::protobuf::Message* m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const FieldDescriptor* f : fields) {
    const int n = f->is_repeated() ? r->FieldSize(*m, f) : 1;
    for (int i = 0; i < n; ++i) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
          if (f->is_repeated() ? r->GetRepeatedDouble(*m, f, i) == 0 : r->GetDouble(*m, f) == 0) {
            f->is_repeated() ? r->SetRepeatedDouble(m, f, i, 0.0) : r->SetDouble(m, f, 0.0);
          }
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          if (f->is_repeated() ? r->GetRepeatedFloat(*m, f, i) == 0 : r->GetFloat(*m, f) == 0) {
            f->is_repeated() ? r->SetRepeatedFloat(m, f, i, 0.0f) : r->SetFloat(m, f, 0.0f);
          }
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          ZeroNegativeZeros(f->is_repeated() ? r->MutableRepeatedMessage(m, f, i)
                                             : r->MutableMessage(m, f));
          break;
        default:
          break;
      }
    }
  }
}

// Every count of the spec against its bound (job_spec.h), before anything
// multiplies them or narrows them to int.
absl::Status CheckCounts(const v1::JobSpec& spec) {
  struct Count {
    const char* field;
    uint64_t value;
    uint64_t max;
  };
  const v1::ModelConfig& m = spec.model();
  const v1::ParallelConfig& p = spec.parallel();
  const v1::TrainingConfig& t = spec.training();
  const uint64_t world = static_cast<uint64_t>(plan::kMaxWorldSize);
  const Count counts[] = {
      {"model.num_layers", m.num_layers(), static_cast<uint64_t>(plan::kMaxLayers)},
      {"model.hidden_size", m.hidden_size(), static_cast<uint64_t>(plan::kMaxWidth)},
      {"model.num_heads", m.num_heads(), static_cast<uint64_t>(plan::kMaxWidth)},
      {"model.ffn_hidden_size", m.ffn_hidden_size(), static_cast<uint64_t>(plan::kMaxWidth)},
      {"model.vocab_size", m.vocab_size(), static_cast<uint64_t>(plan::kMaxVocab)},
      {"model.seq_length", m.seq_length(), static_cast<uint64_t>(plan::kMaxSeqLength)},
      {"parallel.tp", p.tp(), world},
      {"parallel.pp", p.pp(), world},
      {"parallel.vpp", p.vpp(), static_cast<uint64_t>(plan::kMaxLayers)},
      {"parallel.zero_stage", p.zero_stage(), 3},
      {"parallel.zero_alignment", p.zero_alignment(), static_cast<uint64_t>(plan::kMaxAlignment)},
      {"training.micro_batch", t.micro_batch(), static_cast<uint64_t>(plan::kMaxMicroBatchSize)},
      {"training.global_batch", t.global_batch(), kMaxGlobalBatch},
      {"training.warmup_steps", t.warmup_steps(), kMaxTrainSteps},
      {"checkpoint.interval_steps", spec.checkpoint().interval_steps(), kMaxTrainSteps},
      {"checkpoint.keep_last", spec.checkpoint().keep_last(), kMaxKeepLast},
      {"elastic.min_workers", spec.elastic().min_workers(), world},
      {"elastic.max_workers", spec.elastic().max_workers(), world},
  };
  for (const Count& c : counts) {
    if (c.value > c.max) {
      return Invalid(absl::StrCat("spec.", c.field, "=", c.value, " is too large; the limit is ",
                                  c.max));
    }
  }
  if (uint64_t{p.tp()} * p.pp() > world) {
    return Invalid(absl::StrCat("spec.parallel.tp=", p.tp(), " x spec.parallel.pp=", p.pp(), " = ",
                                uint64_t{p.tp()} * p.pp(),
                                " is too large; one model replica is at most ", world,
                                " workers"));
  }
  return absl::OkStatus();
}

// The planner's field names as spec paths.
absl::Status InSpecTerms(const absl::Status& s) {
  static const auto* const kNames = new std::vector<std::pair<std::string, std::string>>{
      {"num_layers=", "spec.model.num_layers="},
      {"ffn_hidden_size=", "spec.model.ffn_hidden_size="},
      {"hidden_size=", "spec.model.hidden_size="},
      {"num_heads=", "spec.model.num_heads="},
      {"vocab_size=", "spec.model.vocab_size="},
      {"seq_length=", "spec.model.seq_length="},
      {"zero_stage=", "spec.parallel.zero_stage="},
      {"zero_alignment=", "spec.parallel.zero_alignment="},
      {"micro_batch_size=", "spec.training.micro_batch="},
      {"tp=", "spec.parallel.tp="},
      {"pp=", "spec.parallel.pp="},
      {"vpp=", "spec.parallel.vpp="},
      {"schedule=", "spec.parallel.schedule="}};
  return plan::RenameFields(s, *kNames);
}

// Shared by both kinds: <directory>/<job_id>/ on a filesystem the
// coordinator and every worker see at the same path.
absl::Status CheckCheckpointDirectory(const std::string& ckpt) {
  if (!ckpt.empty() && (ckpt.front() != '/' || absl::StrContains(absl::StrCat(ckpt, "/"), "/../") ||
                        ckpt.size() > kMaxPathBytes || !IsDisplayText(ckpt))) {
    return Invalid(absl::StrCat("spec.checkpoint.directory='", AbbreviateValue(ckpt),
                                "' must be an absolute path without '..' or control characters, "
                                "at most ",
                                kMaxPathBytes,
                                " bytes (the coordinator and every "
                                "worker use it as given), e.g. /var/lib/shardline/checkpoints"));
  }
  return absl::OkStatus();
}

// Shared by both kinds: elastic's durations get their defaults, then their
// bounds (job_spec.h).
absl::Status ResolveElasticDurations(v1::ElasticPolicy& e) {
  SetIfUnset(e.mutable_heartbeat_interval(), kDefaultHeartbeatInterval);
  SetIfUnset(e.mutable_heartbeat_timeout(), kDefaultHeartbeatTimeout);
  SetIfUnset(e.mutable_join_timeout(), kDefaultJoinTimeout);
  SetIfUnset(e.mutable_last_call(), kDefaultLastCall);
  SetIfUnset(e.mutable_collective_timeout(), kDefaultCollectiveTimeout);
  const std::pair<const char*, const google::protobuf::Duration*> durations[] = {
      {"heartbeat_interval", &e.heartbeat_interval()},
      {"heartbeat_timeout", &e.heartbeat_timeout()},
      {"join_timeout", &e.join_timeout()},
      {"last_call", &e.last_call()},
      {"collective_timeout", &e.collective_timeout()}};
  for (const auto& [field, d] : durations) {
    if (FromProto(*d) <= absl::ZeroDuration()) {
      return Invalid(absl::StrCat("spec.elastic.", field, "=", TimeUtil::ToString(*d),
                                  " is invalid; give a positive duration such as \"10s\""));
    }
    if (FromProto(*d) < kMinSpecDuration) {
      return Invalid(absl::StrCat("spec.elastic.", field, "=", TimeUtil::ToString(*d),
                                  " is too short; at least ",
                                  absl::FormatDuration(kMinSpecDuration)));
    }
    if (FromProto(*d) > kMaxSpecDuration) {
      return Invalid(absl::StrCat("spec.elastic.", field, "=", TimeUtil::ToString(*d),
                                  " is too long; at most ",
                                  absl::FormatDuration(kMaxSpecDuration)));
    }
  }
  if (FromProto(e.heartbeat_timeout()) > kMaxHeartbeatTimeout) {
    return Invalid(
        absl::StrCat("spec.elastic.heartbeat_timeout=", TimeUtil::ToString(e.heartbeat_timeout()),
                     " is too long; at most ", absl::FormatDuration(kMaxHeartbeatTimeout)));
  }
  const absl::Duration min_timeout =
      std::max(kMinTimeoutIntervals * FromProto(e.heartbeat_interval()), kMinHeartbeatTimeout);
  if (FromProto(e.heartbeat_timeout()) < min_timeout) {
    return Invalid(absl::StrCat(
        "spec.elastic.heartbeat_timeout=", TimeUtil::ToString(e.heartbeat_timeout()),
        " must be longer: at least ", kMinTimeoutIntervals, " x spec.elastic.heartbeat_interval=",
        TimeUtil::ToString(e.heartbeat_interval()), " and at least ",
        absl::FormatDuration(kMinHeartbeatTimeout), ", so ", absl::FormatDuration(min_timeout),
        " (a few intervals, e.g. 10x: one late heartbeat "
        "must not lose a worker)"));
  }
  return absl::OkStatus();
}

// Shared by both kinds: hang and straggler detection (job.proto
// ElasticPolicy.progress_timeout .. straggler_policy; bounds in job_spec.h).
// progress_timeout stays unset when unset (automatic); the others get
// their defaults.
absl::Status ResolveProgressPolicy(v1::ElasticPolicy& e) {
  if (e.has_progress_timeout()) {
    const absl::Duration d = FromProto(e.progress_timeout());
    if (d < absl::ZeroDuration() || (d > absl::ZeroDuration() && d < kMinProgressTimeout) ||
        d > kMaxProgressTimeout) {
      return Invalid(absl::StrCat(
          "spec.elastic.progress_timeout=", TimeUtil::ToString(e.progress_timeout()),
          " is invalid; give ", absl::FormatDuration(kMinProgressTimeout), " .. ",
          absl::FormatDuration(kMaxProgressTimeout), " (e.g. \"60s\"), \"0s\" to turn hang "
          "detection off, or leave it unset for the automatic timeout (the larger of 30s and "
          "10x the median step time)"));
    }
  }
  if (e.hang_policy() == v1::HANG_POLICY_UNSPECIFIED) e.set_hang_policy(v1::HANG_POLICY_EVICT);
  const double factor = e.straggler_factor();
  if (factor == 0) {
    e.set_straggler_factor(kDefaultStragglerFactor);
  } else if (!std::isfinite(factor) || factor <= 1 || factor > kMaxStragglerFactor) {
    return Invalid(absl::StrCat("spec.elastic.straggler_factor=", factor,
                                " is invalid; give a factor > 1 and at most ",
                                kMaxStragglerFactor, " (e.g. 1.5), or 0 for the default ",
                                kDefaultStragglerFactor));
  }
  const uint32_t window = e.straggler_window_steps();
  if (window == 0) {
    e.set_straggler_window_steps(kDefaultStragglerWindowSteps);
  } else if (window < kMinStragglerWindowSteps || window > kMaxStragglerWindowSteps) {
    return Invalid(absl::StrCat("spec.elastic.straggler_window_steps=", window,
                                " is invalid; give ", kMinStragglerWindowSteps, "..",
                                kMaxStragglerWindowSteps, " steps, or 0 for the default ",
                                kDefaultStragglerWindowSteps));
  }
  if (!e.has_straggler_min_excess()) {
    *e.mutable_straggler_min_excess() =
        TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(kDefaultStragglerMinExcess));
  } else if (FromProto(e.straggler_min_excess()) < absl::ZeroDuration() ||
             FromProto(e.straggler_min_excess()) > kMaxStragglerMinExcess) {
    return Invalid(absl::StrCat(
        "spec.elastic.straggler_min_excess=", TimeUtil::ToString(e.straggler_min_excess()),
        " is invalid; give 0s .. ", absl::FormatDuration(kMaxStragglerMinExcess),
        " (e.g. \"20ms\"; 0s judges by straggler_factor alone), or leave it unset for ",
        absl::FormatDuration(kDefaultStragglerMinExcess)));
  }
  if (e.straggler_policy() == v1::STRAGGLER_POLICY_UNSPECIFIED) {
    e.set_straggler_policy(v1::STRAGGLER_POLICY_REPORT);
  }
  return absl::OkStatus();
}

bool IsFrameworkChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// An external job (job.proto ExternalWorkload): the GPT sections unset,
// a framework name, elastic as for GPT jobs with min_workers >= 1 nodes,
// checkpoint without a schedule.
absl::StatusOr<v1::JobSpec> ResolveExternalSpec(const v1::JobSpec& in) {
  // The framework first: it is what the spec says it is.
  const std::string& framework = in.external().framework();
  if (framework.size() > kMaxFrameworkBytes) {
    return Invalid(absl::StrCat("spec.external.framework='", AbbreviateValue(framework), "' is ",
                                framework.size(), " bytes; give 0..", kMaxFrameworkBytes,
                                " bytes of [a-z0-9._-], e.g. torchrun"));
  }
  if (!std::all_of(framework.begin(), framework.end(), IsFrameworkChar)) {
    return Invalid(absl::StrCat("spec.external.framework='", AbbreviateValue(framework),
                                "' is invalid; give 0..", kMaxFrameworkBytes,
                                " bytes of [a-z0-9._-], e.g. torchrun"));
  }
  const std::pair<const char*, bool> gpt_sections[] = {{"model", in.has_model()},
                                                       {"parallel", in.has_parallel()},
                                                       {"training", in.has_training()},
                                                       {"data", in.has_data()}};
  for (const auto& [field, set] : gpt_sections) {
    if (set) {
      return Invalid(absl::StrCat(
          "spec.", field,
          " must be unset for an external job (spec.external is set): the "
          "workload brings its own model, layout, training loop and data; remove spec.",
          field, ", or remove spec.external for a GPT training job"));
    }
  }
  v1::JobSpec spec = in;
  const v1::CheckpointConfig& c = spec.checkpoint();
  if (c.interval_steps() != 0) {
    return Invalid(absl::StrCat("spec.checkpoint.interval_steps=", c.interval_steps(),
                                " must be 0 for an external job (spec.external is set): the "
                                "workload saves when it chooses"));
  }
  if (c.async_save()) {
    return Invalid(
        "spec.checkpoint.async_save=true must be false for an external job "
        "(spec.external is set): the workload saves when and how it chooses");
  }
  if (absl::Status s = CheckCheckpointDirectory(c.directory()); !s.ok()) return s;
  v1::ElasticPolicy& e = *spec.mutable_elastic();
  if (e.min_workers() == 0) {
    return Invalid(
        "spec.elastic.min_workers=0 is invalid for an external job; give the fewest "
        "nodes (agents) it runs with, >= 1, e.g. min_workers: 2");
  }
  if (e.max_workers() == 0) e.set_max_workers(static_cast<uint32_t>(plan::kMaxWorldSize));
  if (e.max_workers() < e.min_workers()) {
    return Invalid(absl::StrCat("spec.elastic.max_workers=", e.max_workers(),
                                " < spec.elastic.min_workers=", e.min_workers(),
                                "; give 0 (no cap) or at least min_workers"));
  }
  if (absl::Status s = ResolveElasticDurations(e); !s.ok()) return s;
  if (absl::Status s = ResolveProgressPolicy(e); !s.ok()) return s;
  return spec;
}

}  // namespace

absl::Status CheckEnumValue(absl::string_view field, const google::protobuf::EnumDescriptor* type,
                            int value) {
  if (type->FindValueByNumber(value) != nullptr) return absl::OkStatus();
  std::vector<std::string> choices;
  std::string unset;
  for (int i = 0; i < type->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* v = type->value(i);
    if (v->number() == 0) {
      unset = absl::StrCat(", or leave it unset (", v->name(), ", 0)");
    } else {
      choices.push_back(absl::StrCat(v->name(), " (", v->number(), ")"));
    }
  }
  return Invalid(absl::StrCat(field, "=", value, " is not a ", type->name(), "; use one of ",
                              absl::StrJoin(choices, ", "), unset));
}

plan::GptConfig ModelOf(const v1::JobSpec& spec) {
  const v1::ModelConfig& m = spec.model();
  return plan::GptConfig{m.num_layers(), m.hidden_size(), m.num_heads(),
                         m.ffn_hidden_size(), m.vocab_size(), m.seq_length()};
}

plan::ParallelConfig ParallelOf(const v1::JobSpec& spec, int dp) {
  const v1::ParallelConfig& p = spec.parallel();
  plan::ParallelConfig out;
  out.tp = static_cast<int>(p.tp());
  out.pp = static_cast<int>(p.pp());
  out.dp = dp;
  out.vpp = static_cast<int>(std::max<uint32_t>(p.vpp(), 1));
  out.zero_stage = static_cast<int>(p.zero_stage());
  out.zero_alignment = static_cast<int64_t>(std::max<uint64_t>(p.zero_alignment(), 1));
  out.micro_batch_size = spec.training().micro_batch();
  const uint64_t per_step = spec.training().global_batch() /
                            std::max<uint64_t>(spec.training().micro_batch(), 1);
  out.micro_batches = static_cast<int>(per_step / std::max(dp, 1));
  out.schedule = p.schedule() == v1::SCHEDULE_GPIPE         ? plan::ScheduleKind::kGpipe
                 : p.schedule() == v1::SCHEDULE_INTERLEAVED ? plan::ScheduleKind::kInterleaved
                                                            : plan::ScheduleKind::kOneFOneB;
  out.precision = spec.training().precision() == v1::PRECISION_MIXED ? plan::Precision::kMixed
                                                                     : plan::Precision::kFp32;
  return out;
}

absl::StatusOr<plan::Plan> PlanGeneration(const v1::JobSpec& spec, int dp) {
  absl::StatusOr<plan::Plan> p = plan::MakePlan(ModelOf(spec), ParallelOf(spec, dp));
  if (!p.ok()) return InSpecTerms(p.status());
  return p;
}

std::optional<int> ChooseDp(const v1::JobSpec& spec, int available) {
  if (spec.has_external()) return std::nullopt;  // no dp: nothing is planned
  const int64_t model_parallel = int64_t{spec.parallel().tp()} * spec.parallel().pp();
  const int64_t cap = std::min<int64_t>(available, spec.elastic().max_workers());
  const uint64_t per_step = spec.training().global_batch() / spec.training().micro_batch();
  for (int64_t dp = cap / model_parallel; dp >= 1; --dp) {
    if (dp * model_parallel < spec.elastic().min_workers()) break;
    if (per_step % dp != 0) continue;  // the global batch must stay constant
    if (plan::ValidateConfig(ModelOf(spec), ParallelOf(spec, static_cast<int>(dp))).ok() &&
        plan::BuildSchedule(ParallelOf(spec, static_cast<int>(dp)).schedule, spec.parallel().pp(),
                            std::max<uint32_t>(spec.parallel().vpp(), 1),
                            static_cast<int>(per_step / dp))
            .ok()) {
      return static_cast<int>(dp);
    }
  }
  return std::nullopt;
}

std::optional<int> ChooseWorldSize(const v1::JobSpec& spec, int available) {
  if (spec.has_external()) {
    const int64_t world = std::min<int64_t>(available, spec.elastic().max_workers());
    if (world < 1 || world < int64_t{spec.elastic().min_workers()}) return std::nullopt;
    return static_cast<int>(world);
  }
  const std::optional<int> dp = ChooseDp(spec, available);
  if (!dp.has_value()) return std::nullopt;
  return *dp * static_cast<int>(spec.parallel().tp() * spec.parallel().pp());
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& given) {
  v1::JobSpec in = given;
  ZeroNegativeZeros(&in);
  v1::JobSpec spec = in;
  v1::ModelConfig& m = *spec.mutable_model();
  v1::ParallelConfig& p = *spec.mutable_parallel();
  v1::TrainingConfig& t = *spec.mutable_training();
  v1::ElasticPolicy& e = *spec.mutable_elastic();
  // Free text that listings and `job get` print: one short printable line.
  if (absl::Status s = CheckText("spec.name", spec.name(), kMaxJobNameBytes, /*required=*/true);
      !s.ok()) {
    return Invalid(absl::StrCat(s.message(), ", e.g. name: shakespeare"));
  }
  if (const size_t bytes = in.ByteSizeLong(); bytes > kMaxSerializedSpecBytes) {
    return Invalid(absl::StrCat("spec is ", bytes, " bytes serialized; the limit is ",
                                kMaxSerializedSpecBytes, " bytes (1 MiB)"));
  }
  if (absl::Status s = CheckShape(in, "spec"); !s.ok()) return s;
  if (absl::Status s = CheckCounts(in); !s.ok()) return s;
  if (in.has_external()) return ResolveExternalSpec(in);
  if (!in.has_model()) {
    return Invalid(
        "spec.model is unset: a GPT training job needs model, parallel, training and data; "
        "for a workload that brings its own trainer (e.g. PyTorch under torchrun) set "
        "spec.external instead (external: {framework: torchrun})");
  }
  if (m.ffn_hidden_size() == 0) m.set_ffn_hidden_size(4 * m.hidden_size());
  if (p.tp() == 0) return Invalid("spec.parallel.tp=0 is invalid; tp must be >= 1");
  if (p.pp() == 0) return Invalid("spec.parallel.pp=0 is invalid; pp must be >= 1");
  if (p.vpp() == 0) p.set_vpp(1);
  if (p.zero_alignment() == 0) p.set_zero_alignment(1);
  if (p.schedule() == v1::SCHEDULE_UNSPECIFIED) {
    p.set_schedule(p.vpp() > 1 ? v1::SCHEDULE_INTERLEAVED : v1::SCHEDULE_ONE_F_ONE_B);
  }
  if (t.precision() == v1::PRECISION_UNSPECIFIED) t.set_precision(v1::PRECISION_FP32);
  if (t.micro_batch() == 0) {
    return Invalid("spec.training.micro_batch=0 is invalid; give samples per micro-batch, >= 1");
  }
  if (t.global_batch() == 0 || t.global_batch() % t.micro_batch() != 0) {
    return Invalid(absl::StrCat("spec.training.global_batch=", t.global_batch(),
                                " is not a positive multiple of spec.training.micro_batch=",
                                t.micro_batch()));
  }
  if (t.train_steps() == 0 || t.train_steps() > kMaxTrainSteps) {
    return Invalid(absl::StrCat("spec.training.train_steps=", t.train_steps(),
                                " is invalid; give the optimizer steps to run, 1..",
                                kMaxTrainSteps));
  }
  // Optimizer settings: finite and in their ranges (0 means the default).
  struct Range {
    const char* field;
    double value;
    double low;
    double high;
    bool high_open;
  };
  const Range ranges[] = {
      {"training.learning_rate", t.learning_rate(), 0, 1e3, false},
      {"training.min_learning_rate", t.min_learning_rate(), 0, 1e3, false},
      {"training.weight_decay", t.weight_decay(), 0, 1e3, false},
      {"training.grad_clip", t.grad_clip(), 0, 1e12, false},
      {"training.adam_beta1", t.adam_beta1(), 0, 1, true},
      {"training.adam_beta2", t.adam_beta2(), 0, 1, true},
      {"training.adam_epsilon", t.adam_epsilon(), 0, 1, false},
      {"data.validation_fraction", spec.data().validation_fraction(), 0, 1, true}};
  for (const Range& r : ranges) {
    if (!std::isfinite(r.value) || r.value < r.low || r.value > r.high ||
        (r.high_open && r.value == r.high)) {
      return Invalid(absl::StrCat("spec.", r.field, "=", r.value, " is invalid; use a value in [",
                                  r.low, ", ", r.high, r.high_open ? ")" : "]"));
    }
  }
  // The data is bytes (worker/train/data.h): every byte value is a token.
  if (spec.model().vocab_size() < 256) {
    return Invalid(absl::StrCat("spec.model.vocab_size=", spec.model().vocab_size(),
                                " is smaller than the byte vocabulary the data uses; set "
                                "vocab_size to 256 (or more)"));
  }
  if (absl::Status st = CheckCheckpointDirectory(spec.checkpoint().directory()); !st.ok()) {
    return st;
  }
  // Every worker reads the corpus at this path; an empty one would only
  // fail on the workers, after the job formed.
  const std::string& dataset = spec.data().dataset_path();
  if (dataset.empty()) {
    return Invalid(absl::StrCat(
        "spec.data.dataset_path is empty; give the path of the text corpus every worker can read "
        "(at most ", kMaxPathBytes, " bytes), e.g. /data/tinyshakespeare.txt"));
  }
  if (dataset.size() > kMaxPathBytes || !IsDisplayText(dataset)) {
    return Invalid(absl::StrCat("spec.data.dataset_path='", AbbreviateValue(dataset),
                                "' is invalid; give a path of at most ", kMaxPathBytes,
                                " bytes without control characters, e.g. "
                                "/data/tinyshakespeare.txt"));
  }
  if (t.learning_rate() > 0 && t.min_learning_rate() > t.learning_rate()) {
    return Invalid(absl::StrCat("spec.training.min_learning_rate=", t.min_learning_rate(),
                                " exceeds spec.training.learning_rate=", t.learning_rate(),
                                "; the cosine schedule decays from the peak to the minimum"));
  }
  // The model and the layout alone (any dp), before the worker range.
  plan::ParallelConfig probe = ParallelOf(spec, 1);
  probe.micro_batches = 1;
  if (absl::Status s = InSpecTerms(plan::ValidateConfig(ModelOf(spec), probe)); !s.ok()) return s;
  const uint32_t model_parallel = p.tp() * p.pp();
  if (e.min_workers() == 0) e.set_min_workers(model_parallel);
  if (e.max_workers() == 0) e.set_max_workers(static_cast<uint32_t>(plan::kMaxWorldSize));
  if (e.min_workers() < model_parallel) {
    return Invalid(absl::StrCat("spec.elastic.min_workers=", e.min_workers(), " < tp*pp=",
                                model_parallel, "; one model replica needs tp*pp workers"));
  }
  if (e.max_workers() < e.min_workers()) {
    return Invalid(absl::StrCat("spec.elastic.max_workers=", e.max_workers(),
                                " < spec.elastic.min_workers=", e.min_workers()));
  }
  if (e.max_workers() > plan::kMaxWorldSize) {
    return Invalid(absl::StrCat("spec.elastic.max_workers=", e.max_workers(),
                                " is too large; the limit is ", plan::kMaxWorldSize));
  }
  if (absl::Status st = ResolveElasticDurations(e); !st.ok()) return st;
  if (absl::Status st = ResolveProgressPolicy(e); !st.ok()) return st;
  // world = dp * tp * pp must lie in min_workers..max_workers.
  const uint32_t min_dp = (e.min_workers() + model_parallel - 1) / model_parallel;
  const uint32_t max_dp = e.max_workers() / model_parallel;
  if (min_dp > max_dp) {
    return Invalid(absl::StrCat(
        "no data-parallel degree fits: the world size is dp * tp*pp, a multiple of tp*pp=",
        model_parallel, ", and none lies in spec.elastic.min_workers..max_workers = ",
        e.min_workers(), "..", e.max_workers(), "; set min_workers to ",
        max_dp * model_parallel, " or max_workers to ", min_dp * model_parallel,
        " (or change tp or pp)"));
  }
  if (!ChooseDp(spec, static_cast<int>(e.max_workers())).has_value()) {
    return Invalid(absl::StrCat(
        "no data-parallel degree fits: with tp*pp=", model_parallel, " and ",
        e.min_workers(), "..", e.max_workers(), " workers, dp must be in ",
        min_dp == max_dp ? absl::StrCat("{", min_dp, "}")
                         : absl::StrCat("[", min_dp, ", ", max_dp, "]"),
        " and divide spec.training.global_batch / spec.training.micro_batch = ",
        t.global_batch() / t.micro_batch(),
        " (and the schedule must run that many micro-batches); change the batch or the "
        "worker range"));
  }
  return spec;
}

}  // namespace shardline::spec

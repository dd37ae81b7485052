#include "spec/spec_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "spec/job_spec.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace shardline::spec {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using Json = nlohmann::ordered_json;

// A spec file is a few hundred bytes; anything this large is the wrong file.
constexpr size_t kMaxSpecBytes = 4 << 20;
// google.protobuf.Duration's range (seconds), see google/protobuf/duration.proto.
constexpr int64_t kMaxDurationSeconds = 315576000000;

// The parsed document and where each field path was written ("line:column",
// 1-based; YAML only).
struct Document {
  Json root;
  std::map<std::string, std::string> where;
};

class SpecParser {
 public:
  explicit SpecParser(std::string source) : source_(std::move(source)) {}

  absl::Status Parse(const std::string& text, SpecFormat format,
                     google::protobuf::Message* message);

 private:
  // "<source>:<line>:<column>: " for `path` or its nearest written parent.
  std::string At(const std::string& path) const;
  absl::Status Invalid(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(At(path) + what);
  }

  absl::Status LoadYaml(const std::string& text);
  absl::Status FromYaml(const YAML::Node& node, const std::string& path, Json* out);
  absl::Status LoadJson(const std::string& text);

  absl::Status CheckMessage(const Descriptor* d, Json& obj, const std::string& path);
  absl::Status CheckValue(const FieldDescriptor* f, Json& value, const std::string& path);
  absl::Status CheckInteger(const FieldDescriptor* f, Json& value, const std::string& path);
  absl::Status CheckEnum(const EnumDescriptor* e, Json& value, const std::string& path);
  absl::Status CheckDuration(Json& value, const std::string& path);

  std::string source_;
  Document doc_;
};

std::string Join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : absl::StrCat(parent, ".", key);
}

// How a value reads in a message: `the number 10`, `the text "ten"`, ...
std::string Describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "an empty value";
    case Json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case Json::value_t::string:
      return absl::StrCat("the text \"", AbbreviateValue(v.get<std::string>()), "\"");
    case Json::value_t::array:
      return "a list";
    case Json::value_t::object:
      return "a mapping";
    default:
      return absl::StrCat("the number ", v.dump());
  }
}

std::string Where(const YAML::Mark& m) { return absl::StrCat(m.line + 1, ":", m.column + 1); }

std::string SpecParser::At(const std::string& path) const {
  std::string p = path;
  while (true) {
    auto it = doc_.where.find(p);
    if (it != doc_.where.end()) return absl::StrCat(source_, ":", it->second, ": ");
    const size_t cut = p.find_last_of(".[");
    if (cut == std::string::npos) break;
    p = p.substr(0, cut);
  }
  return absl::StrCat(source_, ": ");
}

// YAML 1.2 core schema resolution of a plain (unquoted) scalar.
Json PlainScalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return Json(nullptr);
  if (s == "true" || s == "True" || s == "TRUE") return Json(true);
  if (s == "false" || s == "False" || s == "FALSE") return Json(false);
  if (s == ".inf" || s == "+.inf" || s == ".Inf" || s == "+.Inf") return Json("Infinity");
  if (s == "-.inf" || s == "-.Inf") return Json("-Infinity");
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return Json("NaN");
  const size_t start = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  bool digits = start < s.size(), number = start < s.size(), seen_digit = false, dot = false,
       exp = false;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    if (absl::ascii_isdigit(c)) {
      seen_digit = true;
      continue;
    }
    digits = false;
    if (c == '.' && !dot && !exp) {
      dot = true;
    } else if ((c == 'e' || c == 'E') && seen_digit && !exp) {
      exp = true;
      if (i + 1 < s.size() && (s[i + 1] == '-' || s[i + 1] == '+')) ++i;
      if (i + 1 >= s.size()) number = false;
    } else {
      number = false;
    }
  }
  if (digits) {
    uint64_t u;
    int64_t i;
    if (s[0] != '-' && absl::SimpleAtoi(s, &u)) return Json(u);
    if (absl::SimpleAtoi(s, &i)) return Json(i);
    return Json(s);  // Out of range: the field check names it.
  }
  double d;
  if (number && seen_digit && absl::SimpleAtod(s, &d) && std::isfinite(d)) return Json(d);
  return Json(s);
}

absl::Status SpecParser::FromYaml(const YAML::Node& node, const std::string& path, Json* out) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      *out = Json(nullptr);
      return absl::OkStatus();
    case YAML::NodeType::Scalar:
      // yaml-cpp tags a quoted scalar "!" and a plain one "?".
      *out = node.Tag() == "!" ? Json(node.Scalar()) : PlainScalar(node.Scalar());
      return absl::OkStatus();
    case YAML::NodeType::Sequence: {
      *out = Json::array();
      size_t i = 0;
      for (const YAML::Node& item : node) {
        const std::string item_path = absl::StrCat(path, "[", i++, "]");
        doc_.where[item_path] = Where(item.Mark());
        Json value;
        if (absl::Status s = FromYaml(item, item_path, &value); !s.ok()) return s;
        out->push_back(std::move(value));
      }
      return absl::OkStatus();
    }
    case YAML::NodeType::Map: {
      *out = Json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(
              source_, ":", Where(kv.first.Mark()), ": a key under '", path.empty() ? "the top level" : path,
              "' is not a plain name; keys are field names such as num_layers"));
        }
        const std::string key = kv.first.Scalar();
        const std::string key_path = Join(path, key);
        if (out->contains(key)) {
          return absl::InvalidArgumentError(absl::StrCat(source_, ":", Where(kv.first.Mark()),
                                                         ": duplicate key '", key_path,
                                                         "'; give each field once"));
        }
        doc_.where[key_path] = Where(kv.first.Mark());
        Json value;
        if (absl::Status s = FromYaml(kv.second, key_path, &value); !s.ok()) return s;
        (*out)[key] = std::move(value);
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown YAML node type");
}

// Finds the first alias (*name). Job specs have no use for aliases, and
// expanding them is how a tiny file becomes gigabytes (the "billion laughs")
// or, aliasing itself, an endless recursion.
class AliasFinder final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    if (!alias.has_value()) alias = mark;
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  std::optional<YAML::Mark> alias;
};

absl::Status SpecParser::LoadYaml(const std::string& text) {
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    AliasFinder finder;
    // At most two documents are read: one is a spec, a second is an error.
    // The bound matters: yaml-cpp 0.7 reads a stray flow indicator (",", ",:"
    // at top level) as an endless run of empty documents (found by
    // fuzz/spec_fuzzer; fuzz/regressions/spec/), so reading "all" never ends.
    int documents = 0;
    while (documents < 2 && !finder.alias.has_value() && parser.HandleNextDocument(finder)) {
      ++documents;
    }
    if (finder.alias.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ":", Where(*finder.alias),
          ": YAML aliases (*name) are not allowed in a job spec; write the value out"));
    }
    if (documents > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": holds more than one YAML document (separated by ---, or text such as a "
          "stray ',' outside [ ] and { } that YAML reads as another); a spec file holds one job "
          "spec"));
    }
    if (documents == 0) {
      doc_.root = Json(nullptr);
      return absl::OkStatus();
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", Where(e.mark), ": YAML syntax error: ", e.msg));
  }
  YAML::Node doc;
  try {
    doc = YAML::Load(text);  // the one document (counted above)
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", Where(e.mark), ": YAML syntax error: ", e.msg));
  }
  try {
    return FromYaml(doc, "", &doc_.root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", Where(e.mark), ": YAML error: ", e.msg));
  }
}

absl::Status SpecParser::LoadJson(const std::string& text) {
  // Duplicate keys: nlohmann keeps the last silently; a spec must not.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && duplicate.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    doc_.root = Json::parse(text, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::parse_error& e) {
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    const size_t bracket = what.find("] ");
    if (absl::StartsWith(what, "[json.exception") && bracket != std::string::npos) {
      what = what.substr(bracket + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(source_, ": JSON syntax error: ", what));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": duplicate key '", duplicate,
                                                   "'; give each field once"));
  }
  return absl::OkStatus();
}

const FieldDescriptor* FindField(const Descriptor* d, const std::string& key) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->name() == key || f->json_name() == key) return f;
  }
  return nullptr;
}

absl::Status SpecParser::CheckMessage(const Descriptor* d, Json& obj, const std::string& path) {
  if (!obj.is_object()) {
    return Invalid(path, absl::StrCat(path.empty() ? "the spec" : "'" + path + "'",
                                      " must be a mapping of fields (", d->name(), "), not ",
                                      Describe(obj)));
  }
  for (auto& [key, value] : obj.items()) {
    const std::string field_path = Join(path, key);
    const FieldDescriptor* f = FindField(d, key);
    if (f == nullptr) {
      std::vector<std::string> names;
      for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
      return Invalid(field_path,
                     absl::StrCat("unknown field '", field_path, "'; ",
                                  path.empty() ? "a job spec" : "'" + path + "'", " has: ",
                                  absl::StrJoin(names, ", ")));
    }
    if (value.is_null() || f->is_map()) continue;  // null = unset; maps: protobuf checks.
    if (f->is_repeated()) {
      if (!value.is_array()) {
        return Invalid(field_path, absl::StrCat("'", field_path, "' must be a list, not ",
                                                Describe(value)));
      }
      for (size_t i = 0; i < value.size(); ++i) {
        if (absl::Status s = CheckValue(f, value[i], absl::StrCat(field_path, "[", i, "]"));
            !s.ok()) {
          return s;
        }
      }
      continue;
    }
    if (absl::Status s = CheckValue(f, value, field_path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status SpecParser::CheckValue(const FieldDescriptor* f, Json& value,
                                    const std::string& path) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      const std::string& type = f->message_type()->full_name();
      if (type == "google.protobuf.Duration") return CheckDuration(value, path);
      if (absl::StartsWith(type, "google.protobuf.")) return absl::OkStatus();
      return CheckMessage(f->message_type(), value, path);
    }
    case FieldDescriptor::CPPTYPE_ENUM:
      return CheckEnum(f->enum_type(), value, path);
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return CheckInteger(f, value, path);
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      if (value.is_number()) return absl::OkStatus();
      if (value.is_string() && (value == "Infinity" || value == "-Infinity" || value == "NaN")) {
        return absl::OkStatus();
      }
      return Invalid(path, absl::StrCat("'", path, "' must be a number, e.g. 0.001, not ",
                                        Describe(value)));
    case FieldDescriptor::CPPTYPE_BOOL:
      if (value.is_boolean()) return absl::OkStatus();
      return Invalid(path,
                     absl::StrCat("'", path, "' must be true or false, not ", Describe(value)));
    case FieldDescriptor::CPPTYPE_STRING:
      if (value.is_string()) return absl::OkStatus();
      return Invalid(path, absl::StrCat("'", path, "' must be text, not ", Describe(value),
                                        value.is_primitive() ? "; put it in quotes" : ""));
  }
  return absl::OkStatus();
}

// Unsigned fields whose valid range is narrower than their type's: the
// coordinator refuses 0 (ResolveJobSpec, plan::ValidateConfig), so a range
// hint of "0..max" would contradict the next error. By proto full name, so
// camelCase keys match too.
struct IntegerRange {
  const char* field;
  uint64_t min;
  uint64_t max;  // 0: the type's maximum
};
constexpr IntegerRange kIntegerRanges[] = {
    {"shardline.v1.ModelConfig.num_layers", 1, 0},
    {"shardline.v1.ModelConfig.hidden_size", 1, 0},
    {"shardline.v1.ModelConfig.num_heads", 1, 0},
    {"shardline.v1.ModelConfig.vocab_size", 256, 0},
    {"shardline.v1.ModelConfig.seq_length", 1, 0},
    {"shardline.v1.ParallelConfig.tp", 1, 0},
    {"shardline.v1.ParallelConfig.pp", 1, 0},
    {"shardline.v1.TrainingConfig.global_batch", 1, 0},
    {"shardline.v1.TrainingConfig.micro_batch", 1, 0},
    {"shardline.v1.TrainingConfig.train_steps", 1, kMaxTrainSteps},
};

absl::Status SpecParser::CheckInteger(const FieldDescriptor* f, Json& value,
                                      const std::string& path) {
  const bool is_unsigned = f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32 ||
                           f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
  const bool is_32 = f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ||
                     f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32;
  uint64_t min = 0;
  uint64_t max = is_32 ? uint64_t{std::numeric_limits<uint32_t>::max()}
                       : std::numeric_limits<uint64_t>::max();
  for (const IntegerRange& r : kIntegerRanges) {
    if (f->full_name() != r.field) continue;
    min = r.min;
    if (r.max != 0) max = r.max;
  }
  // The wire type's range is what parses; the hint gives the valid one.
  const std::string range =
      is_unsigned ? absl::StrCat(min, "..", max)
                  : absl::StrCat(is_32 ? int64_t{std::numeric_limits<int32_t>::min()}
                                       : std::numeric_limits<int64_t>::min(),
                                 "..",
                                 is_32 ? int64_t{std::numeric_limits<int32_t>::max()}
                                       : std::numeric_limits<int64_t>::max());
  const std::string kind = absl::StrCat("'", path, "' must be a whole number in ", range);
  // A quoted integer is fine in proto3 JSON; check its range the same way.
  std::string text;
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number_integer()) {
    text = value.dump();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::floor(d) != d) return Invalid(path, absl::StrCat(kind, ", not ", Describe(value)));
    text = absl::StrFormat("%.0f", d);
  } else {
    return Invalid(path, absl::StrCat(kind, ", not ", Describe(value)));
  }
  uint64_t u;
  int64_t i;
  bool ok;
  if (is_unsigned) {
    ok = absl::SimpleAtoi(text, &u) && text[0] != '-' &&
         (!is_32 || u <= std::numeric_limits<uint32_t>::max());
    if (ok) value = Json(u);
  } else {
    ok = absl::SimpleAtoi(text, &i) &&
         (!is_32 || (i >= std::numeric_limits<int32_t>::min() &&
                     i <= std::numeric_limits<int32_t>::max()));
    if (ok) value = Json(i);
  }
  if (!ok) return Invalid(path, absl::StrCat(kind, ", not ", Describe(value)));
  return absl::OkStatus();
}

// Enum value names share an upper-snake prefix from the enum's name
// (Schedule → SCHEDULE_, JobPhase → JOB_PHASE_).
std::string EnumPrefix(const EnumDescriptor* e) {
  std::string out;
  for (char c : e->name()) {
    if (absl::ascii_isupper(c) && !out.empty()) out += '_';
    out += absl::ascii_toupper(c);
  }
  return out + "_";
}

std::string NormalizeEnumName(std::string s) {
  absl::AsciiStrToUpper(&s);
  absl::StrReplaceAll({{"-", "_"}, {" ", "_"}}, &s);
  return s;
}

absl::Status SpecParser::CheckEnum(const EnumDescriptor* e, Json& value,
                                   const std::string& path) {
  const std::string prefix = EnumPrefix(e);
  std::vector<std::string> choices;
  for (int i = 0; i < e->value_count(); ++i) {
    const std::string& name = e->value(i)->name();
    if (absl::EndsWith(name, "_UNSPECIFIED")) continue;
    choices.push_back(absl::AsciiStrToLower(
        absl::StartsWith(name, prefix) ? name.substr(prefix.size()) : name));
  }
  if (e->full_name() == "shardline.v1.Schedule") choices.push_back("1f1b");
  const std::string bad = absl::StrCat("'", path, "' = ", value.is_string() ? "\"" : "",
                                       value.is_string() ? value.get<std::string>() : value.dump(),
                                       value.is_string() ? "\"" : "", " is not a valid ",
                                       e->name(), "; choose one of ", absl::StrJoin(choices, ", "));
  if (value.is_number_integer()) {
    const int64_t n = value.get<int64_t>();
    if (n >= std::numeric_limits<int>::min() && n <= std::numeric_limits<int>::max() &&
        e->FindValueByNumber(static_cast<int>(n)) != nullptr) {
      value = Json(e->FindValueByNumber(static_cast<int>(n))->name());
      return absl::OkStatus();
    }
    return Invalid(path, bad);
  }
  if (!value.is_string()) return Invalid(path, bad);
  std::string name = NormalizeEnumName(value.get<std::string>());
  if (e->full_name() == "shardline.v1.Schedule" && name == "1F1B") name = "ONE_F_ONE_B";
  for (const std::string& candidate : {name, prefix + name}) {
    if (const auto* v = e->FindValueByName(candidate); v != nullptr) {
      value = Json(v->name());
      return absl::OkStatus();
    }
  }
  return Invalid(path, bad);
}

absl::Status SpecParser::CheckDuration(Json& value, const std::string& path) {
  const std::string hint = "write a number with a unit, e.g. \"10s\", \"500ms\" or \"2m\"";
  if (!value.is_string()) {
    return Invalid(path, absl::StrCat("'", path, "' is a duration and ", Describe(value),
                                      " has no unit; ", hint));
  }
  absl::Duration d;
  const std::string text = value.get<std::string>();
  if (!absl::ParseDuration(text, &d) || d == absl::InfiniteDuration() ||
      d == -absl::InfiniteDuration()) {
    return Invalid(path, absl::StrCat("'", path, "' = \"", text, "\" is not a duration; ", hint));
  }
  if (absl::AbsDuration(d) > absl::Seconds(kMaxDurationSeconds)) {
    return Invalid(path, absl::StrCat("'", path, "' = \"", text,
                                      "\" is out of range (at most 10000 years)"));
  }
  // A duration is kept in whole nanoseconds (google.protobuf.Duration): one
  // that parses to a fraction of a nanosecond, or to zero from non-zero
  // digits, is refused rather than truncated (0.5ns would become 0s, which
  // several fields read as "unset" or "off").
  if (d != absl::Trunc(d, absl::Nanoseconds(1)) ||
      (d == absl::ZeroDuration() && text.find_first_of("123456789") != std::string::npos)) {
    return Invalid(path, absl::StrCat("'", path, "' = \"", text,
                                      "\" is finer than a nanosecond; durations are kept in whole "
                                      "nanoseconds"));
  }
  // proto3 JSON takes only seconds: "90s", "0.500s".
  const int64_t nanos = absl::ToInt64Nanoseconds(absl::AbsDuration(d));
  std::string out = absl::StrCat(d < absl::ZeroDuration() ? "-" : "", nanos / 1000000000);
  if (nanos % 1000000000 != 0) absl::StrAppendFormat(&out, ".%09d", nanos % 1000000000);
  value = Json(out + "s");
  return absl::OkStatus();
}

absl::Status SpecParser::Parse(const std::string& text, SpecFormat format,
                               google::protobuf::Message* message) {
  message->Clear();
  if (format == SpecFormat::kAuto) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    format = first != std::string::npos && text[first] == '{' ? SpecFormat::kJson
                                                               : SpecFormat::kYaml;
  }
  if (absl::Status s = format == SpecFormat::kJson ? LoadJson(text) : LoadYaml(text); !s.ok()) {
    return s;
  }
  if (doc_.root.is_null()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": is empty; a job spec needs at least model, parallel and training (see "
                 "deploy/jobs/shakespeare.yaml)"));
  }
  if (absl::Status s = CheckMessage(message->GetDescriptor(), doc_.root, ""); !s.ok()) return s;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(doc_.root.dump(), message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", status.message().as_string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseSpecMessage(const std::string& text, SpecFormat format,
                              const std::string& source, google::protobuf::Message* message) {
  // A spec is UTF-8 text (protobuf strings must be); say where it is not
  // before a parser meets the byte.
  for (size_t i = 0, line = 1, column = 1; i < text.size(); ++column) {
    const size_t n = Utf8Length(text, i);
    if (n == 0) {
      message->Clear();
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d:%d: byte 0x%02x is not UTF-8; a job spec is UTF-8 text", source, line, column,
          static_cast<unsigned char>(text[i])));
    }
    if (text[i] == '\n') {
      ++line;
      column = 0;
    }
    i += n;
  }
  absl::Status s;
  try {
    s = SpecParser(source).Parse(text, format, message);
  } catch (const std::exception& e) {
    s = absl::InvalidArgumentError(absl::StrCat(source, ": cannot read the spec: ", e.what()));
  }
  if (s.ok()) return s;
  // Messages quote the file (keys, values): one short line, no terminal
  // control characters, whatever the file holds.
  return absl::Status(s.code(), AbbreviateValue(s.message(), 512));
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(const std::string& text, SpecFormat format,
                                         const std::string& source) {
  v1::JobSpec spec;
  if (absl::Status s = ParseSpecMessage(text, format, source, &spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path, SpecFormat format) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string what =
        absl::StrCat("cannot read spec file '", path, "': ", std::strerror(err));
    return err == ENOENT || err == ENOTDIR ? absl::NotFoundError(what)
                                           : absl::FailedPreconditionError(what);
  }
  if (S_ISDIR(st.st_mode)) {
    // A wrong argument, as a missing file is (exit 2 in the tools).
    return absl::InvalidArgumentError(
        absl::StrCat("spec file '", path, "' is a directory; give a .yaml or .json file"));
  }
  if (S_ISREG(st.st_mode) && static_cast<size_t>(st.st_size) > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec file '", path, "' is ", st.st_size,
                                                   " bytes; a job spec is at most ",
                                                   kMaxSpecBytes, " bytes"));
  }
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read spec file '", path, "': ", std::strerror(errno)));
  }
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0 && text.size() <= kMaxSpecBytes) {
    text.append(buffer, n);
  }
  const bool failed = std::ferror(file) != 0;
  const int err = errno;
  std::fclose(file);
  if (failed) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read spec file '", path, "': ", std::strerror(err)));
  }
  if (text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec file '", path, "' is over ",
                                                   kMaxSpecBytes, " bytes; a job spec is smaller"));
  }
  if (format == SpecFormat::kAuto) {
    if (absl::EndsWithIgnoreCase(path, ".json")) format = SpecFormat::kJson;
    if (absl::EndsWithIgnoreCase(path, ".yaml") || absl::EndsWithIgnoreCase(path, ".yml")) {
      format = SpecFormat::kYaml;
    }
  }
  return ParseJobSpec(text, format, path);
}

}  // namespace shardline::spec

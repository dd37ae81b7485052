#include "spec/spec_file.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "spec/job_spec.h"

namespace shardline::spec {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kExample[] = "deploy/jobs/shakespeare.yaml";

absl::StatusOr<v1::JobSpec> Yaml(const std::string& text) {
  return ParseJobSpec(text, SpecFormat::kYaml, "spec.yaml");
}
absl::StatusOr<v1::JobSpec> Json(const std::string& text) {
  return ParseJobSpec(text, SpecFormat::kJson, "spec.json");
}
std::string Error(const absl::StatusOr<v1::JobSpec>& r) {
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  return std::string(r.status().message());
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The demo job, field by field (the numbers README and DESIGN quote).
TEST(SpecFileTest, ExampleSpecParses) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(kExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "shakespeare");
  EXPECT_EQ(spec->model().num_layers(), 4u);
  EXPECT_EQ(spec->model().hidden_size(), 128u);
  EXPECT_EQ(spec->model().num_heads(), 4u);
  EXPECT_EQ(spec->model().vocab_size(), 256u);
  EXPECT_EQ(spec->model().seq_length(), 64u);
  EXPECT_EQ(spec->parallel().tp(), 1u);
  EXPECT_EQ(spec->parallel().pp(), 2u);
  EXPECT_EQ(spec->parallel().zero_stage(), 2u);
  EXPECT_EQ(spec->training().global_batch(), 24u);
  EXPECT_EQ(spec->training().micro_batch(), 3u);
  EXPECT_EQ(spec->training().train_steps(), 2000u);
  EXPECT_DOUBLE_EQ(spec->training().learning_rate(), 1e-3);
  EXPECT_EQ(spec->training().precision(), v1::PRECISION_FP32);
  EXPECT_EQ(spec->data().dataset_path(), "data/tinyshakespeare.txt");
  EXPECT_EQ(spec->checkpoint().directory(), "/tmp/shardline-ckpt");
  EXPECT_EQ(spec->checkpoint().interval_steps(), 100u);
  EXPECT_EQ(spec->checkpoint().keep_last(), 3u);
  EXPECT_EQ(spec->elastic().min_workers(), 4u);
  EXPECT_EQ(spec->elastic().max_workers(), 5u);
  EXPECT_EQ(spec->elastic().heartbeat_interval().seconds(), 1);
  EXPECT_EQ(spec->elastic().heartbeat_timeout().seconds(), 10);
  EXPECT_FALSE(spec->elastic().has_join_timeout());
}

// The example's commented-out hang and straggler lines: left as they are
// they set nothing (the defaults apply); uncommented, each is a valid
// setting that the coordinator accepts.
TEST(SpecFileTest, ExampleSpecHangAndStragglerLinesAreValidWhenUncommented) {
  absl::StatusOr<v1::JobSpec> as_is = ReadJobSpecFile(kExample);
  ASSERT_TRUE(as_is.ok()) << as_is.status();
  EXPECT_FALSE(as_is->elastic().has_progress_timeout());
  EXPECT_EQ(as_is->elastic().hang_policy(), v1::HANG_POLICY_UNSPECIFIED);
  EXPECT_EQ(as_is->elastic().straggler_factor(), 0);
  EXPECT_EQ(as_is->elastic().straggler_window_steps(), 0u);
  EXPECT_EQ(as_is->elastic().straggler_policy(), v1::STRAGGLER_POLICY_UNSPECIFIED);
  EXPECT_FALSE(as_is->elastic().has_straggler_min_excess());

  std::ifstream in(kExample);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string uncommented;
  int settings = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    for (const char* field : {"progress_timeout", "hang_policy", "straggler_factor",
                              "straggler_window_steps", "straggler_min_excess",
                              "straggler_policy"}) {
      if (absl::StartsWith(line, absl::StrCat("  # ", field, ": "))) {
        line.remove_prefix(4);  // "  # " -> ""; keep the elastic: indentation below
        ++settings;
        uncommented += "  ";
        break;
      }
    }
    absl::StrAppend(&uncommented, line, "\n");
  }
  ASSERT_EQ(settings, 6) << text;
  absl::StatusOr<v1::JobSpec> spec = Yaml(uncommented);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << uncommented;
  EXPECT_EQ(spec->elastic().progress_timeout().seconds(), 120);
  EXPECT_EQ(spec->elastic().hang_policy(), v1::HANG_POLICY_REPORT);
  EXPECT_DOUBLE_EQ(spec->elastic().straggler_factor(), 2.0);
  EXPECT_EQ(spec->elastic().straggler_window_steps(), 20u);
  EXPECT_EQ(spec->elastic().straggler_min_excess().nanos(), 20000000);
  EXPECT_EQ(spec->elastic().straggler_policy(), v1::STRAGGLER_POLICY_REPLACE);
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
}

// The external example (job.proto ExternalWorkload): only name, external
// and elastic; `external: {}` alone marks the kind.
TEST(SpecFileTest, ExternalExampleSpecParses) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile("deploy/jobs/torchrun-external.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "torchrun-external");
  EXPECT_TRUE(spec->has_external());
  EXPECT_EQ(spec->external().framework(), "torchrun");
  EXPECT_FALSE(spec->has_model());
  EXPECT_FALSE(spec->has_training());
  EXPECT_EQ(spec->elastic().min_workers(), 2u);
  EXPECT_EQ(spec->elastic().max_workers(), 4u);
  EXPECT_EQ(spec->elastic().heartbeat_interval().seconds(), 1);
  EXPECT_EQ(spec->elastic().heartbeat_timeout().seconds(), 5);
  EXPECT_EQ(spec->elastic().last_call().seconds(), 2);
  absl::StatusOr<v1::JobSpec> flow = Yaml("name: x\nexternal: {framework: torchrun}\n");
  ASSERT_TRUE(flow.ok()) << flow.status();
  EXPECT_EQ(flow->external().framework(), "torchrun");
  absl::StatusOr<v1::JobSpec> empty = Yaml("name: x\nexternal: {}\n");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->has_external());
  EXPECT_THAT(Error(Yaml("name: x\nexternal: {framwork: torchrun}\n")), HasSubstr("framwork"));
}

// The same spec written as JSON, with lowerCamel names for some fields and
// enum / duration spellings as proto3 JSON writes them, gives the same message.
TEST(SpecFileTest, JsonEquivalentGivesTheSameMessage) {
  const std::string json = R"({
    "name": "shakespeare",
    "model": {"num_layers": 4, "hiddenSize": 128, "numHeads": 4, "vocab_size": 256,
              "seqLength": 64},
    "parallel": {"tp": 1, "pp": 2, "zeroStage": 2},
    "training": {"globalBatch": "24", "micro_batch": 3, "train_steps": 2000,
                 "learning_rate": 0.001, "warmup_steps": 100, "min_learning_rate": 0.0001,
                 "weight_decay": 0.1, "grad_clip": 1, "adam_beta2": 0.99, "seed": 1234,
                 "precision": "PRECISION_FP32"},
    "data": {"dataset_path": "data/tinyshakespeare.txt", "validation_fraction": 0.1},
    "checkpoint": {"directory": "/tmp/shardline-ckpt", "interval_steps": 100, "keep_last": 3},
    "elastic": {"min_workers": 4, "max_workers": 5, "heartbeat_interval": "1s",
                "heartbeatTimeout": "10.000s"}
  })";
  absl::StatusOr<v1::JobSpec> from_yaml = ReadJobSpecFile(kExample);
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  absl::StatusOr<v1::JobSpec> from_json = Json(json);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  std::string diff;
  MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(*from_yaml, *from_json)) << diff;

  // And through a .json file picked by its extension.
  const std::string path = WriteTemp("shakespeare.json", json);
  absl::StatusOr<v1::JobSpec> from_file = ReadJobSpecFile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*from_yaml, *from_file));

  // protobuf's own JSON of the message reads back to the same message.
  std::string printed;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*from_yaml, &printed).ok());
  absl::StatusOr<v1::JobSpec> round_trip = Json(printed);
  ASSERT_TRUE(round_trip.ok()) << round_trip.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*from_yaml, *round_trip)) << printed;
}

TEST(SpecFileTest, UnknownFieldIsNamedWithItsLine) {
  const std::string e = Error(Yaml("name: x\nelastic:\n  min_workers: 4\n  hearbeat_timeout: 10s\n"));
  EXPECT_THAT(e, AllOf(HasSubstr("spec.yaml:4:3:"), HasSubstr("unknown field 'elastic.hearbeat_timeout'"),
                       HasSubstr("heartbeat_timeout")));
  EXPECT_THAT(Error(Yaml("modle:\n  num_layers: 4\n")),
              AllOf(HasSubstr("spec.yaml:1:1: unknown field 'modle'"), HasSubstr("model")));
  EXPECT_THAT(Error(Json(R"({"model": {"layers": 4}})")),
              AllOf(HasSubstr("spec.json: unknown field 'model.layers'"), HasSubstr("num_layers")));
}

// Hang and straggler detection keys (job.proto ElasticPolicy), YAML and JSON.
TEST(SpecFileTest, ProgressPolicyKeys) {
  absl::StatusOr<v1::JobSpec> spec = Yaml(
      "elastic:\n  progress_timeout: 30s\n  hang_policy: report\n  straggler_factor: 2.5\n"
      "  straggler_window_steps: 20\n  straggler_policy: replace\n  straggler_min_excess: 0s\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->elastic().has_straggler_min_excess());  // 0s is set: the factor alone
  EXPECT_EQ(spec->elastic().straggler_min_excess().seconds(), 0);
  EXPECT_TRUE(spec->elastic().has_progress_timeout());
  EXPECT_EQ(spec->elastic().progress_timeout().seconds(), 30);
  EXPECT_EQ(spec->elastic().hang_policy(), v1::HANG_POLICY_REPORT);
  EXPECT_DOUBLE_EQ(spec->elastic().straggler_factor(), 2.5);
  EXPECT_EQ(spec->elastic().straggler_window_steps(), 20u);
  EXPECT_EQ(spec->elastic().straggler_policy(), v1::STRAGGLER_POLICY_REPLACE);
  // "0s" is set (off), not unset (automatic); enum spellings as proto3 JSON.
  spec = Json(R"({"elastic": {"progressTimeout": "0s", "hangPolicy": "HANG_POLICY_EVICT",
                  "stragglerPolicy": "report"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->elastic().has_progress_timeout());
  EXPECT_EQ(spec->elastic().progress_timeout().seconds(), 0);
  EXPECT_EQ(spec->elastic().hang_policy(), v1::HANG_POLICY_EVICT);
  EXPECT_EQ(spec->elastic().straggler_policy(), v1::STRAGGLER_POLICY_REPORT);
  spec = Yaml("elastic:\n  straggler_factor: 1.5\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->elastic().has_progress_timeout());
  EXPECT_THAT(Error(Yaml("elastic:\n  hang_policy: kill\n")),
              AllOf(HasSubstr("spec.yaml:2:3:"), HasSubstr("'elastic.hang_policy' = \"kill\""),
                    HasSubstr("choose one of evict, report")));
  EXPECT_THAT(Error(Yaml("elastic:\n  straggler_policy: evict\n")),
              HasSubstr("choose one of report, replace"));
  EXPECT_THAT(Error(Yaml("elastic:\n  progress_timeout: 30\n")),
              HasSubstr("'elastic.progress_timeout' is a duration and the number 30 has no unit"));
  EXPECT_THAT(Error(Yaml("elastic:\n  straggler_window_steps: ten\n")),
              HasSubstr("'elastic.straggler_window_steps' must be a whole number"));
}

TEST(SpecFileTest, BadDurations) {
  EXPECT_THAT(Error(Yaml("elastic:\n  heartbeat_interval: ten seconds\n")),
              AllOf(HasSubstr("spec.yaml:2:3:"), HasSubstr("'elastic.heartbeat_interval'"),
                    HasSubstr("\"ten seconds\" is not a duration"), HasSubstr("\"10s\"")));
  EXPECT_THAT(Error(Yaml("elastic:\n  heartbeat_timeout: 10\n")),
              AllOf(HasSubstr("'elastic.heartbeat_timeout' is a duration"),
                    HasSubstr("the number 10 has no unit")));
  EXPECT_THAT(Error(Json(R"({"elastic": {"join_timeout": 30}})")),
              HasSubstr("'elastic.join_timeout' is a duration and the number 30 has no unit"));
  // Finer than a nanosecond: refused, not truncated to 0s ("unset"/"off").
  EXPECT_THAT(Error(Yaml("elastic:\n  progress_timeout: 0.5ns\n")),
              AllOf(HasSubstr("'elastic.progress_timeout' = \"0.5ns\""),
                    HasSubstr("finer than a nanosecond")));
  EXPECT_THAT(Error(Yaml("elastic:\n  heartbeat_interval: 0.0000000001s\n")),
              HasSubstr("'elastic.heartbeat_interval' = \"0.0000000001s\" is finer than"));
  absl::StatusOr<v1::JobSpec> zero = Yaml("elastic:\n  straggler_min_excess: 0.000s\n");
  ASSERT_TRUE(zero.ok()) << zero.status();  // a written zero is zero
  absl::StatusOr<v1::JobSpec> whole = Yaml("elastic:\n  straggler_min_excess: 1.000000001s\n");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->elastic().straggler_min_excess().seconds(), 1);
  EXPECT_EQ(whole->elastic().straggler_min_excess().nanos(), 1);
}

TEST(SpecFileTest, DurationsWithUnitsBecomeSeconds) {
  absl::StatusOr<v1::JobSpec> spec = Yaml(
      "elastic:\n  heartbeat_interval: 500ms\n  join_timeout: 1m30s\n  last_call: '2s'\n"
      "  collective_timeout: 1.5h\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->elastic().heartbeat_interval().seconds(), 0);
  EXPECT_EQ(spec->elastic().heartbeat_interval().nanos(), 500000000);
  EXPECT_EQ(spec->elastic().join_timeout().seconds(), 90);
  EXPECT_EQ(spec->elastic().last_call().seconds(), 2);
  EXPECT_EQ(spec->elastic().collective_timeout().seconds(), 5400);
}

TEST(SpecFileTest, EnumSpellings) {
  for (const char* s : {"1f1b", "one_f_one_b", "ONE_F_ONE_B", "SCHEDULE_ONE_F_ONE_B", "2"}) {
    absl::StatusOr<v1::JobSpec> spec = Yaml(std::string("parallel:\n  schedule: ") + s + "\n");
    ASSERT_TRUE(spec.ok()) << s << ": " << spec.status();
    EXPECT_EQ(spec->parallel().schedule(), v1::SCHEDULE_ONE_F_ONE_B) << s;
  }
  absl::StatusOr<v1::JobSpec> mixed = Yaml("training:\n  precision: mixed\n");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->training().precision(), v1::PRECISION_MIXED);
  absl::StatusOr<v1::JobSpec> bf16 = Yaml("training:\n  precision: bf16\n");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->training().precision(), v1::PRECISION_BF16);  // an alias: the same value
  EXPECT_THAT(Error(Yaml("training:\n  precision: fp16\n")),
              AllOf(HasSubstr("'training.precision' = \"fp16\" is not a valid Precision"),
                    HasSubstr("fp32, mixed")));
  EXPECT_THAT(Error(Yaml("parallel:\n  schedule: 9\n")), HasSubstr("not a valid Schedule"));
}

TEST(SpecFileTest, IntegersAreWholeAndInRange) {
  EXPECT_THAT(Error(Yaml("model:\n  num_layers: 4294967296\n")),
              AllOf(HasSubstr("spec.yaml:2:3:"), HasSubstr("'model.num_layers' must be a whole "
                                                           "number in 1..4294967295")));
  // The hint is the valid range, not the type's: 0 would be refused next.
  EXPECT_THAT(Error(Yaml("training:\n  global_batch: -24\n")),
              HasSubstr("'training.global_batch' must be a whole number in "
                        "1..18446744073709551615, not the number -24"));
  EXPECT_THAT(Error(Yaml("training:\n  trainSteps: -1\n")),
              HasSubstr("must be a whole number in 1..1099511627776"));
  EXPECT_THAT(Error(Yaml("model:\n  vocab_size: -1\n")),
              HasSubstr("'model.vocab_size' must be a whole number in 256..4294967295"));
  // Fields where 0 means "the default" keep 0 in the range.
  EXPECT_THAT(Error(Yaml("parallel:\n  vpp: -1\n")),
              HasSubstr("'parallel.vpp' must be a whole number in 0..4294967295"));
  EXPECT_THAT(Error(Yaml("model:\n  num_layers: -1\n")), HasSubstr("'model.num_layers'"));
  EXPECT_THAT(Error(Yaml("model:\n  num_layers: 4.5\n")),
              HasSubstr("not the number 4.5"));
  EXPECT_THAT(Error(Yaml("model:\n  num_layers: four\n")), HasSubstr("not the text \"four\""));
  absl::StatusOr<v1::JobSpec> quoted = Yaml("model:\n  num_layers: '4'\ntraining:\n  seed: 1e3\n");
  ASSERT_TRUE(quoted.ok()) << quoted.status();
  EXPECT_EQ(quoted->model().num_layers(), 4u);
  EXPECT_EQ(quoted->training().seed(), 1000u);
  absl::StatusOr<v1::JobSpec> big = Yaml("training:\n  seed: 18446744073709551615\n");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->training().seed(), 18446744073709551615u);
}

TEST(SpecFileTest, KindsOfValues) {
  EXPECT_THAT(Error(Yaml("name: 123\n")),
              AllOf(HasSubstr("'name' must be text, not the number 123"), HasSubstr("quotes")));
  EXPECT_THAT(Error(Yaml("model: 4\n")),
              HasSubstr("'model' must be a mapping of fields (ModelConfig), not the number 4"));
  EXPECT_THAT(Error(Yaml("checkpoint:\n  async_save: yes\n")),
              HasSubstr("'checkpoint.async_save' must be true or false"));
  EXPECT_THAT(Error(Yaml("training:\n  learning_rate: fast\n")),
              HasSubstr("'training.learning_rate' must be a number"));
  absl::StatusOr<v1::JobSpec> ok = Yaml("name: '123'\ncheckpoint:\n  async_save: true\nmodel:\n  num_layers: ~\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->name(), "123");
  EXPECT_TRUE(ok->checkpoint().async_save());
}

TEST(SpecFileTest, DocumentShape) {
  EXPECT_THAT(Error(Yaml("")), HasSubstr("spec.yaml: is empty"));
  EXPECT_THAT(Error(Yaml("# only a comment\n")), HasSubstr("is empty"));
  EXPECT_THAT(Error(Yaml("- name: x\n")), HasSubstr("the spec must be a mapping of fields"));
  // A file that is not a spec at all (e.g. /etc/passwd: one long scalar) is
  // quoted by its first 64 bytes, not in full.
  const std::string passwd = "root:x:0:0:root:/root:/bin/bash " + std::string(500, 'x');
  const std::string not_a_spec = Error(Yaml(passwd + "\n"));
  EXPECT_THAT(not_a_spec, HasSubstr("not the text \"" + passwd.substr(0, 64) + "... (532 bytes)\""));
  EXPECT_LT(not_a_spec.size(), 200u) << not_a_spec;
  EXPECT_THAT(Error(Yaml("name: a\n---\nname: b\n")),
              HasSubstr("holds more than one YAML document"));
  // yaml-cpp reads a stray top-level ',' as endless empty documents: the
  // parser must stop and say so, not loop (found by fuzz/spec_fuzzer).
  EXPECT_THAT(Error(Yaml(",:")), HasSubstr("holds more than one YAML document"));
  EXPECT_THAT(Error(Yaml(",\"")), HasSubstr("stray ','"));
  EXPECT_THAT(Error(Yaml("name: a\nname: b\n")),
              AllOf(HasSubstr("spec.yaml:2:1: duplicate key 'name'")));
  EXPECT_THAT(Error(Json(R"({"model": {"num_layers": 4, "num_layers": 5}})")),
              HasSubstr("duplicate key 'num_layers'"));
  EXPECT_THAT(Error(Yaml("model: {num_layers: 4\n")), HasSubstr("YAML syntax error"));
  EXPECT_THAT(Error(Json("{\"model\": }")), HasSubstr("spec.json: JSON syntax error"));
}

// Hostile bytes in a spec file: never a crash (invalid UTF-8 used to abort
// shardctl from inside the JSON library), never raw control characters or a
// megabyte in an error line.
TEST(SpecFileTest, HostileTextGivesOneShortLine) {
  EXPECT_EQ(Error(Yaml("name: ok\ndata: {dataset_path: \"/tmp/\xfe\"}\n")),
            "spec.yaml:2:28: byte 0xfe is not UTF-8; a job spec is UTF-8 text");
  EXPECT_EQ(Error(Yaml("name: a\xff" "b\n")),
            "spec.yaml:1:8: byte 0xff is not UTF-8; a job spec is UTF-8 text");
  EXPECT_THAT(Error(Json("{\"name\": \"\xc3\x28\"}")), HasSubstr("is not UTF-8"));
  const std::string escape = Error(Yaml("\"\x1b[31mevil\": 1\n"));
  EXPECT_THAT(escape, HasSubstr("\\x1b[31mevil"));
  EXPECT_EQ(escape.find('\x1b'), std::string::npos) << escape;
  const std::string huge = Error(Yaml("model:\n  num_layers: \"" + std::string(20000, 'x') + "\"\n"));
  EXPECT_THAT(huge, HasSubstr("'model.num_layers' must be a whole number"));
  EXPECT_LT(huge.size(), 600u) << huge.size();
  const std::string lines = Error(Yaml("model:\n  num_layers: \"a\\nb\\nc\"\n"));
  EXPECT_EQ(lines.find('\n'), std::string::npos) << lines;
}

TEST(SpecFileTest, FileErrorsNameThePath) {
  absl::StatusOr<v1::JobSpec> missing = ReadJobSpecFile("/nonexistent/job.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot read spec file '/nonexistent/job.yaml': No such file or directory"));

  const char* dir = std::getenv("TEST_TMPDIR");
  absl::StatusOr<v1::JobSpec> directory = ReadJobSpecFile(dir ? dir : "/tmp");
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(directory.status().message(), HasSubstr("is a directory"));

  const std::string bad = WriteTemp("bad.yaml", "model:\n  layers: 4\n");
  absl::StatusOr<v1::JobSpec> field = ReadJobSpecFile(bad);
  ASSERT_FALSE(field.ok());
  EXPECT_THAT(field.status().message(), HasSubstr(bad + ":2:3: unknown field 'model.layers'"));

  // No extension: JSON when it starts with '{', else YAML.
  const std::string json = WriteTemp("spec-noext", "{\"name\": \"j\"}");
  absl::StatusOr<v1::JobSpec> sniffed = ReadJobSpecFile(json);
  ASSERT_TRUE(sniffed.ok()) << sniffed.status();
  EXPECT_EQ(sniffed->name(), "j");
}

}  // namespace
}  // namespace shardline::spec

namespace shardline::spec {
namespace {

// Aliases are refused before anything is expanded: a "billion laughs" file
// (9 levels of 10 aliases) would otherwise grow to gigabytes, and an alias of
// itself would recurse forever.
TEST(SpecFileAliasTest, AliasesAreRefusedBeforeExpansion) {
  std::string bomb = "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  for (int i = 1; i <= 9; ++i) {
    bomb += absl::StrCat("a", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j) bomb += absl::StrCat(j ? "," : "", "*a", i - 1);
    bomb += "]\n";
  }
  const absl::Time start = absl::Now();
  const absl::StatusOr<v1::JobSpec> r = ParseJobSpec(bomb, SpecFormat::kYaml, "bomb.yaml");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr("bomb.yaml:2:10: YAML aliases (*name) are not allowed"));
  const absl::StatusOr<v1::JobSpec> self =
      ParseJobSpec("name: &a [*a]\n", SpecFormat::kYaml, "self.yaml");
  EXPECT_THAT(std::string(self.status().message()), ::testing::HasSubstr("aliases"));
}

}  // namespace
}  // namespace shardline::spec

// ResolveJobSpec's refusals of values a new user can type, and the helpers
// that keep free text and echoed values short and printable.
#include "spec/job_spec.h"
#include "testing/job_specs.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::spec {
namespace {

using ::testing::HasSubstr;

// grpc_test_util's small GPT (12 samples of micro-batch 1, one worker),
// its corpus given relative to the workers' directory.
v1::JobSpec Valid() {
  v1::JobSpec spec = fixtures::SmallSpec(1, 1, 12);
  spec.mutable_data()->set_dataset_path("data/tinyshakespeare.txt");
  return spec;
}

std::string Error(const v1::JobSpec& spec) {
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(spec);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(ResolveJobSpecTest, TheBaseSpecIsValid) {
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(Valid());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->data().dataset_path(), "data/tinyshakespeare.txt");  // relative is the workers' call
}

// -0.0 is 0: resolved to an unset 0.0, so the spec's JSON parses back to it
// (spec_fuzzer found min_learning_rate: -0.0 printed as -0 and read back as
// another spec).
TEST(ResolveJobSpecTest, NegativeZeroIsZero) {
  v1::JobSpec spec = Valid();
  spec.mutable_training()->set_min_learning_rate(-0.0);
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(std::signbit(r->training().min_learning_rate()));
  v1::JobSpec plus = Valid();
  plus.mutable_training()->set_min_learning_rate(0.0);
  absl::StatusOr<v1::JobSpec> p = ResolveJobSpec(plus);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(r->SerializeAsString(), p->SerializeAsString());
}

TEST(ResolveJobSpecTest, DatasetPathIsRequired) {
  v1::JobSpec spec = Valid();
  spec.mutable_data()->set_dataset_path("");
  EXPECT_EQ(Error(spec),
            "spec.data.dataset_path is empty; give the path of the text corpus every worker can "
            "read (at most 4096 bytes), e.g. /data/tinyshakespeare.txt");
  spec.mutable_data()->set_dataset_path("/data/x\nPhase: fake");
  EXPECT_THAT(Error(spec), HasSubstr("spec.data.dataset_path='/data/x\\nPhase: fake' is invalid"));
  spec.mutable_data()->set_dataset_path("/" + std::string(5000, 'p'));
  EXPECT_THAT(Error(spec), HasSubstr("... (5001 bytes)' is invalid; give a path of at most 4096"));
}

TEST(ResolveJobSpecTest, NameIsOneShortPrintableLine) {
  v1::JobSpec spec = Valid();
  spec.set_name("");
  EXPECT_EQ(Error(spec),
            "spec.name is empty; use 1..128 bytes of printable text on one line, e.g. name: "
            "shakespeare");
  spec.set_name("x\x1b[2J\nPhase: COMPLETED");
  EXPECT_EQ(Error(spec),
            "spec.name='x\\x1b[2J\\nPhase: COMPLETED' contains control characters or malformed "
            "UTF-8; use 1..128 bytes of printable text on one line, e.g. name: shakespeare");
  spec.set_name(std::string(2000000, 'n'));
  const std::string huge = Error(spec);
  EXPECT_EQ(huge, absl::StrCat("spec.name='", std::string(64, 'n'),
                               "... (2000000 bytes)' is too long; use 1..128 bytes of printable "
                               "text on one line, e.g. name: shakespeare"));
  spec.set_name(std::string(128, 'n'));
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec.set_name("Shakespeare run #2 \xc3\xa9t\xc3\xa9 (tp 1)");  // spaces and UTF-8 are fine
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec.set_name("bell\x07");
  EXPECT_THAT(Error(spec), HasSubstr("spec.name='bell\\x07' contains control characters"));
  spec.set_name("c1 \xc2\x9b" "2J");  // U+009B, the one-byte CSI
  EXPECT_THAT(Error(spec), HasSubstr("spec.name='c1 \\u009b2J' contains control characters"));
  spec.set_name("\xe2\x80\xae" "evil");  // U+202E: reverses the rest of a table row
  EXPECT_THAT(Error(spec), HasSubstr("spec.name='\\u202eevil' contains control characters"));
  spec.set_name("zero\xe2\x80\x8bwidth");  // U+200B
  EXPECT_THAT(Error(spec), HasSubstr("spec.name='zero\\u200bwidth' contains control characters"));
  spec.set_name("   ");
  EXPECT_THAT(Error(spec), HasSubstr("spec.name='   ' is blank; use 1..128 bytes"));
}

TEST(ResolveJobSpecTest, HugeCheckpointDirectoryIsNamedInAShortMessage) {
  v1::JobSpec spec = Valid();
  spec.mutable_checkpoint()->set_directory("/" + std::string(20000, 'd'));
  const std::string message = Error(spec);
  EXPECT_THAT(message, HasSubstr("spec.checkpoint.directory='/ddd"));
  EXPECT_THAT(message, HasSubstr("... (20001 bytes)' must be an absolute path without '..' or "
                                 "control characters, at most 4096 bytes"));
  EXPECT_LT(message.size(), 300u);
  spec.mutable_checkpoint()->set_directory("relative/ckpt");
  EXPECT_THAT(Error(spec), HasSubstr("spec.checkpoint.directory='relative/ckpt' must be an "
                                     "absolute path"));
}

// pp=3 with 4..4 workers: no world dp*3 lies in 4..4. The message says so
// instead of "dp must be in [2, 1]".
TEST(ResolveJobSpecTest, NoMultipleOfTpPpInTheWorkerRange) {
  v1::JobSpec spec = Valid();
  spec.mutable_model()->set_num_layers(3);
  spec.mutable_parallel()->set_pp(3);
  spec.mutable_elastic()->set_min_workers(4);
  spec.mutable_elastic()->set_max_workers(4);
  EXPECT_EQ(Error(spec),
            "no data-parallel degree fits: the world size is dp * tp*pp, a multiple of tp*pp=3, "
            "and none lies in spec.elastic.min_workers..max_workers = 4..4; set min_workers to 3 "
            "or max_workers to 6 (or change tp or pp)");
  spec.mutable_elastic()->set_max_workers(6);
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  // A non-empty range whose only dp does not divide the batch keeps the
  // divisibility message, with the one dp written as a set.
  spec.mutable_training()->set_global_batch(7);
  EXPECT_THAT(Error(spec), HasSubstr("dp must be in {2} and divide"));
}

// Issue 14 defect 11: what an independent gRPC client could put in a spec
// and get stored. Each case was accepted by ResolveJobSpec before (checked
// against the previous job_spec.cc) and is refused now, naming the field.
struct HostileCase {
  const char* what;
  std::function<void(v1::JobSpec*)> change;
  std::string error;  // the start of the message
};

void AddUnknownField(google::protobuf::Message* m, int number, std::string bytes) {
  m->GetReflection()->MutableUnknownFields(m)->AddLengthDelimited(number, std::move(bytes));
}

TEST(ResolveJobSpecTest, HostileValuesAreRefusedNamingTheField) {
  const std::vector<HostileCase> cases = {
      {"join_timeout past Duration's range (it overflowed and FAILED the job at once)",
       [](v1::JobSpec* s) {
         s->mutable_elastic()->mutable_join_timeout()->set_seconds(
             std::numeric_limits<int64_t>::max());
       },
       "spec.elastic.join_timeout={seconds: 9223372036854775807, nanos: 0} is not a valid "
       "google.protobuf.Duration (seconds within +-315576000000, nanos within +-999999999 with "
       "the same sign)"},
      {"nanos of two seconds",
       [](v1::JobSpec* s) { s->mutable_elastic()->mutable_heartbeat_interval()->set_nanos(2000000000); },
       "spec.elastic.heartbeat_interval={seconds: 0, nanos: 2000000000} is not a valid "
       "google.protobuf.Duration"},
      {"nanos against the seconds' sign",
       [](v1::JobSpec* s) {
         s->mutable_elastic()->mutable_last_call()->set_seconds(5);
         s->mutable_elastic()->mutable_last_call()->set_nanos(-1);
       },
       "spec.elastic.last_call={seconds: 5, nanos: -1} is not a valid google.protobuf.Duration"},
      {"1 ns heartbeats, 2 ns timeout (105 generations in 12 s)",
       [](v1::JobSpec* s) {
         s->mutable_elastic()->mutable_heartbeat_interval()->set_nanos(1);
         s->mutable_elastic()->mutable_heartbeat_timeout()->set_nanos(2);
       },
       "spec.elastic.heartbeat_interval=0.000000001s is too short; at least 10ms"},
      {"a timeout of less than two intervals",
       [](v1::JobSpec* s) {
         s->mutable_elastic()->mutable_heartbeat_interval()->set_nanos(100000000);
         s->mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(0);
         s->mutable_elastic()->mutable_heartbeat_timeout()->set_nanos(150000000);
       },
       "spec.elastic.heartbeat_timeout=0.150s must be longer: at least 2 x "
       "spec.elastic.heartbeat_interval=0.100s and at least 100ms, so 200ms"},
      {"a timeout below the coordinator's tick",
       [](v1::JobSpec* s) {
         s->mutable_elastic()->mutable_heartbeat_interval()->set_nanos(10000000);
         s->mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(0);
         s->mutable_elastic()->mutable_heartbeat_timeout()->set_nanos(50000000);
       },
       "spec.elastic.heartbeat_timeout=0.050s must be longer: at least 2 x "
       "spec.elastic.heartbeat_interval=0.010s and at least 100ms, so 100ms"},
      {"a join timeout of a year",
       [](v1::JobSpec* s) { s->mutable_elastic()->mutable_join_timeout()->set_seconds(31536000); },
       "spec.elastic.join_timeout=31536000s is too long; at most 24h"},
      {"a collective timeout of 1 us",
       [](v1::JobSpec* s) { s->mutable_elastic()->mutable_collective_timeout()->set_nanos(1000); },
       "spec.elastic.collective_timeout=0.000001s is too short; at least 10ms"},
      {"schedule=99",
       [](v1::JobSpec* s) { s->mutable_parallel()->set_schedule(static_cast<v1::Schedule>(99)); },
       "spec.parallel.schedule=99 is not a Schedule; use one of SCHEDULE_GPIPE (1), "
       "SCHEDULE_ONE_F_ONE_B (2), SCHEDULE_INTERLEAVED (3), or leave it unset "
       "(SCHEDULE_UNSPECIFIED, 0)"},
      {"precision=77",
       [](v1::JobSpec* s) { s->mutable_training()->set_precision(static_cast<v1::Precision>(77)); },
       "spec.training.precision=77 is not a Precision; use one of PRECISION_FP32 (1), "
       "PRECISION_MIXED (2), PRECISION_BF16 (2), or leave it unset (PRECISION_UNSPECIFIED, 0)"},
      {"tp=2^32-1 (printed as tp=-1)",
       [](v1::JobSpec* s) { s->mutable_parallel()->set_tp(4294967295u); },
       "spec.parallel.tp=4294967295 is too large; the limit is 262144"},
      {"pp=2^32-1", [](v1::JobSpec* s) { s->mutable_parallel()->set_pp(4294967295u); },
       "spec.parallel.pp=4294967295 is too large; the limit is 262144"},
      {"tp*pp past the world size (and past uint32 when multiplied)",
       [](v1::JobSpec* s) {
         s->mutable_parallel()->set_tp(65536);
         s->mutable_parallel()->set_pp(65536);
       },
       "spec.parallel.tp=65536 x spec.parallel.pp=65536 = 4294967296 is too large"},
      {"zero_stage=2^32-1",
       [](v1::JobSpec* s) { s->mutable_parallel()->set_zero_stage(4294967295u); },
       "spec.parallel.zero_stage=4294967295 is too large; the limit is 3"},
      {"vpp=2^32-1", [](v1::JobSpec* s) { s->mutable_parallel()->set_vpp(4294967295u); },
       "spec.parallel.vpp=4294967295 is too large; the limit is 16384"},
      {"global_batch past int",
       [](v1::JobSpec* s) { s->mutable_training()->set_global_batch(uint64_t{1} << 40); },
       "spec.training.global_batch=1099511627776 is too large; the limit is 2147483647"},
      {"micro_batch=2^32-1",
       [](v1::JobSpec* s) { s->mutable_training()->set_micro_batch(4294967295u); },
       "spec.training.micro_batch=4294967295 is too large; the limit is 16777216"},
      {"warmup_steps=2^64-1",
       [](v1::JobSpec* s) {
         s->mutable_training()->set_warmup_steps(std::numeric_limits<uint64_t>::max());
       },
       "spec.training.warmup_steps=18446744073709551615 is too large; the limit is 1099511627776"},
      {"checkpoint.interval_steps=2^64-1",
       [](v1::JobSpec* s) {
         s->mutable_checkpoint()->set_interval_steps(std::numeric_limits<uint64_t>::max());
       },
       "spec.checkpoint.interval_steps=18446744073709551615 is too large"},
      {"checkpoint.keep_last=2^32-1",
       [](v1::JobSpec* s) { s->mutable_checkpoint()->set_keep_last(4294967295u); },
       "spec.checkpoint.keep_last=4294967295 is too large; the limit is 1048576"},
      {"elastic.min_workers=2^32-1",
       [](v1::JobSpec* s) { s->mutable_elastic()->set_min_workers(4294967295u); },
       "spec.elastic.min_workers=4294967295 is too large; the limit is 262144"},
      {"a small unknown field inside spec.elastic",
       [](v1::JobSpec* s) { AddUnknownField(s->mutable_elastic(), 99, "x"); },
       "spec.elastic has an unknown field (number 99; 4 bytes) that shardline.v1.ElasticPolicy "
       "does not define"},
      {"unknown fields at the top",
       [](v1::JobSpec* s) {
         AddUnknownField(s, 1000, "a");
         s->GetReflection()->MutableUnknownFields(s)->AddVarint(1001, 7);
       },
       "spec has unknown fields (number 1000, 1001;"},
      {"a 30 MB unknown field (it was stored)",
       [](v1::JobSpec* s) { AddUnknownField(s->mutable_model(), 77, std::string(30 << 20, 'u')); },
       "spec is 31457"},
      {"a spec over 1 MiB in known fields",
       [](v1::JobSpec* s) { s->mutable_data()->set_dataset_path(std::string(2 << 20, 'p')); },
       "spec is 2097"},
  };
  for (const HostileCase& c : cases) {
    SCOPED_TRACE(c.what);
    v1::JobSpec spec = Valid();
    c.change(&spec);
    absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(spec);
    if (r.ok()) {
      ADD_FAILURE() << "accepted: " << c.what;  // report every case, not only the first
      continue;
    }
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), ::testing::StartsWith(c.error));
    EXPECT_LT(r.status().message().size(), 1000u);
  }
}

// The bounds themselves are accepted.
TEST(ResolveJobSpecTest, DurationAndCountBoundsAreInclusive) {
  v1::JobSpec spec = Valid();
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->mutable_heartbeat_interval()->set_seconds(0);
  e->mutable_heartbeat_interval()->set_nanos(10000000);  // 10 ms
  e->mutable_heartbeat_timeout()->set_seconds(0);
  e->mutable_heartbeat_timeout()->set_nanos(100000000);  // 100 ms
  e->mutable_join_timeout()->set_seconds(86400);         // 1 day
  e->mutable_collective_timeout()->set_seconds(0);
  e->mutable_collective_timeout()->set_nanos(10000000);
  spec.mutable_checkpoint()->set_keep_last(1 << 20);
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(spec);
  ASSERT_TRUE(r.ok()) << r.status();
  e->mutable_heartbeat_timeout()->set_seconds(600);  // 10 min
  e->mutable_heartbeat_timeout()->set_nanos(0);
  e->mutable_heartbeat_interval()->set_seconds(300);  // timeout = 2 x interval
  e->mutable_heartbeat_interval()->set_nanos(0);
  r = ResolveJobSpec(spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->elastic().heartbeat_timeout().seconds(), 600);
}

TEST(AbbreviateValueTest, ShortPrintableIsUnchangedLongIsCutOnACharacter) {
  EXPECT_EQ(AbbreviateValue("node3:cuda:1"), "node3:cuda:1");
  EXPECT_EQ(AbbreviateValue(std::string(64, 'a')), std::string(64, 'a'));
  EXPECT_EQ(AbbreviateValue(std::string(65, 'a')), std::string(64, 'a') + "... (65 bytes)");
  EXPECT_EQ(AbbreviateValue("a\tb\nc\x1b\x7f"), "a\\tb\\nc\\x1b\\x7f");
  // 63 ASCII bytes then a 2-byte character: it does not fit in 64, so it
  // is dropped whole.
  const std::string cut = std::string(63, 'a') + "\xc3\xa9" + "zz";
  EXPECT_EQ(AbbreviateValue(cut), std::string(63, 'a') + "... (67 bytes)");
  EXPECT_EQ(AbbreviateValue("\xff"), "\\xff");  // a stray byte
}

TEST(CheckTextTest, LengthControlCharactersAndRequired) {
  EXPECT_TRUE(CheckText("reason", "", kMaxReasonBytes).ok());
  EXPECT_TRUE(CheckText("reason", std::string(1024, 'r'), kMaxReasonBytes).ok());
  EXPECT_EQ(CheckText("reason", std::string(1025, 'r'), kMaxReasonBytes).message(),
            absl::StrCat("reason='", std::string(64, 'r'),
                         "... (1025 bytes)' is too long; use at most 1024 bytes of printable text "
                         "on one line"));
  EXPECT_EQ(CheckText("reason", "a\x1b[2Jb\nPhase: fake", kMaxReasonBytes).message(),
            "reason='a\\x1b[2Jb\\nPhase: fake' contains control characters or malformed UTF-8; "
            "use at most 1024 bytes of printable text on one line");
  EXPECT_EQ(CheckText("x", "\xc3", 10).code(), absl::StatusCode::kInvalidArgument);  // truncated
  EXPECT_TRUE(IsDisplayText("caf\xc3\xa9 \xe2\x9c\x93"));
  EXPECT_FALSE(IsDisplayText("tab\there"));
}

// --- External jobs (job.proto ExternalWorkload) ---------------------------

v1::JobSpec External() {
  v1::JobSpec spec;
  spec.set_name("torchrun-external");
  spec.mutable_external()->set_framework("torchrun");
  spec.mutable_elastic()->set_min_workers(2);
  spec.mutable_elastic()->set_max_workers(4);
  return spec;
}

TEST(ResolveExternalSpecTest, DefaultsAsForGptJobs) {
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(External());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(IsExternalJob(*r));
  EXPECT_FALSE(r->has_model());
  EXPECT_FALSE(r->has_parallel());
  EXPECT_FALSE(r->has_training());
  EXPECT_FALSE(r->has_data());
  EXPECT_EQ(r->elastic().min_workers(), 2u);
  EXPECT_EQ(r->elastic().max_workers(), 4u);
  EXPECT_EQ(r->elastic().heartbeat_interval().seconds(), 5);
  EXPECT_EQ(r->elastic().heartbeat_timeout().seconds(), 30);
  EXPECT_EQ(r->elastic().join_timeout().seconds(), 600);
  EXPECT_EQ(r->elastic().last_call().seconds(), 10);
  EXPECT_EQ(r->elastic().collective_timeout().seconds(), 300);
  v1::JobSpec uncapped = External();
  uncapped.mutable_elastic()->set_max_workers(0);
  uncapped.mutable_external()->clear_framework();  // unnamed is fine
  r = ResolveJobSpec(uncapped);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->elastic().max_workers(), static_cast<uint32_t>(plan::kMaxWorldSize));
  // Its world: the nodes, capped, once min_workers are there.
  EXPECT_EQ(ChooseWorldSize(*r, 1), std::nullopt);
  EXPECT_EQ(ChooseWorldSize(*r, 2), 2);
  EXPECT_EQ(ChooseWorldSize(*r, 9), 9);
  EXPECT_EQ(ChooseDp(*r, 9), std::nullopt);
  r = ResolveJobSpec(External());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ChooseWorldSize(*r, 7), 4);
}

TEST(ResolveExternalSpecTest, GptSectionsMustBeUnsetNamingTheField) {
  const v1::JobSpec gpt = Valid();
  v1::JobSpec s = External();
  *s.mutable_model() = gpt.model();
  EXPECT_THAT(Error(s),
              HasSubstr("spec.model must be unset for an external job (spec.external is set)"));
  s = External();
  *s.mutable_parallel() = gpt.parallel();
  EXPECT_THAT(Error(s), HasSubstr("spec.parallel must be unset for an external job"));
  s = External();
  s.mutable_training()->set_train_steps(10);
  EXPECT_THAT(Error(s), HasSubstr("spec.training must be unset for an external job"));
  s = External();
  s.mutable_data();  // even an empty section
  EXPECT_THAT(Error(s), HasSubstr("spec.data must be unset for an external job"));
  // Both kinds at once: the GPT spec with external set.
  s = gpt;
  s.mutable_external()->set_framework("torchrun");
  EXPECT_THAT(Error(s), HasSubstr("spec.model must be unset for an external job"));
  // Neither kind.
  v1::JobSpec neither;
  neither.set_name("x");
  EXPECT_THAT(Error(neither), HasSubstr("spec.model is unset"));
  EXPECT_THAT(Error(neither), HasSubstr("set spec.external"));
}

TEST(ResolveExternalSpecTest, FrameworkElasticAndCheckpointRules) {
  v1::JobSpec s = External();
  s.mutable_external()->set_framework("Torch Run");
  EXPECT_THAT(Error(s), HasSubstr("spec.external.framework='Torch Run' is invalid; give 0..64 "
                                  "bytes of [a-z0-9._-]"));
  s.mutable_external()->set_framework(std::string(65, 'a'));
  EXPECT_THAT(Error(s), HasSubstr("' is 65 bytes; give 0..64 bytes"));
  s.mutable_external()->set_framework(std::string(64, 'a'));
  EXPECT_TRUE(ResolveJobSpec(s).ok());
  s.mutable_external()->set_framework("torch-1.13_run.v2");
  EXPECT_TRUE(ResolveJobSpec(s).ok());

  s = External();
  s.mutable_elastic()->set_min_workers(0);
  EXPECT_THAT(Error(s), HasSubstr("spec.elastic.min_workers=0 is invalid for an external job"));
  s = External();
  s.mutable_elastic()->set_min_workers(3);
  s.mutable_elastic()->set_max_workers(2);
  EXPECT_THAT(Error(s), HasSubstr("spec.elastic.max_workers=2 < spec.elastic.min_workers=3"));
  s = External();
  s.mutable_elastic()->mutable_heartbeat_interval()->set_seconds(10);
  s.mutable_elastic()->mutable_heartbeat_timeout()->set_seconds(15);
  EXPECT_THAT(Error(s), HasSubstr("spec.elastic.heartbeat_timeout=15s must be longer"));
  s = External();
  s.mutable_elastic()->mutable_last_call()->set_seconds(-1);
  EXPECT_THAT(Error(s), HasSubstr("spec.elastic.last_call=-1s is invalid"));
  s = External();
  s.mutable_elastic()->set_max_workers(1u << 20);
  EXPECT_THAT(Error(s), HasSubstr("spec.elastic.max_workers=1048576 is too large"));

  s = External();
  s.mutable_checkpoint()->set_interval_steps(100);
  EXPECT_THAT(Error(s), HasSubstr("spec.checkpoint.interval_steps=100 must be 0 for an external "
                                  "job"));
  s = External();
  s.mutable_checkpoint()->set_async_save(true);
  EXPECT_THAT(Error(s), HasSubstr("spec.checkpoint.async_save=true must be false"));
  s = External();
  s.mutable_checkpoint()->set_directory("relative/dir");
  EXPECT_THAT(Error(s), HasSubstr("spec.checkpoint.directory='relative/dir' must be an absolute"));
  s = External();
  s.mutable_checkpoint()->set_directory("/shared/ckpt");
  s.mutable_checkpoint()->set_keep_last(3);
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->checkpoint().keep_last(), 3u);
}

// --- Hang and straggler detection (ElasticPolicy.progress_timeout ..) -------

TEST(ResolveJobSpecTest, ProgressPolicyDefaults) {
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(Valid());
  ASSERT_TRUE(r.ok()) << r.status();
  // Unset stays unset: the automatic timeout.
  EXPECT_FALSE(r->elastic().has_progress_timeout());
  EXPECT_EQ(r->elastic().hang_policy(), v1::HANG_POLICY_EVICT);
  EXPECT_DOUBLE_EQ(r->elastic().straggler_factor(), 1.5);
  EXPECT_EQ(r->elastic().straggler_window_steps(), 10u);
  EXPECT_EQ(r->elastic().straggler_policy(), v1::STRAGGLER_POLICY_REPORT);
  ASSERT_TRUE(r->elastic().has_straggler_min_excess());
  EXPECT_EQ(r->elastic().straggler_min_excess().seconds(), 0);
  EXPECT_EQ(r->elastic().straggler_min_excess().nanos(), 5000000);
  // 0 s (off) and the bounds are kept as given.
  v1::JobSpec spec = Valid();
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->mutable_progress_timeout()->set_seconds(0);
  e->mutable_straggler_min_excess()->set_seconds(0);
  e->set_hang_policy(v1::HANG_POLICY_REPORT);
  e->set_straggler_factor(100);
  e->set_straggler_window_steps(3);
  e->set_straggler_policy(v1::STRAGGLER_POLICY_REPLACE);
  r = ResolveJobSpec(spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->elastic().has_progress_timeout());
  EXPECT_EQ(r->elastic().progress_timeout().seconds(), 0);
  EXPECT_EQ(r->elastic().hang_policy(), v1::HANG_POLICY_REPORT);
  EXPECT_DOUBLE_EQ(r->elastic().straggler_factor(), 100);
  EXPECT_EQ(r->elastic().straggler_window_steps(), 3u);
  EXPECT_EQ(r->elastic().straggler_policy(), v1::STRAGGLER_POLICY_REPLACE);
  EXPECT_TRUE(r->elastic().has_straggler_min_excess());
  EXPECT_EQ(r->elastic().straggler_min_excess().seconds(), 0);
  EXPECT_EQ(r->elastic().straggler_min_excess().nanos(), 0);
  e->mutable_progress_timeout()->set_nanos(100000000);  // 100 ms, the shortest
  e->set_straggler_window_steps(1000);
  e->mutable_straggler_min_excess()->set_seconds(600);  // the longest
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  e->mutable_progress_timeout()->set_seconds(86400);
  e->mutable_progress_timeout()->set_nanos(0);
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
}

TEST(ResolveJobSpecTest, ProgressPolicyRefusalsNameTheField) {
  struct Case {
    std::function<void(v1::ElasticPolicy*)> change;
    std::string error;
  };
  const std::string timeout_hint =
      " is invalid; give 100ms .. 24h (e.g. \"60s\"), \"0s\" to turn hang detection off, or "
      "leave it unset for the automatic timeout (the larger of 30s and 10x the median step "
      "time)";
  const Case cases[] = {
      {[](v1::ElasticPolicy* e) { e->mutable_progress_timeout()->set_nanos(99000000); },
       "spec.elastic.progress_timeout=0.099s" + timeout_hint},
      {[](v1::ElasticPolicy* e) { e->mutable_progress_timeout()->set_seconds(-1); },
       "spec.elastic.progress_timeout=-1s" + timeout_hint},
      {[](v1::ElasticPolicy* e) { e->mutable_progress_timeout()->set_seconds(86401); },
       "spec.elastic.progress_timeout=86401s" + timeout_hint},
      {[](v1::ElasticPolicy* e) { e->set_hang_policy(static_cast<v1::HangPolicy>(7)); },
       "spec.elastic.hang_policy=7 is not a HangPolicy; use one of HANG_POLICY_EVICT (1), "
       "HANG_POLICY_REPORT (2), or leave it unset (HANG_POLICY_UNSPECIFIED, 0)"},
      {[](v1::ElasticPolicy* e) { e->set_straggler_factor(1); },
       "spec.elastic.straggler_factor=1 is invalid; give a factor > 1 and at most 100 (e.g. "
       "1.5), or 0 for the default 1.5"},
      {[](v1::ElasticPolicy* e) { e->set_straggler_factor(100.5); },
       "spec.elastic.straggler_factor=100.5 is invalid"},
      {[](v1::ElasticPolicy* e) { e->set_straggler_factor(-2); },
       "spec.elastic.straggler_factor=-2 is invalid"},
      {[](v1::ElasticPolicy* e) {
         e->set_straggler_factor(std::numeric_limits<double>::quiet_NaN());
       },
       "spec.elastic.straggler_factor=nan is invalid"},
      {[](v1::ElasticPolicy* e) { e->set_straggler_window_steps(2); },
       "spec.elastic.straggler_window_steps=2 is invalid; give 3..1000 steps, or 0 for the "
       "default 10"},
      {[](v1::ElasticPolicy* e) { e->set_straggler_window_steps(1001); },
       "spec.elastic.straggler_window_steps=1001 is invalid"},
      {[](v1::ElasticPolicy* e) {
         e->set_straggler_policy(static_cast<v1::StragglerPolicy>(3));
       },
       "spec.elastic.straggler_policy=3 is not a StragglerPolicy"},
      {[](v1::ElasticPolicy* e) { e->mutable_straggler_min_excess()->set_nanos(-1000000); },
       "spec.elastic.straggler_min_excess=-0.001s is invalid; give 0s .. 10m (e.g. \"20ms\"; "
       "0s judges by straggler_factor alone), or leave it unset for 5ms"},
      {[](v1::ElasticPolicy* e) { e->mutable_straggler_min_excess()->set_seconds(601); },
       "spec.elastic.straggler_min_excess=601s is invalid"},
      {[](v1::ElasticPolicy* e) {
         e->mutable_straggler_min_excess()->set_seconds(1);
         e->mutable_straggler_min_excess()->set_nanos(-1);
       },
       "spec.elastic.straggler_min_excess={seconds: 1, nanos: -1} is not a valid "
       "google.protobuf.Duration"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = Valid();
    c.change(spec.mutable_elastic());
    EXPECT_THAT(Error(spec), HasSubstr(c.error));
  }
}

// An external job accepts the fields (the same checks and defaults); it is
// never judged (its agents send no progress).
TEST(ResolveExternalSpecTest, ProgressPolicyAsForGptJobs) {
  v1::JobSpec spec = External();
  absl::StatusOr<v1::JobSpec> r = ResolveJobSpec(spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->elastic().has_progress_timeout());
  EXPECT_DOUBLE_EQ(r->elastic().straggler_factor(), 1.5);
  EXPECT_EQ(r->elastic().hang_policy(), v1::HANG_POLICY_EVICT);
  spec.mutable_elastic()->set_straggler_window_steps(2);
  EXPECT_THAT(Error(spec), HasSubstr("spec.elastic.straggler_window_steps=2 is invalid"));
}

}  // namespace
}  // namespace shardline::spec

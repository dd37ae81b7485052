// ResolveJobSpec's refusals of values a new user can type, and the helpers
// that keep free text and echoed values short and printable.
#include "spec/job_spec.h"
#include "testing/job_specs.h"

#include <string>

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

}  // namespace
}  // namespace shardline::spec

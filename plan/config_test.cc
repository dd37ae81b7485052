#include "plan/config.h"

#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::plan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

GptConfig Small() { return {4, 128, 8, 0, 256, 64}; }

MATCHER_P(IsInvalidArgumentWith, text, "") {
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         ::testing::Value(std::string(arg.message()), HasSubstr(text));
}

TEST(ConfigTest, ValidConfigPasses) {
  ParallelConfig p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 3;
  EXPECT_TRUE(ValidateConfig(Small(), p).ok());
  EXPECT_EQ(p.world_size(), 12);
  EXPECT_EQ(Small().ffn(), 512);
}

TEST(ConfigTest, TpMustDivideHeadsAndSaysWhichTpWouldWork) {
  ParallelConfig p;
  p.tp = 3;
  const absl::Status s = ValidateConfig(Small(), p);
  EXPECT_THAT(s, IsInvalidArgumentWith("tp=3 does not divide num_heads=8"));
  EXPECT_THAT(s, IsInvalidArgumentWith("choose tp in {1, 2, 4, 8}"));
}

TEST(ConfigTest, TpMustDivideHiddenFfnAndVocab) {
  GptConfig m = Small();
  m.num_heads = 4;
  m.hidden_size = 12;  // 4 | 12, but tp = 8 does not
  ParallelConfig p;
  p.tp = 8;
  EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith("tp=8 does not divide num_heads=4"));
  m = Small();
  m.ffn_hidden_size = 100;
  p.tp = 8;
  EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith("does not divide ffn_hidden_size=100"));
  EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith("choose tp in {1, 2, 4}"));
  m = Small();
  m.vocab_size = 50257;
  p.tp = 2;
  EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith("tp=2 does not divide vocab_size=50257"));
}

TEST(ConfigTest, HeadsMustDivideHidden) {
  GptConfig m = Small();
  m.num_heads = 6;
  EXPECT_THAT(ValidateGptConfig(m), IsInvalidArgumentWith("num_heads=6 does not divide hidden_size=128"));
}

TEST(ConfigTest, LayersMustFillEveryChunk) {
  GptConfig m = Small();
  m.num_layers = 3;
  ParallelConfig p;
  p.pp = 4;
  EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith("num_layers=3 is fewer than pp*vpp=4*1=4"));
  p.pp = 2;
  p.vpp = 2;
  p.schedule = ScheduleKind::kInterleaved;
  EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith("pp*vpp=2*2=4"));
}

TEST(ConfigTest, EveryFieldIsCheckedAndNamed) {
  struct Case {
    std::function<void(GptConfig&, ParallelConfig&)> mutate;
    std::string expected;
  };
  const Case cases[] = {
      {[](GptConfig& m, ParallelConfig&) { m.num_layers = 0; }, "num_layers=0"},
      {[](GptConfig& m, ParallelConfig&) { m.hidden_size = -1; }, "hidden_size=-1"},
      {[](GptConfig& m, ParallelConfig&) { m.num_heads = 0; }, "num_heads=0"},
      {[](GptConfig& m, ParallelConfig&) { m.vocab_size = 0; }, "vocab_size=0"},
      {[](GptConfig& m, ParallelConfig&) { m.seq_length = 0; }, "seq_length=0"},
      {[](GptConfig& m, ParallelConfig&) { m.ffn_hidden_size = -4; }, "ffn_hidden_size=-4"},
      {[](GptConfig& m, ParallelConfig&) { m.hidden_size = int64_t{1} << 40; }, "too large"},
      {[](GptConfig& m, ParallelConfig&) { m.num_layers = 70000; }, "num_layers=70000 is too large"},
      {[](GptConfig& m, ParallelConfig&) { m.seq_length = int64_t{1} << 25; }, "seq_length=33554432"},
      {[](GptConfig& m, ParallelConfig&) { m.ffn_hidden_size = int64_t{1} << 23; }, "ffn_hidden_size=8388608"},
      {[](GptConfig& m, ParallelConfig&) {
         m.num_layers = 16000;
         m.hidden_size = 1 << 22;
         m.ffn_hidden_size = 1;
         m.num_heads = 1;
       },
       "more than 1125899906842624 parameters"},
      {[](GptConfig&, ParallelConfig& p) {
         p.pp = 128;
         p.micro_batches = 1 << 16;
       },
       "pp*vpp*micro_batches=8388608"},
      {[](GptConfig&, ParallelConfig& p) { p.micro_batch_size = int64_t{1} << 30; }, "micro_batch_size=1073741824"},
      {[](GptConfig&, ParallelConfig& p) { p.zero_alignment = int64_t{1} << 30; }, "zero_alignment=1073741824"},
      {[](GptConfig&, ParallelConfig& p) { p.dp = 1 << 18; }, "ZeRO shard ranges"},
      {[](GptConfig&, ParallelConfig& p) { p.tp = 0; }, "tp=0"},
      {[](GptConfig&, ParallelConfig& p) { p.pp = -2; }, "pp=-2"},
      {[](GptConfig&, ParallelConfig& p) { p.dp = 0; }, "dp=0"},
      {[](GptConfig&, ParallelConfig& p) { p.vpp = 0; }, "vpp=0"},
      {[](GptConfig&, ParallelConfig& p) { p.micro_batches = 0; }, "micro_batches=0"},
      {[](GptConfig&, ParallelConfig& p) { p.micro_batch_size = 0; }, "micro_batch_size=0"},
      {[](GptConfig&, ParallelConfig& p) { p.zero_alignment = 0; }, "zero_alignment=0"},
      {[](GptConfig&, ParallelConfig& p) { p.zero_stage = 4; }, "choose zero_stage in {0, 1, 2, 3}"},
      {[](GptConfig&, ParallelConfig& p) { p.zero_stage = -1; }, "zero_stage=-1"},
      {[](GptConfig&, ParallelConfig& p) { p.vpp = 2; }, "vpp=2 needs schedule=interleaved"},
      {[](GptConfig&, ParallelConfig& p) {
         p.pp = 1;
         p.vpp = 2;
         p.schedule = ScheduleKind::kInterleaved;
       },
       "vpp=2 with pp=1: an interleaved schedule needs two or more pipeline stages"},
      {[](GptConfig&, ParallelConfig& p) { p.dp = 1 << 21; }, "too large"},
      {[](GptConfig&, ParallelConfig& p) { p.micro_batches = 1 << 17; }, "too large"},
  };
  for (const Case& c : cases) {
    GptConfig m = Small();
    ParallelConfig p;
    c.mutate(m, p);
    EXPECT_THAT(ValidateConfig(m, p), IsInvalidArgumentWith(c.expected)) << c.expected;
  }
}

TEST(ConfigTest, WorldSizeMustEqualProductOfDegrees) {
  ParallelConfig p;
  p.tp = 2;
  p.pp = 2;
  p.dp = 1;
  EXPECT_TRUE(ValidateWorldSize(4, p).ok());
  EXPECT_THAT(ValidateWorldSize(8, p), IsInvalidArgumentWith("world_size=8 != tp*pp*dp=2*2*1=4; use dp=2"));
  EXPECT_THAT(ValidateWorldSize(6, p), IsInvalidArgumentWith("must be a multiple of tp*pp=4"));
}

TEST(ConfigTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseSchedule("gpipe"), ScheduleKind::kGpipe);
  EXPECT_EQ(*ParseSchedule("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(*ParseSchedule("interleaved"), ScheduleKind::kInterleaved);
  EXPECT_THAT(ParseSchedule("zb").status(), IsInvalidArgumentWith("gpipe, 1f1b, interleaved"));
  EXPECT_EQ(*ParsePrecision("mixed"), Precision::kMixed);
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kMixed);
  EXPECT_THAT(ParsePrecision("fp8").status(), IsInvalidArgumentWith("choose fp32 or mixed"));
}

TEST(ConfigTest, DivisorsAreAscending) {
  EXPECT_EQ(DivisorsOf(1), "{1}");
  EXPECT_EQ(DivisorsOf(12), "{1, 2, 3, 4, 6, 12}");
  EXPECT_EQ(DivisorsOf(49), "{1, 7, 49}");
}

}  // namespace
}  // namespace shardline::plan

namespace shardline::plan {
namespace {

TEST(RenameFieldsTest, RewritesOnlyWholeFieldNamesAtWordStarts) {
  const absl::Status s = absl::InvalidArgumentError(
      "tp=3 does not divide ffn_hidden_size=100 (hidden_size=8, pp*vpp=4); choose tp in {1}");
  const absl::Status r = RenameFields(s, {{"ffn_hidden_size=", "spec.model.ffn_hidden_size="},
                                          {"hidden_size=", "spec.model.hidden_size="},
                                          {"tp=", "spec.parallel.tp="},
                                          {"vpp=", "spec.parallel.vpp="}});
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.message(),
            "spec.parallel.tp=3 does not divide spec.model.ffn_hidden_size=100 "
            "(spec.model.hidden_size=8, pp*vpp=4); choose tp in {1}");
  EXPECT_TRUE(RenameFields(absl::OkStatus(), {{"a", "b"}}).ok());
}

}  // namespace
}  // namespace shardline::plan

#include "client/shardctl/plan_command.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace shardline::shardctl {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using Args = std::vector<std::string>;

const Args kModel = {"--layers", "4", "--hidden", "128", "--heads", "4",
                     "--vocab",  "256", "--seq",  "64"};

Args With(Args extra) {
  Args a = kModel;
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

absl::StatusOr<std::string> RunPlan(const Args& args) {
  std::ostringstream out;
  absl::Status s = RunPlanCommand(args, out);
  if (!s.ok()) return s;
  return out.str();
}

json RunJson(const Args& args) {
  absl::StatusOr<std::string> out = RunPlan(args);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? json::parse(*out) : json();
}

// The field names of --json are a contract scripts use (issue: "names are a
// contract"); every one of them is checked here with its real value.
TEST(PlanCommandTest, JsonContractFields) {
  const json j = RunJson(With({"--tp", "2", "--pp", "2", "--dp", "2", "--zero", "2",
                               "--micro-batches", "4", "--json"}));
  EXPECT_EQ(j["model"]["parameters"], 834304);
  EXPECT_EQ(j["topology"]["groups"]["tp"], json::parse("[[0,1],[2,3],[4,5],[6,7]]"));
  EXPECT_EQ(j["topology"]["groups"]["dp"], json::parse("[[0,2],[1,3],[4,6],[5,7]]"));
  EXPECT_EQ(j["topology"]["groups"]["pp"], json::parse("[[0,4],[1,5],[2,6],[3,7]]"));
  EXPECT_EQ(j["pipeline"]["stages"][0]["chunks"][0]["layers"], json::parse("[0,1]"));
  EXPECT_EQ(j["pipeline"]["stages"][1]["chunks"][0]["layers"], json::parse("[2,3]"));
  EXPECT_DOUBLE_EQ(j["schedule"]["bubble_ratio"].get<double>(), 0.25);  // (pp-1)/m
  EXPECT_EQ(j["schedule"]["ranks"][0]["warmup"], 1);
  EXPECT_EQ(j["schedule"]["ranks"][1]["warmup"], 0);
  EXPECT_EQ(j["schedule"]["ranks"][0]["actions"],
            json::parse(R"(["F0.0","F1.0","B0.0","F2.0","B1.0","F3.0","B2.0","B3.0"])"));
  const json& unit = j["zero"]["units"][0];
  EXPECT_EQ(unit["name"], "embedding");
  // Vocab-parallel word embedding 256*128/2 + positions 64*128.
  EXPECT_EQ(unit["numel"], 16384 + 8192);
  EXPECT_EQ(unit["padded"], 24576);
  EXPECT_EQ(unit["shards"], json::parse(R"([{"begin":0,"end":12288},{"begin":12288,"end":24576}])"));
  const json& bytes = j["memory"]["per_rank_bytes"];
  EXPECT_EQ(bytes["total"].get<int64_t>(), bytes["params"].get<int64_t>() +
                                               bytes["grads"].get<int64_t>() +
                                               bytes["optimizer"].get<int64_t>());
  // ZeRO-2 fp32: grads are half of params (sharded over dp=2), optimizer 2x grads.
  EXPECT_EQ(bytes["grads"].get<int64_t>() * 2, bytes["params"].get<int64_t>());
  EXPECT_EQ(bytes["optimizer"].get<int64_t>(), bytes["params"].get<int64_t>());
  EXPECT_EQ(j["memory"]["ranks"].size(), 8u);
  EXPECT_EQ(j["parallel"]["world_size"], 8);
}

// Every --json output is laid out as nlohmann::json's dump(2) of the same
// document, key order kept (the writer streams it; scripts and diffs see
// the layout they saw when the document was built first), and ends in a
// newline. Covers the plan (integers, doubles, bools, nested arrays, empty
// shards), --params and owner (null and integer element).
TEST(PlanCommandTest, JsonTextIsDumpTwoOfItsDocument) {
  const std::vector<Args> cases = {
      With({"--tp", "2", "--pp", "2", "--dp", "2", "--zero", "2", "--micro-batches", "4",
            "--json"}),
      With({"--pp", "2", "--vpp", "2", "--dp", "3", "--zero", "3", "--micro-batches", "8",
            "--precision", "mixed", "--json"}),
      {"--params", "1000000", "--tp", "2", "--dp", "2", "--json"},
      With({"owner", "embedding.word_embeddings.weight", "--tp", "2", "--pp", "2", "--dp", "2",
            "--zero", "3", "--json"}),
      With({"owner", "layers.0.input_layernorm.weight", "--element", "5", "--dp", "2",
            "--json"}),
  };
  for (const Args& args : cases) {
    absl::StatusOr<std::string> out = RunPlan(args);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, nlohmann::ordered_json::parse(*out).dump(2) + "\n") << absl::StrJoin(args, " ");
  }
}

TEST(PlanCommandTest, InterleavedWithUnevenMicroBatchesSaysSo) {
  const auto out = RunPlan({"--layers", "8", "--hidden", "64", "--heads", "4", "--vocab", "256",
                            "--seq", "16", "--pp", "4", "--vpp", "2", "--micro-batches", "6"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("note: micro-batches 6 is not a multiple of pp 4"));
  EXPECT_THAT(*out, HasSubstr("holds for m = 8, 12"));
}

TEST(PlanCommandTest, ReadableSummary) {
  const auto out = RunPlan(With({"--pp", "2", "--micro-batches", "2"}));
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(*out, HasSubstr("834,304 parameters"));
  EXPECT_THAT(*out, HasSubstr("stage 0: chunk 0 layers 0-1 +embedding"));
  EXPECT_THAT(*out, HasSubstr("1f1b: bubble ratio 0.5000"));
}

TEST(PlanCommandTest, VppImpliesInterleaved) {
  const json j = RunJson({"--layers", "8", "--hidden", "64", "--heads", "4", "--vocab", "256",
                          "--seq", "16", "--pp", "2", "--vpp", "2", "--micro-batches", "4",
                          "--json"});
  EXPECT_EQ(j["schedule"]["kind"], "interleaved");
  EXPECT_DOUBLE_EQ(j["schedule"]["bubble_ratio"].get<double>(), 1.0 / 8);  // (pp-1)/(vpp*m)
  EXPECT_EQ(j["pipeline"]["stages"][0]["chunks"][1]["layers"], json::parse("[4,5]"));
}

TEST(PlanCommandTest, MemoryOnlyFromParams) {
  const json j = RunJson({"--params", "7500000000", "--dp", "64", "--zero", "1", "--precision",
                          "mixed", "--json"});
  EXPECT_EQ(j["memory"]["per_rank_bytes"]["total"], 31406250000);  // ZeRO paper: 31.4 GB
  const auto text = RunPlan({"--params", "1000", "--zero", "3", "--dp", "4"});
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("(4,000 bytes)"));  // 250 elements x 16 bytes
  // Alignment pads the shard: ceil(100 / (3 * 7)) * 21 / 3 = 35 elements.
  const json aligned = RunJson({"--params", "100", "--dp", "3", "--zero", "3", "--alignment", "7",
                                "--json"});
  EXPECT_EQ(aligned["memory"]["per_rank_bytes"]["params"], 35 * 4);
}

TEST(PlanCommandTest, OwnerQuery) {
  const json j = RunJson(With({"owner", "layers.3.mlp.fc2.bias", "--element", "5", "--pp", "2",
                               "--dp", "2", "--zero", "3", "--json"}));
  EXPECT_EQ(j["parameter"], "layers.3.mlp.fc2.bias");
  EXPECT_EQ(j["element"], 5);
  ASSERT_EQ(j["holders"].size(), 3u);  // ZeRO-3: one dp rank holds each kind
  for (const json& h : j["holders"]) {
    EXPECT_EQ(h["pp_rank"], 1);
    EXPECT_EQ(h["unit"], "layers.3");
    EXPECT_EQ(h["local_range"], json::parse(R"({"begin":5,"end":6})"));
  }
  const auto text = RunPlan(With({"owner", "embedding.word_embeddings.weight", "--pp", "2"}));
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("(tied head copy)"));
}

TEST(PlanCommandTest, WritesScheduleSvg) {
  const std::string path = ::testing::TempDir() + "/schedule.svg";
  ASSERT_TRUE(RunPlan(With({"--pp", "4", "--micro-batches", "8", "--schedule", "gpipe",
                        "--schedule-svg", path}))
                  .ok());
  std::ifstream file(path);
  std::stringstream content;
  content << file.rdbuf();
  EXPECT_THAT(content.str(), HasSubstr("gpipe schedule: pp=4, vpp=1, m=8"));
  EXPECT_THAT(content.str(), HasSubstr("bubble ratio 0.3750"));
  const auto bad = RunPlan(With({"--schedule-svg", "/nonexistent-dir/x.svg"}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("/nonexistent-dir/x.svg"));
}

TEST(PlanCommandTest, BadInputGetsAClearError) {
  const std::pair<Args, std::string> cases[] = {
      {With({"--tp", "3"}), "--tp=3 does not divide --heads=4; choose tp in {1, 2, 4}"},
      {{"--layers", "4", "--heads", "4", "--vocab", "256", "--seq", "64"}, "--hidden is required"},
      {With({"--pp", "8"}), "--layers=4 is fewer than pp*vpp=8*1=8"},
      {With({"--zero", "5"}), "--zero=5 is invalid; choose zero_stage in {0, 1, 2, 3}"},
      {With({"--schedule", "zigzag"}), "choose one of gpipe, 1f1b, interleaved"},
      {With({"--precision", "fp8"}), "choose fp32 or mixed"},
      {With({"--vpp", "2", "--schedule", "1f1b"}), "--vpp=2 needs --schedule=interleaved"},
      {With({"--pp", "1", "--vpp", "2"}),
       "--vpp=2 with --pp=1: an interleaved schedule needs two or more pipeline stages; use "
       "--vpp=1, or --pp=2 or more"},
      {With({"--tp", "0"}), "--tp=0 is invalid"},
      {With({"--tp", "4294967296"}), "--tp=4294967296 is out of range"},
      {With({"--world", "6", "--tp", "2"}), "--world=6 != tp*pp*dp=2*1*1=2; use --dp=3"},
      {With({"--world", "0"}), "--world=0 is invalid; choose world_size in [1, 262144]"},
      {{"--layers", "4", "--hidden", "8388608", "--heads", "1", "--vocab", "256", "--seq", "64"},
       "--hidden=8388608 is too large"},
      {With({"-tp", "2"}), "unknown option '-tp'; flags take two dashes"},
      {With({"--schedule-svg", ""}), "--schedule-svg needs a file path"},
      {With({"--schedule-svg", "-"}), "--schedule-svg needs a file path"},
      {With({"owner", "final_layernorm.bias", "--schedule-svg", "x.svg"}), "does not apply to 'shardctl plan owner'"},
      {{"--params", "100", "--micro-batches", "4"}, "--micro-batches does not apply to a memory-only estimate"},
      {{"--params", "100", "--vpp", "2"}, "--vpp does not apply"},
      {With({"--pp", "4", "--micro-batches", "8192", "--schedule-svg", "x.svg"}), "--schedule-svg draws at most 16384 forward passes"},
      {With({"--params", "10"}), "--params gives a memory-only estimate"},
      {With({"--element", "3"}), "--element only applies to 'shardctl plan owner'"},
      {With({"owner"}), "plan owner takes exactly one parameter name"},
      {With({"ownr", "x"}), "unexpected argument 'ownr'"},
      {With({"--frobnicate"}), "unknown flag --frobnicate"},
      {With({"owner", "layers.0.attention.qkv.weight", "--element", "999999"}),
       "choose element in [0, 49152)"},
      {{"--layers", "12", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "16",
        "--pp", "4", "--vpp", "3", "--micro-batches", "5"},
       "use micro_batches that are a multiple of pp (e.g. 8)"},
  };
  for (const auto& [args, message] : cases) {
    const auto out = RunPlan(args);
    ASSERT_FALSE(out.ok()) << message;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(out.status().message()), HasSubstr(message));
  }
  const auto unknown = RunPlan(With({"owner", "layers.0.nope"}));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardline::shardctl

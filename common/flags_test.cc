#include "common/flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Parsed {
  int64_t tp = 1;
  std::string schedule;
  bool json = false;
};

absl::StatusOr<std::vector<std::string>> ParseWith(const std::vector<std::string>& args, Parsed& p) {
  ArgParser parser("shardctl test");
  parser.AddInt("tp", &p.tp, "tensor-parallel degree");
  parser.AddString("schedule", &p.schedule, "schedule name");
  parser.AddBool("json", &p.json, "print JSON");
  return parser.Parse(args);
}

TEST(ArgParserTest, AcceptsBothValueFormsBooleansAndPositionals) {
  Parsed p;
  const auto pos = ParseWith({"owner", "--tp", "4", "--schedule=1f1b", "--json", "x", "--", "--tp"}, p);
  ASSERT_TRUE(pos.ok()) << pos.status();
  EXPECT_EQ(p.tp, 4);
  EXPECT_EQ(p.schedule, "1f1b");
  EXPECT_TRUE(p.json);
  EXPECT_EQ(*pos, (std::vector<std::string>{"owner", "x", "--tp"}));
  Parsed q;
  ASSERT_TRUE(ParseWith({"--json=false", "--tp=-3"}, q).ok());
  EXPECT_FALSE(q.json);
  EXPECT_EQ(q.tp, -3);  // range checks belong to the command
}

TEST(ArgParserTest, ErrorsNameTheFlag) {
  Parsed p;
  auto unknown = ParseWith({"--pt", "2"}, p);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown flag --pt"));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("--json --schedule --tp"));
  EXPECT_THAT(std::string(ParseWith({"--tp", "two"}, p).status().message()),
              HasSubstr("--tp='two' is not an integer"));
  EXPECT_THAT(std::string(ParseWith({"--tp", "99999999999999999999"}, p).status().message()),
              HasSubstr("is not an integer"));
  EXPECT_EQ(ParseWith({"--tp"}, p).status().message(),
            "--tp needs a value: tensor-parallel degree");
  EXPECT_THAT(std::string(ParseWith({"--tp=1", "--tp=2"}, p).status().message()),
              HasSubstr("more than once"));
  EXPECT_THAT(std::string(ParseWith({"--json=maybe"}, p).status().message()),
              HasSubstr("is not a boolean"));
}

TEST(ArgParserTest, AStringsFlagMayRepeatAndKeepsEveryValueInOrder) {
  ArgParser parser("worker");
  std::vector<std::string> faults;
  std::string job;
  parser.AddStrings("inject-fault", &faults, "test facility");
  parser.AddString("job", &job, "job id");
  absl::StatusOr<std::vector<std::string>> positional =
      parser.Parse({"--inject-fault", "a=1", "--job=j", "--inject-fault=b=2,c=3"});
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_THAT(faults, ElementsAre("a=1", "b=2,c=3"));
  EXPECT_TRUE(parser.WasSet("inject-fault"));
  // Other flags still refuse a repeat.
  ArgParser again("worker");
  again.AddStrings("inject-fault", &faults, "test facility");
  again.AddString("job", &job, "job id");
  EXPECT_THAT(std::string(again.Parse({"--job=a", "--job=b"}).status().message()),
              HasSubstr("--job is given more than once"));
  EXPECT_THAT(std::string(again.Parse({"--inject-fault"}).status().message()),
              HasSubstr("--inject-fault needs a value"));
}

// A value flag followed by another of the parser's flags, or by "--", lacks
// its value rather than taking the flag as it; "--name=VALUE" takes any.
TEST(ArgParserTest, AFlagIsNotTheValueOfTheFlagBeforeIt) {
  Parsed p;
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--schedule", "--json"},
                                             {"--schedule", "--tp=2"},
                                             {"--schedule", "--"},
                                             {"job", "--schedule", "--json", "x"}}) {
    EXPECT_EQ(ParseWith(args, p).status().message(), "--schedule needs a value: schedule name")
        << args.size();
  }
  // Anything else that starts with dashes is a value, and "=" gives any.
  Parsed q;
  ASSERT_TRUE(ParseWith({"--schedule", "--other"}, q).ok());
  EXPECT_EQ(q.schedule, "--other");
  ASSERT_TRUE(ParseWith({"--schedule=--json"}, q).ok());
  EXPECT_EQ(q.schedule, "--json");
}

TEST(ArgParserTest, AValueNameShowsInUsageAndTheMissingValueError) {
  ArgParser parser("shardctl whatif");
  std::vector<std::string> lose;
  std::string reason;
  parser.AddStrings("lose", &lose, "workers to suppose lost", "WORKER[,WORKER...]");
  parser.AddString("reason", &reason, "", "TEXT");
  EXPECT_THAT(parser.Usage(), HasSubstr("  --lose WORKER[,WORKER...] workers to suppose lost\n"));
  EXPECT_THAT(parser.Usage(), HasSubstr("  --reason TEXT"));
  EXPECT_EQ(parser.Parse({"j", "--lose"}).status().message(),
            "--lose needs a value: WORKER[,WORKER...]; workers to suppose lost");
  ArgParser other("x");
  other.AddString("reason", &reason, "", "TEXT");
  EXPECT_EQ(other.Parse({"--reason"}).status().message(), "--reason needs a value: TEXT");
  ArgParser bare("x");
  bare.AddString("reason", &reason, "");
  EXPECT_EQ(bare.Parse({"--reason"}).status().message(), "--reason needs a value");
}

TEST(ArgParserTest, UsageListsEveryFlag) {
  ArgParser parser("shardctl x");
  int64_t v = 0;
  parser.AddInt("micro-batches", &v, "micro-batches per iteration");
  EXPECT_THAT(parser.Usage(), HasSubstr("--micro-batches VALUE"));
  EXPECT_THAT(parser.Usage(), HasSubstr("micro-batches per iteration"));
}

}  // namespace
}  // namespace shardline

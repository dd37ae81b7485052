#include "client/shardctl/table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::shardctl {
namespace {

TEST(TableTest, AlignsColumnsAndTrimsTrailingSpace) {
  Table t({"JOB", "PHASE", "STEP"});
  t.AlignRight(2);
  t.AddRow({"shakespeare", "RUNNING", "120"});
  t.AddRow({"b", "PENDING", "0"});
  EXPECT_EQ(t.Render(),
            "JOB          PHASE    STEP\n"
            "shakespeare  RUNNING   120\n"
            "b            PENDING     0\n");
  EXPECT_EQ(t.num_rows(), 2u);
}

TEST(TableTest, ShortRowsArePaddedLongRowsCut) {
  Table t({"A", "B"});
  t.AddRow({"x"});
  t.AddRow({"1", "2", "3"});
  EXPECT_EQ(t.Render(), "A  B\nx\n1  2\n");
}

TEST(TableTest, HeaderOnly) { EXPECT_EQ(Table({"A", "LONG"}).Render(), "A  LONG\n"); }

TEST(TableTest, WidthCountsCodePoints) {
  Table t({"NAME", "X"});
  t.AddRow({"café", "1"});
  t.AddRow({"abcde", "2"});
  EXPECT_EQ(t.Render(), "NAME   X\ncafé   1\nabcde  2\n");
  EXPECT_EQ(DisplayWidth("café"), 4u);
}

TEST(TableTest, KeyValueBlock) {
  EXPECT_EQ(KeyValueBlock({{"Job", "a"}, {"Generation", "3"}, {"Empty", ""}}),
            "Job:         a\n"
            "Generation:  3\n"
            "Empty:\n");
  EXPECT_EQ(KeyValueBlock({{"Job", "a"}, {"Stragglers", "rank 3\nrank 1"}}),
            "Job:         a\n"
            "Stragglers:  rank 3\n"
            "             rank 1\n");
}

}  // namespace
}  // namespace shardline::shardctl

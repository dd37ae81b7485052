// JoinForPeople (common/text.h); the other functions of text.h are tested
// where they are used (spec/job_spec_test.cc, client/shardctl).
#include "common/text.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardline {
namespace {

TEST(JoinForPeopleTest, NoneOneTwoMany) {
  EXPECT_EQ(JoinForPeople({}), "");
  EXPECT_EQ(JoinForPeople({"w1"}), "w1");
  EXPECT_EQ(JoinForPeople({"w1", "w2"}), "w1 and w2");
  EXPECT_EQ(JoinForPeople({"w1", "w2", "w3"}), "w1, w2 and w3");
}

TEST(JoinForPeopleTest, PastMaxShownSaysHowManyMore) {
  std::vector<std::string> names;
  for (int i = 1; i <= 10; ++i) names.push_back("w" + std::to_string(i));
  EXPECT_EQ(JoinForPeople(names), "w1, w2, w3, w4, w5, w6, w7, w8 and 2 more");
  EXPECT_EQ(JoinForPeople(names, 2), "w1, w2 and 8 more");
  EXPECT_EQ(JoinForPeople(names, 10), "w1, w2, w3, w4, w5, w6, w7, w8, w9 and w10");
  EXPECT_EQ(JoinForPeople(names, 0), "w1 and 9 more");  // at least one shown
}

}  // namespace
}  // namespace shardline

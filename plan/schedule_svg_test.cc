#include "plan/schedule_svg.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::plan {
namespace {

using ::testing::HasSubstr;

int Occurrences(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

TEST(ScheduleSvgTest, OneBoxPerActionAndTheBubbleInTheTitle) {
  const auto s = BuildSchedule(ScheduleKind::kInterleaved, 2, 2, 4);
  ASSERT_TRUE(s.ok());
  const std::string svg = ScheduleSvg(*s);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>\n"));
  EXPECT_EQ(Occurrences(svg, "<title>F"), 2 * 2 * 4);  // pp * vpp * m forwards
  EXPECT_EQ(Occurrences(svg, "<title>B"), 2 * 2 * 4);
  EXPECT_EQ(Occurrences(svg, "<title>idle (bubble)</title>"), 2);  // one lane per rank
  EXPECT_THAT(svg, HasSubstr("bubble ratio 0.1250"));
  EXPECT_THAT(svg, HasSubstr("<title>B0.2: t=6..8</title>"));
}

}  // namespace
}  // namespace shardline::plan

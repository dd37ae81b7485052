#include "common/log.h"

#include "gtest/gtest.h"

namespace shardline {
namespace {

TEST(LogTest, FormatIsIsoUtcMillisProgramContextText) {
  const absl::Time t = absl::FromUnixMillis(1764613592123);  // 2025-12-01T18:26:32.123Z
  EXPECT_EQ(FormatLogLine(t, "shardline-worker", "job=j gen=2 rank=1", "restored"),
            "2025-12-01T18:26:32.123Z shardline-worker job=j gen=2 rank=1: restored");
  EXPECT_EQ(FormatLogLine(t, "shardline-coordinator", "", "generation ended job=j"),
            "2025-12-01T18:26:32.123Z shardline-coordinator: generation ended job=j");
  EXPECT_EQ(FormatLogLine(absl::FromUnixSeconds(0), "p", "", "x"),
            "1970-01-01T00:00:00.000Z p: x");
}

}  // namespace
}  // namespace shardline

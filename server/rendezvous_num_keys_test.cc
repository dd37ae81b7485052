// Rendezvous::NumKeys (rendezvous.proto KvNumKeys, torch's Store.num_keys):
// counts per (job, generation, scope), counters included, and the
// generation's end.
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;

uint64_t Count(const Rendezvous& rv, const std::string& job, uint64_t generation,
               const std::string& scope) {
  absl::StatusOr<uint64_t> n = rv.NumKeys(job, generation, scope);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : 12345;
}

TEST(RendezvousNumKeysTest, CountsKeysPerScopeCountersIncluded) {
  FakeClock clock;
  Rendezvous rv(&clock);
  EXPECT_EQ(Count(rv, "j", 1, "s"), 0u);  // nothing yet
  ASSERT_TRUE(rv.Set("j", 1, "s", "a", "1").ok());
  ASSERT_TRUE(rv.Set("j", 1, "s", "b", "2").ok());
  ASSERT_TRUE(rv.Set("j", 1, "s", "a", "overwritten").ok());
  ASSERT_TRUE(rv.Add("j", 1, "s", "counter", 5).ok());
  ASSERT_TRUE(rv.CompareAndSet("j", 1, "s", "cas", std::nullopt, "x").ok());
  EXPECT_EQ(Count(rv, "j", 1, "s"), 4u);
  // Scopes, generations and jobs are separate.
  ASSERT_TRUE(rv.Set("j", 1, "t", "a", "1").ok());
  ASSERT_TRUE(rv.Set("j", 2, "s", "a", "1").ok());
  ASSERT_TRUE(rv.Set("k", 1, "s", "a", "1").ok());
  EXPECT_EQ(Count(rv, "j", 1, "s"), 4u);
  EXPECT_EQ(Count(rv, "j", 1, "t"), 1u);
  EXPECT_EQ(Count(rv, "j", 1, ""), 0u);
  EXPECT_EQ(Count(rv, "j", 2, "s"), 1u);
  EXPECT_EQ(Count(rv, "k", 1, "s"), 1u);
  // A delete takes one away; reading a missing key creates none.
  ASSERT_TRUE(*rv.Delete("j", 1, "s", "b"));
  EXPECT_EQ(Count(rv, "j", 1, "s"), 3u);
  absl::StatusOr<std::optional<std::string>> missing =
      rv.Get("j", 1, "s", "missing", /*wait=*/false);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  EXPECT_EQ(Count(rv, "j", 1, "s"), 3u);
  EXPECT_EQ(rv.GetUsage("j", 1).keys, 4);  // s: 3, t: 1
}

TEST(RendezvousNumKeysTest, EndedGenerationAndBadScope) {
  FakeClock clock;
  Rendezvous rv(&clock);
  ASSERT_TRUE(rv.Set("j", 1, "s", "a", "1").ok());
  ASSERT_TRUE(rv.Set("j", 2, "s", "a", "1").ok());
  rv.EndGeneration("j", 1);
  absl::StatusOr<uint64_t> ended = rv.NumKeys("j", 1, "s");
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Count(rv, "j", 2, "s"), 1u);  // the newer one is untouched
  absl::StatusOr<uint64_t> long_scope = rv.NumKeys("j", 2, std::string(kMaxScopeBytes + 1, 's'));
  EXPECT_EQ(long_scope.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rv.NumKeys("", 2, "s").status().code(), absl::StatusCode::kInvalidArgument);
  rv.DropJob("j");
  EXPECT_EQ(rv.NumKeys("j", 2, "s").status().code(), absl::StatusCode::kAborted);
}

// Linearizable with the writes: a count taken after a Set returned sees it,
// while another thread keeps adding keys.
TEST(RendezvousNumKeysTest, SeesEveryCompletedSet) {
  FakeClock clock;
  Rendezvous rv(&clock);
  constexpr int kKeys = 500;
  std::thread writer([&] {
    for (int i = 0; i < kKeys; ++i) {
      ASSERT_TRUE(rv.Set("j", 1, "w", std::to_string(i), "v").ok());
    }
  });
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(rv.Set("j", 1, "m", std::to_string(i), "v").ok());
    EXPECT_GE(Count(rv, "j", 1, "m"), static_cast<uint64_t>(i + 1));
  }
  writer.join();
  EXPECT_EQ(Count(rv, "j", 1, "w"), static_cast<uint64_t>(kKeys));
  EXPECT_EQ(Count(rv, "j", 1, "m"), static_cast<uint64_t>(kKeys));
}

}  // namespace
}  // namespace shardline::server

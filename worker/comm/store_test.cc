#include "worker/comm/store.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

TEST(InMemoryStoreTest, SetGetAddWait) {
  auto store = NewInMemoryStore();
  ASSERT_TRUE(store->Set("a", "1").ok());
  EXPECT_EQ(*store->Get("a", absl::Seconds(1)), "1");
  EXPECT_EQ(*store->Add("n", 5), 5);
  EXPECT_EQ(*store->Add("n", -2), 3);
  EXPECT_EQ(store->Add("a", 1).value(), 2);
  ASSERT_TRUE(store->Set("s", "x").ok());
  EXPECT_EQ(store->Add("s", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Wait({"a", "n"}, absl::Seconds(1)).ok());
}

TEST(InMemoryStoreTest, GetBlocksUntilSetAndTimesOut) {
  auto store = NewInMemoryStore();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    (void)store->Set("k", "v");
  });
  EXPECT_EQ(*store->Get("k", absl::Seconds(10)), "v");
  setter.join();
  const absl::Time start = absl::Now();
  auto missing = store->Get("missing", absl::Milliseconds(100));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  auto w = store->Wait({"k", "other"}, absl::Milliseconds(50));
  EXPECT_EQ(w.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("other"), std::string::npos);
}

TEST(PrefixStoreTest, ScopesKeys) {
  auto base = NewInMemoryStore();
  auto a = PrefixStore(base, "a/");
  auto b = PrefixStore(base, "b/");
  ASSERT_TRUE(a->Set("k", "1").ok());
  EXPECT_EQ(*base->Get("a/k", absl::Seconds(1)), "1");
  EXPECT_EQ(b->Get("k", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*a->Add("n", 2), 2);
  EXPECT_TRUE(a->Wait({"k", "n"}, absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace shardline::worker

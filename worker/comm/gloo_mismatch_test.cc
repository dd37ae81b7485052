// Ranks that disagree on an operation: every rank gets FailedPrecondition
// naming both ranks and both calls, within seconds (far inside the op
// timeout), the process lives on, and the group stays failed. Two (or
// three) ranks as threads over real loopback TCP, as in gloo_backend_test.
// Before the descriptor checks (gloo_checks.h) the count mismatches of
// all_reduce / all_gather / broadcast aborted the whole process (an uncaught
// gloo::EnforceNotMet on Gloo's network thread), and the others returned OK
// with wrong data.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

using ::shardline::worker::testing::RunRanks;
using ::shardline::worker::testing::TestOptions;
using ::testing::HasSubstr;

// A 60 s op timeout: a mismatch that were only noticed by timing out would
// fail the bounds below.
constexpr absl::Duration kOpTimeout = absl::Seconds(60);
constexpr absl::Duration kDetectedWithin = absl::Seconds(10);

// Group "dp/0" whose members are global ranks 3, 5 (and 7).
GlooOptions NamedOptions(int size) {
  GlooOptions o = TestOptions(kOpTimeout);
  o.group_name = "dp/0";
  for (int r = 0; r < size; ++r) o.global_ranks.push_back(3 + 2 * r);
  return o;
}

std::string Name(int group_rank) {
  return absl::StrCat("rank ", 3 + 2 * group_rank, " (dp/0 rank ", group_rank, ")");
}

// Every rank issues issue(rank, backend) and must get FailedPrecondition,
// within kDetectedWithin, whose message contains each of `want`; then the
// group is unusable (a barrier and a send fail at once, not Ok, not a hang).
void ExpectMismatchOnEveryRank(int size,
                               const std::function<std::shared_ptr<Work>(int, Backend&)>& issue,
                               const std::vector<std::string>& want) {
  std::atomic<int> failed{0};
  std::vector<std::string> messages(size);
  RunRanks(
      size,
      [&](int r, Backend& b) {
        const absl::Time start = absl::Now();
        const absl::Status s = issue(r, b)->Wait(kDetectedWithin);
        EXPECT_LT(absl::Now() - start, kDetectedWithin);
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << ": " << s;
        for (const std::string& w : want)
          EXPECT_THAT(std::string(s.message()), HasSubstr(w)) << "rank " << r;
        messages[r] = std::string(s.message());
        if (absl::IsFailedPrecondition(s)) ++failed;
        // The group stays failed, with the same error, on every later op.
        const absl::Status later = b.Barrier()->Wait(kDetectedWithin);
        EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
        EXPECT_EQ(later.message(), s.message());
        float x = 1;
        const absl::Status p2p =
            b.Send(&x, 1, DType::kFloat32, (r + 1) % size, 99)->Wait(kDetectedWithin);
        EXPECT_EQ(p2p.code(), absl::StatusCode::kFailedPrecondition) << p2p;
      },
      NamedOptions(size));
  EXPECT_EQ(failed.load(), size);
  // Every rank says the same thing.
  for (int r = 1; r < size; ++r) EXPECT_EQ(messages[r], messages[0]) << "rank " << r;
  // The process is alive and a fresh group works.
  RunRanks(size, [&](int r, Backend& b) {
    float v = static_cast<float>(r + 1);
    SL_EXPECT_OK_WORK(b.AllReduce(&v, 1, DType::kFloat32, ReduceOp::kSum));
    EXPECT_EQ(v, size * (size + 1) / 2.0f);
  });
}

TEST(GlooMismatchTest, AllReduceDifferentCounts) {
  std::vector<float> buf[2] = {std::vector<float>(10, 1.0f), std::vector<float>(20, 1.0f)};
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        return b.AllReduce(buf[r].data(), buf[r].size(), DType::kFloat32, ReduceOp::kSum);
      },
      {"collective #1 of group dp/0 differs between ranks: " + Name(0) +
       " issued all_reduce count=10 float32 sum, " + Name(1) +
       " issued all_reduce count=20 float32 sum"});
}

TEST(GlooMismatchTest, AllReduceDifferentCountsLaterInTheSequence) {
  // Three good all_reduces first: the mismatch is #4.
  std::vector<float> big(4096), small(4095);
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        for (int i = 0; i < 3; ++i) {
          float v = 1;
          SL_EXPECT_OK_WORK(b.AllReduce(&v, 1, DType::kFloat32, ReduceOp::kSum));
        }
        std::vector<float>& mine = r == 0 ? big : small;
        return b.AllReduce(mine.data(), mine.size(), DType::kFloat32, ReduceOp::kAvg);
      },
      {"collective #4 of group dp/0", Name(0) + " issued all_reduce count=4096 float32 avg",
       Name(1) + " issued all_reduce count=4095 float32 avg"});
}

TEST(GlooMismatchTest, AllGatherDifferentCounts) {
  std::vector<float> in[2] = {std::vector<float>(10, 1.0f), std::vector<float>(20, 1.0f)};
  std::vector<float> out[2] = {std::vector<float>(20), std::vector<float>(40)};
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        return b.AllGather(in[r].data(), in[r].size(), out[r].data(), DType::kFloat32);
      },
      {Name(0) + " issued all_gather count=10 float32, " + Name(1) +
       " issued all_gather count=20 float32"});
}

TEST(GlooMismatchTest, BroadcastDifferentCounts) {
  std::vector<float> buf[2] = {std::vector<float>(10, 1.0f), std::vector<float>(20, 1.0f)};
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        return b.Broadcast(buf[r].data(), buf[r].size(), DType::kFloat32, 0);
      },
      {Name(0) + " issued broadcast count=10 float32 root=0, " + Name(1) +
       " issued broadcast count=20 float32 root=0"});
}

TEST(GlooMismatchTest, BroadcastDifferentRoots) {
  std::vector<float> buf[2] = {std::vector<float>(10, 1.0f), std::vector<float>(10, 2.0f)};
  ExpectMismatchOnEveryRank(
      2, [&](int r, Backend& b) { return b.Broadcast(buf[r].data(), 10, DType::kFloat32, r); },
      {Name(0) + " issued broadcast count=10 float32 root=0, " + Name(1) +
       " issued broadcast count=10 float32 root=1"});
}

TEST(GlooMismatchTest, ReduceScatterDifferentCounts) {
  std::vector<float> in(40, 1.0f), out(20);
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        const std::vector<size_t> counts = r == 0 ? std::vector<size_t>{5, 5}
                                                  : std::vector<size_t>{10, 10};
        return b.ReduceScatter(in.data(), out.data(), counts, DType::kFloat32, ReduceOp::kSum);
      },
      {Name(0) + " issued reduce_scatter count=10 float32 sum, " + Name(1) +
       " issued reduce_scatter count=20 float32 sum"});
}

// Same total, different split: the message shows the counts' hashes (the
// descriptions would otherwise read the same).
TEST(GlooMismatchTest, ReduceScatterSameTotalDifferentSplit) {
  std::vector<float> in(10, 1.0f), out(10);
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        const std::vector<size_t> counts = r == 0 ? std::vector<size_t>{4, 6}
                                                  : std::vector<size_t>{5, 5};
        return b.ReduceScatter(in.data(), out.data(), counts, DType::kFloat32, ReduceOp::kSum);
      },
      {Name(0) + " issued reduce_scatter count=10 float32 sum counts_hash=",
       Name(1) + " issued reduce_scatter count=10 float32 sum counts_hash="});
}

TEST(GlooMismatchTest, DifferentOperationsAtTheSameSequence) {
  std::vector<float> buf[2] = {std::vector<float>(10, 1.0f), std::vector<float>(10, 1.0f)};
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        return r == 0 ? b.AllReduce(buf[r].data(), 10, DType::kFloat32, ReduceOp::kSum)
                      : b.Broadcast(buf[r].data(), 10, DType::kFloat32, 0);
      },
      {Name(0) + " issued all_reduce count=10 float32 sum, " + Name(1) +
       " issued broadcast count=10 float32 root=0"});
}

TEST(GlooMismatchTest, AllReduceFloat32AgainstBFloat16) {
  std::vector<float> f32(10, 1.0f);
  std::vector<uint16_t> bf16(10, 0x3f80);  // 1.0
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        return r == 0 ? b.AllReduce(f32.data(), 10, DType::kFloat32, ReduceOp::kSum)
                      : b.AllReduce(bf16.data(), 10, DType::kBFloat16, ReduceOp::kSum);
      },
      {Name(0) + " issued all_reduce count=10 float32 sum, " + Name(1) +
       " issued all_reduce count=10 bfloat16 sum"});
}

// Three ranks, only the last differs (in its reduce op): all three fail,
// naming rank 0 and rank 2.
TEST(GlooMismatchTest, ThreeRanksOneDiffers) {
  std::vector<float> buf[3] = {std::vector<float>(8, 1.0f), std::vector<float>(8, 1.0f),
                               std::vector<float>(8, 1.0f)};
  ExpectMismatchOnEveryRank(
      3,
      [&](int r, Backend& b) {
        return b.AllReduce(buf[r].data(), 8, DType::kFloat32,
                           r == 2 ? ReduceOp::kMax : ReduceOp::kSum);
      },
      {Name(0) + " issued all_reduce count=8 float32 sum, " + Name(2) +
       " issued all_reduce count=8 float32 max"});
}

// Issued back to back (so several descriptors cross in one exchange) on rank
// 0, one at a time on rank 1: #1 and #2 match and complete with the right
// values, #3 differs and fails on both, and #4 fails with the same error.
TEST(GlooMismatchTest, BackToBackOnlyTheDifferingOpFails) {
  for (int back_to_back_rank : {0, 1}) {
    std::atomic<int> failed{0};
    RunRanks(
        2,
        [&](int r, Backend& b) {
          float a = static_cast<float>(r + 1), c = static_cast<float>(10 * (r + 1));
          std::vector<float> third(r == 0 ? 16 : 17, 1.0f);
          std::shared_ptr<Work> w1, w2, w3;
          w1 = b.AllReduce(&a, 1, DType::kFloat32, ReduceOp::kSum);
          if (r != back_to_back_rank) SL_EXPECT_OK_WORK(w1);
          w2 = b.AllReduce(&c, 1, DType::kFloat32, ReduceOp::kMax);
          if (r != back_to_back_rank) SL_EXPECT_OK_WORK(w2);
          w3 = b.AllReduce(third.data(), third.size(), DType::kFloat32, ReduceOp::kSum);
          std::shared_ptr<Work> w4 = b.Barrier();
          SL_EXPECT_OK_WORK(w1);
          SL_EXPECT_OK_WORK(w2);
          EXPECT_EQ(a, 3.0f);
          EXPECT_EQ(c, 20.0f);
          const absl::Status s3 = w3->Wait(kDetectedWithin);
          EXPECT_EQ(s3.code(), absl::StatusCode::kFailedPrecondition) << s3;
          EXPECT_THAT(std::string(s3.message()),
                      HasSubstr("collective #3 of group dp/0 differs between ranks: " + Name(0) +
                                " issued all_reduce count=16 float32 sum, " + Name(1) +
                                " issued all_reduce count=17 float32 sum"));
          const absl::Status s4 = w4->Wait(kDetectedWithin);
          EXPECT_EQ(s4, s3);
          if (absl::IsFailedPrecondition(s3)) ++failed;
        },
        NamedOptions(2));
    EXPECT_EQ(failed.load(), 2) << "back to back on rank " << back_to_back_rank;
  }
}

// Many collectives back to back, more than one exchange holds: all right.
TEST(GlooMismatchTest, ManyBackToBackCollectivesMatch) {
  RunRanks(3, [&](int r, Backend& b) {
    constexpr int kOps = 50;
    std::vector<float> v(kOps);
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < kOps; ++i) {
      v[i] = static_cast<float>(r + i);
      works.push_back(i % 5 == 4 ? b.Barrier()
                                 : b.AllReduce(&v[i], 1, DType::kFloat32, ReduceOp::kSum));
    }
    for (auto& w : works) SL_EXPECT_OK_WORK(w);
    for (int i = 0; i < kOps; ++i) {
      if (i % 5 != 4) {
        EXPECT_EQ(v[i], static_cast<float>(3 + 3 * i)) << i;
      }
    }
    EXPECT_EQ(b.Progress().collective.sequence, static_cast<uint64_t>(kOps));
  });
}

// Without a group name or global ranks, group ranks are named.
TEST(GlooMismatchTest, UnnamedGroupNamesGroupRanks) {
  std::vector<float> buf(20, 1.0f);
  std::atomic<int> failed{0};
  RunRanks(
      2,
      [&](int r, Backend& b) {
        const absl::Status s =
            b.AllReduce(buf.data(), r == 0 ? 10 : 20, DType::kFloat32, ReduceOp::kSum)
                ->Wait(kDetectedWithin);
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr("collective #1 of this group differs between ranks: rank 0 issued "
                              "all_reduce count=10 float32 sum, rank 1 issued all_reduce "
                              "count=20 float32 sum"));
        if (!s.ok()) ++failed;
      },
      TestOptions(kOpTimeout));
  EXPECT_EQ(failed.load(), 2);
}

TEST(GlooMismatchTest, GlobalRanksOfTheWrongSizeAreInvalid) {
  GlooOptions o = TestOptions();
  o.global_ranks = {1, 2, 3};
  auto b = CreateGlooBackend(NewInMemoryStore(), 0, 2, o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("options.global_ranks has 3 entries"));
}

// --- send / recv ---

// Rank 0 sends (count0, dtype0), rank 1 receives (count1, dtype1), tag 7.
void ExpectP2PMismatch(size_t count0, DType dtype0, size_t count1, DType dtype1,
                       const std::string& want) {
  std::vector<float> buf0(count0, 1.0f), buf1(count1, -1.0f);
  ExpectMismatchOnEveryRank(
      2,
      [&](int r, Backend& b) {
        return r == 0 ? b.Send(buf0.data(), count0, dtype0, 1, 7)
                      : b.Recv(buf1.data(), count1, dtype1, 0, 7);
      },
      {want});
  // No payload moved: the receiver's buffer is untouched.
  for (float v : buf1) ASSERT_EQ(v, -1.0f);
}

TEST(GlooMismatchTest, Send10Recv20) {
  ExpectP2PMismatch(10, DType::kFloat32, 20, DType::kFloat32,
                    "send/recv with tag 7 of group dp/0 differs between ranks: " + Name(0) +
                        " issued send count=10 float32 to " + Name(1) + ", " + Name(1) +
                        " issued recv count=20 float32 from " + Name(0));
}

TEST(GlooMismatchTest, Send20Recv10) {
  ExpectP2PMismatch(20, DType::kFloat32, 10, DType::kFloat32,
                    Name(0) + " issued send count=20 float32 to " + Name(1) + ", " + Name(1) +
                        " issued recv count=10 float32 from " + Name(0));
}

TEST(GlooMismatchTest, SendFloat32RecvBFloat16) {
  ExpectP2PMismatch(10, DType::kFloat32, 10, DType::kBFloat16,
                    Name(0) + " issued send count=10 float32 to " + Name(1) + ", " + Name(1) +
                        " issued recv count=10 bfloat16 from " + Name(0));
}

// Same bytes, different dtype (10 fp32 = 20 bf16) is a mismatch too.
TEST(GlooMismatchTest, SendRecvSameBytesDifferentDtype) {
  ExpectP2PMismatch(10, DType::kFloat32, 20, DType::kBFloat16,
                    Name(0) + " issued send count=10 float32 to " + Name(1) + ", " + Name(1) +
                        " issued recv count=20 bfloat16 from " + Name(0));
}

// Several sends with one tag, posted back to back, arrive in posting order
// even though each posts its payload from its own thread.
TEST(GlooMismatchTest, SameTagMessagesStayInOrder) {
  RunRanks(2, [&](int r, Backend& b) {
    constexpr int kMessages = 8;
    std::vector<std::vector<float>> bufs(kMessages);
    std::vector<std::shared_ptr<Work>> works;
    for (int m = 0; m < kMessages; ++m) {
      const size_t count = 1000 + m;  // a different count each: out of order would mismatch
      bufs[m].assign(count, r == 0 ? static_cast<float>(m) : -1.0f);
      works.push_back(r == 0 ? b.Send(bufs[m].data(), count, DType::kFloat32, 1, 3)
                             : b.Recv(bufs[m].data(), count, DType::kFloat32, 0, 3));
    }
    for (auto& w : works) SL_EXPECT_OK_WORK(w);
    if (r == 1) {
      for (int m = 0; m < kMessages; ++m)
        for (float v : bufs[m]) ASSERT_EQ(v, static_cast<float>(m)) << "message " << m;
    }
  });
}

}  // namespace
}  // namespace shardline::worker

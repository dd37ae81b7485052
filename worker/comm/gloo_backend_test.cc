// Multi-rank tests: N ranks as threads over real loopback TCP with an
// in-memory store; sweep ranks x counts; closed-form expected values.
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/float16.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

using ::shardline::worker::testing::RunRanks;
using ::shardline::worker::testing::TestOptions;
using ::testing::HasSubstr;

const std::vector<int> kRanks = {1, 2, 3, 4, 8};
const std::vector<size_t> kCounts = {0, 1, 7, 4096, 1048576 + 3};

// Rank r's contribution at index i: small integers and halves, exact in fp32.
float F(int r, size_t i) { return static_cast<float>(r + 1) + 0.5f * (i % 13); }

// Counts wrong elements and reports the first one.
struct Mismatch {
  size_t wrong = 0;
  size_t first = 0;
  float got = 0, want = 0;
  void Check(size_t i, float got_v, float want_v, float tol = 0) {
    if (std::fabs(got_v - want_v) > tol || std::isnan(got_v)) {
      if (wrong++ == 0) {
        first = i;
        got = got_v;
        want = want_v;
      }
    }
  }
};
#define EXPECT_NO_MISMATCH(m, ctx)                                                             \
  EXPECT_EQ((m).wrong, 0u) << ctx << ": first wrong index " << (m).first << " got " << (m).got \
                           << " want " << (m).want

TEST(GlooBackendTest, AllReduceEveryOpFloat32) {
  for (int n : kRanks) {
    RunRanks(n, [&](int r, Backend& b) {
      EXPECT_EQ(b.rank(), r);
      EXPECT_EQ(b.size(), n);
      for (size_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
          std::vector<float> data(count);
          for (size_t i = 0; i < count; ++i) data[i] = F(r, i);
          SL_EXPECT_OK_WORK(b.AllReduce(data.data(), count, DType::kFloat32, op));
          Mismatch m;
          for (size_t i = 0; i < count; ++i) {
            const float k = 0.5f * (i % 13);
            float want = 0;
            switch (op) {
              case ReduceOp::kSum:
                want = n * (n + 1) / 2.0f + n * k;
                break;
              case ReduceOp::kAvg:
                want = (n + 1) / 2.0f + k;
                break;
              case ReduceOp::kMax:
                want = n + k;
                break;
              case ReduceOp::kMin:
                want = 1 + k;
                break;
            }
            m.Check(i, data[i], want, op == ReduceOp::kAvg ? 1e-5f * want : 0);
          }
          EXPECT_NO_MISMATCH(
              m, "n=" << n << " rank=" << r << " count=" << count << " op=" << ReduceOpName(op));
        }
      }
    });
  }
}

// fp16 / bf16 sums accumulate in fp32: the result must be the fp32 sum of the
// (already rounded) inputs, rounded once — within one ulp of the format.
TEST(GlooBackendTest, AllReduceSum16BitAgainstFloat32Reference) {
  for (int n : kRanks) {
    RunRanks(n, [&](int r, Backend& b) {
      for (size_t count : kCounts) {
        for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
          auto enc = [dt](float f) {
            return dt == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
          };
          auto dec = [dt](uint16_t h) {
            return dt == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
          };
          auto val = [](int rr, size_t i) { return 0.1f * (rr + 1) + 0.013f * (i % 29); };
          std::vector<uint16_t> data(count);
          for (size_t i = 0; i < count; ++i) data[i] = enc(val(r, i));
          SL_EXPECT_OK_WORK(b.AllReduce(data.data(), count, dt, ReduceOp::kSum));
          const float ulp = dt == DType::kFloat16 ? std::ldexp(1.0f, -10) : std::ldexp(1.0f, -7);
          Mismatch m;
          for (size_t i = 0; i < count; ++i) {
            float ref = 0;
            for (int q = 0; q < n; ++q) ref += dec(enc(val(q, i)));
            m.Check(i, dec(data[i]), ref, ulp * std::fabs(ref));
          }
          EXPECT_NO_MISMATCH(m, "n=" << n << " count=" << count << " dtype=" << DTypeName(dt));
        }
      }
    });
  }
}

TEST(GlooBackendTest, AllReduceAvgAndMaxBFloat16) {
  RunRanks(4, [&](int r, Backend& b) {
    std::vector<uint16_t> avg(5, FloatToBFloat16(static_cast<float>(r)));
    std::vector<uint16_t> mx(5, FloatToBFloat16(static_cast<float>(-r)));
    SL_EXPECT_OK_WORK(b.AllReduce(avg.data(), 5, DType::kBFloat16, ReduceOp::kAvg));
    SL_EXPECT_OK_WORK(b.AllReduce(mx.data(), 5, DType::kBFloat16, ReduceOp::kMax));
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(BFloat16ToFloat(avg[i]), 1.5f);
      EXPECT_EQ(BFloat16ToFloat(mx[i]), 0.0f);
    }
  });
}

TEST(GlooBackendTest, AllGatherSeparateAndInPlace) {
  for (int n : kRanks) {
    RunRanks(n, [&](int r, Backend& b) {
      for (size_t count : kCounts) {
        for (bool in_place : {false, true}) {
          std::vector<float> in(count), out(count * n, -1.0f);
          for (size_t i = 0; i < count; ++i) in[i] = F(r, i);
          const float* src = in.data();
          if (in_place) {
            std::memcpy(out.data() + r * count, in.data(), count * 4);
            src = out.data() + r * count;
          }
          SL_EXPECT_OK_WORK(b.AllGather(src, count, out.data(), DType::kFloat32));
          Mismatch m;
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i) m.Check(q * count + i, out[q * count + i], F(q, i));
          EXPECT_NO_MISMATCH(m, "n=" << n << " count=" << count << " in_place=" << in_place);
        }
      }
    });
  }
}

TEST(GlooBackendTest, AllGatherFloat16IsBitExact) {
  RunRanks(3, [&](int r, Backend& b) {
    std::vector<uint16_t> in(7), out(21);
    for (int i = 0; i < 7; ++i) in[i] = static_cast<uint16_t>(r * 1000 + i);
    SL_EXPECT_OK_WORK(b.AllGather(in.data(), 7, out.data(), DType::kFloat16));
    for (int q = 0; q < 3; ++q)
      for (int i = 0; i < 7; ++i) EXPECT_EQ(out[q * 7 + i], q * 1000 + i);
  });
}

TEST(GlooBackendTest, ReduceScatterEqualAndUneven) {
  for (int n : kRanks) {
    RunRanks(n, [&](int r, Backend& b) {
      for (size_t count : kCounts) {
        for (bool uneven : {false, true}) {
          // Uneven: piece p has count + p elements, and piece 1 is empty.
          std::vector<size_t> counts(n);
          for (int p = 0; p < n; ++p) counts[p] = uneven ? (p == 1 ? 0 : count + p) : count;
          const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
          std::vector<float> in(total), out(counts[r] + 1, -7.0f);
          for (size_t i = 0; i < total; ++i) in[i] = F(r, i);
          size_t offset = 0;
          for (int p = 0; p < r; ++p) offset += counts[p];
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
            SL_EXPECT_OK_WORK(b.ReduceScatter(in.data(), out.data(), counts, DType::kFloat32, op));
            Mismatch m;
            for (size_t i = 0; i < counts[r]; ++i) {
              const float k = 0.5f * ((offset + i) % 13);
              m.Check(i, out[i], op == ReduceOp::kSum ? n * (n + 1) / 2.0f + n * k : n + k);
            }
            EXPECT_EQ(out[counts[r]], -7.0f) << "wrote past counts[rank]";
            EXPECT_NO_MISMATCH(m, "n=" << n << " count=" << count << " uneven=" << uneven
                                       << " op=" << ReduceOpName(op));
          }
        }
      }
    });
  }
}

TEST(GlooBackendTest, ReduceScatterAvgFloat16) {
  RunRanks(2, [&](int r, Backend& b) {
    std::vector<uint16_t> in(6, FloatToHalf(r == 0 ? 1.0f : 2.0f)), out(3);
    SL_EXPECT_OK_WORK(
        b.ReduceScatter(in.data(), out.data(), {3, 3}, DType::kFloat16, ReduceOp::kAvg));
    for (auto h : out) EXPECT_EQ(HalfToFloat(h), 1.5f);
  });
}

// Piece s -> d: about count/n elements, with every third pair empty.
size_t Piece(int s, int d, int n, size_t count) {
  if ((s + d) % 3 == 2) return 0;
  return count / n + (static_cast<size_t>(d) < count % n ? 1 : 0) + (count > 0 ? (s % 2) : 0);
}
float A2AValue(int s, int d, size_t j) { return s * 100000.0f + d * 1000.0f + (j % 1000); }

TEST(GlooBackendTest, AllToAllUnevenWithEmptyPieces) {
  for (int n : kRanks) {
    RunRanks(n, [&](int r, Backend& b) {
      for (size_t count : kCounts) {
        std::vector<size_t> send(n), recv(n);
        for (int p = 0; p < n; ++p) {
          send[p] = Piece(r, p, n, count);
          recv[p] = Piece(p, r, n, count);
        }
        std::vector<float> in(std::accumulate(send.begin(), send.end(), size_t{0}));
        std::vector<float> out(std::accumulate(recv.begin(), recv.end(), size_t{0}), -1.0f);
        size_t k = 0;
        for (int p = 0; p < n; ++p)
          for (size_t j = 0; j < send[p]; ++j) in[k++] = A2AValue(r, p, j);
        SL_EXPECT_OK_WORK(b.AllToAll(in.data(), send, out.data(), recv, DType::kFloat32));
        Mismatch m;
        k = 0;
        for (int p = 0; p < n; ++p)
          for (size_t j = 0; j < recv[p]; ++j, ++k) m.Check(k, out[k], A2AValue(p, r, j));
        EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r << " count=" << count);
      }
    });
  }
}

TEST(GlooBackendTest, BroadcastFromEveryRoot) {
  for (int n : kRanks) {
    RunRanks(n, [&](int r, Backend& b) {
      for (size_t count : kCounts) {
        for (int root : {0, n - 1}) {
          std::vector<float> data(count);
          for (size_t i = 0; i < count; ++i) data[i] = F(r, i);
          SL_EXPECT_OK_WORK(b.Broadcast(data.data(), count, DType::kFloat32, root));
          Mismatch m;
          for (size_t i = 0; i < count; ++i) m.Check(i, data[i], F(root, i));
          EXPECT_NO_MISMATCH(m, "n=" << n << " count=" << count << " root=" << root);
        }
      }
    });
  }
}

TEST(GlooBackendTest, SendRecvRing) {
  for (int n : {2, 3, 4, 8}) {
    RunRanks(n, [&](int r, Backend& b) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{4096}, size_t{1048579}}) {
        std::vector<float> out(count), in(count, -1.0f);
        for (size_t i = 0; i < count; ++i) out[i] = F(r, i);
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        // Even ranks send first, odd ranks receive first; for odd n the last
        // rank and rank 0 are both even, so rank 0 receives first too.
        const bool send_first = r % 2 == 0 && !(r == 0 && n % 2 == 1);
        if (send_first) {
          SL_EXPECT_OK_WORK(b.Send(out.data(), count, DType::kFloat32, next, 7));
          SL_EXPECT_OK_WORK(b.Recv(in.data(), count, DType::kFloat32, prev, 7));
        } else {
          SL_EXPECT_OK_WORK(b.Recv(in.data(), count, DType::kFloat32, prev, 7));
          SL_EXPECT_OK_WORK(b.Send(out.data(), count, DType::kFloat32, next, 7));
        }
        Mismatch m;
        for (size_t i = 0; i < count; ++i) m.Check(i, in[i], F(prev, i));
        EXPECT_NO_MISMATCH(m, "n=" << n << " count=" << count);
      }
    });
  }
}

// Send and Recv are posted at once, outside the collective order: both
// ranks post a send and then a receive to each other and wait for the
// receive first (a pipeline's activation / gradient exchange). With sends
// queued in issue order this would deadlock. A collective issued between
// them still runs.
TEST(GlooBackendTest, SendRecvPostedAtOnceBothWays) {
  RunRanks(2, [&](int r, Backend& b) {
    const int peer = 1 - r;
    for (int round = 0; round < 3; ++round) {
      std::vector<float> out(4096), in(4096, -1.0f);
      for (size_t i = 0; i < out.size(); ++i) out[i] = F(r, i + round);
      std::shared_ptr<Work> send = b.Send(out.data(), out.size(), DType::kFloat32, peer, 10 + r);
      float sum = static_cast<float>(r + 1);
      std::shared_ptr<Work> reduce = b.AllReduce(&sum, 1, DType::kFloat32, ReduceOp::kSum);
      std::shared_ptr<Work> recv = b.Recv(in.data(), in.size(), DType::kFloat32, peer, 10 + peer);
      SL_EXPECT_OK_WORK(recv);
      SL_EXPECT_OK_WORK(send);
      SL_EXPECT_OK_WORK(reduce);
      EXPECT_EQ(sum, 3.0f);
      Mismatch m;
      for (size_t i = 0; i < in.size(); ++i) m.Check(i, in[i], F(peer, i + round));
      EXPECT_NO_MISMATCH(m, "rank " << r << " round " << round);
    }
  });
}

TEST(GlooBackendTest, BarrierAllSizes) {
  for (int n : kRanks) {
    std::atomic<int> arrived{0};
    RunRanks(n, [&](int r, Backend& b) {
      if (r == 0) absl::SleepFor(absl::Milliseconds(100));
      arrived++;
      SL_EXPECT_OK_WORK(b.Barrier());
      EXPECT_EQ(arrived.load(), n);
    });
  }
}

// C7: all-to-all with uneven splits, both examples, exactly.
TEST(GlooBackendTest, C7AllToAllUnevenSplits) {
  {
    const std::vector<std::vector<size_t>> splits = {{3, 2, 1}, {2, 2, 2}, {1, 2, 3}};
    const std::vector<std::vector<float>> want = {
        {0, 1, 2, 100, 101, 200}, {3, 4, 102, 103, 201, 202}, {5, 104, 105, 203, 204, 205}};
    RunRanks(3, [&](int r, Backend& b) {
      std::vector<float> in(6);
      for (int i = 0; i < 6; ++i) in[i] = 100.0f * r + i;
      std::vector<size_t> recv = {splits[0][r], splits[1][r], splits[2][r]};
      std::vector<float> out(6, -1);
      SL_EXPECT_OK_WORK(b.AllToAll(in.data(), splits[r], out.data(), recv, DType::kFloat32));
      EXPECT_EQ(out, want[r]) << "rank " << r;
    });
  }
  {
    const std::vector<std::vector<size_t>> splits = {{1, 0, 2}, {0, 3, 0}, {2, 1, 1}};
    const std::vector<std::vector<float>> inputs = {{10, 11, 12}, {20, 21, 22}, {30, 31, 32, 33}};
    const std::vector<std::vector<float>> want = {{10, 30, 31}, {20, 21, 22, 32}, {11, 12, 33}};
    RunRanks(3, [&](int r, Backend& b) {
      std::vector<size_t> recv = {splits[0][r], splits[1][r], splits[2][r]};
      std::vector<float> out(want[r].size(), -1);
      SL_EXPECT_OK_WORK(b.AllToAll(inputs[r].data(), splits[r], out.data(), recv, DType::kFloat32));
      EXPECT_EQ(out, want[r]) << "rank " << r;
    });
  }
}

// C8: zero-size pieces.
TEST(GlooBackendTest, C8ZeroSizePieces) {
  RunRanks(2, [&](int r, Backend& b) {
    std::vector<float> in = r == 0 ? std::vector<float>{1.5f, 2.5f} : std::vector<float>{};
    std::vector<size_t> send = r == 0 ? std::vector<size_t>{1, 1} : std::vector<size_t>{0, 0};
    std::vector<size_t> recv = r == 0 ? std::vector<size_t>{1, 0} : std::vector<size_t>{1, 0};
    std::vector<float> out(1, -1);
    SL_EXPECT_OK_WORK(b.AllToAll(in.data(), send, out.data(), recv, DType::kFloat32));
    EXPECT_EQ(out[0], r == 0 ? 1.5f : 2.5f);
  });
  RunRanks(4, [&](int r, Backend& b) {
    std::vector<float> out;  // four empty results
    SL_EXPECT_OK_WORK(b.AllGather(nullptr, 0, out.data(), DType::kFloat32));
    SL_EXPECT_OK_WORK(b.AllGather(nullptr, 0, nullptr, DType::kBFloat16));
  });
}

TEST(GlooBackendTest, C8InconsistentSplitsFailNamingThePairWithoutHanging) {
  // W=3: rank 0 sends 0 to rank 2 while rank 2 expects 5 from rank 0.
  const absl::Duration timeout = absl::Seconds(5);
  RunRanks(
      3,
      [&](int r, Backend& b) {
        std::vector<size_t> send = {1, 1, 1}, recv = {1, 1, 1};
        if (r == 0) send[2] = 0;
        if (r == 2) recv[0] = 5;
        std::vector<float> in(3, 1.0f), out(8);
        const absl::Time start = absl::Now();
        absl::Status s = b.AllToAll(in.data(), send, out.data(), recv, DType::kFloat32)
                             ->Wait(timeout + absl::Seconds(10));
        EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(5));
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 sends 0 elements to rank 2"));
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 expects 5 from rank 0"));
        // The group is poisoned afterwards, deterministically on every rank.
        EXPECT_FALSE(b.Barrier()->Wait(absl::Seconds(10)).ok());
      },
      TestOptions(timeout));
}

TEST(GlooBackendTest, InvalidArgumentsNameTheField) {
  RunRanks(2, [&](int r, Backend& b) {
    float x[4] = {};
    auto code = [](const std::shared_ptr<Work>& w) { return w->Wait(absl::Seconds(1)).code(); };
    auto msg = [](const std::shared_ptr<Work>& w) {
      return std::string(w->Wait(absl::Seconds(1)).message());
    };
    auto rs = b.ReduceScatter(x, x, {1, 1, 1}, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(code(rs), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(msg(rs), HasSubstr("counts.size()=3"));
    auto a2a = b.AllToAll(x, {1}, x, {1, 1}, DType::kFloat32);
    EXPECT_THAT(msg(a2a), HasSubstr("send_counts.size()=1"));
    auto a2a2 = b.AllToAll(x, {1, 1}, x, {1, 1, 1}, DType::kFloat32);
    EXPECT_THAT(msg(a2a2), HasSubstr("recv_counts.size()=3"));
    auto bc = b.Broadcast(x, 1, DType::kFloat32, 2);
    EXPECT_EQ(code(bc), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(msg(bc), HasSubstr("root=2"));
    EXPECT_THAT(msg(b.Send(x, 1, DType::kFloat32, -1, 0)), HasSubstr("peer=-1"));
    EXPECT_THAT(msg(b.Recv(x, 1, DType::kFloat32, r, 0)), HasSubstr("peer=" + std::to_string(r)));
    EXPECT_EQ(code(b.AllReduce(nullptr, 3, DType::kFloat32, ReduceOp::kSum)),
              absl::StatusCode::kInvalidArgument);
    // InvalidArgument does not poison the group.
    SL_EXPECT_OK_WORK(b.Barrier());
  });
  auto store = NewInMemoryStore();
  EXPECT_THAT(std::string(CreateGlooBackend(store, 2, 2, TestOptions()).status().message()),
              HasSubstr("rank=2"));
  EXPECT_THAT(std::string(CreateGlooBackend(store, 0, 0, TestOptions()).status().message()),
              HasSubstr("size=0"));
  GlooOptions bad = TestOptions();
  bad.timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateGlooBackend(store, 0, 1, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  GlooOptions bad_address = TestOptions();
  bad_address.interface_address = "999.1.1.1";
  const absl::StatusOr<std::unique_ptr<Backend>> no_device =
      CreateGlooBackend(store, 0, 2, bad_address);
  EXPECT_EQ(no_device.status().code(), absl::StatusCode::kInvalidArgument) << no_device.status();
  EXPECT_THAT(std::string(no_device.status().message()), HasSubstr("interface_address"));
  // A well-formed address this host does not own: bind fails, no crash.
  bad_address.interface_address = "192.0.2.1";  // TEST-NET-1
  const absl::StatusOr<std::unique_ptr<Backend>> not_local =
      CreateGlooBackend(store, 0, 2, bad_address);
  EXPECT_FALSE(not_local.ok());
  EXPECT_THAT(std::string(not_local.status().message()), HasSubstr("192.0.2.1"));
}

// C11, second part: group [2,3] inside W=4 bootstraps (rank 2 is its root)
// through a PrefixStore; ranks 0 and 1 form and use their own group
// meanwhile, and are not blocked by it.
TEST(GlooBackendTest, C11SubgroupDoesNotBlockOtherRanks) {
  auto store = NewInMemoryStore();
  absl::Notification zero_one_done;
  std::vector<std::thread> threads;
  for (int world_rank = 0; world_rank < 4; ++world_rank) {
    threads.emplace_back([&, world_rank] {
      if (world_rank >= 2) {
        // Start bootstrapping [2,3] only after [0,1] finished: if anything in
        // 0/1's path waited for 2/3, this would deadlock (and time out).
        ASSERT_TRUE(zero_one_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
      }
      const bool low = world_rank < 2;
      auto group = CreateGlooBackend(PrefixStore(store, low ? "g/0,1/" : "g/2,3/"), world_rank % 2,
                                     2, TestOptions());
      ASSERT_TRUE(group.ok()) << group.status();
      float v = static_cast<float>(world_rank);
      SL_EXPECT_OK_WORK((*group)->AllReduce(&v, 1, DType::kFloat32, ReduceOp::kSum));
      EXPECT_EQ(v, low ? 1.0f : 5.0f);
      float root_value = static_cast<float>(world_rank);
      SL_EXPECT_OK_WORK((*group)->Broadcast(&root_value, 1, DType::kFloat32, 0));
      EXPECT_EQ(root_value, low ? 0.0f : 2.0f);  // group rank 0 = world rank 2
      SL_EXPECT_OK_WORK((*group)->Barrier());
      if (world_rank == 0) zero_one_done.Notify();
    });
  }
  for (auto& t : threads) t.join();
}

// One rank never calls: the others fail with DeadlineExceeded within the op
// timeout plus slack, and Work::Wait with a short timeout does not block.
TEST(GlooBackendTest, TimeoutWhenOneRankNeverCalls) {
  const absl::Duration timeout = absl::Milliseconds(500);
  absl::Notification others_done;
  std::atomic<int> done{0};
  RunRanks(
      3,
      [&](int r, Backend& b) {
        if (r == 2) {
          ASSERT_TRUE(others_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
          return;
        }
        std::vector<float> data(4096, 1.0f);
        const absl::Time start = absl::Now();
        auto work = b.AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
        EXPECT_FALSE(work->IsCompleted());
        EXPECT_EQ(work->Wait(absl::Milliseconds(1)).code(), absl::StatusCode::kDeadlineExceeded);
        absl::Status s = work->Wait(absl::Seconds(30));
        const absl::Duration took = absl::Now() - start;
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_GE(took, timeout - absl::Milliseconds(50));
        EXPECT_LT(took, timeout + absl::Seconds(3));
        EXPECT_TRUE(work->IsCompleted());
        if (++done == 2) others_done.Notify();
      },
      TestOptions(timeout));
}

// Point-to-point and barrier time out too, and a rank missing at bootstrap
// fails CreateGlooBackend with DeadlineExceeded within connect_timeout.
TEST(GlooBackendTest, RecvBarrierAndBootstrapTimeouts) {
  const absl::Duration timeout = absl::Milliseconds(300);
  absl::Notification done;
  RunRanks(
      2,
      [&](int r, Backend& b) {
        if (r == 1) {
          ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
          return;
        }
        float x = 0;
        const absl::Time start = absl::Now();
        absl::Status s = b.Recv(&x, 1, DType::kFloat32, 1, 3)->Wait(absl::Seconds(30));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(3));
        done.Notify();
      },
      TestOptions(timeout));
  absl::Notification barrier_done;
  std::atomic<int> waiting{2};
  RunRanks(
      3,
      [&](int r, Backend& b) {
        if (r == 0) {  // alive (sockets open) but never enters the barrier
          ASSERT_TRUE(barrier_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
          return;
        }
        absl::Status s = b.Barrier()->Wait(absl::Seconds(30));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        if (--waiting == 0) barrier_done.Notify();
      },
      TestOptions(timeout));
  GlooOptions options = TestOptions();
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto lonely = CreateGlooBackend(NewInMemoryStore(), 0, 2, options);
  EXPECT_EQ(lonely.status().code(), absl::StatusCode::kDeadlineExceeded) << lonely.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Abort while the peer is silent returns promptly and fails the op and every
// later op with Aborted.
TEST(GlooBackendTest, AbortReturnsPromptlyWhilePeerIsSilent) {
  absl::Notification aborted;
  RunRanks(
      2,
      [&](int r, Backend& b) {
        if (r == 1) {
          ASSERT_TRUE(aborted.WaitForNotificationWithTimeout(absl::Seconds(30)));
          return;
        }
        std::vector<float> data(1024, 1.0f);
        auto work = b.AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
        auto queued = b.Barrier();
        absl::SleepFor(absl::Milliseconds(100));
        const absl::Time start = absl::Now();
        b.Abort();
        EXPECT_LT(absl::Now() - start, absl::Seconds(2));
        EXPECT_EQ(work->Wait(absl::Seconds(2)).code(), absl::StatusCode::kAborted);
        EXPECT_EQ(queued->Wait(absl::Seconds(2)).code(), absl::StatusCode::kAborted);
        EXPECT_EQ(b.Barrier()->Wait(absl::Seconds(2)).code(), absl::StatusCode::kAborted);
        b.Abort();  // idempotent
        aborted.Notify();
      },
      TestOptions(absl::Seconds(60)));
}

// An aborted backend whose op is still blocked inside Gloo (its peer is
// silent) is destroyed without waiting for that op: the op thread is let go
// and counted until it ends at its op timeout. An idle backend's op thread
// is joined, never counted. (Destruction used to wait 0.5 s for the blocked
// thread first, which held up every re-formation after a node loss;
// bench/control_plane/node_loss.py measures that path.) In shared memory
// the aborted op leaves its wait at once: nothing is ever left behind.
TEST(GlooBackendTest, DestroyingAnAbortedBackendLetsABlockedOpGo) {
  const int64_t stalls = ::shardline::worker::testing::TestsUseTcp() ? 1 : 0;
  const int64_t stalled_before = GlooStalledOpThreads();
  absl::Notification destroyed;
  RunRanks(
      2,
      [&](int r, Backend& b) {
        if (r == 1) {
          // Silent until rank 0's backend is gone, so its op stays blocked.
          ASSERT_TRUE(destroyed.WaitForNotificationWithTimeout(absl::Seconds(60)));
          return;
        }
        std::vector<float> data(1024, 1.0f);
        auto work = b.AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
        absl::SleepFor(absl::Milliseconds(100));
        b.Abort();
        EXPECT_EQ(work->Wait(absl::Seconds(10)).code(), absl::StatusCode::kAborted);
      },
      TestOptions(absl::Seconds(3)), nullptr, [&](int r) {
        if (r == 0) {
          EXPECT_EQ(GlooStalledOpThreads(), stalled_before + stalls);
          destroyed.Notify();
        }
      });
  // The blocked all_reduce ends at its 3 s op timeout; then it is not counted.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (GlooStalledOpThreads() > stalled_before && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(GlooStalledOpThreads(), stalled_before);
  // An idle backend: nothing is left behind.
  RunRanks(2, [&](int, Backend& b) { SL_EXPECT_OK_WORK(b.Barrier()); });
  EXPECT_EQ(GlooStalledOpThreads(), stalled_before);
}

// A rank that aborts (closes its sockets) mid-collective: every other rank
// gets Unavailable well before the op timeout, even ranks that were not
// talking to it (the loss propagates), and every message names the victim:
// directly, or as the group's first recorded failure.
TEST(GlooBackendTest, PeerAbortIsUnavailableNamingThePeer) {
  for (int n : {2, 3, 4, 8}) {
    for (int victim : {0, n - 1}) {
      std::atomic<int> pending{n - 1};
      absl::Notification all_failed;
      RunRanks(
          n,
          [&](int r, Backend& b) {
            std::vector<float> data(4096, 1.0f);
            if (r == victim) {
              absl::SleepFor(absl::Milliseconds(200));
              b.Abort();
              return;
            }
            const absl::Time start = absl::Now();
            absl::Status s = b.AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum)
                                 ->Wait(absl::Seconds(60));
            EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
            const std::string name = absl::StrCat("lost peer rank ", victim);
            const std::string msg(s.message());
            EXPECT_TRUE(absl::StrContains(msg, name + ":") || absl::StrContains(msg, name + ")"))
                << "n=" << n << " rank=" << r << ": " << msg;
            EXPECT_LT(absl::Now() - start, absl::Seconds(10));
            // Keep this rank's sockets open until every survivor has its error,
            // so nothing is detected only because a survivor went away.
            if (--pending == 0) all_failed.Notify();
            EXPECT_TRUE(all_failed.WaitForNotificationWithTimeout(absl::Seconds(30)));
          },
          TestOptions(absl::Seconds(60)));
    }
  }
}

}  // namespace
}  // namespace shardline::worker

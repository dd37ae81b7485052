// The Gloo backend's shared memory transport, ranks as threads (one host, or
// several simulated with GlooOptions::host): which transport each rank gets
// and why, results bit for bit against a reference reduced in rank order
// (sizes 0, 1, odd, not divisible by the ranks, larger than the staging
// buffers; fp32, bf16, fp16; every op), groups over several "hosts" (shared
// memory within, TCP across, singleton hosts), segment names gone once
// mapped, and a lost peer named in groups over several hosts. The generic
// contract (mismatches, progress, timeouts, abort) runs on shared memory in
// gloo_backend_test, gloo_mismatch_test and gloo_progress_test.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/float16.h"
#include "worker/comm/shm_segment.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

using ::testing::HasSubstr;

GlooOptions ShmOptions(size_t buffer_bytes = 0) {
  GlooOptions o;
  o.timeout = absl::Seconds(60);
  o.connect_timeout = absl::Seconds(30);
  o.shm_buffer_bytes = buffer_bytes;
  return o;
}

// Runs fn(rank, backend) on `size` threads, rank r's backend made with
// options_for(r); no backend is destroyed before every fn returned (as
// testing::RunRanks).
void RunRanksWith(int size, const std::function<GlooOptions(int)>& options_for,
                  const std::function<void(int, Backend&)>& fn) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  absl::Mutex mu;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto backend = CreateGlooBackend(store, r, size, options_for(r));
      if (backend.ok()) fn(r, **backend);
      absl::MutexLock lock(&mu);
      ++finished;
      auto all = [&finished, size] { return finished >= size; };
      mu.Await(absl::Condition(&all));
      ASSERT_TRUE(backend.ok()) << "rank " << r << ": " << backend.status();
    });
  }
  for (auto& t : threads) t.join();
}

void RunRanksOn(int size, const GlooOptions& options,
                const std::function<void(int, Backend&)>& fn) {
  RunRanksWith(size, [&](int) { return options; }, fn);
}

// --- Values ---

// Rank r's input at index i: varied fractions in [-8, 8), so that sums in
// another order would round differently.
float Input(int r, size_t i) {
  uint32_t h = static_cast<uint32_t>(r) * 2654435761u ^ static_cast<uint32_t>(i) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return static_cast<float>(h & 0xffff) / 4096.0f - 8.0f;
}

uint32_t Encode(float f, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
    case DType::kFloat16:
      return FloatToHalf(f);
    case DType::kBFloat16:
      return FloatToBFloat16(f);
  }
  return 0;
}

float Decode(uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kFloat16:
      return HalfToFloat(static_cast<uint16_t>(bits));
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<uint16_t>(bits));
  }
  return 0;
}

// A buffer of `count` elements of `dtype` as raw bytes.
struct Buffer {
  DType dtype;
  std::vector<uint8_t> bytes;
  Buffer(size_t count, DType d) : dtype(d), bytes(count * ElementSize(d) + 1, 0xee) {}
  void* data() { return bytes.data(); }
  uint32_t Get(size_t i) const {
    uint32_t u = 0;
    std::memcpy(&u, bytes.data() + i * ElementSize(dtype), ElementSize(dtype));
    return u;
  }
  void Set(size_t i, uint32_t bits) {
    std::memcpy(bytes.data() + i * ElementSize(dtype), &bits, ElementSize(dtype));
  }
};

// Rank r's input in `dtype` (rounded once), element i.
float Stored(int r, size_t i, DType dtype) { return Decode(Encode(Input(r, i), dtype), dtype); }

// op over ranks 0..n-1 of Stored(r, i) in fp32, in rank order, encoded.
uint32_t Reference(int n, size_t i, DType dtype, ReduceOp op) {
  float acc = Stored(0, i, dtype);
  for (int r = 1; r < n; ++r) {
    const float v = Stored(r, i, dtype);
    switch (op) {
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      default:
        acc += v;
    }
  }
  if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
  return Encode(acc, dtype);
}

const char* Name(DType d) { return DTypeName(d); }
const char* Name(ReduceOp op) { return ReduceOpName(op); }

// --- Transport ---

TEST(ShmBackendTest, RanksOnThisHostShareMemory) {
  for (int n : {1, 2, 3}) {
    RunRanksOn(n, ShmOptions(), [&](int, Backend& b) {
      const TransportInfo t = b.Transport();
      EXPECT_EQ(t.hosts, 1) << "n=" << n;
      EXPECT_EQ(t.local_ranks, n);
      EXPECT_EQ(t.shared_memory, n > 1);
      EXPECT_EQ(t.note, "");
    });
  }
}

TEST(ShmBackendTest, SharedMemoryOffOnAnyRankMeansTcpAndSaysWhy) {
  for (bool everywhere : {true, false}) {
    RunRanksWith(
        3,
        [&](int r) {
          GlooOptions o = ShmOptions();
          if (everywhere || r == 2) o.shared_memory = GlooOptions::SharedMemory::kOff;
          return o;
        },
        [&](int r, Backend& b) {
          const TransportInfo t = b.Transport();
          EXPECT_EQ(t.hosts, 1);
          EXPECT_EQ(t.local_ranks, 3);
          EXPECT_FALSE(t.shared_memory);
          EXPECT_THAT(t.note, HasSubstr("shared memory is off")) << "rank " << r;
          float v = static_cast<float>(r + 1);
          SL_EXPECT_OK_WORK(b.AllReduce(&v, 1, DType::kFloat32, ReduceOp::kSum));
          EXPECT_EQ(v, 6.0f);
        });
  }
}

TEST(ShmBackendTest, InvalidOptionsNameTheField) {
  GlooOptions o = ShmOptions(4096 + 1);
  auto b = CreateGlooBackend(NewInMemoryStore(), 0, 1, o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("shm_buffer_bytes=4097"));
  o = ShmOptions(size_t{512} << 20);
  b = CreateGlooBackend(NewInMemoryStore(), 0, 1, o);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("shm_buffer_bytes"));
  o = ShmOptions();
  o.host = std::string(256, 'h');
  b = CreateGlooBackend(NewInMemoryStore(), 0, 1, o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("options.host is 256 bytes"));
}

// This process's segment names in /dev/shm.
std::vector<std::string> OurSegments() {
  struct stat st;
  std::vector<std::string> out;
  if (::stat("/proc/self/ns/pid", &st) != 0) return out;
  const std::string prefix = absl::StrCat("shardline-", st.st_ino, "-", ::getpid(), "-");
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (struct dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

TEST(ShmBackendTest, SegmentNamesAreGoneOnceEveryRankMappedThem) {
  std::atomic<int> checked{0};
  RunRanksOn(4, ShmOptions(), [&](int, Backend& b) {
    EXPECT_TRUE(b.Transport().shared_memory);
    // Every rank's backend exists here, and so does their segment; its name
    // does not.
    EXPECT_THAT(OurSegments(), ::testing::IsEmpty());
    SL_EXPECT_OK_WORK(b.Barrier());
    ++checked;
  });
  EXPECT_EQ(checked.load(), 4);
  EXPECT_THAT(OurSegments(), ::testing::IsEmpty());
}

// --- Results against the reference, every rank on this host ---

// Counts for n ranks: empty, one, odd, not divisible by n, above the direct
// all_reduce size and many times the 4 KiB staging buffer, and larger.
std::vector<size_t> Counts(int n) {
  return {0, 1, 7, static_cast<size_t>(16 * n + 3), 40000 + static_cast<size_t>(n), 300001};
}

TEST(ShmBackendTest, AllReduceMatchesTheRankOrderReference) {
  for (size_t buffer : {size_t{4096}, size_t{0}}) {
    for (int n : {1, 2, 3, 4, 5}) {
      RunRanksOn(n, ShmOptions(buffer), [&](int r, Backend& b) {
        ASSERT_EQ(b.Transport().shared_memory, n > 1);
        for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
            for (size_t count : Counts(n)) {
              Buffer buf(count, dtype);
              for (size_t i = 0; i < count; ++i) buf.Set(i, Encode(Input(r, i), dtype));
              SL_EXPECT_OK_WORK(b.AllReduce(buf.data(), count, dtype, op));
              size_t wrong = 0, first = 0;
              for (size_t i = 0; i < count; ++i) {
                if (buf.Get(i) != Reference(n, i, dtype, op) && wrong++ == 0) first = i;
              }
              EXPECT_EQ(wrong, 0u) << "buffer " << buffer << " n=" << n << " rank " << r << " "
                                   << Name(dtype) << " " << Name(op) << " count " << count
                                   << ": first wrong index " << first;
              EXPECT_EQ(buf.bytes.back(), 0xee) << "wrote past the buffer";
            }
          }
        }
      });
    }
  }
}

TEST(ShmBackendTest, ReduceScatterMatchesTheRankOrderReference) {
  for (size_t buffer : {size_t{4096}, size_t{0}}) {
    for (int n : {1, 2, 3, 5}) {
      // Equal, uneven, empty pieces, and pieces longer than the buffer.
      std::vector<std::vector<size_t>> layouts = {std::vector<size_t>(n, 1),
                                                  std::vector<size_t>(n, 1027)};
      std::vector<size_t> uneven(n);
      for (int p = 0; p < n; ++p) uneven[p] = p % 2 == 0 ? 3 * p + 1 : 0;
      layouts.push_back(uneven);
      std::vector<size_t> big(n);
      for (int p = 0; p < n; ++p) big[p] = 50000 + 17 * p;
      layouts.push_back(big);
      layouts.push_back(std::vector<size_t>(n, 0));
      RunRanksOn(n, ShmOptions(buffer), [&](int r, Backend& b) {
        for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            for (const std::vector<size_t>& counts : layouts) {
              size_t total = 0, offset = 0;
              for (int p = 0; p < n; ++p) {
                if (p < r) offset += counts[p];
                total += counts[p];
              }
              Buffer in(total, dtype), out(counts[r], dtype);
              for (size_t i = 0; i < total; ++i) in.Set(i, Encode(Input(r, i), dtype));
              SL_EXPECT_OK_WORK(b.ReduceScatter(in.data(), out.data(), counts, dtype, op));
              size_t wrong = 0;
              for (size_t j = 0; j < counts[r]; ++j) {
                wrong += out.Get(j) != Reference(n, offset + j, dtype, op);
              }
              EXPECT_EQ(wrong, 0u) << "buffer " << buffer << " n=" << n << " rank " << r << " "
                                   << Name(dtype) << " " << Name(op) << " total " << total;
              EXPECT_EQ(out.bytes.back(), 0xee) << "wrote past the output";
            }
          }
        }
      });
    }
  }
}

TEST(ShmBackendTest, AllGatherAndBroadcastCopyExactly) {
  for (size_t buffer : {size_t{4096}, size_t{0}}) {
    for (int n : {2, 3, 4}) {
      RunRanksOn(n, ShmOptions(buffer), [&](int r, Backend& b) {
        for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          for (size_t count : Counts(n)) {
            // Out of place, then in place (in = out + rank * count).
            for (bool in_place : {false, true}) {
              Buffer in(count, dtype), out(count * n, dtype);
              for (size_t i = 0; i < count; ++i) in.Set(i, Encode(Input(r, i), dtype));
              void* src = in.data();
              if (in_place) {
                std::memcpy(out.bytes.data() + r * count * ElementSize(dtype), in.data(),
                            count * ElementSize(dtype));
                src = out.bytes.data() + r * count * ElementSize(dtype);
              }
              SL_EXPECT_OK_WORK(b.AllGather(src, count, out.data(), dtype));
              size_t wrong = 0;
              for (int p = 0; p < n; ++p) {
                for (size_t i = 0; i < count; ++i) {
                  wrong += out.Get(p * count + i) != Encode(Input(p, i), dtype);
                }
              }
              EXPECT_EQ(wrong, 0u) << "all_gather buffer " << buffer << " n=" << n << " rank "
                                   << r << " count " << count << " in place " << in_place;
              EXPECT_EQ(out.bytes.back(), 0xee);
            }
            for (int root = 0; root < n; ++root) {
              Buffer data(count, dtype);
              for (size_t i = 0; i < count; ++i) data.Set(i, Encode(Input(r, i), dtype));
              SL_EXPECT_OK_WORK(b.Broadcast(data.data(), count, dtype, root));
              size_t wrong = 0;
              for (size_t i = 0; i < count; ++i) wrong += data.Get(i) != Encode(Input(root, i), dtype);
              EXPECT_EQ(wrong, 0u) << "broadcast n=" << n << " root " << root << " count " << count;
            }
          }
        }
      });
    }
  }
}

// Outputs of 8 MiB and more are copied out with streaming stores; odd
// counts put the pieces at every 16-byte misalignment.
TEST(ShmBackendTest, LargeOutputsAreExact) {
  const size_t count = (size_t{9} << 20) / 4 + 3;  // 9 MiB of fp32, odd
  RunRanksOn(2, ShmOptions(), [&](int r, Backend& b) {
    Buffer data(count, DType::kFloat32);
    for (size_t i = 0; i < count; ++i) data.Set(i, Encode(Input(r, i), DType::kFloat32));
    SL_EXPECT_OK_WORK(b.AllReduce(data.data(), count, DType::kFloat32, ReduceOp::kSum));
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += data.Get(i) != Reference(2, i, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(wrong, 0u) << "all_reduce rank " << r;
    // 4718600 bytes a piece (not a multiple of 16: the second piece starts
    // misaligned); an output of 9 MiB.
    const size_t piece = count / 2 + 1;
    Buffer in(piece, DType::kFloat32), out(2 * piece, DType::kFloat32);
    for (size_t i = 0; i < piece; ++i) in.Set(i, Encode(Input(r, i), DType::kFloat32));
    SL_EXPECT_OK_WORK(b.AllGather(in.data(), piece, out.data(), DType::kFloat32));
    wrong = 0;
    for (int p = 0; p < 2; ++p)
      for (size_t i = 0; i < piece; ++i)
        wrong += out.Get(p * piece + i) != Encode(Input(p, i), DType::kFloat32);
    EXPECT_EQ(wrong, 0u) << "all_gather rank " << r;
    EXPECT_EQ(out.bytes.back(), 0xee);
    Buffer bcast(count, DType::kFloat32);
    for (size_t i = 0; i < count; ++i) bcast.Set(i, Encode(Input(r, i), DType::kFloat32));
    SL_EXPECT_OK_WORK(b.Broadcast(bcast.data(), count, DType::kFloat32, 1));
    wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += bcast.Get(i) != Encode(Input(1, i), DType::kFloat32);
    EXPECT_EQ(wrong, 0u) << "broadcast rank " << r;
    EXPECT_EQ(bcast.bytes.back(), 0xee);
  });
}

// Back to back, waited on only at the end: the staging buffers take turns
// while ranks run ahead of each other.
TEST(ShmBackendTest, ManyCollectivesInFlightStayInOrder) {
  constexpr int kOps = 64;
  RunRanksOn(3, ShmOptions(4096), [&](int r, Backend& b) {
    std::vector<std::vector<float>> data(kOps);
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      const size_t count = 1 + static_cast<size_t>(k) * 97;  // up to ~6 KiB x 4 bytes
      data[k].assign(count, static_cast<float>(r + 1) * static_cast<float>(k + 1));
      works.push_back(b.AllReduce(data[k].data(), count, DType::kFloat32, ReduceOp::kSum));
    }
    for (int k = 0; k < kOps; ++k) {
      SL_EXPECT_OK_WORK(works[k]);
      const float want = 6.0f * static_cast<float>(k + 1);
      EXPECT_EQ(std::count(data[k].begin(), data[k].end(), want),
                static_cast<std::ptrdiff_t>(data[k].size()))
          << "op " << k;
    }
  });
}

// A thread waiting with no timeout runs the collective itself (Work::Wait);
// Abort from another thread still ends it at once, and the backend's other
// calls after it fail with Aborted.
TEST(ShmBackendTest, AbortEndsACollectiveRunByItsWaitingThread) {
  absl::Notification aborted;
  RunRanksOn(2, ShmOptions(), [&](int r, Backend& b) {
    if (r == 1) {  // never issues: rank 0 waits for it
      ASSERT_TRUE(aborted.WaitForNotificationWithTimeout(absl::Seconds(60)));
      return;
    }
    std::vector<float> data(1000, 1.0f);
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(200));
      b.Abort();
    });
    const absl::Status s =
        b.AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum)->Wait();
    aborter.join();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_EQ(b.Barrier()->Wait().code(), absl::StatusCode::kAborted);
    // Nothing was written: the peer never arrived.
    EXPECT_EQ(std::count(data.begin(), data.end(), 1.0f), 1000);
    aborted.Notify();
  });
}

// --- Several hosts ---

// Inputs whose sums are exact in any order (the TCP part among host leaders
// reduces in Gloo's order): small integers and halves.
float Exact(int r, size_t i) { return static_cast<float>(r + 1) + 0.5f * static_cast<float>(i % 13); }

// Every op on a group whose ranks are spread over hosts as `host_of` says.
void ExpectEveryOpOnHosts(const std::vector<std::string>& host_of, size_t buffer) {
  const int n = static_cast<int>(host_of.size());
  std::vector<int> local_ranks(n, 0);
  int hosts = 0;
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) local_ranks[r] += host_of[q] == host_of[r];
    bool first = true;
    for (int q = 0; q < r; ++q) first = first && host_of[q] != host_of[r];
    hosts += first;
  }
  RunRanksWith(
      n,
      [&](int r) {
        GlooOptions o = ShmOptions(buffer);
        o.host = host_of[r];
        return o;
      },
      [&](int r, Backend& b) {
        const TransportInfo t = b.Transport();
        EXPECT_EQ(t.hosts, hosts);
        EXPECT_EQ(t.local_ranks, local_ranks[r]);
        EXPECT_EQ(t.shared_memory, local_ranks[r] > 1) << "rank " << r;
        const std::string ctx = absl::StrCat("rank ", r, " buffer ", buffer);
        for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4 * 1024 + 3}, size_t{70001}}) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
              Buffer data(count, dtype);
              for (size_t i = 0; i < count; ++i) data.Set(i, Encode(Exact(r, i), dtype));
              SL_EXPECT_OK_WORK(b.AllReduce(data.data(), count, dtype, op));
              size_t wrong = 0;
              for (size_t i = 0; i < count; ++i) {
                const float k = 0.5f * static_cast<float>(i % 13);
                float want = n * (n + 1) / 2.0f + n * k;
                if (op == ReduceOp::kAvg) want = (n + 1) / 2.0f + k;
                if (op == ReduceOp::kMax) want = n + k;
                if (op == ReduceOp::kMin) want = 1 + k;
                wrong += data.Get(i) != Encode(want, dtype);
              }
              EXPECT_EQ(wrong, 0u) << ctx << " all_reduce " << Name(dtype) << " " << Name(op)
                                   << " count " << count;
            }
            // all_gather, out of place.
            Buffer in(count, dtype), out(count * n, dtype);
            for (size_t i = 0; i < count; ++i) in.Set(i, Encode(Exact(r, i), dtype));
            SL_EXPECT_OK_WORK(b.AllGather(in.data(), count, out.data(), dtype));
            size_t wrong = 0;
            for (int p = 0; p < n; ++p)
              for (size_t i = 0; i < count; ++i)
                wrong += out.Get(p * count + i) != Encode(Exact(p, i), dtype);
            EXPECT_EQ(wrong, 0u) << ctx << " all_gather count " << count;
            EXPECT_EQ(out.bytes.back(), 0xee);
            // reduce_scatter with uneven pieces (rank p gets count + p, one gets 0).
            std::vector<size_t> counts(n);
            size_t total = 0, offset = 0;
            for (int p = 0; p < n; ++p) {
              counts[p] = p == 1 ? 0 : count + p;
              if (p < r) offset += counts[p];
              total += counts[p];
            }
            Buffer rin(total, dtype), rout(counts[r], dtype);
            for (size_t i = 0; i < total; ++i) rin.Set(i, Encode(Exact(r, i), dtype));
            SL_EXPECT_OK_WORK(b.ReduceScatter(rin.data(), rout.data(), counts, dtype, ReduceOp::kSum));
            wrong = 0;
            for (size_t j = 0; j < counts[r]; ++j) {
              const float k = 0.5f * static_cast<float>((offset + j) % 13);
              wrong += rout.Get(j) != Encode(n * (n + 1) / 2.0f + n * k, dtype);
            }
            EXPECT_EQ(wrong, 0u) << ctx << " reduce_scatter count " << count;
            EXPECT_EQ(rout.bytes.back(), 0xee);
            // broadcast from every root.
            for (int root = 0; root < n; ++root) {
              Buffer data(count, dtype);
              for (size_t i = 0; i < count; ++i) data.Set(i, Encode(Exact(r, i), dtype));
              SL_EXPECT_OK_WORK(b.Broadcast(data.data(), count, dtype, root));
              wrong = 0;
              for (size_t i = 0; i < count; ++i) wrong += data.Get(i) != Encode(Exact(root, i), dtype);
              EXPECT_EQ(wrong, 0u) << ctx << " broadcast root " << root << " count " << count;
            }
          }
        }
        SL_EXPECT_OK_WORK(b.Barrier());
        // all_to_all and send / recv stay on TCP.
        std::vector<size_t> splits(n, 3);
        std::vector<float> a2a_in(3 * n), a2a_out(3 * n);
        for (int p = 0; p < n; ++p)
          for (int j = 0; j < 3; ++j) a2a_in[3 * p + j] = static_cast<float>(100 * r + 10 * p + j);
        SL_EXPECT_OK_WORK(b.AllToAll(a2a_in.data(), splits, a2a_out.data(), splits, DType::kFloat32));
        for (int p = 0; p < n; ++p)
          for (int j = 0; j < 3; ++j)
            EXPECT_EQ(a2a_out[3 * p + j], static_cast<float>(100 * p + 10 * r + j)) << ctx;
        float token = static_cast<float>(r), got = -1;
        auto sent = b.Send(&token, 1, DType::kFloat32, (r + 1) % n, 1);
        auto received = b.Recv(&got, 1, DType::kFloat32, (r + n - 1) % n, 1);
        SL_EXPECT_OK_WORK(sent);
        SL_EXPECT_OK_WORK(received);
        EXPECT_EQ(got, static_cast<float>((r + n - 1) % n)) << ctx;
      });
}

TEST(ShmBackendTest, TwoHostsShareMemoryWithinAndUseTcpAcross) {
  // Interleaved: host A holds ranks 0, 2 and 3, host B ranks 1 and 4.
  for (size_t buffer : {size_t{4096}, size_t{0}}) {
    ExpectEveryOpOnHosts({"A", "B", "A", "A", "B"}, buffer);
  }
}

TEST(ShmBackendTest, HostsOfOneRankUseTcpBesideASharedHost) {
  ExpectEveryOpOnHosts({"A", "A", "B", "C"}, 4096);
  ExpectEveryOpOnHosts({"B", "A", "A"}, 4096);
}

// A peer that aborts mid-collective in a group over two hosts: every other
// rank gets Unavailable naming it (directly, or as the group's first
// failure), whether it shares the victim's host or not, and whether the
// victim leads its host or not.
TEST(ShmBackendTest, LostPeerInAGroupOverTwoHostsIsUnavailableNamingIt) {
  const std::vector<std::string> host_of = {"A", "A", "B", "B"};
  for (int victim : {0, 1, 3}) {
    std::atomic<int> pending{3};
    absl::Notification all_failed;
    RunRanksWith(
        4,
        [&](int r) {
          GlooOptions o = ShmOptions();
          o.host = host_of[r];
          return o;
        },
        [&](int r, Backend& b) {
          std::vector<float> data(100000, 1.0f);
          if (r == victim) {
            absl::SleepFor(absl::Milliseconds(200));
            b.Abort();
            return;
          }
          const absl::Status s =
              b.AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum)
                  ->Wait(absl::Seconds(90));
          EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << r << ": " << s;
          const std::string name = absl::StrCat("lost peer rank ", victim);
          const std::string msg(s.message());
          EXPECT_TRUE(absl::StrContains(msg, name + ":") || absl::StrContains(msg, name + ")"))
              << "victim " << victim << " rank " << r << ": " << msg;
          // Stay until every survivor has its error, so that nothing is found
          // only because a survivor went away.
          if (--pending == 0) all_failed.Notify();
          EXPECT_TRUE(all_failed.WaitForNotificationWithTimeout(absl::Seconds(60)));
        });
  }
}

// --- Segments ---

TEST(ShmBackendTest, SegmentOpenChecksWhatTheRendezvousDescribed) {
  const std::string name = shm::SegmentName("test", 42);
  auto created = shm::Segment::Create(name, 2, 4096, 42);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(shm::Segment::Create(name, 2, 4096, 42).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(shm::Segment::Open(name, 2, 4096, 42).ok());
  EXPECT_EQ(shm::Segment::Open(name, 2, 4096, 43).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shm::Segment::Open(name, 3, 4096, 42).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shm::Segment::Unlink(name).ok());
  EXPECT_TRUE(shm::Segment::Unlink(name).ok());  // already gone is fine
  EXPECT_EQ(shm::Segment::Open(name, 2, 4096, 42).status().code(), absl::StatusCode::kNotFound);
  // The mapping outlives the name.
  (*created)->buffer(1, 1)[4095] = 7;
  EXPECT_EQ((*created)->buffer(1, 1)[4095], 7);
  EXPECT_EQ(shm::Segment::Create(name, 0, 4096, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shm::Segment::Create(name, 2, 1000, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker

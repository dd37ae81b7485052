// The NCCL backend. Everywhere: argument checks and the fallback path (no
// plugin / no GPU / CUDA compiled out -> Unavailable, so the worker uses
// Gloo). Where GPUs exist: ranks as threads, one device each (NCCL does not
// allow two ranks of one communicator on one device), every collective with
// closed-form values, and the timeout/abort paths. Multi-rank tests skip,
// naming the reason, when there are fewer devices than ranks.
#include "worker/comm/nccl_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

using ::testing::AnyOf;
using ::testing::HasSubstr;

#ifdef SHARDLINE_NCCL_LOOPBACK
// nccl_backend_loopback_test: the same tests over the fake plugin's loopback
// communicators (worker/gpu/fake_plugin.cc; SHARDLINE_FAKE_LOOPBACK_DEVICES
// is set by the BUILD rule), so the "With GPUs" tests below run everywhere.
constexpr char kPlugin[] = "worker/gpu/libshardline_gpu_fake.so";  // runfiles-relative
#else
constexpr char kPlugin[] = "worker/gpu/libshardline_gpu.so";  // runfiles-relative
#endif

NcclOptions Options(absl::Duration timeout = absl::Seconds(60)) {
  NcclOptions o;
  o.plugin_path = kPlugin;
  o.timeout = timeout;
  o.connect_timeout = absl::Seconds(60);
  return o;
}

// Devices usable for NCCL here, or the reason there are none.
absl::StatusOr<int> Devices() {
  absl::StatusOr<DeviceMemory> mem = DeviceMemory::Load(kPlugin);
  if (!mem.ok()) return mem.status();
  return mem->DeviceCount();
}

// Skips the test unless `n` devices exist (one per rank).
#define SKIP_UNLESS_DEVICES(n)                                                         \
  do {                                                                                 \
    const absl::StatusOr<int> _d = Devices();                                          \
    if (!_d.ok()) GTEST_SKIP() << "no GPU: " << _d.status().message();                 \
    if (*_d < (n))                                                                     \
      GTEST_SKIP() << "needs " << (n) << " GPUs (NCCL allows one rank per device per " \
                   << "communicator); this machine has " << *_d;                       \
  } while (0)

// A device buffer of `count` elements of T on `device`.
template <typename T>
class DeviceVector {
 public:
  DeviceVector(int device, size_t count) : device_(device), count_(count) {
    auto mem = DeviceMemory::Load(kPlugin);
    EXPECT_TRUE(mem.ok()) << mem.status();
    mem_ = std::make_unique<DeviceMemory>(*mem);
    auto p = mem_->Alloc(device, std::max<size_t>(count, 1) * sizeof(T));
    EXPECT_TRUE(p.ok()) << p.status();
    ptr_ = p.ok() ? *p : nullptr;
  }
  ~DeviceVector() {
    if (ptr_ != nullptr) mem_->Free(device_, ptr_);
  }
  T* get() const { return static_cast<T*>(ptr_); }
  void Upload(const std::vector<T>& v) {
    ASSERT_EQ(v.size(), count_);
    absl::Status s = mem_->CopyToDevice(device_, ptr_, v.data(), v.size() * sizeof(T));
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<T> Download() const {
    std::vector<T> v(count_);
    absl::Status s = mem_->CopyToHost(device_, v.data(), ptr_, v.size() * sizeof(T));
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }

 private:
  int device_;
  size_t count_;
  std::unique_ptr<DeviceMemory> mem_;
  void* ptr_ = nullptr;
};

// Runs fn(rank, backend) on `n` threads, rank r on device r.
void RunNcclRanks(int n, const std::function<void(int, Backend&)>& fn,
                  NcclOptions options = Options()) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o = options;
      o.device = r;
      auto backend = CreateNcclBackend(store, r, n, o);
      ASSERT_TRUE(backend.ok()) << "rank " << r << ": " << backend.status();
      fn(r, **backend);
    });
  }
  for (auto& t : threads) t.join();
}

// Rank counts to sweep: every one the machine has devices for (1 always).
std::vector<int> RankCounts() {
  const absl::StatusOr<int> d = Devices();
  std::vector<int> out;
  for (int n : {1, 2, 3, 4, 8})
    if (d.ok() && n <= *d) out.push_back(n);
  return out;
}

const std::vector<size_t> kCounts = {0, 1, 7, 4096, 1048576 + 3};

// Rank r's contribution at index i: small integers and halves, exact in fp32,
// fp16 and bf16, and so are their sums over <= 8 ranks.
float F(int r, size_t i) { return static_cast<float>(r + 1) + 0.5f * (i % 13); }

struct Mismatch {
  size_t wrong = 0, first = 0;
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

// --- Everywhere (no GPU needed) ---

#ifndef SHARDLINE_NCCL_LOOPBACK  // the loopback fake always has devices
TEST(NcclBackendTest, WithoutAGpuItIsUnavailableSoTheWorkerFallsBackToGloo) {
  const absl::StatusOr<int> d = Devices();
  if (d.ok()) GTEST_SKIP() << "this machine has " << *d << " GPU(s); the no-GPU path needs none";
  // The default plugin: none when CUDA is compiled out; else the real one.
  NcclOptions o = Options();
  o.plugin_path = "";
  auto backend = CreateNcclBackend(NewInMemoryStore(), 0, 1, o);
  if (backend.ok() || !absl::StrContains(backend.status().message(), "compiled out"))
    backend = CreateNcclBackend(NewInMemoryStore(), 0, 1, Options());
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("NCCL backend unavailable"));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("Gloo"));
  // Which reason depends on the build: CUDA compiled out, or no device.
  EXPECT_THAT(std::string(backend.status().message()),
              AnyOf(HasSubstr("compiled out"), HasSubstr("no usable GPU")));
}
#endif  // SHARDLINE_NCCL_LOOPBACK

TEST(NcclBackendTest, MissingPluginIsUnavailable) {
  NcclOptions o = Options();
  o.plugin_path = "/nonexistent/libshardline_gpu.so";
  auto backend = CreateNcclBackend(NewInMemoryStore(), 0, 1, o);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("NCCL backend unavailable"));
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("/nonexistent/libshardline_gpu.so"));
}

TEST(NcclBackendTest, InvalidArgumentsNameTheField) {
  auto store = NewInMemoryStore();
  auto check = [](const absl::StatusOr<std::unique_ptr<Backend>>& b, const char* field) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
    EXPECT_THAT(std::string(b.status().message()), HasSubstr(field));
  };
  check(CreateNcclBackend(nullptr, 0, 1, Options()), "store");
  check(CreateNcclBackend(store, 0, 0, Options()), "size=0");
  check(CreateNcclBackend(store, 2, 2, Options()), "rank=2");
  check(CreateNcclBackend(store, -1, 2, Options()), "rank=-1");
  NcclOptions o = Options();
  o.timeout = absl::ZeroDuration();
  check(CreateNcclBackend(store, 0, 1, o), "options.timeout");
  o = Options();
  o.connect_timeout = absl::Seconds(-1);
  check(CreateNcclBackend(store, 0, 1, o), "options.connect_timeout");
}

#ifndef SHARDLINE_NCCL_LOOPBACK  // the steered fake (loopback mode is off here)
// --- Everywhere: the worker side over the fake plugin ---

// The fake plugin (worker/gpu/fake_plugin.cc) and its controls. The backend
// dlopen()s the same path, so both share the fake's state.
class FakePlugin {
 public:
  static constexpr char kPath[] = "worker/gpu/libshardline_gpu_fake.so";
  static constexpr int kComplete = 0, kHang = 1, kAsyncError = 2, kInitHang = 3;

  FakePlugin() {
    handle_ = dlopen(kPath, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle_, nullptr) << dlerror();
    if (handle_ == nullptr) return;
    set_mode_ = reinterpret_cast<void (*)(int)>(dlsym(handle_, "shardline_fake_set_mode"));
    aborts_ = reinterpret_cast<int (*)()>(dlsym(handle_, "shardline_fake_aborts"));
    inits_with_id_ =
        reinterpret_cast<int (*)(const uint8_t*)>(dlsym(handle_, "shardline_fake_inits_with_id"));
    stream_calls_ = reinterpret_cast<void (*)(int64_t*, int64_t*)>(
        dlsym(handle_, "shardline_fake_stream_calls"));
    reinterpret_cast<void (*)()>(dlsym(handle_, "shardline_fake_reset"))();
  }

  // comm_order_after_stream and stream_wait_event calls since the reset.
  std::pair<int64_t, int64_t> StreamCalls() {
    int64_t orders = 0, waits = 0;
    stream_calls_(&orders, &waits);
    return {orders, waits};
  }

  void SetMode(int m) { set_mode_(m); }
  int Aborts() { return aborts_(); }
  int InitsWithId(const std::string& id) {
    return inits_with_id_(reinterpret_cast<const uint8_t*>(id.data()));
  }

  static NcclOptions Options(absl::Duration timeout = absl::Seconds(30)) {
    NcclOptions o;
    o.plugin_path = kPath;
    o.timeout = timeout;
    o.connect_timeout = absl::Seconds(10);
    return o;
  }

 private:
  void* handle_ = nullptr;  // kept open, like the backend's
  void (*set_mode_)(int) = nullptr;
  int (*aborts_)() = nullptr;
  int (*inits_with_id_)(const uint8_t*) = nullptr;
  void (*stream_calls_)(int64_t*, int64_t*) = nullptr;
};

std::unique_ptr<Backend> MakeFakeBackend(NcclOptions o = FakePlugin::Options()) {
  auto b = CreateNcclBackend(NewInMemoryStore(), 0, 1, std::move(o));
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

TEST(NcclBackendFakeTest, RanksGetRankZerosUniqueIdThroughTheStore) {
  FakePlugin fake;
  std::shared_ptr<Store> store = NewInMemoryStore();
  constexpr int kSize = 4;
  std::vector<std::thread> threads;
  for (int r = kSize - 1; r >= 0; --r) {  // rank 0 last: the others must wait for its id
    threads.emplace_back([&, r] {
      auto b = CreateNcclBackend(store, r, kSize, FakePlugin::Options());
      ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
      EXPECT_EQ((*b)->rank(), r);
      EXPECT_EQ((*b)->size(), kSize);
    });
  }
  for (auto& t : threads) t.join();
  absl::StatusOr<std::string> id = store->Get("nccl_unique_id", absl::Seconds(1));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 128u);
  EXPECT_EQ(fake.InitsWithId(*id), kSize);
}

TEST(NcclBackendFakeTest, OperationsCompleteAndInvalidArgumentsNameTheField) {
  FakePlugin fake;
  auto b = MakeFakeBackend();
  ASSERT_NE(b, nullptr);
  float data[4] = {1, 2, 3, 4}, out[4] = {0};
  auto w = b->AllReduce(data, 4, DType::kFloat32, ReduceOp::kAvg);
  EXPECT_TRUE(w->Wait(absl::Seconds(5)).ok());
  EXPECT_TRUE(w->IsCompleted());
  EXPECT_TRUE(b->AllGather(data, 4, out, DType::kFloat32)->Wait(absl::Seconds(5)).ok());
  EXPECT_EQ(out[3], 4.0f);
  EXPECT_TRUE(b->Barrier()->Wait(absl::Seconds(5)).ok());
  EXPECT_TRUE(b->ReduceScatter(data, out, {4}, DType::kBFloat16, ReduceOp::kMax)->Wait().ok());
  EXPECT_TRUE(b->AllToAll(data, {4}, out, {4}, DType::kFloat16)->Wait().ok());
  EXPECT_TRUE(b->Broadcast(data, 4, DType::kFloat32, 0)->Wait().ok());

  auto invalid = [](const std::shared_ptr<Work>& w, const char* field) {
    const absl::Status s = w->Wait(absl::Seconds(5));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
  };
  invalid(b->ReduceScatter(data, out, {2, 2}, DType::kFloat32, ReduceOp::kSum), "counts.size()=2");
  invalid(b->AllToAll(data, {4, 0}, out, {4}, DType::kFloat32), "send_counts.size()=2");
  invalid(b->AllToAll(data, {4}, out, {}, DType::kFloat32), "recv_counts.size()=0");
  invalid(b->Broadcast(data, 4, DType::kFloat32, 1), "root=1");
  invalid(b->Send(data, 4, DType::kFloat32, 0, 0), "peer=0 == rank");
  invalid(b->Recv(data, 4, DType::kFloat32, -1, 0), "peer=-1");
  // Argument errors do not poison the group.
  EXPECT_TRUE(b->Barrier()->Wait(absl::Seconds(5)).ok());
  EXPECT_EQ(fake.Aborts(), 0);
}

TEST(NcclBackendFakeTest, WaitTimeoutDoesNotCancel) {
  FakePlugin fake;
  auto b = MakeFakeBackend();
  ASSERT_NE(b, nullptr);
  fake.SetMode(FakePlugin::kHang);
  auto w = b->Barrier();
  EXPECT_FALSE(w->IsCompleted());
  const absl::Status s = w->Wait(absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("still running"));
  EXPECT_FALSE(w->IsCompleted());
  EXPECT_EQ(fake.Aborts(), 0);
  b->Abort();
  EXPECT_TRUE(absl::IsAborted(w->Wait(absl::Seconds(5))));
}

TEST(NcclBackendFakeTest, OpTimeoutAbortsTheCommunicatorAndTheGroupStaysFailed) {
  FakePlugin fake;
  auto b = MakeFakeBackend(FakePlugin::Options(absl::Milliseconds(200)));
  ASSERT_NE(b, nullptr);
  fake.SetMode(FakePlugin::kHang);
  float data[1] = {0};
  auto w = b->AllReduce(data, 1, DType::kFloat32, ReduceOp::kSum);
  const absl::Time start = absl::Now();
  const absl::Status s = w->Wait(absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce of 1 elements on rank 0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("NcclOptions::timeout"));
  EXPECT_EQ(fake.Aborts(), 1);
  fake.SetMode(FakePlugin::kComplete);
  const absl::Status later = b->Barrier()->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(later)) << later;
  b->Abort();
  const absl::Status after_abort = b->Barrier()->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsAborted(after_abort)) << after_abort;
  EXPECT_THAT(std::string(after_abort.message()), HasSubstr("earlier failure"));
  EXPECT_EQ(fake.Aborts(), 1);  // ncclCommAbort once
}

TEST(NcclBackendFakeTest, AsyncErrorIsUnavailableWithNcclsText) {
  FakePlugin fake;
  auto b = MakeFakeBackend();
  ASSERT_NE(b, nullptr);
  auto before = b->Barrier();  // finished, and seen to finish, before the error
  EXPECT_TRUE(before->Wait(absl::Seconds(5)).ok());
  auto unseen = b->Barrier();  // finished on the "GPU" but not polled before the error
  fake.SetMode(FakePlugin::kHang);
  auto pending = b->Barrier();
  fake.SetMode(FakePlugin::kAsyncError);
  auto failing = b->Barrier();
  const absl::Status s = failing->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("remote process exited"));
  EXPECT_EQ(fake.Aborts(), 1);
  EXPECT_TRUE(before->Wait(absl::Seconds(5)).ok());  // a status, once seen, stays
  // After an asynchronous error NCCL promises nothing about operations not yet
  // seen to finish, so they report the error too.
  EXPECT_TRUE(absl::IsUnavailable(unseen->Wait(absl::Seconds(5))));
  const absl::Status p = pending->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(p)) << p;
}

// A stand-in for the compute stream: the fake never dereferences it.
int fake_compute_stream = 0;
const DeviceStream kStream{&fake_compute_stream};

TEST(NcclBackendFakeTest, OperationsOrderOnAnotherStreamBothWays) {
  FakePlugin fake;
  auto b = MakeFakeBackend();
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->stream_ordered());
  ASSERT_TRUE(b->OrderAfter(kStream).ok());
  float data[2] = {1, 2};
  auto w = b->AllReduce(data, 2, DType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(w->OrderBefore(kStream).ok());
  EXPECT_TRUE(w->Wait(absl::Seconds(5)).ok());
  EXPECT_EQ(fake.StreamCalls(), std::make_pair(int64_t{1}, int64_t{1}));

  // Null streams name the call; an operation rejected at issue passes its
  // error on instead of ordering anything.
  const absl::Status null_after = b->OrderAfter(DeviceStream{});
  EXPECT_TRUE(absl::IsInvalidArgument(null_after)) << null_after;
  EXPECT_THAT(std::string(null_after.message()), HasSubstr("OrderAfter: null stream"));
  const absl::Status null_before = w->OrderBefore(DeviceStream{});
  EXPECT_TRUE(absl::IsInvalidArgument(null_before)) << null_before;
  const absl::Status rejected = b->Broadcast(data, 2, DType::kFloat32, 3)->OrderBefore(kStream);
  EXPECT_TRUE(absl::IsInvalidArgument(rejected)) << rejected;
  EXPECT_THAT(std::string(rejected.message()), HasSubstr("root=3"));
  EXPECT_EQ(fake.StreamCalls(), std::make_pair(int64_t{1}, int64_t{1}));

  b->Abort();
  const absl::Status aborted = b->OrderAfter(kStream);
  EXPECT_TRUE(absl::IsAborted(aborted)) << aborted;
}

// Nobody polls the operation on the host: the stream waits for it (the
// fake's stream_wait_event blocks, as an emulated stream would), and only
// the backend's watchdog can abort it at its deadline, which frees the
// stream. Without the watchdog this test never returns.
TEST(NcclBackendFakeTest, TheWatchdogAbortsAStuckOperationThatAStreamWaitsFor) {
  FakePlugin fake;
  auto b = MakeFakeBackend(FakePlugin::Options(absl::Milliseconds(300)));
  ASSERT_NE(b, nullptr);
  fake.SetMode(FakePlugin::kHang);
  float data[1] = {0};
  auto w = b->AllReduce(data, 1, DType::kFloat32, ReduceOp::kSum);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(w->OrderBefore(kStream).ok());
  const absl::Duration held = absl::Now() - start;
  EXPECT_GE(held, absl::Milliseconds(250));
  EXPECT_LT(held, absl::Seconds(10));
  EXPECT_EQ(fake.Aborts(), 1);
  const absl::Status s = w->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce of 1 elements on rank 0"));
  // The group stays failed: the next ordering says so.
  const absl::Status later = b->OrderAfter(kStream);
  EXPECT_TRUE(absl::IsDeadlineExceeded(later)) << later;
}

// The watchdog polls one running operation per communicator, the oldest:
// once that one has finished, the next is polled and aborted at its own
// deadline, and the finished one keeps its status.
TEST(NcclBackendFakeTest, TheWatchdogMovesOnToTheNextOperationOfACommunicator) {
  FakePlugin fake;
  auto b = MakeFakeBackend(FakePlugin::Options(absl::Milliseconds(300)));
  ASSERT_NE(b, nullptr);
  auto done = b->Barrier();
  fake.SetMode(FakePlugin::kHang);
  auto stuck = b->Barrier();
  ASSERT_TRUE(done->OrderBefore(kStream).ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(stuck->OrderBefore(kStream).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(fake.Aborts(), 1);
  EXPECT_TRUE(done->Wait(absl::Seconds(5)).ok());
  const absl::Status s = stuck->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST(NcclBackendFakeTest, TheWatchdogAbortsOnAnAsynchronousErrorBeforeTheDeadline) {
  FakePlugin fake;
  auto b = MakeFakeBackend(FakePlugin::Options(absl::Minutes(5)));
  ASSERT_NE(b, nullptr);
  fake.SetMode(FakePlugin::kAsyncError);
  auto w = b->Barrier();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(w->OrderBefore(kStream).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(fake.Aborts(), 1);
  const absl::Status s = w->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("remote process exited"));
}

TEST(NcclBackendFakeTest, AbortFromAnotherThreadEndsAWaitPromptly) {
  FakePlugin fake;
  auto b = MakeFakeBackend();
  ASSERT_NE(b, nullptr);
  fake.SetMode(FakePlugin::kHang);
  auto w = b->Barrier();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    b->Abort();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = w->Wait();
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  b->Abort();  // idempotent
  EXPECT_EQ(fake.Aborts(), 1);
  EXPECT_TRUE(absl::IsAborted(b->Barrier()->Wait(absl::Seconds(5))));
}

TEST(NcclBackendFakeTest, WorkOutlivesItsBackend) {
  FakePlugin fake;
  auto b = MakeFakeBackend();
  ASSERT_NE(b, nullptr);
  fake.SetMode(FakePlugin::kHang);
  auto w = b->Barrier();
  b.reset();  // destruction aborts pending work
  EXPECT_TRUE(absl::IsAborted(w->Wait(absl::Seconds(5))));
  EXPECT_EQ(fake.Aborts(), 1);
}

// Progress: counted at issue, the running op (the fake hangs it) with its
// elapsed time growing, the latest finished one, and send / recv with the
// peer.
TEST(NcclBackendFakeTest, ProgressCountsAtIssueAndShowsTheRunningOp) {
  FakePlugin fake;
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::unique_ptr<Backend> peer;
  std::thread peer_thread([&] {
    auto b = CreateNcclBackend(store, 1, 2, FakePlugin::Options());
    ASSERT_TRUE(b.ok()) << b.status();
    peer = *std::move(b);
  });
  auto made = CreateNcclBackend(store, 0, 2, FakePlugin::Options());
  peer_thread.join();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Backend> b = *std::move(made);
  EXPECT_EQ(b->Progress().collective.operation, "");
  EXPECT_EQ(b->Progress().collective.sequence, 0u);
  float data[4] = {1, 2, 3, 4};
  EXPECT_TRUE(b->AllReduce(data, 4, DType::kFloat32, ReduceOp::kSum)->Wait(absl::Seconds(5)).ok());
  EXPECT_TRUE(b->Barrier()->Wait(absl::Seconds(5)).ok());
  auto unwaited = b->Broadcast(data, 3, DType::kBFloat16, 1);  // finished, never waited on
  BackendProgress p = b->Progress();
  EXPECT_EQ(p.collective.sequence, 3u);
  EXPECT_EQ(p.collective.operation, "broadcast");
  EXPECT_EQ(p.collective.count, 3u);
  EXPECT_EQ(p.collective.dtype, DType::kBFloat16);
  EXPECT_FALSE(p.collective.in_flight);
  EXPECT_FALSE(p.p2p.has_value());

  fake.SetMode(FakePlugin::kHang);
  auto hung = b->AllGather(data, 2, data, DType::kFloat16);
  auto send = b->Send(data, 3, DType::kFloat32, 1, 0);
  p = b->Progress();
  EXPECT_EQ(p.collective.sequence, 4u);
  EXPECT_EQ(p.collective.operation, "all_gather");
  EXPECT_EQ(p.collective.count, 2u);
  EXPECT_TRUE(p.collective.in_flight);
  ASSERT_TRUE(p.p2p.has_value());
  EXPECT_EQ(p.p2p->operation, "send");
  EXPECT_EQ(p.p2p->peer, 1);
  EXPECT_EQ(p.p2p->count, 3u);
  EXPECT_EQ(p.p2p->sequence, 1u);
  EXPECT_TRUE(p.p2p->in_flight);
  const absl::Duration first = p.collective.elapsed;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (b->Progress().collective.elapsed < first + absl::Milliseconds(50) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  p = b->Progress();
  EXPECT_TRUE(p.collective.in_flight);
  EXPECT_GE(p.collective.elapsed, first + absl::Milliseconds(50));

  // Aborted: both end; the latest is the all_gather, no longer in flight.
  b->Abort();
  EXPECT_TRUE(absl::IsAborted(hung->Wait(absl::Seconds(5))));
  EXPECT_TRUE(absl::IsAborted(send->Wait(absl::Seconds(5))));
  p = b->Progress();
  EXPECT_EQ(p.collective.sequence, 4u);
  EXPECT_FALSE(p.collective.in_flight);
  EXPECT_GE(p.collective.elapsed, first + absl::Milliseconds(50));
  EXPECT_FALSE(p.p2p.has_value());
  peer->Abort();
}

TEST(NcclBackendFakeTest, BootstrapTimeouts) {
  FakePlugin fake;
  NcclOptions o = FakePlugin::Options();
  o.connect_timeout = absl::Milliseconds(200);
  // Rank 0 never sets the unique id.
  auto b = CreateNcclBackend(NewInMemoryStore(), 1, 2, o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(b.status())) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("unique id"));
  // NCCL's init does not complete (a rank never joins).
  fake.SetMode(FakePlugin::kInitHang);
  b = CreateNcclBackend(NewInMemoryStore(), 0, 2, o);
  EXPECT_TRUE(absl::IsDeadlineExceeded(b.status())) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("rank 0 of 2"));
  // A stale value of the wrong size under the key.
  fake.SetMode(FakePlugin::kComplete);
  auto store = NewInMemoryStore();
  ASSERT_TRUE(store->Set("nccl_unique_id", "short").ok());
  b = CreateNcclBackend(store, 1, 2, o);
  EXPECT_TRUE(absl::IsFailedPrecondition(b.status())) << b.status();
  // Out-of-range device.
  o.device = 1;
  b = CreateNcclBackend(NewInMemoryStore(), 0, 1, o);
  EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("options.device=1"));
}

#endif  // SHARDLINE_NCCL_LOOPBACK

// --- With GPUs (and everywhere over the loopback fake) ---

TEST(NcclBackendTest, AllReduceEveryOpFloat32) {
  SKIP_UNLESS_DEVICES(1);
  for (int n : RankCounts()) {
    RunNcclRanks(n, [&](int r, Backend& b) {
      EXPECT_EQ(b.rank(), r);
      EXPECT_EQ(b.size(), n);
      for (size_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
          std::vector<float> host(count);
          for (size_t i = 0; i < count; ++i) host[i] = F(r, i);
          DeviceVector<float> dev(r, count);
          dev.Upload(host);
          SL_EXPECT_OK_WORK(b.AllReduce(dev.get(), count, DType::kFloat32, op));
          const std::vector<float> got = dev.Download();
          Mismatch m;
          for (size_t i = 0; i < count; ++i) {
            float sum = 0;
            for (int q = 0; q < n; ++q) sum += F(q, i);
            switch (op) {
              case ReduceOp::kSum:
                m.Check(i, got[i], sum);
                break;
              case ReduceOp::kAvg:  // ncclAvg may multiply by 1/n: one rounding
                m.Check(i, got[i], sum / n, 1e-5f * sum);
                break;
              case ReduceOp::kMax:
                m.Check(i, got[i], F(n - 1, i));
                break;
              case ReduceOp::kMin:
                m.Check(i, got[i], F(0, i));
                break;
            }
          }
          EXPECT_NO_MISMATCH(
              m, "n=" << n << " rank=" << r << " count=" << count << " op=" << ReduceOpName(op));
        }
      }
    });
  }
}

TEST(NcclBackendTest, AllReduceSum16Bit) {
  SKIP_UNLESS_DEVICES(1);
  for (int n : RankCounts()) {
    RunNcclRanks(n, [&](int r, Backend& b) {
      for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
        const size_t count = 4099;
        auto enc = [&](float f) {
          return dt == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
        };
        auto dec = [&](uint16_t h) {
          return dt == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
        };
        std::vector<uint16_t> host(count);
        for (size_t i = 0; i < count; ++i) host[i] = enc(F(r, i));
        DeviceVector<uint16_t> dev(r, count);
        dev.Upload(host);
        SL_EXPECT_OK_WORK(b.AllReduce(dev.get(), count, dt, ReduceOp::kSum));
        const std::vector<uint16_t> got = dev.Download();
        Mismatch m;
        for (size_t i = 0; i < count; ++i) {
          float sum = 0;
          for (int q = 0; q < n; ++q) sum += F(q, i);
          m.Check(i, dec(got[i]), sum);  // every partial sum is exact in 16 bits
        }
        EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r << " dtype=" << DTypeName(dt));
      }
    });
  }
}

TEST(NcclBackendTest, AllGatherSeparateAndInPlace) {
  SKIP_UNLESS_DEVICES(1);
  for (int n : RankCounts()) {
    RunNcclRanks(n, [&](int r, Backend& b) {
      for (size_t count : kCounts) {
        std::vector<float> in(count);
        for (size_t i = 0; i < count; ++i) in[i] = F(r, i);
        for (bool in_place : {false, true}) {
          DeviceVector<float> out(r, n * count);
          DeviceVector<float> separate(r, count);
          const float* src = separate.get();
          if (in_place) {
            std::vector<float> whole(n * count, -1.0f);
            std::copy(in.begin(), in.end(), whole.begin() + r * count);
            out.Upload(whole);
            src = out.get() + r * count;
          } else {
            separate.Upload(in);
          }
          SL_EXPECT_OK_WORK(b.AllGather(src, count, out.get(), DType::kFloat32));
          const std::vector<float> got = out.Download();
          Mismatch m;
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < count; ++i) m.Check(p * count + i, got[p * count + i], F(p, i));
          EXPECT_NO_MISMATCH(
              m, "n=" << n << " rank=" << r << " count=" << count << " in_place=" << in_place);
        }
      }
    });
  }
}

TEST(NcclBackendTest, ReduceScatterEqualAndUneven) {
  SKIP_UNLESS_DEVICES(1);
  for (int n : RankCounts()) {
    RunNcclRanks(n, [&](int r, Backend& b) {
      std::vector<std::vector<size_t>> shapes = {std::vector<size_t>(n, 1000)};
      std::vector<size_t> uneven(n);
      for (int p = 0; p < n; ++p) uneven[p] = p == 1 ? 0 : 100 * (p + 1) + 3;  // rank 1 gets 0
      shapes.push_back(uneven);
      for (const auto& counts : shapes) {
        size_t total = 0;
        for (size_t c : counts) total += c;
        std::vector<float> in(total);
        for (size_t i = 0; i < total; ++i) in[i] = F(r, i);
        DeviceVector<float> din(r, total), dout(r, counts[r]);
        din.Upload(in);
        SL_EXPECT_OK_WORK(
            b.ReduceScatter(din.get(), dout.get(), counts, DType::kFloat32, ReduceOp::kSum));
        const std::vector<float> got = dout.Download();
        size_t offset = 0;
        for (int p = 0; p < r; ++p) offset += counts[p];
        Mismatch m;
        for (size_t j = 0; j < counts[r]; ++j) {
          float sum = 0;
          for (int q = 0; q < n; ++q) sum += F(q, offset + j);
          m.Check(j, got[j], sum);
        }
        EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r << " counts[0]=" << counts[0]);
      }
      // The size of counts is checked locally.
      auto w = b.ReduceScatter(nullptr, nullptr, std::vector<size_t>(n + 1, 1), DType::kFloat32,
                               ReduceOp::kSum);
      const absl::Status s = w->Wait(absl::Seconds(5));
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("counts.size()"));
    });
  }
}

TEST(NcclBackendTest, AllToAllUnevenWithEmptyPieces) {
  SKIP_UNLESS_DEVICES(1);
  // Elements from s to d: (s + 2d) % 3 * 50 (0 for some pairs, including self).
  auto pairs = [](int s, int d) { return static_cast<size_t>((s + 2 * d) % 3) * 50; };
  auto value = [](int s, int d, size_t j) { return s * 1000.0f + d * 100.0f + (j % 97); };
  for (int n : RankCounts()) {
    RunNcclRanks(n, [&](int r, Backend& b) {
      std::vector<size_t> send(n), recv(n);
      size_t send_total = 0, recv_total = 0;
      for (int p = 0; p < n; ++p) {
        send[p] = pairs(r, p);
        recv[p] = pairs(p, r);
        send_total += send[p];
        recv_total += recv[p];
      }
      std::vector<float> in;
      for (int p = 0; p < n; ++p)
        for (size_t j = 0; j < send[p]; ++j) in.push_back(value(r, p, j));
      DeviceVector<float> din(r, send_total), dout(r, recv_total);
      din.Upload(in);
      SL_EXPECT_OK_WORK(b.AllToAll(din.get(), send, dout.get(), recv, DType::kFloat32));
      const std::vector<float> got = dout.Download();
      Mismatch m;
      size_t k = 0;
      for (int p = 0; p < n; ++p)
        for (size_t j = 0; j < recv[p]; ++j, ++k) m.Check(k, got[k], value(p, r, j));
      EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r);
    });
  }
}

TEST(NcclBackendTest, BroadcastFromEveryRoot) {
  SKIP_UNLESS_DEVICES(1);
  for (int n : RankCounts()) {
    RunNcclRanks(n, [&](int r, Backend& b) {
      for (int root = 0; root < n; ++root) {
        const size_t count = 65537;
        std::vector<float> host(count);
        for (size_t i = 0; i < count; ++i) host[i] = F(r, i);
        DeviceVector<float> dev(r, count);
        dev.Upload(host);
        SL_EXPECT_OK_WORK(b.Broadcast(dev.get(), count, DType::kFloat32, root));
        const std::vector<float> got = dev.Download();
        Mismatch m;
        for (size_t i = 0; i < count; ++i) m.Check(i, got[i], F(root, i));
        EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r << " root=" << root);
      }
      const absl::Status s = b.Broadcast(nullptr, 1, DType::kFloat32, n)->Wait(absl::Seconds(5));
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("root="));
    });
  }
}

TEST(NcclBackendTest, SendRecvRingAndBarrier) {
  SKIP_UNLESS_DEVICES(2);
  for (int n : RankCounts()) {
    if (n < 2) continue;
    RunNcclRanks(n, [&](int r, Backend& b) {
      const size_t count = 10007;
      std::vector<float> host(count);
      for (size_t i = 0; i < count; ++i) host[i] = F(r, i);
      DeviceVector<float> out(r, count), in(r, count);
      out.Upload(host);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      // Posted in the same order on both sides of every pair (NCCL matches in
      // issue order): even ranks send first, odd ranks receive first.
      std::shared_ptr<Work> s, v;
      if (r % 2 == 0) {
        s = b.Send(out.get(), count, DType::kFloat32, next, 7);
        v = b.Recv(in.get(), count, DType::kFloat32, prev, 7);
      } else {
        v = b.Recv(in.get(), count, DType::kFloat32, prev, 7);
        s = b.Send(out.get(), count, DType::kFloat32, next, 7);
      }
      SL_EXPECT_OK_WORK(s);
      SL_EXPECT_OK_WORK(v);
      const std::vector<float> got = in.Download();
      Mismatch m;
      for (size_t i = 0; i < count; ++i) m.Check(i, got[i], F(prev, i));
      EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r);
      SL_EXPECT_OK_WORK(b.Barrier());
      const absl::Status self = b.Send(out.get(), 1, DType::kFloat32, r, 0)->Wait(absl::Seconds(5));
      EXPECT_TRUE(absl::IsInvalidArgument(self)) << self;
      EXPECT_THAT(std::string(self.message()), HasSubstr("== rank"));
    });
  }
}

TEST(NcclBackendTest, BarrierAndAbortOnOneRank) {
  SKIP_UNLESS_DEVICES(1);
  RunNcclRanks(1, [&](int, Backend& b) {
    SL_EXPECT_OK_WORK(b.Barrier());
    const absl::Time start = absl::Now();
    b.Abort();
    b.Abort();  // idempotent
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    const absl::Status s = b.Barrier()->Wait(absl::Seconds(5));
    EXPECT_TRUE(absl::IsAborted(s)) << s;
  });
}

TEST(NcclBackendTest, InitTimesOutWhenARankNeverJoins) {
  SKIP_UNLESS_DEVICES(1);
  NcclOptions o = Options();
  o.connect_timeout = absl::Seconds(3);
  o.device = 0;
  const absl::Time start = absl::Now();
  auto b = CreateNcclBackend(NewInMemoryStore(), 0, 2, o);  // rank 1 never comes
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded) << b.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(NcclBackendTest, UniqueIdWaitTimesOutWhenRankZeroNeverComes) {
  SKIP_UNLESS_DEVICES(1);
  NcclOptions o = Options();
  o.connect_timeout = absl::Seconds(1);
  o.device = 0;
  auto b = CreateNcclBackend(NewInMemoryStore(), 1, 2, o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("unique id"));
}

TEST(NcclBackendTest, OpTimeoutAbortsWhenAPeerNeverCalls) {
  SKIP_UNLESS_DEVICES(2);
  absl::Notification done;
  RunNcclRanks(
      2,
      [&](int r, Backend& b) {
        if (r == 1) {  // never issues; leaves once rank 0 has given up
          done.WaitForNotificationWithTimeout(absl::Seconds(60));
          return;
        }
        DeviceVector<float> dev(0, 1024);
        const absl::Time start = absl::Now();
        const absl::Status s =
            b.AllReduce(dev.get(), 1024, DType::kFloat32, ReduceOp::kSum)->Wait(absl::Seconds(60));
        EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("NcclOptions::timeout"));
        EXPECT_LT(absl::Now() - start, absl::Seconds(30));
        const absl::Status later = b.Barrier()->Wait(absl::Seconds(5));
        EXPECT_TRUE(absl::IsDeadlineExceeded(later)) << later;  // the group stays failed
        done.Notify();
      },
      Options(absl::Seconds(2)));
}

TEST(NcclBackendTest, AbortFromAnotherThreadEndsAHangingOp) {
  SKIP_UNLESS_DEVICES(2);
  absl::Notification done;
  RunNcclRanks(2, [&](int r, Backend& b) {
    if (r == 1) {
      done.WaitForNotificationWithTimeout(absl::Seconds(60));
      return;
    }
    DeviceVector<float> dev(0, 1024);
    auto w = b.AllReduce(dev.get(), 1024, DType::kFloat32, ReduceOp::kSum);
    EXPECT_FALSE(w->IsCompleted());
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(300));
      b.Abort();
    });
    const absl::Time start = absl::Now();
    const absl::Status s = w->Wait(absl::Seconds(30));
    aborter.join();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    done.Notify();
  });
}

#ifdef SHARDLINE_NCCL_LOOPBACK
// --- Loopback only: what the fake's communicators add to the tests above ---

// The loopback fake's controls (the backend dlopen()s the same path).
struct Loopback {
  Loopback() {
    void* h = dlopen(kPlugin, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(h, nullptr) << dlerror();
    reset = reinterpret_cast<void (*)()>(dlsym(h, "shardline_fake_reset"));
    log = reinterpret_cast<size_t (*)(char*, size_t)>(dlsym(h, "shardline_fake_stream_log"));
    rendezvous = reinterpret_cast<void (*)(size_t)>(dlsym(h, "shardline_fake_set_rendezvous_bytes"));
    reset();
  }
  ~Loopback() { reset(); }
  // The stream log's lines of rank `rank`, without the "group G rank R: ".
  std::vector<std::string> StreamOf(int rank) {
    std::string text(log(nullptr, 0) + 1, '\0');
    log(text.data(), text.size());
    std::vector<std::string> out;
    const std::string tag = absl::StrCat(" rank ", rank, ": ");
    for (absl::string_view line : absl::StrSplit(text.c_str(), '\n')) {
      const size_t at = line.find(tag);
      if (at != absl::string_view::npos) out.emplace_back(line.substr(at + tag.size()));
    }
    return out;
  }
  void (*reset)() = nullptr;
  size_t (*log)(char*, size_t) = nullptr;
  void (*rendezvous)(size_t) = nullptr;
};

TEST(NcclBackendLoopbackTest, AStreamRunsItsOperationsInIssueOrder) {
  Loopback loopback;
  RunNcclRanks(2, [&](int r, Backend& b) {
    DeviceVector<float> a(r, 64), g(r, 2 * 32), c(r, 16);
    std::vector<std::shared_ptr<Work>> works;
    // Issued without waiting in between: the stream orders them.
    works.push_back(b.AllReduce(a.get(), 64, DType::kFloat32, ReduceOp::kSum));
    works.push_back(b.AllGather(a.get(), 32, g.get(), DType::kFloat32));
    works.push_back(b.Broadcast(c.get(), 16, DType::kFloat32, 1));
    works.push_back(b.Barrier());
    for (auto& w : works) SL_EXPECT_OK_WORK(w);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(loopback.StreamOf(r),
                ::testing::ElementsAre("all_reduce count=64 float32", "all_gather count=32 float32",
                                       "broadcast count=16 float32 root=1", "barrier"))
        << "rank " << r;
  }
}

TEST(NcclBackendLoopbackTest, SendsAndReceivesMatchInIssueOrderNotByTag) {
  Loopback loopback;
  RunNcclRanks(2, [&](int r, Backend& b) {
    DeviceVector<float> first(r, 4), second(r, 4);
    if (r == 0) {
      first.Upload({1, 1, 1, 1});
      second.Upload({2, 2, 2, 2});
      SL_EXPECT_OK_WORK(b.Send(first.get(), 4, DType::kFloat32, 1, /*tag=*/5));
      SL_EXPECT_OK_WORK(b.Send(second.get(), 4, DType::kFloat32, 1, /*tag=*/6));
    } else {
      // Tags in the other order: NCCL ignores them, so the first receive
      // gets the first send.
      SL_EXPECT_OK_WORK(b.Recv(first.get(), 4, DType::kFloat32, 0, /*tag=*/6));
      SL_EXPECT_OK_WORK(b.Recv(second.get(), 4, DType::kFloat32, 0, /*tag=*/5));
      EXPECT_EQ(first.Download(), (std::vector<float>{1, 1, 1, 1}));
      EXPECT_EQ(second.Download(), (std::vector<float>{2, 2, 2, 2}));
    }
  });
}

TEST(NcclBackendLoopbackTest, ALargeSendWaitsForItsReceive) {
  Loopback loopback;
  loopback.rendezvous(1024);  // sends above 1 KiB rendezvous
  absl::Notification received;
  RunNcclRanks(2, [&](int r, Backend& b) {
    DeviceVector<float> buf(r, 1024);
    if (r == 0) {
      auto small = b.Send(buf.get(), 16, DType::kFloat32, 1, 0);
      SL_EXPECT_OK_WORK(small);  // 64 bytes: finishes before rank 1 receives
      auto large = b.Send(buf.get(), 1024, DType::kFloat32, 1, 0);
      absl::SleepFor(absl::Milliseconds(200));
      EXPECT_FALSE(large->IsCompleted());  // 4 KiB: waits for the receive
      EXPECT_FALSE(received.HasBeenNotified());
      received.Notify();
      SL_EXPECT_OK_WORK(large);
    } else {
      received.WaitForNotification();
      SL_EXPECT_OK_WORK(b.Recv(buf.get(), 16, DType::kFloat32, 0, 0));
      SL_EXPECT_OK_WORK(b.Recv(buf.get(), 1024, DType::kFloat32, 0, 0));
    }
  });
}

// Every rank sends to both ring neighbours before receiving from them, with
// sends that wait for their receive (NCCL above its buffer size): on the
// group's one stream that waits forever; with p2p channels (a stream per
// direction between neighbours) it finishes, at every group size.
TEST(NcclBackendLoopbackTest, P2pChannelsLetNeighboursBothSendFirst) {
  Loopback loopback;
  loopback.rendezvous(0);
  for (int n : {2, 3, 4}) {
    NcclOptions o = Options(absl::Seconds(20));
    o.p2p_channels = true;
    RunNcclRanks(
        n,
        [&](int r, Backend& b) {
          const size_t count = 1000;
          const int next = (r + 1) % n, prev = (r + n - 1) % n;
          DeviceVector<float> out(r, count), from_next(r, count), from_prev(r, count);
          std::vector<float> host(count);
          for (size_t i = 0; i < count; ++i) host[i] = F(r, i);
          out.Upload(host);
          auto s1 = b.Send(out.get(), count, DType::kFloat32, next, 0);
          std::shared_ptr<Work> s2;
          if (prev != next) s2 = b.Send(out.get(), count, DType::kFloat32, prev, 0);
          auto r1 = b.Recv(from_prev.get(), count, DType::kFloat32, prev, 0);
          std::shared_ptr<Work> r2;
          if (prev != next) r2 = b.Recv(from_next.get(), count, DType::kFloat32, next, 0);
          for (auto& w : {s1, s2, r1, r2})
            if (w != nullptr) SL_EXPECT_OK_WORK(w);
          Mismatch m;
          const std::vector<float> got_prev = from_prev.Download();
          for (size_t i = 0; i < count; ++i) m.Check(i, got_prev[i], F(prev, i));
          if (prev != next) {
            const std::vector<float> got_next = from_next.Download();
            for (size_t i = 0; i < count; ++i) m.Check(i, got_next[i], F(next, i));
          }
          EXPECT_NO_MISMATCH(m, "n=" << n << " rank=" << r);
          // Collectives still run on the main communicator.
          SL_EXPECT_OK_WORK(b.Barrier());
        },
        o);
  }
}

TEST(NcclBackendLoopbackTest, ALostRankIsUnavailableNamingIt) {
  Loopback loopback;
  absl::Notification issued[2];
  RunNcclRanks(3, [&](int r, Backend& b) {
    DeviceVector<float> buf(r, 1000);
    if (r == 2) {  // dies before its all_reduce: its communicator is aborted
      for (auto& n : issued) n.WaitForNotification();
      absl::SleepFor(absl::Milliseconds(100));
      b.Abort();
      return;
    }
    auto w = b.AllReduce(buf.get(), 1000, DType::kFloat32, ReduceOp::kSum);
    issued[r].Notify();
    const absl::Time start = absl::Now();
    const absl::Status s = w->Wait(absl::Seconds(30));
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 of this 3-rank communicator is gone"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the 60 s op timeout
    // The group stays failed.
    EXPECT_TRUE(absl::IsUnavailable(b.Barrier()->Wait(absl::Seconds(5))));
  });
}

// A rank that reached the collective and then died: ranks that arrive
// after it fail naming it (its operation is gone from the collective, not
// read after it ended).
TEST(NcclBackendLoopbackTest, ARankLostInsideACollectiveFailsLaterArrivals) {
  Loopback loopback;
  absl::Notification gone;
  RunNcclRanks(3, [&](int r, Backend& b) {
    DeviceVector<float> buf(r, 1000);
    if (r == 2) {
      auto w = b.AllReduce(buf.get(), 1000, DType::kFloat32, ReduceOp::kSum);
      absl::SleepFor(absl::Milliseconds(100));  // waiting inside it
      b.Abort();
      EXPECT_TRUE(absl::IsAborted(w->Wait(absl::Seconds(10))));
      gone.Notify();
      return;
    }
    gone.WaitForNotification();
    const absl::Status s =
        b.AllReduce(buf.get(), 1000, DType::kFloat32, ReduceOp::kSum)->Wait(absl::Seconds(30));
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 of this 3-rank communicator is gone"));
  });
}

TEST(NcclBackendLoopbackTest, DifferentCollectivesAtOnePlaceFailNamingBothRanks) {
  Loopback loopback;
  RunNcclRanks(2, [&](int r, Backend& b) {
    DeviceVector<float> buf(r, 64);
    std::shared_ptr<Work> w = r == 0 ? b.AllReduce(buf.get(), 64, DType::kFloat32, ReduceOp::kSum)
                                     : b.AllReduce(buf.get(), 32, DType::kFloat32, ReduceOp::kSum);
    const absl::Status s = w->Wait(absl::Seconds(30));
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce count=64"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce count=32"));
  });
}

TEST(NcclBackendLoopbackTest, AReceiveOfAnotherSizeFailsNamingBothSides) {
  Loopback loopback;
  RunNcclRanks(2, [&](int r, Backend& b) {
    DeviceVector<float> buf(r, 64);
    if (r == 0) {
      SL_EXPECT_OK_WORK(b.Send(buf.get(), 64, DType::kFloat32, 1, 0));  // eager: done
    } else {
      const absl::Status s = b.Recv(buf.get(), 32, DType::kFloat32, 0, 0)->Wait(absl::Seconds(30));
      EXPECT_TRUE(absl::IsUnavailable(s)) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr("rank 0 sent 64 float32 elements where rank 1 receives 32"));
    }
  });
}

TEST(NcclBackendLoopbackTest, TwoRanksOfOneCommunicatorOnOneDeviceAreRefused) {
  Loopback loopback;
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o = Options();
      o.device = 0;
      o.connect_timeout = absl::Seconds(2);
      status[r] = CreateNcclBackend(store, r, 2, o).status();
    });
  }
  for (auto& t : threads) t.join();
  // One of the two is refused at once; the other then waits out its
  // connect timeout for a second rank that never joins.
  const int refused = absl::IsInvalidArgument(status[0]) ? 0 : 1;
  EXPECT_TRUE(absl::IsInvalidArgument(status[refused])) << status[refused];
  EXPECT_THAT(std::string(status[refused].message()), HasSubstr("one rank per device"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status[1 - refused])) << status[1 - refused];
}
#endif  // SHARDLINE_NCCL_LOOPBACK

}  // namespace
}  // namespace shardline::worker

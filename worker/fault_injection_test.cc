// --inject-fault: parsing (every error), the stall, slow compute, and the
// count-mismatch decorator on a recording fake Backend.
#include "worker/fault_injection.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"

namespace shardline::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- Parsing -----------------------------------------------------------------

TEST(FaultSpecTest, NothingGivenIsNoFault) {
  absl::StatusOr<FaultSpec> s = ParseFaultSpecs({});
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->any());
  EXPECT_EQ(s->ToString(), "");
}

TEST(FaultSpecTest, RepeatedAndCommaSeparatedFormsCombine) {
  absl::StatusOr<FaultSpec> s =
      ParseFaultSpecs({"stall_at_step=15", "slow_compute=2.5, collective_count_mismatch_at_step=3"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->any());
  EXPECT_EQ(s->stall_at_step, 15u);
  EXPECT_DOUBLE_EQ(s->slow_compute, 2.5);
  EXPECT_EQ(s->collective_count_mismatch_at_step, 3u);
  EXPECT_EQ(s->ToString(), "stall_at_step=15,slow_compute=2.5,collective_count_mismatch_at_step=3");
  absl::StatusOr<FaultSpec> one = ParseFaultSpecs({"slow_compute=1"});
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->any());  // F = 1 slows nothing
}

TEST(FaultSpecTest, EveryErrorNamesTheFlagTheItemAndTheValidForms) {
  struct Case {
    std::vector<std::string> values;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{""}, "'' has an empty item"},
      {{"stall_at_step=3,"}, "'stall_at_step=3,' has an empty item"},
      {{"stall_at_step"}, "'stall_at_step' has no '=VALUE'"},
      {{"stall_at_step="}, "'stall_at_step=' needs a whole step number N in 1..1099511627776"},
      {{"stall_at_step=0"}, "needs a whole step number N in 1..1099511627776"},
      {{"stall_at_step=-2"}, "needs a whole step number N in 1..1099511627776"},
      {{"stall_at_step=+2"}, "needs a whole step number N in 1..1099511627776"},
      {{"stall_at_step=1.5"}, "needs a whole step number N in 1..1099511627776"},
      {{"stall_at_step=x"}, "needs a whole step number N in 1..1099511627776"},
      {{"collective_count_mismatch_at_step=0"}, "needs a whole step number N in 1..1099511627776"},
      {{"slow_compute=0.5"}, "'slow_compute=0.5' needs a decimal factor F in 1..100"},
      {{"slow_compute=inf"}, "needs a decimal factor F in 1..100"},
      {{"slow_compute=nan"}, "needs a decimal factor F in 1..100"},
      {{"slow_compute=fast"}, "needs a decimal factor F in 1..100"},
      {{"stall_at_step=1", "stall_at_step=2"}, "'stall_at_step=2' is given twice"},
      {{"slow_compute=2,slow_compute=3"}, "'slow_compute=3' is given twice"},
      {{"collective_count_mismatch_at_step=1,collective_count_mismatch_at_step=1"},
       "is given twice"},
      {{"hang=3"}, "'hang=3' names no fault kind ('hang')"},
      {{"slow_compute=1e9"}, "'slow_compute=1e9' needs a decimal factor F in 1..100"},
      {{"slow_compute=101"}, "needs a decimal factor F in 1..100"},
      {{"slow_compute=0x10"}, "needs a decimal factor F in 1..100"},
      {{"stall_at_step=0x10"}, "needs a whole step number N in 1..1099511627776"},
      {{"stall_at_step=1099511627777"}, "needs a whole step number N in 1..1099511627776"},
      {{"collective_count_mismatch_at_step=99999999999999999999"},
       "needs a whole step number N in 1..1099511627776"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<FaultSpec> s = ParseFaultSpecs(c.values);
    ASSERT_FALSE(s.ok()) << c.says;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(s.status().message());
    EXPECT_THAT(m, HasSubstr("--inject-fault: ")) << m;
    EXPECT_THAT(m, HasSubstr(c.says)) << m;
    EXPECT_THAT(m, HasSubstr(kFaultForms)) << m;
  }
}

// --- Stall and slow compute --------------------------------------------------

TEST(FaultInjectorTest, TheStallBlocksBeforeItsStepOnlyUntilReleased) {
  FaultSpec spec;
  spec.stall_at_step = 3;
  std::vector<std::string> lines;  // written by the stalling thread before stalled()
  FaultInjector faults(spec, nullptr, [&](const std::string& l) { lines.push_back(l); });
  faults.BeforeStep(1);
  faults.BeforeStep(2);
  EXPECT_FALSE(faults.stalled());
  absl::Notification returned;
  std::thread training([&] {
    faults.BeforeStep(3);
    returned.Notify();
  });
  // Poll (bounded) until the thread is inside the stall.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!faults.stalled() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(faults.stalled());
  EXPECT_THAT(lines, ElementsAre("TEST FACILITY: the training thread stalls before step 3 for "
                                 "good (--inject-fault stall_at_step=3)"));
  // It stays blocked: nothing but the release ends it.
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  faults.ReleaseStallForTest();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(60)));
  training.join();
  // Once per process: step 3 again (a later generation) runs.
  faults.BeforeStep(3);
}

TEST(FaultInjectorTest, SlowComputeSleepsTheExtraComputeAndSaysHowLong) {
  FaultSpec spec;
  spec.slow_compute = 2.5;
  std::vector<absl::Duration> slept;
  FaultInjector faults(spec, [&](absl::Duration d) { slept.push_back(d); });
  EXPECT_EQ(faults.AfterStep(absl::Milliseconds(100)), absl::Milliseconds(150));
  EXPECT_EQ(faults.AfterStep(absl::ZeroDuration()), absl::ZeroDuration());
  EXPECT_EQ(faults.AfterStep(absl::Milliseconds(40)), absl::Milliseconds(60));
  EXPECT_THAT(slept, ElementsAre(absl::Milliseconds(150), absl::Milliseconds(60)));
}

TEST(FaultInjectorTest, WithoutSlowComputeNothingSleeps) {
  int sleeps = 0;
  FaultInjector faults(FaultSpec{}, [&](absl::Duration) { ++sleeps; });
  EXPECT_EQ(faults.AfterStep(absl::Seconds(1)), absl::ZeroDuration());
  EXPECT_EQ(sleeps, 0);
  faults.BeforeStep(1);  // no stall
  EXPECT_FALSE(faults.stalled());
}

// --- Count mismatch ----------------------------------------------------------

class DoneWork : public Work {
 public:
  bool IsCompleted() override { return true; }
  absl::Status Wait(absl::Duration) override { return absl::OkStatus(); }
};

// Records every call; all_reduce and reduce_scatter write a recognisable
// result (element i becomes 100 + i) into every element they were given.
class RecordingBackend : public Backend {
 public:
  struct Call {
    std::string op;
    const void* in = nullptr;
    void* out = nullptr;
    size_t count = 0;
    std::vector<size_t> counts;
    std::vector<float> input;  // what `in` held when called (float32)
    std::vector<uint8_t> bytes;  // what `in` held when called (16-bit types)
  };
  RecordingBackend(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::shared_ptr<Work> AllReduce(void* data, size_t count, DType dtype, ReduceOp) override {
    Call c{"all_reduce", data, data, count, {}, {}};
    if (dtype == DType::kFloat32) {
      const float* f = static_cast<const float*>(data);
      c.input.assign(f, f + count);
      for (size_t i = 0; i < count; ++i) static_cast<float*>(data)[i] = 100.0f + i;
    } else {
      const uint8_t* b = static_cast<const uint8_t*>(data);
      c.bytes.assign(b, b + count * ElementSize(dtype));
    }
    calls.push_back(c);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> AllGather(const void* in, size_t count, void* out, DType) override {
    calls.push_back({"all_gather", in, out, count, {}, {}});
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                      DType, ReduceOp) override {
    size_t total = 0;
    for (size_t n : counts) total += n;
    Call c{"reduce_scatter", in, out, total, counts, {}};
    const float* f = static_cast<const float*>(in);
    c.input.assign(f, f + total);
    for (size_t i = 0; i < counts[static_cast<size_t>(rank_)]; ++i) {
      static_cast<float*>(out)[i] = 100.0f + i;
    }
    calls.push_back(c);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> AllToAll(const void*, const std::vector<size_t>&, void*,
                                 const std::vector<size_t>&, DType) override {
    calls.push_back({"all_to_all"});
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> Broadcast(void* data, size_t count, DType, int) override {
    calls.push_back({"broadcast", data, data, count, {}, {}});
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> Send(const void* data, size_t count, DType, int, uint32_t) override {
    calls.push_back({"send", data, nullptr, count, {}, {}});
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> Recv(void* data, size_t count, DType, int, uint32_t) override {
    calls.push_back({"recv", nullptr, data, count, {}, {}});
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> Barrier() override {
    calls.push_back({"barrier"});
    return std::make_shared<DoneWork>();
  }
  void Abort() override { aborted = true; }

  std::vector<Call> calls;
  bool aborted = false;

 private:
  const int rank_, size_;
};

FaultInjector MismatchAt(uint64_t step) {
  FaultSpec spec;
  spec.collective_count_mismatch_at_step = step;
  return FaultInjector(spec);
}

TEST(CountMismatchTest, TheFirstAllReduceOfTheStepGetsOneMoreElementExactlyOnce) {
  FaultSpec spec;
  spec.collective_count_mismatch_at_step = 2;
  std::vector<std::string> lines;
  FaultInjector faults(spec, nullptr, [&](const std::string& l) { lines.push_back(l); });
  RecordingBackend inner(0, 2);
  std::unique_ptr<Backend> dp = faults.WrapDataParallel(&inner);
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(dp->size(), 2);
  float a[3] = {1, 2, 3};
  faults.BeforeStep(1);
  ASSERT_TRUE(dp->AllReduce(a, 3, DType::kFloat32, ReduceOp::kSum)->Wait().ok());
  faults.BeforeStep(2);
  float b[3] = {4, 5, 6};
  ASSERT_TRUE(dp->AllReduce(b, 3, DType::kFloat32, ReduceOp::kSum)->Wait().ok());
  float c[3] = {7, 8, 9};
  ASSERT_TRUE(dp->AllReduce(c, 3, DType::kFloat32, ReduceOp::kSum)->Wait().ok());
  faults.BeforeStep(2);  // a later generation's step 2: once per process
  ASSERT_TRUE(dp->AllReduce(c, 3, DType::kFloat32, ReduceOp::kSum)->Wait().ok());
  ASSERT_EQ(inner.calls.size(), 4u);
  EXPECT_EQ(inner.calls[0].count, 3u);
  EXPECT_EQ(inner.calls[0].in, a);
  // Step 2's first all_reduce: 4 elements, on a scratch copy (the caller's
  // 3 then a zero), the caller's buffer gets the result's first 3.
  EXPECT_EQ(inner.calls[1].count, 4u);
  EXPECT_NE(inner.calls[1].in, b);
  EXPECT_THAT(inner.calls[1].input, ElementsAre(4, 5, 6, 0));
  EXPECT_THAT(b, ElementsAre(100, 101, 102));
  EXPECT_EQ(inner.calls[2].count, 3u);
  EXPECT_EQ(inner.calls[2].in, c);
  EXPECT_EQ(inner.calls[3].count, 3u);
  EXPECT_EQ(faults.mismatches_issued(), 1);
  EXPECT_THAT(lines, ElementsAre("TEST FACILITY: step 2 issues its dp all_reduce of 3 elements "
                                 "as 4 (--inject-fault collective_count_mismatch_at_step=2)"));
}

TEST(CountMismatchTest, AReduceScatterGetsItsLastPieceOneLonger) {
  FaultInjector faults = MismatchAt(1);
  RecordingBackend inner(1, 2);
  std::unique_ptr<Backend> dp = faults.WrapDataParallel(&inner);
  // Other calls pass through untouched and do not consume the fault.
  float g[2] = {1, 2}, gathered[4] = {};
  faults.BeforeStep(1);
  ASSERT_TRUE(dp->AllGather(g, 2, gathered, DType::kFloat32)->Wait().ok());
  ASSERT_TRUE(dp->Barrier()->Wait().ok());
  const float in[5] = {1, 2, 3, 4, 5};
  float out[3] = {-1, -1, -1};
  ASSERT_TRUE(dp->ReduceScatter(in, out, {2, 3}, DType::kFloat32, ReduceOp::kSum)->Wait().ok());
  ASSERT_EQ(inner.calls.size(), 3u);
  EXPECT_EQ(inner.calls[0].op, "all_gather");
  EXPECT_EQ(inner.calls[0].in, g);
  EXPECT_EQ(inner.calls[1].op, "barrier");
  const RecordingBackend::Call& rs = inner.calls[2];
  EXPECT_EQ(rs.op, "reduce_scatter");
  EXPECT_THAT(rs.counts, ElementsAre(2, 4));
  EXPECT_NE(rs.in, in);
  EXPECT_NE(rs.out, out);
  EXPECT_THAT(rs.input, ElementsAre(1, 2, 3, 4, 5, 0));
  // This rank's piece (3 elements, 4 in the longer call) comes back as 3.
  EXPECT_THAT(out, ElementsAre(100, 101, 102));
  EXPECT_EQ(faults.mismatches_issued(), 1);
  ASSERT_TRUE(dp->ReduceScatter(in, out, {2, 3}, DType::kFloat32, ReduceOp::kSum)->Wait().ok());
  EXPECT_THAT(inner.calls[3].counts, ElementsAre(2, 3));
  EXPECT_EQ(inner.calls[3].in, in);
}

TEST(CountMismatchTest, NoDecoratorWithoutTheFault) {
  FaultSpec spec;
  spec.stall_at_step = 9;
  spec.slow_compute = 2;
  FaultInjector faults(spec);
  RecordingBackend inner(0, 2);
  EXPECT_EQ(faults.WrapDataParallel(&inner), nullptr);
  FaultInjector mismatch = MismatchAt(1);
  EXPECT_EQ(mismatch.WrapDataParallel(nullptr), nullptr);  // a world without dp
}

TEST(CountMismatchTest, SixteenBitElementsAreCountedInElements) {
  FaultInjector faults = MismatchAt(1);
  RecordingBackend inner(0, 2);
  std::unique_ptr<Backend> dp = faults.WrapDataParallel(&inner);
  uint16_t h[4] = {0x0101, 0x0202, 0x0303, 0x0404};
  // Broadcast is forwarded as is and does not consume the fault.
  ASSERT_TRUE(dp->Broadcast(h, 4, DType::kBFloat16, 0)->Wait().ok());
  faults.BeforeStep(1);
  ASSERT_TRUE(dp->AllReduce(h, 4, DType::kBFloat16, ReduceOp::kSum)->Wait().ok());
  ASSERT_EQ(inner.calls.size(), 2u);
  EXPECT_EQ(inner.calls[0].count, 4u);
  EXPECT_EQ(inner.calls[0].in, h);
  EXPECT_EQ(inner.calls[1].count, 5u);
  EXPECT_NE(inner.calls[1].in, h);
  EXPECT_THAT(inner.calls[1].bytes, ElementsAre(1, 1, 2, 2, 3, 3, 4, 4, 0, 0));
  EXPECT_EQ(faults.mismatches_issued(), 1);
  dp->Abort();
  EXPECT_TRUE(inner.aborted);
}

}  // namespace
}  // namespace shardline::worker

#include "worker/train/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spec/spec_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan.h"
#include "spec/job_spec.h"
#include "worker/train/data.h"
#include "worker/train/job_options.h"
#include "worker/train/trainer.h"

namespace shardline::worker::train {
namespace {

using ::testing::HasSubstr;

// The demo model: 4 layers, h=128, 4 heads, f=4h, V=256, s=64. Its
// parameter count, V*h + s*h + L*(4h^2 + 2hf + 9h + f) + 2h, is
// 32768 + 8192 + 4 * 198272 + 256 = 834304.
constexpr plan::GptConfig kModel{
    .num_layers = 4, .hidden_size = 128, .num_heads = 4, .vocab_size = 256, .seq_length = 64};
constexpr int64_t kParameters = 834304;

HostMemoryProbe Fixed(int64_t bytes) {
  return [bytes]() -> absl::StatusOr<HostMemory> { return HostMemory{bytes, "test limit"}; };
}

TEST(EstimateRankMemoryTest, OneRankHoldsSixteenBytesPerParameterInFp32) {
  ASSERT_EQ(plan::GptParameterCount(kModel), kParameters);
  absl::StatusOr<plan::MemoryEstimate> m = EstimateRankMemory(kModel, plan::ParallelConfig{}, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->params, 4 * kParameters);     // 3,337,216
  EXPECT_EQ(m->grads, 4 * kParameters);      // 3,337,216
  EXPECT_EQ(m->optimizer, 8 * kParameters);  // 6,674,432: AdamW m and v
  EXPECT_EQ(m->total(), 13'348'864);
}

TEST(EstimateRankMemoryTest, EqualsThePlannersEstimateForEveryRank) {
  // The demo job's layout at dp=2: pp=2, ZeRO-2.
  plan::ParallelConfig parallel{
      .tp = 1, .pp = 2, .dp = 2, .zero_stage = 2, .micro_batches = 4, .micro_batch_size = 3};
  absl::StatusOr<plan::Plan> plan = plan::MakePlan(kModel, parallel);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int rank = 0; rank < parallel.world_size(); ++rank) {
    absl::StatusOr<plan::MemoryEstimate> m =
        EstimateRankMemory(kModel, parallel, plan->topology.CoordinatesOf(rank));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->params, plan->memory[rank].params) << "rank " << rank;
    EXPECT_EQ(m->grads, plan->memory[rank].grads) << "rank " << rank;
    EXPECT_EQ(m->optimizer, plan->memory[rank].optimizer) << "rank " << rank;
  }
  // Rank 0 (stage 0: the embedding, V*h + s*h = 40960, and layers 0-1,
  // 198272 each; all even, so no ZeRO padding): whole fp32 parameters, and
  // ZeRO-2 over dp=2 halves gradients and AdamW moments.
  absl::StatusOr<plan::MemoryEstimate> first = EstimateRankMemory(kModel, parallel, {});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->params, 4 * (40960 + 2 * 198272));  // 1,750,016
  EXPECT_EQ(first->grads, 875'008);
  EXPECT_EQ(first->optimizer, 1'750'016);
}

TEST(EstimateRankMemoryTest, CoordinatesOutsideTheLayoutAreInvalid) {
  absl::StatusOr<plan::MemoryEstimate> m =
      EstimateRankMemory(kModel, plan::ParallelConfig{.pp = 2}, {.pp_rank = 2});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("pp_rank=2"));
}

TEST(CheckHostMemoryTest, NeedAboveTheInjectedLimitIsResourceExhaustedWithTheNumbers) {
  absl::Status s = CheckHostMemory(kModel, plan::ParallelConfig{}, {{}}, Fixed(1 << 20));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsHostMemoryShortage(s));
  const std::string message(s.message());
  EXPECT_THAT(message, HasSubstr("rank 0 (tp_rank 0, pp_rank 0, dp_rank 0) needs 12.73 MiB "
                                 "(13348864 bytes) for its model states (params 3.18 MiB, "
                                 "grads 3.18 MiB, optimizer 6.37 MiB; fp32, ZeRO stage 0"));
  EXPECT_THAT(message, HasSubstr("can get 1.00 MiB (1048576 bytes, test limit)"));
  EXPECT_THAT(message, HasSubstr("raise spec.parallel.pp or spec.parallel.tp; now tp=1 pp=1"));
  EXPECT_THAT(message, HasSubstr("zero_stage=0 at dp=1"));
  EXPECT_THAT(message, HasSubstr("spec.training.micro_batch"));
  EXPECT_THAT(message, HasSubstr("a host with more memory"));
}

TEST(CheckHostMemoryTest, ExactlyEnoughFits) {
  EXPECT_TRUE(CheckHostMemory(kModel, plan::ParallelConfig{}, {{}}, Fixed(13'348'864)).ok());
  EXPECT_EQ(CheckHostMemory(kModel, plan::ParallelConfig{}, {{}}, Fixed(13'348'863)).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CheckHostMemoryTest, RanksOfOneProcessAddUp) {
  // pp=2: stage 0 holds the embedding and layers 0-1, stage 1 layers 2-3,
  // the final LayerNorm and the tied copy of the word embedding.
  plan::ParallelConfig parallel{.pp = 2};
  absl::StatusOr<plan::Plan> plan = plan::MakePlan(kModel, parallel);
  ASSERT_TRUE(plan.ok());
  const int64_t both = plan->memory[0].total() + plan->memory[1].total();
  const std::vector<plan::RankCoordinates> ranks = {{.pp_rank = 0}, {.pp_rank = 1}};
  EXPECT_TRUE(CheckHostMemory(kModel, parallel, ranks, Fixed(both)).ok());
  absl::Status s = CheckHostMemory(kModel, parallel, ranks, Fixed(both - 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("the 2 ranks of this process need ")));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("(", both, " bytes)")));
}

TEST(CheckHostMemoryTest, AFailingProbeChecksNothing) {
  HostMemoryProbe broken = []() -> absl::StatusOr<HostMemory> {
    return absl::UnavailableError("no /proc");
  };
  EXPECT_TRUE(CheckHostMemory(kModel, plan::ParallelConfig{}, {{}}, broken).ok());
}

TEST(CheckHostMemoryTest, TheHugeDemoSpecDoesNotFitAnyHost) {
  // The attack spec: the demo job with hidden_size 65536 (`shardctl plan`:
  // 3.00 TiB per rank at pp=1).
  absl::StatusOr<v1::JobSpec> raw = spec::ReadJobSpecFile("deploy/jobs/shakespeare.yaml");
  ASSERT_TRUE(raw.ok()) << raw.status();
  raw->mutable_model()->set_hidden_size(65536);
  raw->mutable_parallel()->set_pp(1);
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(*raw);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainingOptions> options = TrainingOptionsFromSpec(*spec, /*dp=*/1);
  ASSERT_TRUE(options.ok()) << options.status();
  absl::StatusOr<plan::MemoryEstimate> m =
      EstimateRankMemory(options->model, options->parallel, {});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->total(), 16 * plan::GptParameterCount(options->model));
  // 16 bytes x 206,182,940,672 parameters ~ 3.00 TiB.
  EXPECT_EQ(plan::GptParameterCount(options->model), 206'182'940'672);
  absl::Status s =
      CheckHostMemory(options->model, options->parallel, {{}}, Fixed(int64_t{1} << 40));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs 3.00 TiB (3298927050752 bytes)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("can get 1.00 TiB (1099511627776 bytes"));
}

TEST(HostOutOfMemoryErrorTest, IsAShortage) {
  absl::Status s = HostOutOfMemoryError("building the trainer", kModel, plan::ParallelConfig{});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsHostMemoryShortage(s));
  EXPECT_FALSE(IsHostMemoryShortage(absl::ResourceExhaustedError("out of device memory")));
  EXPECT_FALSE(IsHostMemoryShortage(absl::OkStatus()));
}

// A /proc field in bytes ("MemAvailable:" of /proc/meminfo, "VmSize:" of
// /proc/self/status); -1 when absent.
int64_t ProcBytes(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kb = 0;
    if (f.size() >= 2 && f[0] == key && absl::SimpleAtoi(f[1], &kb)) return kb * 1024;
  }
  return -1;
}

// AddressSanitizer and ThreadSanitizer (.bazelrc --config=asan, tsan) map
// terabytes of shadow memory, so any RLIMIT_AS below that makes their own
// allocator die ("Failed to mmap"), and their operator new aborts instead
// of throwing std::bad_alloc: the RLIMIT_AS checks below cannot run there.
#if defined(ABSL_HAVE_ADDRESS_SANITIZER) || defined(ABSL_HAVE_THREAD_SANITIZER)
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif

// Lowers RLIMIT_AS to `bytes`; exits 0 (nothing to check) if it cannot.
void LimitAddressSpace(int64_t bytes) {
  rlimit r{};
  getrlimit(RLIMIT_AS, &r);
  r.rlim_cur = static_cast<rlim_t>(bytes);
  if (setrlimit(RLIMIT_AS, &r) != 0) _exit(0);
}

// Exits 0 when ProbeHostMemory honours an 8 GiB RLIMIT_AS.
[[noreturn]] void ProbeUnderRlimitAs() {
  constexpr int64_t kLimit = int64_t{8} << 30;
  LimitAddressSpace(kLimit);
  absl::StatusOr<HostMemory> h = ProbeHostMemory();
  const bool ok = h.ok() && h->available <= kLimit - ProcBytes("/proc/self/status", "VmSize:");
  std::fprintf(stderr, "probe: %s\n", ok ? "honours RLIMIT_AS" : "ignores RLIMIT_AS");
  _exit(ok ? 0 : 1);
}

// Builds a trainer with a 3.2 GB unit (one layer of h = 8192) with only
// 512 MiB more address space than the process has: exits 3 when Create
// returns the host-memory ResourceExhausted (printed) instead of throwing.
[[noreturn]] void CreateTrainerTooLargeForAddressSpace() {
  absl::StatusOr<Corpus> corpus = Corpus::FromBytes(std::string(4096, 'x'), 0.1);
  if (!corpus.ok()) _exit(2);
  TrainingOptions options;
  options.model = {
      .num_layers = 1, .hidden_size = 8192, .num_heads = 4, .vocab_size = 256, .seq_length = 64};
  LimitAddressSpace(ProcBytes("/proc/self/status", "VmSize:") + (int64_t{512} << 20));
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(options, {}, &*corpus);
  std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
  _exit(!t.ok() && IsHostMemoryShortage(t.status()) ? 3 : 4);
}

TEST(ProbeHostMemoryTest, NeverMoreThanMemAvailableAndHonoursRlimitAs) {
  absl::StatusOr<HostMemory> host = ProbeHostMemory();
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_GT(host->available, 0);
  // MemAvailable moves a little between two reads.
  EXPECT_LE(host->available, ProcBytes("/proc/meminfo", "MemAvailable:") + (int64_t{64} << 20));
  EXPECT_FALSE(host->limit.empty());
  if (kUnderSanitizer) GTEST_SKIP() << "RLIMIT_AS under a sanitizer (see kUnderSanitizer)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ProbeUnderRlimitAs(), ::testing::ExitedWithCode(0), "");
}

TEST(TrainerTest, BadAllocWhileBuildingIsResourceExhaustedNotACrash) {
  if (kUnderSanitizer) GTEST_SKIP() << "RLIMIT_AS under a sanitizer (see kUnderSanitizer)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CreateTrainerTooLargeForAddressSpace(), ::testing::ExitedWithCode(3),
              "RESOURCE_EXHAUSTED: out of host memory \\(std::bad_alloc\\) while building the "
              "trainer for 1 layers of hidden_size 8192");
}

}  // namespace
}  // namespace shardline::worker::train

// The worker daemon on the GPU path without a GPU: a real shardline-coordinator
// and shardline-worker processes train the same one-rank job twice, once with
// --device cpu and once with --device cuda:0 --backend nccl on the emulated
// GPU plugin (worker/gpu/testing/libshardline_gpu_emu.so: the real CUDA
// kernels and cuBLAS mapping over host memory, and the fake plugin's NCCL
// communicators, here of one rank). The GPU worker keeps its state on the
// device and must log the CPU worker's losses step for step. A job of more
// ranks cannot run this way: the fake's communicators join the ranks of one
// process, and each worker is its own process. The model is the tests' small
// one (the emulator runs one host thread per CUDA thread).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "testing/job_specs.h"
#include "testing/process_harness.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

constexpr int kSteps = 4;

// The "gen G step N/T loss X" lines of a worker's log, in order.
std::vector<std::string> LossLines(const std::string& log) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const size_t step = line.find(" step ");
    const size_t loss = line.find(" loss ");
    const size_t lr = line.find(" lr ");
    if (step == absl::string_view::npos || loss == absl::string_view::npos ||
        lr == absl::string_view::npos || !absl::StrContains(line, "gen "))
      continue;
    // "step N/T loss X lr Y grad_norm Z": everything but the timings.
    const size_t tokens = line.find(" tokens/s ");
    out.emplace_back(line.substr(step, tokens == absl::string_view::npos ? line.size() - step
                                                                           : tokens - step));
  }
  return out;
}

TEST(GpuWorkerEmuTest, NcclOnTheEmulatedGpuLogsTheCpuWorkersLosses) {
  const std::string dir = TempDir();
  std::unique_ptr<Child> coordinator;
  const std::string address =
      StartMemoryCoordinator(&coordinator, dir + "/coordinator.log");
  ASSERT_FALSE(address.empty()) << coordinator->Log();
  auto jobs = v1::JobService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (const char* job : {"cpu", "gpu"}) {
    v1::CreateJobRequest req;
    req.set_job_id(job);
    v1::JobSpec spec = fixtures::SmallSpec(/*min_workers=*/1, /*max_workers=*/1,
                                           /*global_batch=*/2, absl::Seconds(60));
    spec.mutable_data()->set_dataset_path(Runfile("data/tinyshakespeare.txt"));
    spec.mutable_data()->set_validation_fraction(0.1);
    spec.mutable_training()->set_train_steps(kSteps);
    spec.mutable_training()->set_learning_rate(1e-2);
    spec.mutable_elastic()->mutable_collective_timeout()->set_seconds(120);
    *req.mutable_spec() = spec;
    v1::CreateJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string worker = Runfile("worker/shardline-worker");
  Child cpu(worker,
            {"--coordinator", address, "--job", "cpu", "--worker-id", "c0", "--device", "cpu",
             "--log-interval", "1", "--metrics-port", "-1"},
            dir + "/cpu.log");
  Child gpu(worker,
            {"--coordinator", address, "--job", "gpu", "--worker-id", "g0", "--device", "cuda:0",
             "--backend", "nccl", "--gpu-plugin",
             Runfile("worker/gpu/testing/libshardline_gpu_emu.so"), "--log-interval", "1",
             "--metrics-port", "-1"},
            dir + "/gpu.log");
  EXPECT_EQ(cpu.WaitExit(absl::Seconds(120)), 0) << cpu.Log();
  EXPECT_EQ(gpu.WaitExit(absl::Seconds(240)), 0) << gpu.Log();
  EXPECT_TRUE(absl::StrContains(gpu.Log(), "state on cuda:0")) << gpu.Log();
  EXPECT_TRUE(absl::StrContains(cpu.Log(), "state on cpu")) << cpu.Log();
  const std::vector<std::string> cpu_losses = LossLines(cpu.Log());
  const std::vector<std::string> gpu_losses = LossLines(gpu.Log());
  for (const std::string& line : gpu_losses) std::printf("gpu:%s\n", line.c_str());
  for (const std::string& line : cpu_losses) std::printf("cpu:%s\n", line.c_str());
  ASSERT_EQ(cpu_losses.size(), static_cast<size_t>(kSteps)) << cpu.Log();
  EXPECT_EQ(gpu_losses, cpu_losses) << "cpu:\n" << cpu.Log() << "\ngpu:\n" << gpu.Log();
}

}  // namespace
}  // namespace shardline::worker

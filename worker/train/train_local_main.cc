// shardline-train-local: trains a job spec on this machine alone, every rank
// a thread with real Gloo communicators over loopback (no coordinator). For
// experiments, quality runs and benchmarks; production jobs run
// shardline-worker processes under the coordinator.
//
//   shardline-train-local deploy/jobs/shakespeare.yaml --dp 1 --steps 2000
//       --eval-interval 250 --sample-length 300   (one command line)
//
// Prints one line per --log-interval steps from rank 0:
//   step 100/2000 loss 2.4811 lr 1.00e-03 grad_norm 0.412 tokens/s 9120 comm 3.1% step_ms 84.2
// then the validation loss and, with --sample-length, a text sample.
//
// --device cuda:N runs every rank's layers on GPU N through the GPU plugin
// (--gpu-plugin, default libshardline_gpu.so next to this binary, else in its
// Bazel runfiles). Where the optimizer state lives (trainer.h "Where the
// state lives"): on the GPU at world 1, and with --backend nccl (rank r on
// GPU N + r, NCCL communicators between them); on the host with Gloo at
// world > 1, or with --host-optimizer. Without a usable GPU it exits 1
// before training, naming the cause (the CUDA error); a malformed --device
// exits 2.
// Every rank's model states (the planner's estimate, as `shardctl plan`
// prints) must fit in this host's memory together (host_memory.h): else it
// exits 1 before training, naming the sizes and what to change.
// Exit status 0 on success (and for --help, which prints the usage to
// stdout), 2 on a bad argument or spec, 1 when the corpus cannot be read, the
// ranks do not fit in host memory or a step fails (the message names the
// cause).
#include <csignal>
#include <cstdio>
#include <limits>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "spec/spec_file.h"
#include "spec/job_spec.h"
#include "worker/comm/nccl_backend.h"
#include "worker/gpu/gpu_compute_device.h"
#include "worker/gpu/gpu_plugin.h"
#include "worker/train/data.h"
#include "worker/train/host_memory.h"
#include "worker/train/job_options.h"
#include "worker/train/local_cluster.h"
#include "worker/train/ops.h"
#include "worker/train/trainer.h"

namespace shardline::worker::train {
namespace {

// Exit 2 for bad input (flags, the spec), 1 for a failure while running.
int Fail(const std::string& what, int code = 2) {
  std::cerr << "shardline-train-local: " << what << "\n";
  return code;
}

int Main(int argc, char** argv) {
  // Writes to a lost peer's socket fail with EPIPE instead of killing us.
  std::signal(SIGPIPE, SIG_IGN);
  ArgParser args("shardline-train-local SPEC");
  // Bounds that keep a typo from running for hours: an evaluation reads
  // eval_samples windows; sampling generates one byte per forward pass.
  constexpr int64_t kMaxEvalSamples = 1000000;
  constexpr int64_t kMaxSampleLength = 1 << 20;
  constexpr int64_t kSpecSteps = std::numeric_limits<int64_t>::min();  // --steps not given
  int64_t dp = 1, steps = kSpecSteps, log_interval = 10, eval_interval = 0, eval_samples = 240,
          sample_length = 0, threads = 1;
  std::string data_override, prompt = "\n", device_name = "cpu", gpu_plugin, backend = "gloo";
  bool host_optimizer = false;
  args.AddInt("dp", &dp, "data-parallel degree (world = tp * pp * dp threads); default 1");
  args.AddInt("steps", &steps, "optimizer steps (default: the spec's training.train_steps)");
  args.AddInt("log-interval", &log_interval, "print every N steps (default 10)");
  args.AddInt("eval-interval", &eval_interval,
              "validation loss every N steps (default 0: only at the end)");
  args.AddInt("eval-samples", &eval_samples, "validation samples per evaluation (default 240)");
  args.AddInt("sample-length", &sample_length, "bytes of text to sample at the end (default 0)");
  args.AddString("prompt", &prompt, "prompt of the text sample (default a newline)");
  args.AddInt("threads", &threads,
              "threads of each rank's kernels (intra-op, as torch.set_num_threads; 1..256, "
              "default 1)");
  args.AddString("data", &data_override, "corpus path (default: the spec's data.dataset_path)");
  args.AddString("device", &device_name,
                 "where the layers run: cpu (default) or cuda[:N] (the GPU plugin's CUDA math)");
  args.AddString("backend", &backend,
                 "collectives between the ranks: gloo (default) or nccl (with --device cuda[:N]: "
                 "rank r on GPU N + r)");
  args.AddBool("host-optimizer", &host_optimizer,
               "with --device cuda: keep parameters, gradients and AdamW on the host "
               "(ZeRO-Offload; not with --backend nccl)");
  args.AddString("gpu-plugin", &gpu_plugin,
                 "path of libshardline_gpu.so (default: next to this binary, else its "
                 "runfiles)");
  bool help = false;
  args.AddBool("help", &help, "print this help and exit");
  std::vector<std::string> tail(argv + 1, argv + argc);
  absl::StatusOr<std::vector<std::string>> positional = args.Parse(tail);
  if (!positional.ok()) return Fail(std::string(positional.status().message()) + "\n" + args.Usage());
  for (const std::string& p : *positional) help = help || p == "-h";
  if (help) {
    std::cout << "Usage: shardline-train-local SPEC [flags]\n"
                 "Trains job spec SPEC (YAML or JSON) on this machine, every rank a thread, e.g.\n"
                 "  shardline-train-local deploy/jobs/shakespeare.yaml --steps 200\n\n"
              << args.Usage();
    return 0;
  }
  if (positional->size() != 1) return Fail("give one job spec file (YAML or JSON)\n" + args.Usage());
  if (dp < 1) return Fail(absl::StrCat("--dp=", dp, " must be >= 1"));
  if (log_interval < 1) return Fail(absl::StrCat("--log-interval=", log_interval, " must be >= 1"));
  if (threads < 1 || threads > kMaxIntraOpThreads) {
    return Fail(absl::StrCat("--threads=", threads, " must be in 1..", kMaxIntraOpThreads));
  }
  if (eval_interval < 0) return Fail(absl::StrCat("--eval-interval=", eval_interval, " must be >= 0"));
  if (eval_samples < 1 || eval_samples > kMaxEvalSamples) {
    return Fail(absl::StrCat("--eval-samples=", eval_samples, " must be in 1..", kMaxEvalSamples));
  }
  if (sample_length < 0 || sample_length > kMaxSampleLength) {
    return Fail(absl::StrCat("--sample-length=", sample_length, " must be in 0..",
                             kMaxSampleLength, " (bytes)"));
  }

  if (backend != "gloo" && backend != "nccl") {
    return Fail(absl::StrCat("--backend=", backend, " is not one of gloo, nccl"));
  }
  if (backend == "nccl" && device_name == "cpu") {
    return Fail("--backend nccl needs --device cuda[:N] (NCCL exchanges GPU memory)");
  }
  if (backend == "nccl" && host_optimizer) {
    return Fail("--host-optimizer keeps the state in host memory, which NCCL cannot read: use "
                "--backend gloo with it");
  }
  if (host_optimizer && device_name == "cpu") {
    return Fail("--host-optimizer needs --device cuda[:N] (on the CPU the state is host memory "
                "already)");
  }

  absl::StatusOr<v1::JobSpec> raw = spec::ReadJobSpecFile((*positional)[0]);
  if (!raw.ok()) return Fail(std::string(raw.status().message()));
  if (!data_override.empty()) raw->mutable_data()->set_dataset_path(data_override);
  if (steps != kSpecSteps && steps < 1) {
    return Fail(absl::StrCat("--steps=", steps,
                             " must be >= 1 (optimizer steps; leave it out for the spec's "
                             "training.train_steps)"));
  }
  if (steps != kSpecSteps) raw->mutable_training()->set_train_steps(static_cast<uint64_t>(steps));
  absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(*raw);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  absl::StatusOr<TrainingOptions> options = TrainingOptionsFromSpec(*spec, static_cast<int>(dp));
  if (!options.ok()) return Fail(std::string(options.status().message()));
  // Every rank is a thread of this process: all of their model states must
  // fit in this host's memory together.
  absl::StatusOr<plan::Topology> topology = plan::Topology::Create(
      options->parallel.tp, options->parallel.pp, options->parallel.dp);
  if (!topology.ok()) return Fail(std::string(topology.status().message()));
  std::vector<plan::RankCoordinates> ranks;
  for (int r = 0; r < topology->world_size(); ++r) ranks.push_back(topology->CoordinatesOf(r));
  if (absl::Status s = CheckHostMemory(options->model, options->parallel, ranks, ProbeHostMemory);
      !s.ok()) {
    return Fail(std::string(s.message()), IsHostMemoryShortage(s) ? 1 : 2);
  }
  absl::StatusOr<Corpus> corpus =
      Corpus::Load(spec->data().dataset_path(), spec->data().validation_fraction());
  if (!corpus.ok()) return Fail(std::string(corpus.status().message()), 1);
  // The run ends with a validation loss: say so now, not after training.
  if (corpus->validation_size() <= static_cast<int64_t>(options->model.seq_length)) {
    return Fail(absl::StrCat(
        "the validation split (data.validation_fraction=", spec->data().validation_fraction(),
        " of ", spec->data().dataset_path(), ": ", corpus->validation_size(),
        " bytes) must be longer than model.seq_length=", options->model.seq_length,
        ": this program reports a validation loss; raise data.validation_fraction (e.g. 0.1)"));
  }
  SetIntraOpThreads(static_cast<int>(threads));
  const bool on_gpu = device_name != "cpu";
  // --backend nccl: rank r on GPU first_gpu + r, for its layers and its
  // communicators.
  int first_gpu = 0;
  if (on_gpu) {
    absl::StatusOr<int> ordinal = GpuComputeDevice::Ordinal(device_name);
    if (!ordinal.ok()) return Fail(std::string(ordinal.status().message()));
    first_gpu = *ordinal;
  }
  auto rank_device = [&](int rank) {
    return backend == "nccl" ? absl::StrCat("cuda:", first_gpu + rank) : device_name;
  };
  if (on_gpu) {
    // Fail before training, naming the cause, when a rank's GPU is not
    // usable (with NCCL every rank has its own).
    const int gpus = backend == "nccl" ? options->parallel.world_size() : 1;
    for (int r = 0; r < gpus; ++r) {
      const std::string name = rank_device(r);
      absl::StatusOr<std::unique_ptr<GpuComputeDevice>> probe =
          GpuComputeDevice::FromName(name, gpu_plugin);
      if (probe.ok()) continue;
      // The cause first: CUDA's own text for "no GPU" can mislead
      // ("driver version is insufficient").
      const bool unusable = absl::IsUnavailable(probe.status());
      return Fail(absl::StrCat("--device ", device_name,
                               gpus > 1 ? absl::StrCat(" (rank ", r, " on ", name, ")") : "",
                               unusable ? ": no usable NVIDIA GPU, driver or plugin here (" : ": ",
                               probe.status().message(),
                               unusable ? "): use --device cpu (or --gpu-plugin PATH)"
                               : gpus > 1 ? "; --backend nccl needs a GPU per rank (world = "
                                            "tp * pp * dp)"
                                          : ""),
                  absl::IsInvalidArgument(probe.status()) ? 2 : 1);
    }
  }

  const int64_t total = static_cast<int64_t>(spec->training().train_steps());
  const plan::ParallelConfig& p = options->parallel;
  std::printf("shardline-train-local: %s  device=%s  precision=%s  layers=%lld hidden=%lld "
              "heads=%lld seq=%lld  "
              "tp=%d pp=%d vpp=%d dp=%d zero_stage=%d schedule=%s  global_batch=%lld "
              "(micro_batch %lld x %d x dp %d)  steps=%lld\n",
              spec->name().c_str(), device_name.c_str(),
              options->parallel.precision == plan::Precision::kMixed ? "bf16" : "fp32",
              static_cast<long long>(options->model.num_layers),
              static_cast<long long>(options->model.hidden_size),
              static_cast<long long>(options->model.num_heads),
              static_cast<long long>(options->model.seq_length), p.tp, p.pp, p.vpp, p.dp,
              p.zero_stage, std::string(plan::ScheduleName(p.schedule)).c_str(),
              static_cast<long long>(p.global_batch()),
              static_cast<long long>(p.micro_batch_size), p.micro_batches, p.dp,
              static_cast<long long>(total));
  std::fflush(stdout);

  BackendFactory factory = nullptr;  // Gloo
  if (backend == "nccl") {
    factory = [&](std::shared_ptr<Store> store, plan::GroupKind kind, int rank, int group_rank,
                  int group_size) {
      NcclOptions o;
      o.plugin_path = gpu_plugin;
      o.device = first_gpu + rank;
      o.p2p_channels = kind == plan::GroupKind::kPp;
      return CreateNcclBackend(std::move(store), group_rank, group_size, o);
    };
  }

  const absl::Time start = absl::Now();
  auto run_rank = [&](int rank, const RankGroups& groups) -> absl::Status {
    // One GPU device per rank (thread), declared first so it outlives the trainer.
    std::unique_ptr<GpuComputeDevice> gpu;
    TrainingOptions rank_options = *options;
    rank_options.host_optimizer = host_optimizer;
    if (on_gpu) {
      absl::StatusOr<std::unique_ptr<GpuComputeDevice>> d =
          GpuComputeDevice::FromName(rank_device(rank), gpu_plugin);
      if (!d.ok()) return d.status();
      gpu = *std::move(d);
      rank_options.device = gpu.get();
    }
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(rank_options, groups, &*corpus);
    if (!trainer.ok()) return trainer.status();
    if (rank == 0) {
      std::printf("optimizer state on %s, collectives over %s\n",
                  (*trainer)->state_location().c_str(),
                  p.world_size() == 1 ? "none (world 1)" : backend.c_str());
      std::fflush(stdout);
    }
    absl::Duration window_time, window_comm;
    int64_t window_tokens = 0;
    for (int64_t s = 0; s < total; ++s) {
      absl::StatusOr<StepStats> st = (*trainer)->TrainStep();
      if (!st.ok()) return st.status();
      window_time += st->time;
      window_comm += st->comm_time;
      window_tokens += st->tokens;
      if (rank == 0 && ((s + 1) % log_interval == 0 || s == 0 || s + 1 == total)) {
        const double secs = absl::ToDoubleSeconds(window_time);
        std::printf("step %lld/%lld loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f comm %.1f%% "
                    "step_ms %.1f\n",
                    static_cast<long long>(s + 1), static_cast<long long>(total), st->loss,
                    st->learning_rate, st->grad_norm, secs > 0 ? window_tokens / secs : 0.0,
                    secs > 0 ? 100.0 * absl::ToDoubleSeconds(window_comm) / secs : 0.0,
                    absl::ToDoubleMilliseconds(st->time));
        std::fflush(stdout);
        window_time = window_comm = absl::ZeroDuration();
        window_tokens = 0;
      }
      if (eval_interval > 0 && (s + 1) % eval_interval == 0 && s + 1 != total) {
        absl::StatusOr<double> val = (*trainer)->EvaluateValidation(eval_samples);
        if (!val.ok()) return val.status();
        if (rank == 0) std::printf("step %lld validation loss %.4f\n", static_cast<long long>(s + 1), *val);
      }
    }
    absl::StatusOr<double> val = (*trainer)->EvaluateValidation(eval_samples);
    if (!val.ok()) return val.status();
    if (rank == 0) {
      std::printf("final validation loss %.4f nats/byte (%lld samples) after %lld steps in %.1f s\n",
                  *val, static_cast<long long>(eval_samples), static_cast<long long>(total),
                  absl::ToDoubleSeconds(absl::Now() - start));
    }
    if (sample_length > 0) {
      absl::StatusOr<std::string> text = (*trainer)->Sample(prompt, sample_length, 0.8, 1);
      if (!text.ok()) return text.status();
      if (rank == 0) std::printf("--- sample (temperature 0.8) ---\n%s%s\n---\n", prompt.c_str(), text->c_str());
    }
    std::fflush(stdout);
    return absl::OkStatus();
  };
  auto guarded_rank = [&](int rank, const RankGroups& groups) {
    // The trainer turns its own std::bad_alloc into a status; this catches
    // the rest of a rank's work (evaluation, sampling, logging).
    try {
      return run_rank(rank, groups);
    } catch (const std::bad_alloc&) {
      return HostOutOfMemoryError(absl::StrCat("running rank ", rank), options->model, p);
    }
  };
  absl::Status status = factory == nullptr ? RunLocalCluster(p, guarded_rank)
                                           : RunLocalCluster(p, guarded_rank, factory);
  if (!status.ok()) return Fail(std::string(status.message()), 1);
  return 0;
}

}  // namespace
}  // namespace shardline::worker::train

int main(int argc, char** argv) { return shardline::worker::train::Main(argc, argv); }

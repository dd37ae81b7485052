// shardline-worker: one daemon per rank. Joins a job, waits for its
// assignment, builds its communicators (Gloo, or NCCL with --backend nccl,
// bootstrapped through the coordinator's rendezvous store), checks them with
// a barrier and an all_reduce, restores
// the assignment's checkpoint and trains (worker/training_loop.h) until
// train_steps, saving checkpoints; on a generation change it aborts its
// communicators, re-joins and continues in the same process.
//
//   shardline-worker --coordinator HOST:PORT[,HOST:PORT...] --job ID [--worker-id ID]
//       [--device cpu|cuda:N] [--backend auto|gloo|nccl] [--token T]
//       [--host NAME] [--interface IPV4] [--tls-ca F] [--tls-cert F --tls-key F]
//       [--timeout D] [--connect-timeout D] [--log-interval N]
//       [--sample-length N] [--threads N] [--metrics-port N [--metrics-host ADDR]]
//       [--inject-fault KIND=VALUE[,KIND=VALUE...]]...
//
// --inject-fault is a TEST FACILITY (worker/fault_injection.h), off unless
// given: stall_at_step=N, slow_compute=F, collective_count_mismatch_at_step=N.
//
// --coordinator (else $SHARDLINE_COORDINATOR) names one coordinator, or every
// replica of a highly available one, comma-separated: the worker's calls go
// to the leader and follow it when it changes (client/coordinator_channels.h).
//
// Exit status: 0 after STOP (job COMPLETED or CANCELLED, or this worker
// drained) or SIGINT/SIGTERM (after LeaveJob); 1 when the job FAILED, when
// the coordinator excluded this worker (its own errors ended too many
// generations, or it held the job up: LOSS_REASON_HUNG), or on a runtime
// error; 2 on bad flags.
//
// After STOP the training thread has kStopGrace to return; one that does
// not (it is stuck: the reason a hung rank is evicted) cannot be joined, so
// the process logs "training thread did not return within 5 s after STOP:
// exiting" and exits 1 at once (_exit: no LeaveJob, no destructors; the
// coordinator has already declared it lost).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/log.h"
#include "client/coordinator_client.h"
#include "worker/agent.h"
#include "worker/checkpointer.h"
#include "worker/comm/nccl_backend.h"
#include "worker/communicators.h"
#include "worker/exit_watchdog.h"
#include "worker/fault_injection.h"
#include "worker/rank_progress.h"
#include "metrics/metrics.h"
#include "worker/gpu/gpu_compute_device.h"
#include "worker/train/parallel.h"
#include "worker/training_loop.h"
#include "worker/worker_metrics.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

std::atomic<bool> g_shutdown{false};

// How long the training thread has to return after STOP (see the file
// comment).
constexpr absl::Duration kStopGrace = absl::Seconds(5);

// True when STOP's reason says the coordinator excluded this incarnation
// (server/coordinator_failure.cc, coordinator_membership.cc): its answer to
// ReportError ("excluded: ..."), or to its re-join after the generation
// ended ("worker 'W' (incarnation N) is excluded from job 'J': ...", also
// for a rank evicted as hung).
bool IsExclusion(const std::string& reason) {
  return absl::StartsWith(reason, "excluded: ") ||
         absl::StrContains(reason, ") is excluded from job '");
}

// Every log line carries the job, generation and rank it is about
// ("job=shakespeare gen=2 rank=1"; rank=- for a spare or before an
// assignment), so lines of many workers can be merged and filtered.
ABSL_CONST_INIT absl::Mutex g_log_mu(absl::kConstInit);
std::string g_log_place ABSL_GUARDED_BY(g_log_mu) = "job=- gen=- rank=-";

void SetLogPlace(const std::string& job, uint64_t generation, int64_t rank) {
  absl::MutexLock lock(&g_log_mu);
  g_log_place = absl::StrCat("job=", job, " gen=",
                             generation == 0 ? std::string("-") : absl::StrCat(generation),
                             " rank=", rank < 0 ? std::string("-") : absl::StrCat(rank));
}

void Log(const std::string& line) {
  std::string place;
  {
    absl::MutexLock lock(&g_log_mu);
    place = g_log_place;
  }
  LogLine(place, line);  // common/log.h: one format for every program
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

bool ValidDevice(const std::string& d) {
  if (d == "cpu") return true;
  absl::string_view rest = d;
  int n;
  return absl::ConsumePrefix(&rest, "cuda:") && absl::SimpleAtoi(rest, &n) && n >= 0;
}

// Holds the communicators of the current generation; aborts them from the
// directive callback.
class CommHolder {
 public:
  void Set(std::shared_ptr<Communicators> c) {
    absl::MutexLock lock(&mu_);
    comms_ = std::move(c);
  }
  std::shared_ptr<Communicators> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(comms_);
  }
  // Aborts the held communicators if they are older than `generation`.
  void AbortBefore(uint64_t generation) {
    std::shared_ptr<Communicators> c;
    {
      absl::MutexLock lock(&mu_);
      c = comms_;
    }
    if (c != nullptr && c->generation() < generation) c->Abort();
  }
  // The held communicators' operations, when they are `generation`'s.
  void Progress(uint64_t generation, v1::RankProgress* out) {
    std::shared_ptr<Communicators> c;
    {
      absl::MutexLock lock(&mu_);
      c = comms_;
    }
    if (c != nullptr && c->generation() == generation) c->Progress(out);
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<Communicators> comms_ ABSL_GUARDED_BY(mu_);
};

// After a ReportError: the coordinator's answer, with this rank's own error,
// so a survivor's log names what held the job up (a RESTART's reason names
// the culprit rank when the coordinator knows it).
void LogReportAnswer(uint64_t gen, uint32_t rank, const absl::Status& own,
                     const absl::StatusOr<v1::Directive>& answer) {
  if (!answer.ok()) {
    Log(absl::StrCat("ReportError: ", answer.status().message()));
  } else if (answer->has_restart_at_generation() &&
             !answer->restart_at_generation().reason().empty()) {
    Log(absl::StrCat("generation ", gen, " rank ", rank, ": the coordinator restarts at generation ",
                     answer->restart_at_generation().generation(), ": ",
                     answer->restart_at_generation().reason(), " (this rank's error: ",
                     own.message(), ")"));
  } else if (answer->has_stop()) {
    Log(absl::StrCat("generation ", gen, " rank ", rank, ": the coordinator answered STOP: ",
                     answer->stop().reason(), " (this rank's error: ", own.message(), ")"));
  }
}

int Run(int argc, char** argv) {
  ArgParser parser("shardline-worker");
  client::ConnectionFlags connection_flags;
  connection_flags.Register(parser);
  std::string job, worker_id, device = "cpu", backend_flag = "auto", host, interface = "127.0.0.1";
  std::string connect_timeout = "10s";
  bool help = false;
  int64_t log_interval = 10, sample_length = 0, threads = 1, metrics_port = -1;
  parser.AddInt("metrics-port", &metrics_port,
                "serve Prometheus /metrics and /healthz on this port of --metrics-host (0 picks "
                "one; default off)");
  std::string metrics_host;
  parser.AddString("metrics-host", &metrics_host,
                   "address the metrics port listens on (default: the --interface address; "
                   "0.0.0.0 or :: for every interface)");
  parser.AddInt("log-interval", &log_interval, "log a training line every N steps (default 10)");
  parser.AddInt("sample-length", &sample_length,
                "bytes of text to sample from the model after the last step (default 0)");
  parser.AddInt("threads", &threads,
                "threads of the rank's kernels (intra-op, as torch.set_num_threads; 1..256, "
                "default 1)");
  parser.AddString("connect-timeout", &connect_timeout,
                   "how long to keep retrying an unreachable coordinator at start (default 10s)");
  parser.AddString("job", &job, "job id to join (required)");
  parser.AddString("worker-id", &worker_id, "stable slot name (default HOST:DEVICE)");
  std::string gpu_plugin;
  parser.AddString("device", &device,
                   "cpu or cuda:N: where the layers' math runs (default cpu; cuda:N needs the "
                   "GPU plugin and a GPU)");
  parser.AddString("gpu-plugin", &gpu_plugin,
                   "path of libshardline_gpu.so (default: next to this binary)");
  parser.AddString("backend", &backend_flag,
                   "auto, gloo or nccl (default auto: Gloo; nccl needs --device cuda:N and "
                   "keeps the trainer's state on the GPU)");
  parser.AddString("host", &host, "host name reported to the coordinator (default hostname)");
  parser.AddString("interface", &interface,
                   "IPv4 address Gloo binds and advertises (default 127.0.0.1)");
  std::vector<std::string> fault_flags;
  parser.AddStrings("inject-fault", &fault_flags,
                    absl::StrCat("TEST FACILITY, off unless given (repeatable or "
                                 "comma-separated): ", kFaultForms));
  parser.AddBool("help", &help, "print this help");
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<std::vector<std::string>> positional = parser.Parse(args);
  if (help) {
    std::cout << parser.Usage();
    return 0;
  }
  if (!positional.ok()) {
    std::cerr << "shardline-worker: " << positional.status().message() << "\n" << parser.Usage();
    return 2;
  }
  if (!positional->empty()) {
    std::cerr << "shardline-worker: unexpected argument '" << (*positional)[0] << "'\n";
    return 2;
  }
  absl::StatusOr<client::ConnectionOptions> connection = connection_flags.Resolve(parser);
  if (!connection.ok()) {
    std::cerr << "shardline-worker: " << connection.status().message() << "\n";
    return 2;
  }
  absl::Duration connect_timeout_d;
  if (!absl::ParseDuration(connect_timeout, &connect_timeout_d) ||
      connect_timeout_d <= absl::ZeroDuration() || connect_timeout_d == absl::InfiniteDuration()) {
    std::cerr << "shardline-worker: --connect-timeout='" << connect_timeout
              << "' is not a positive duration; give e.g. --connect-timeout=30s\n";
    return 2;
  }
  if (metrics_port < -1 || metrics_port > 65535) {
    std::cerr << "shardline-worker: --metrics-port=" << metrics_port
              << " is not in 0..65535 (or -1 for off)\n";
    return 2;
  }
  for (const auto& [flag, value, min] : {std::tuple<const char*, int64_t, int64_t>{
                                             "log-interval", log_interval, 1},
                                         {"sample-length", sample_length, 0}}) {
    if (value < min) {
      std::cerr << "shardline-worker: --" << flag << "=" << value << " must be >= " << min << "\n";
      return 2;
    }
  }
  if (sample_length > (int64_t{1} << 20)) {  // one forward pass a byte: keep a typo from running for hours
    std::cerr << "shardline-worker: --sample-length=" << sample_length
              << " must be in 0..1048576 (bytes)\n";
    return 2;
  }
  if (threads < 1 || threads > train::kMaxIntraOpThreads) {
    std::cerr << "shardline-worker: --threads=" << threads << " must be in 1.."
              << train::kMaxIntraOpThreads << "\n";
    return 2;
  }
  absl::StatusOr<FaultSpec> faults = ParseFaultSpecs(fault_flags);
  if (!faults.ok()) {
    std::cerr << "shardline-worker: " << faults.status().message() << "\n";
    return 2;
  }
  if (job.empty()) {
    std::cerr << "shardline-worker: --job is required (the job id given to shardctl job create)\n";
    return 2;
  }
  if (parser.WasSet("worker-id") && worker_id.empty()) {
    std::cerr << "shardline-worker: --worker-id is empty; give a stable slot name (1..128 "
                 "printable ASCII bytes, e.g. node3:cuda:1), or leave the flag out for "
                 "HOST:DEVICE\n";
    return 2;
  }
  if (device == "cuda") device = "cuda:0";  // as shardline-train-local takes it
  if (!ValidDevice(device)) {
    std::cerr << "shardline-worker: --device='" << device << "' is not cpu, cuda or cuda:N\n";
    return 2;
  }
  v1::Backend backend;
  if (backend_flag == "auto") {
    backend = v1::BACKEND_UNSPECIFIED;
  } else if (backend_flag == "gloo") {
    backend = v1::BACKEND_GLOO;
  } else if (backend_flag == "nccl") {
    backend = v1::BACKEND_NCCL;
  } else {
    std::cerr << "shardline-worker: --backend='" << backend_flag
              << "' is not one of auto, gloo, nccl\n";
    return 2;
  }
  if (backend == v1::BACKEND_NCCL && device == "cpu") {
    std::cerr << "shardline-worker: --backend=nccl needs --device=cuda:N\n";
    return 2;
  }
  if (backend == v1::BACKEND_NCCL && faults->collective_count_mismatch_at_step.has_value()) {
    // The injected mismatch copies the caller's buffers in host memory.
    std::cerr << "shardline-worker: --inject-fault collective_count_mismatch_at_step works "
                 "with Gloo only; use --backend gloo with it\n";
    return 2;
  }
  // The GPU, if any, is checked before joining: a worker that cannot use
  // its device must not take a rank.
  std::unique_ptr<GpuComputeDevice> gpu;
  if (device != "cpu") {
    absl::StatusOr<std::unique_ptr<GpuComputeDevice>> d =
        GpuComputeDevice::FromName(device, gpu_plugin);
    if (!d.ok()) {
      // The cause first: CUDA's own text for "no GPU" can mislead
      // ("driver version is insufficient").
      const bool unusable = absl::IsUnavailable(d.status());
      std::cerr << "shardline-worker: --device=" << device << ": "
                << (unusable ? "no usable NVIDIA GPU, driver or plugin here (" : "")
                << d.status().message()
                << (unusable ? "): use --device cpu (or --gpu-plugin PATH)" : "") << "\n";
      return d.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    gpu = *std::move(d);
  }

  {
    // The address Gloo binds must be a local IPv4 address; finding out only
    // when communicators are built would fail every generation.
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool ok = ::inet_pton(AF_INET, interface.c_str(), &addr.sin_addr) == 1 && fd >= 0 &&
                    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) {
      std::cerr << "shardline-worker: --interface='" << interface
                << "' is not an IPv4 address of this machine (e.g. 127.0.0.1, or the address "
                   "of the network the workers share)\n";
      return 2;
    }
  }

  // A write to a socket whose peer died (Gloo's writev to a lost rank) must
  // fail with EPIPE, not kill this process: the default SIGPIPE action
  // silently killed survivors of a peer's SIGKILL.
  std::signal(SIGPIPE, SIG_IGN);

  // SIGINT / SIGTERM: leave the job and exit. Blocked before any thread
  // starts (the agent's, gRPC's) so every thread inherits the mask and only
  // the waiting thread below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  WorkerAgentOptions options;
  options.connection = *connection;
  options.job_id = job;
  options.host = host;
  options.log = [](absl::string_view line) { Log(std::string(line)); };
  if (options.host.empty()) {
    char buf[256] = {};
    ::gethostname(buf, sizeof(buf) - 1);
    options.host = buf;
  }
  options.worker_id = worker_id.empty() ? absl::StrCat(options.host, ":", device) : worker_id;
  options.device = device;
  // auto is Gloo (the trainer's state then stays on the host with
  // --device cuda:N); nccl puts the communicators and the state on the GPU.
  options.backend = backend == v1::BACKEND_NCCL ? v1::BACKEND_NCCL : v1::BACKEND_GLOO;
  options.connect_timeout = connect_timeout_d;
  // Outlive the agent, whose threads call into them (progress source,
  // directive callback).
  RankProgressTracker progress;
  CommHolder holder;
  std::unique_ptr<FaultInjector> injector;
  if (faults->any()) injector = std::make_unique<FaultInjector>(*faults, nullptr, Log);
  ExitWatchdog watchdog(kStopGrace, [](absl::Duration grace) {
    Log(absl::StrCat("training thread did not return within ", absl::FormatDuration(grace),
                     " after STOP: exiting"));
    ::_exit(1);
  });
  // Production wiring: the coordinator's gRPC clients over one channel, real time.
  static const RealClock clock;
  absl::StatusOr<client::CoordinatorClients> clients =
      client::ConnectCoordinator(options.connection, Checkpointer::kMinCallTimeout);
  absl::StatusOr<std::unique_ptr<WorkerAgent>> created =
      clients.ok() ? WorkerAgent::Create(options, *std::move(clients), &clock) : clients.status();
  if (!created.ok()) {
    std::cerr << "shardline-worker: " << created.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<WorkerAgent> agent = *std::move(created);

  std::thread([signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    g_shutdown.store(true);
  }).detach();

  SetLogPlace(job, 0, -1);
  if (injector != nullptr) {
    Log(absl::StrCat("TEST FACILITY: injecting faults: ", injector->spec().ToString()));
  }
  WorkerMetrics metrics(job, agent->worker_id());
  std::unique_ptr<metrics::MetricsHttpServer> metrics_server;
  if (metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> started =
        metrics::MetricsHttpServer::Start(parser.WasSet("metrics-host") ? metrics_host : interface,
                                          static_cast<int>(metrics_port),
                                          [&metrics] { return metrics.Render(); });
    if (!started.ok()) {
      std::cerr << "shardline-worker: --metrics-host/--metrics-port: "
                << started.status().message() << "\n";
      return 2;
    }
    metrics_server = *std::move(started);
    Log(absl::StrCat("metrics on port ", metrics_server->port(), " of ", metrics_server->address(),
                     " (GET /metrics, /healthz)"));
  }

  TrainingLoopOptions loop_options;
  loop_options.metrics = &metrics;
  loop_options.log_interval = log_interval;
  loop_options.sample_length = sample_length;
  loop_options.threads = static_cast<int>(threads);
  loop_options.log = Log;
  loop_options.device = gpu.get();  // null: the CPU
  loop_options.progress = &progress;
  loop_options.faults = injector.get();
  TrainingLoop loop(agent.get(), loop_options);

  agent->SetProgressSource([&progress, &holder](uint64_t generation) {
    v1::RankProgress p;
    progress.Fill(generation, &p);
    holder.Progress(generation, &p);
    return p;
  });
  agent->SetDirectiveCallback([&holder, &loop, &watchdog](const v1::Directive& d) {
    if (d.has_restart_at_generation()) {
      loop.NoteGenerationEnded(absl::Now(), d.restart_at_generation().reason());
      holder.AbortBefore(d.restart_at_generation().generation());
    } else if (d.has_checkpoint()) {
      loop.RequestCheckpoint();
    } else if (d.has_stop()) {
      holder.AbortBefore(UINT64_MAX);
      watchdog.Arm();
    }
  });

  // Connect retries for up to --connect-timeout: say so rather than stay
  // silent meanwhile.
  Log(absl::StrCat("joining job '", job, "' as ", options.worker_id, " at ",
                   options.connection.address, " (retrying while it does not answer; "
                   "--connect-timeout ", absl::FormatDuration(connect_timeout_d), ")"));
  if (absl::Status s = agent->Connect(); !s.ok()) {
    Log(absl::StrCat("cannot join job '", job, "': ", s.message()));
    return 1;
  }
  Log(absl::StrCat("joined job '", job, "' as ", agent->worker_id(), " (incarnation ",
                   agent->incarnation(), ") at generation ", agent->generation()));

  std::string stop_reason;
  v1::JobPhase stop_phase = v1::JOB_PHASE_UNSPECIFIED;
  while (!g_shutdown.load() && !agent->stopped()) {
    absl::StatusOr<v1::Assignment> a = agent->WaitForAssignment(absl::Seconds(2));
    if (!a.ok()) {
      if (a.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      if (agent->stopped()) break;
      Log(absl::StrCat("cannot get an assignment: ", a.status().message()));
      return 1;
    }
    const uint64_t gen = a->generation();
    const v1::JobSpec spec = agent->spec();
    SetLogPlace(job, gen, a->spare() ? -1 : static_cast<int64_t>(a->rank()));
    metrics.SetPlace(gen, a->spare() ? -1 : static_cast<int64_t>(a->rank()));
    if (a->spare()) {
      Log(absl::StrCat("generation ", gen, ": spare (world ", a->world_size(), ")"));
      agent->SetProgress(a->start_step(), v1::WORKER_STATE_WAITING);
    } else {
      agent->SetProgress(a->start_step(), v1::WORKER_STATE_BUILDING_COMMUNICATORS);
      GlooOptions gloo;
      gloo.interface_address = interface;
      if (spec.elastic().has_collective_timeout()) {
        gloo.timeout = FromProto(spec.elastic().collective_timeout());
        gloo.connect_timeout = gloo.timeout;
      }
      std::optional<NcclOptions> nccl;
      if (options.backend == v1::BACKEND_NCCL) {
        nccl.emplace();
        nccl->plugin_path = gpu_plugin;
        nccl->device = gpu->ops().device();
      }
      absl::StatusOr<std::unique_ptr<Communicators>> built =
          Communicators::Build(*a, agent->rendezvous(), agent->clock(), agent->fence(), gloo,
                               agent->GenerationToken(gen), nccl);
      absl::Status status = built.status();
      std::shared_ptr<Communicators> comms;
      if (built.ok()) {
        comms = *std::move(built);
        holder.Set(comms);
        // A restart that arrived while building found nothing to abort.
        if (agent->generation_over() || agent->generation() != gen) comms->Abort();
        status = comms->Check(gloo.timeout);
      }
      if (!status.ok()) {
        if (agent->generation_over() || agent->generation() != gen ||
            status.code() == absl::StatusCode::kAborted) {
          Log(absl::StrCat("generation ", gen,
                           " ended while building communicators: ", status.message()));
        } else {
          Log(absl::StrCat("generation ", gen, " rank ", a->rank(),
                           ": communicators failed: ", status.message(), "; reporting"));
          absl::StatusOr<v1::Directive> d =
              agent->ReportError(status.code(), std::string(status.message()),
                                 "build communicators", std::nullopt, gen);
          LogReportAnswer(gen, a->rank(), status, d);
        }
        if (std::shared_ptr<Communicators> c = holder.Take()) c->Abort();
        continue;
      }
      const std::string transports = comms->TransportSummary();
      Log(absl::StrCat("generation ", gen, " rank ", a->rank(), " world ", a->world_size(),
                       ": communicators ready", transports.empty() ? "" : ": ", transports));
      loop.NoteCommunicatorsReady(absl::Now());
      agent->SetProgress(a->start_step(), v1::WORKER_STATE_READY);
      absl::StatusOr<TrainingLoop::Outcome> outcome = loop.Run(*a, *comms);
      if (!outcome.ok()) {
        Log(absl::StrCat("generation ", gen, " rank ", a->rank(),
                         ": training failed: ", outcome.status().message(), "; reporting"));
        // Fenced with the generation it failed in: if that one has ended
        // meanwhile (a peer's report came first), the coordinator refuses
        // it rather than ending the next generation with a stale error.
        absl::StatusOr<v1::Directive> d = agent->ReportError(
            outcome.status().code(), std::string(outcome.status().message()), "train",
            std::nullopt, gen);
        LogReportAnswer(gen, a->rank(), outcome.status(), d);
        if (std::shared_ptr<Communicators> c = holder.Take()) c->Abort();
        if (train::IsHostMemoryShortage(outcome.status())) {
          // This host cannot hold its share of the model in any generation:
          // leave now rather than end two more generations on the way to
          // being excluded.
          const std::string why = absl::StrCat("this host lacks the memory for its rank: ",
                                               outcome.status().message());
          Log(absl::StrCat("leaving job '", job, "': ", why));
          if (absl::Status s = agent->Leave(why); !s.ok()) Log(s.ToString());
          return 1;
        }
        continue;
      }
      if (*outcome == TrainingLoop::Outcome::kGenerationOver) {
        Log(absl::StrCat("generation ", gen,
                         " ended during training; aborting communicators and re-joining"));
        loop.NoteGenerationEnded(absl::Now(), absl::StrCat("generation ", gen, " ended"));
        if (std::shared_ptr<Communicators> c = holder.Take()) c->Abort();
        continue;
      }
      Log(absl::StrCat("generation ", gen, " rank ", a->rank(), ": finished ",
                       spec.training().train_steps(), " steps; waiting for STOP"));
    }

    // Idle until the generation ends or the job stops.
    while (!g_shutdown.load()) {
      std::optional<v1::Directive> d = agent->NextDirective(absl::Milliseconds(500));
      if (d.has_value()) {
        if (d->has_stop()) {
          stop_reason = d->stop().reason();
          stop_phase = d->stop().phase();
          break;
        }
        if (d->has_restart_at_generation() && d->restart_at_generation().generation() > gen) {
          Log(absl::StrCat("generation ", gen, " is over: ", d->restart_at_generation().reason(),
                           "; aborting communicators and re-joining"));
          break;
        }
      }
      if (agent->stopped() || agent->generation() != gen) break;
    }
    if (std::shared_ptr<Communicators> c = holder.Take()) c->Abort();
  }

  // The main loop returned: it winds down on its own from here.
  watchdog.Disarm();
  if (std::shared_ptr<Communicators> c = holder.Take()) c->Abort();
  // STOP that arrived outside the idle loop (e.g. the answer to ReportError
  // when the coordinator excluded this worker): name its reason.
  while (stop_reason.empty()) {
    std::optional<v1::Directive> d = agent->NextDirective(absl::ZeroDuration());
    if (!d.has_value()) break;
    if (d->has_stop()) {
      stop_reason = d->stop().reason();
      stop_phase = d->stop().phase();
    }
  }
  const std::string reason =
      g_shutdown.load() ? "shutting down (signal)" : absl::StrCat("stopped: ", stop_reason);
  Log(absl::StrCat("leaving job '", job, "': ", reason));
  if (absl::Status s = agent->Leave(reason); !s.ok()) Log(s.ToString());
  // A job that FAILED is a failure of this process too (a supervisor such as
  // systemd's Restart=on-failure should see it); COMPLETED, CANCELLED, a
  // drain or a signal are not.
  // The coordinator's exclusion (its own errors ended too many generations)
  // stops it while the job goes on: a failure of this process as well, and
  // so is a coordinator that no longer accepts this worker's token.
  return stop_phase == v1::JOB_PHASE_FAILED || IsExclusion(stop_reason) ||
                 absl::StartsWith(stop_reason, kRefusedPrefix)
             ? 1
             : 0;
}

}  // namespace
}  // namespace shardline::worker

int main(int argc, char** argv) {
  shardline::SetLogProgram("shardline-worker");
  return shardline::worker::Run(argc, argv);
}

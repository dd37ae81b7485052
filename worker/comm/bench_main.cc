// shardline-bench-collectives: bandwidth of the Gloo or NCCL backend's
// collectives, in the layout of nccl-tests. N ranks run as threads in this
// process, each with a real backend, bootstrapped through one in-memory store
// (as worker/comm/test_util.h does for the tests):
//   --backend gloo (default): the Gloo backend, host buffers; its ranks share
//     this host, so they exchange through shared memory (--transport tcp:
//     shared memory off, Gloo over loopback TCP; --shm-buffer-bytes sets
//     GlooOptions::shm_buffer_bytes).
//   --backend nccl: the NCCL backend through the GPU plugin, rank r on GPU r
//     (NCCL allows one rank per GPU per communicator, so --ranks <= GPUs),
//     device buffers; inputs are uploaded and results downloaded outside the
//     timed loop. Without the plugin or a GPU it prints why and exits 1.
//
//   shardline-bench-collectives --ranks 4 --op all_reduce --max-bytes 67108864 --check
//   shardline-bench-collectives --backend nccl --ranks 8 --check
//
// For each size (bytes, multiplied by --factor from --min-bytes to
// --max-bytes) and each op, every rank runs --warmup untimed iterations, a
// Barrier, then --iters timed iterations (issued back to back, then waited
// on). time = the slowest rank's elapsed time / iters (steady clock).
//
// Definitions (the bus-bandwidth convention of nccl-tests, so figures compare with its own):
//   size   bytes of the per-rank buffer as nccl-tests counts it: the data for
//          all_reduce and broadcast; the total, count*n, for all_gather (the
//          output), reduce_scatter (the input) and all_to_all (either side).
//          Sizes round down to a whole number of elements (and of per-rank
//          pieces of count/n elements for the last three).
//   count  elements in that buffer.
//   algbw  size / time.
//   busbw  algbw * factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter,
//          all_to_all (n-1)/n; broadcast 1. Comparable with the link speed.
//   #wrong with --check, elements (summed over ranks) that differ from the
//          closed-form result of a separate, untimed run on inputs that depend
//          on rank and index; 0 expected. N/A without --check.
// Reductions are sums; broadcast's root is rank 0. all_reduce and broadcast
// run in place (the backend has no out-of-place form); the others out of place.
//
// A last block of "memcpy" rows (Gloo only) copies the same bytes with
// std::memcpy on one thread, no communication: the ceiling a one-process
// transport could reach.
//
// Exit status: 0 when every op succeeded and no element was wrong; 1 when an
// op failed, an element was wrong, or (nccl) no GPU is usable; 2 for bad flags.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <unistd.h>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "worker/comm/backend.h"
#include "worker/comm/float16.h"
#include "worker/comm/nccl_backend.h"
#include "worker/comm/store.h"
#include "worker/gpu/gpu_plugin.h"

namespace shardline::worker {
namespace {

constexpr char kProgram[] = "shardline-bench-collectives";

enum class Op { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };
constexpr Op kAllOps[] = {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter, Op::kAllToAll,
                          Op::kBroadcast};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "?";
}

// busbw / algbw for `op` on `n` ranks (the bus-bandwidth convention of nccl-tests, so figures compare with its own).
double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
      return static_cast<double>(n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
  }
  return 0;
}

const char* TypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "?";
}

struct Config {
  int ranks = 2;
  std::vector<Op> ops;
  DType dtype = DType::kFloat32;
  std::vector<size_t> sizes;  // bytes, as swept (before rounding to elements)
  int64_t iters = 20;
  int64_t warmup = 5;
  bool check = false;
  std::string csv;
  bool nccl = false;       // --backend nccl
  bool tcp = false;        // --transport tcp: Gloo with shared memory off
  int64_t shm_buffer_bytes = 0;  // --shm-buffer-bytes (0: automatic)
  std::string gpu_plugin;  // --gpu-plugin; empty = next to the executable or in its runfiles
};

// One sweep step's buffers, in elements.
struct Shape {
  size_t piece = 0;  // per-rank piece (all_gather, reduce_scatter, all_to_all)
  size_t count = 0;  // elements in the buffer nccl-tests sizes ("count" column)
};

Shape ShapeFor(Op op, size_t bytes, DType dtype, int n) {
  const size_t elements = bytes / ElementSize(dtype);
  Shape s;
  switch (op) {
    case Op::kAllReduce:
    case Op::kBroadcast:
      s.count = elements;
      break;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
      s.piece = elements / n;
      s.count = s.piece * n;
      break;
  }
  return s;
}

// --- Element values and encodings ---

// Rank r's input at buffer index i: small integers and halves, exact in every
// dtype and in fp32 sums of a few hundred ranks, so the closed forms are exact.
float Value(int r, size_t i) {
  return static_cast<float>(r + 1) + 0.5f * static_cast<float>(i % 13);
}

// The bits `f` has when stored as `dtype` (one rounding, as the backend does).
uint32_t Encode(DType dtype, float f) {
  switch (dtype) {
    case DType::kFloat32: {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      return bits;
    }
    case DType::kFloat16:
      return FloatToHalf(f);
    case DType::kBFloat16:
      return FloatToBFloat16(f);
  }
  return 0;
}

uint32_t Load(DType dtype, const uint8_t* buf, size_t i) {
  if (dtype == DType::kFloat32) {
    uint32_t bits;
    std::memcpy(&bits, buf + 4 * i, 4);
    return bits;
  }
  uint16_t h;
  std::memcpy(&h, buf + 2 * i, 2);
  return h;
}

void Put(DType dtype, uint8_t* buf, size_t i, uint32_t bits) {
  if (dtype == DType::kFloat32) {
    std::memcpy(buf + 4 * i, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(buf + 2 * i, &h, 2);
  }
}

// Fills buf[0..count) with rank r's inputs.
void Fill(DType dtype, uint8_t* buf, size_t count, int r) {
  for (size_t i = 0; i < count; ++i) Put(dtype, buf, i, Encode(dtype, Value(r, i)));
}

// Sum over all n ranks of Value(r, i), exactly (fp32, small integers/halves).
float SumOverRanks(int n, size_t i) {
  return static_cast<float>(n) * (n + 1) / 2.0f + static_cast<float>(n) * 0.5f * (i % 13);
}

// --- Results, shared by the rank threads and the printing thread ---

struct Step {
  Op op;
  Shape shape;
};

struct StepResult {
  absl::Duration time;  // per iteration, slowest rank
  int64_t wrong = -1;   // summed over ranks; -1 when not checked
  absl::Status status;  // first failure of any rank
};

// Each rank reports each step once; Await blocks until all have. Thread-safe.
class Results {
 public:
  Results(int ranks, size_t steps) : entries_(steps) {
    for (Entry& e : entries_) e.ranks = ranks;
  }

  void Report(size_t step, absl::Duration elapsed, int64_t wrong, absl::Status status) {
    absl::MutexLock lock(&mu_);
    Entry& e = entries_[step];
    e.result.time = std::max(e.result.time, elapsed);
    if (wrong >= 0) e.result.wrong = std::max<int64_t>(e.result.wrong, 0) + wrong;
    if (e.result.status.ok() && !status.ok()) e.result.status = status;
    ++e.reported;
  }

  StepResult Await(size_t step) {
    absl::MutexLock lock(&mu_);
    const Entry& e = entries_[step];
    mu_.Await(absl::Condition(&e, &Entry::Done));
    return e.result;
  }

 private:
  struct Entry {
    int ranks = 0;
    int reported = 0;
    StepResult result;
    bool Done() const { return reported == ranks; }
  };
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// --- One rank ---

absl::Status WaitAll(const std::vector<std::shared_ptr<Work>>& works) {
  absl::Status first;
  for (const auto& w : works) {
    absl::Status s = w->Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

// Buffers of one rank for one step: host copies (inputs, and the results
// that CountWrong reads), and the pointers the backend gets (the host copies
// for Gloo, device copies for NCCL).
struct Buffers {
  std::vector<uint8_t> in, out;
  void* in_ptr = nullptr;
  void* out_ptr = nullptr;
};

// Issues `op` once on `b`. `in`/`out` as laid out by PrepareBuffers.
std::shared_ptr<Work> Issue(Backend& b, Op op, const Shape& s, DType dtype, Buffers& buf) {
  const int n = b.size();
  switch (op) {
    case Op::kAllReduce:
      return b.AllReduce(buf.in_ptr, s.count, dtype, ReduceOp::kSum);
    case Op::kAllGather:
      return b.AllGather(buf.in_ptr, s.piece, buf.out_ptr, dtype);
    case Op::kReduceScatter:
      return b.ReduceScatter(buf.in_ptr, buf.out_ptr, std::vector<size_t>(n, s.piece), dtype,
                             ReduceOp::kSum);
    case Op::kAllToAll: {
      const std::vector<size_t> counts(n, s.piece);
      return b.AllToAll(buf.in_ptr, counts, buf.out_ptr, counts, dtype);
    }
    case Op::kBroadcast:
      return b.Broadcast(buf.in_ptr, s.count, dtype, /*root=*/0);
  }
  return nullptr;
}

// Device copies of one rank's buffers (--backend nccl), grown as needed.
class DeviceStage {
 public:
  DeviceStage(DeviceMemory mem, int device) : mem_(mem), device_(device) {}
  ~DeviceStage() {
    if (in_ != nullptr) mem_.Free(device_, in_);
    if (out_ != nullptr) mem_.Free(device_, out_);
  }
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // Sizes the device buffers to buf's, uploads buf.in and points buf's
  // in_ptr/out_ptr at the device copies.
  absl::Status Upload(Buffers& buf) {
    absl::Status s = Ensure(in_, in_cap_, buf.in.size());
    if (s.ok()) s = Ensure(out_, out_cap_, buf.out.size());
    if (s.ok()) s = mem_.CopyToDevice(device_, in_, buf.in.data(), buf.in.size());
    buf.in_ptr = in_;
    buf.out_ptr = out_;
    return s;
  }

  // Copies the device buffers back into buf.in and buf.out.
  absl::Status Download(Buffers& buf) {
    absl::Status s = mem_.CopyToHost(device_, buf.in.data(), in_, buf.in.size());
    if (s.ok()) s = mem_.CopyToHost(device_, buf.out.data(), out_, buf.out.size());
    return s;
  }

 private:
  absl::Status Ensure(void*& ptr, size_t& cap, size_t bytes) {
    if (ptr != nullptr && cap >= bytes) return absl::OkStatus();
    if (ptr != nullptr) mem_.Free(device_, ptr);
    ptr = nullptr;
    absl::StatusOr<void*> p = mem_.Alloc(device_, bytes);
    if (!p.ok()) return p.status();
    ptr = *p;
    cap = bytes;
    return absl::OkStatus();
  }

  DeviceMemory mem_;
  int device_;
  void* in_ = nullptr;
  void* out_ = nullptr;
  size_t in_cap_ = 0, out_cap_ = 0;
};

// Sizes the buffers and fills the inputs with rank r's values.
void PrepareBuffers(Op op, const Shape& s, DType dtype, int r, Buffers& buf) {
  const size_t e = ElementSize(dtype);
  size_t in_count = s.count, out_count = 0;
  switch (op) {
    case Op::kAllReduce:
    case Op::kBroadcast:
      break;
    case Op::kAllGather:
      in_count = s.piece;
      out_count = s.count;
      break;
    case Op::kReduceScatter:
      out_count = s.piece;
      break;
    case Op::kAllToAll:
      out_count = s.count;
      break;
  }
  buf.in.assign(std::max<size_t>(in_count * e, 1), 0);
  buf.out.assign(std::max<size_t>(out_count * e, 1), 0);
  Fill(dtype, buf.in.data(), in_count, r);
  buf.in_ptr = buf.in.data();
  buf.out_ptr = buf.out.data();
}

// Elements of rank r's result that differ from the closed form.
int64_t CountWrong(Op op, const Shape& s, DType dtype, int r, int n, const Buffers& buf) {
  int64_t wrong = 0;
  auto expect = [&](const std::vector<uint8_t>& v, size_t i, float want) {
    if (Load(dtype, v.data(), i) != Encode(dtype, want)) ++wrong;
  };
  switch (op) {
    case Op::kAllReduce:
      for (size_t i = 0; i < s.count; ++i) expect(buf.in, i, SumOverRanks(n, i));
      break;
    case Op::kBroadcast:
      for (size_t i = 0; i < s.count; ++i) expect(buf.in, i, Value(0, i));
      break;
    case Op::kAllGather:  // out[p*piece + j] = rank p's in[j]
      for (int p = 0; p < n; ++p)
        for (size_t j = 0; j < s.piece; ++j) expect(buf.out, p * s.piece + j, Value(p, j));
      break;
    case Op::kReduceScatter:  // out[j] = sum over ranks of in[r*piece + j]
      for (size_t j = 0; j < s.piece; ++j) expect(buf.out, j, SumOverRanks(n, r * s.piece + j));
      break;
    case Op::kAllToAll:  // out[p*piece + j] = rank p's in[r*piece + j]
      for (int p = 0; p < n; ++p)
        for (size_t j = 0; j < s.piece; ++j)
          expect(buf.out, p * s.piece + j, Value(p, r * s.piece + j));
      break;
  }
  return wrong;
}

absl::Duration Since(std::chrono::steady_clock::time_point start) {
  return absl::FromChrono(std::chrono::steady_clock::now() - start);
}

// Runs every step on rank r and reports each to `results`. After the first
// failure the group is unusable, so the remaining steps report that failure.
void RunRank(const Config& cfg, const std::vector<Step>& steps, std::shared_ptr<Store> store, int r,
             Results& results) {
  absl::StatusOr<std::unique_ptr<Backend>> created;
  std::unique_ptr<DeviceStage> stage;  // nccl only
  if (cfg.nccl) {
    NcclOptions options;
    options.plugin_path = cfg.gpu_plugin;
    options.device = r;
    options.timeout = absl::Minutes(2);
    options.connect_timeout = absl::Seconds(60);
    created = CreateNcclBackend(store, r, cfg.ranks, options);
    absl::StatusOr<DeviceMemory> mem = DeviceMemory::Load(cfg.gpu_plugin);
    if (created.ok() && !mem.ok()) created = mem.status();
    if (created.ok()) stage = std::make_unique<DeviceStage>(*mem, r);
  } else {
    GlooOptions options;
    options.timeout = absl::Minutes(2);
    options.connect_timeout = absl::Seconds(60);
    if (cfg.tcp) options.shared_memory = GlooOptions::SharedMemory::kOff;
    options.shm_buffer_bytes = static_cast<size_t>(cfg.shm_buffer_bytes);
    created = CreateGlooBackend(store, r, cfg.ranks, options);
  }
  absl::Status failed = created.status();
  if (!failed.ok())
    failed = absl::Status(failed.code(), absl::StrCat("rank ", r, ": ", failed.message()));
  Buffers buf;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (!failed.ok()) {
      results.Report(k, absl::ZeroDuration(), -1, failed);
      continue;
    }
    Backend& b = **created;
    const Step& st = steps[k];
    PrepareBuffers(st.op, st.shape, cfg.dtype, r, buf);
    absl::Status s;
    if (stage != nullptr) s = stage->Upload(buf);
    for (int64_t w = 0; w < cfg.warmup && s.ok(); ++w)
      s = Issue(b, st.op, st.shape, cfg.dtype, buf)->Wait();
    if (s.ok()) s = b.Barrier()->Wait();
    absl::Duration elapsed;
    if (s.ok()) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::shared_ptr<Work>> works;
      works.reserve(cfg.iters);
      for (int64_t i = 0; i < cfg.iters; ++i)
        works.push_back(Issue(b, st.op, st.shape, cfg.dtype, buf));
      s = WaitAll(works);
      elapsed = Since(start) / cfg.iters;
    }
    int64_t wrong = -1;
    if (s.ok() && cfg.check) {
      PrepareBuffers(st.op, st.shape, cfg.dtype, r, buf);
      if (stage != nullptr) s = stage->Upload(buf);
      if (s.ok()) s = Issue(b, st.op, st.shape, cfg.dtype, buf)->Wait();
      if (s.ok() && stage != nullptr) s = stage->Download(buf);
      if (s.ok()) wrong = CountWrong(st.op, st.shape, cfg.dtype, r, cfg.ranks, buf);
    }
    if (!s.ok()) {
      failed = absl::Status(s.code(), absl::StrCat("rank ", r, ", ", OpName(st.op), " of ",
                                                   st.shape.count, " elements: ", s.message()));
      results.Report(k, absl::ZeroDuration(), -1, failed);
      continue;
    }
    results.Report(k, elapsed, wrong, absl::OkStatus());
  }
  if (created.ok()) (*created)->Abort();
  stage.reset();  // after the communicator: no kernel still uses the buffers
}

// --- Output ---

class Table {
 public:
  Table(std::ostream& out, std::ofstream* csv) : out_(out), csv_(csv) {
    out_ << absl::StrFormat("#%11s  %12s  %6s  %14s  %10s  %8s  %8s  %6s\n", "size", "count",
                            "type", "op", "time", "algbw", "busbw", "#wrong");
    out_ << absl::StrFormat("#%11s  %12s  %6s  %14s  %10s  %8s  %8s  %6s\n", "(B)", "(elements)",
                            "", "", "(us)", "(GB/s)", "(GB/s)", "");
    if (csv_ != nullptr)
      *csv_ << "ranks,size_bytes,count,type,op,time_us,algbw_gbps,busbw_gbps,wrong\n";
  }

  // Prints one row; returns busbw (GB/s).
  double Row(int ranks, size_t bytes, size_t count, DType dtype, const std::string& op,
             absl::Duration time, double factor, int64_t wrong) {
    const double seconds = absl::ToDoubleSeconds(time);
    const double algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
    const double busbw = algbw * factor;
    const double us = absl::ToDoubleMicroseconds(time);
    const std::string wrong_s = wrong < 0 ? "N/A" : absl::StrCat(wrong);
    out_ << absl::StrFormat("%12d  %12d  %6s  %14s  %10.2f  %8.3f  %8.3f  %6s\n", bytes, count,
                            TypeName(dtype), op, us, algbw, busbw, wrong_s);
    out_.flush();
    if (csv_ != nullptr) {
      *csv_ << absl::StrFormat("%d,%d,%d,%s,%s,%.3f,%.6f,%.6f,%s\n", ranks, bytes, count,
                               TypeName(dtype), op, us, algbw, busbw, wrong_s);
    }
    return busbw;
  }

 private:
  std::ostream& out_;
  std::ofstream* csv_;
};

// Copies `bytes` with std::memcpy on this thread; per-iteration time.
absl::Duration TimeMemcpy(size_t bytes, int64_t warmup, int64_t iters, bool check, int64_t* wrong) {
  std::vector<uint8_t> src(std::max<size_t>(bytes, 1)), dst(std::max<size_t>(bytes, 1), 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  auto copy = [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    // Keeps the compiler from dropping a copy whose result is not read.
    asm volatile("" : : "r"(dst.data()) : "memory");
  };
  for (int64_t i = 0; i < warmup; ++i) copy();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) copy();
  const absl::Duration t = Since(start) / iters;
  *wrong = -1;
  if (check) {
    *wrong = 0;
    for (size_t i = 0; i < bytes; ++i) *wrong += src[i] != dst[i];
  }
  return t;
}

// --- Flags ---

absl::StatusOr<Config> ParseFlags(const std::vector<std::string>& argv, bool* help,
                                  std::string* usage) {
  ArgParser args(kProgram);
  int64_t ranks = 2, min_bytes = 4, max_bytes = int64_t{64} << 20, factor = 2;
  std::string op = "all", dtype = "fp32", backend = "gloo";
  Config cfg;
  args.AddString("backend", &backend,
                 "gloo (host buffers, loopback TCP) | nccl (GPU r for rank r, device buffers); "
                 "default gloo");
  std::string transport = "auto";
  args.AddString("transport", &transport,
                 "gloo: auto (shared memory between the ranks, which share this host) | tcp "
                 "(loopback TCP, shared memory off); default auto");
  args.AddInt("shm-buffer-bytes", &cfg.shm_buffer_bytes,
              "gloo, shared memory: bytes of each staging buffer (GlooOptions::shm_buffer_bytes: "
              "0, automatic, or a multiple of 4096 in [4096, 268435456]; default 0)");
  args.AddString("gpu-plugin", &cfg.gpu_plugin,
                 "libshardline_gpu.so for --backend nccl (default: next to this program, or in "
                 "its Bazel runfiles)");
  args.AddInt("ranks", &ranks, "ranks, run as threads in this process (1..64; default 2)");
  args.AddString("op", &op,
                 "all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|all (default all)");
  args.AddString("dtype", &dtype, "fp32|fp16|bf16 (default fp32)");
  args.AddInt("min-bytes", &min_bytes, "smallest size in bytes (default 4)");
  args.AddInt("max-bytes", &max_bytes, "largest size in bytes (default 67108864 = 64 MiB)");
  args.AddInt("factor", &factor, "multiply the size by this each step (>= 2; default 2)");
  args.AddInt("iters", &cfg.iters, "timed iterations per size (default 20)");
  args.AddInt("warmup", &cfg.warmup, "untimed iterations before timing (default 5)");
  args.AddBool("check", &cfg.check, "verify results and count wrong elements");
  args.AddString("csv", &cfg.csv, "also write the rows to this CSV file");
  args.AddBool("help", help, "print this help");
  *usage = args.Usage();

  absl::StatusOr<std::vector<std::string>> positional = args.Parse(argv);
  if (!positional.ok()) return positional.status();
  if (*help) return cfg;
  if (!positional->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", (*positional)[0], "'; every setting is a --flag"));
  }
  if (ranks < 1 || ranks > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks=", ranks, " is out of range; give 1..64"));
  }
  cfg.ranks = static_cast<int>(ranks);
  if (backend == "nccl") {
    cfg.nccl = true;
  } else if (backend != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend='", backend, "' is not a backend; use gloo or nccl"));
  }
  if (transport == "tcp") {
    cfg.tcp = true;
  } else if (transport != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport='", transport, "' is not a transport; use auto or tcp"));
  }
  if (cfg.shm_buffer_bytes != 0 &&
      (cfg.shm_buffer_bytes < 4096 || cfg.shm_buffer_bytes > (int64_t{256} << 20) ||
       cfg.shm_buffer_bytes % 4096 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--shm-buffer-bytes=", cfg.shm_buffer_bytes,
                                                   " must be 0 (automatic) or a multiple of 4096 "
                                                   "in [4096, 268435456]"));
  }
  if (op == "all") {
    cfg.ops.assign(std::begin(kAllOps), std::end(kAllOps));
  } else {
    for (Op o : kAllOps)
      if (op == OpName(o)) cfg.ops = {o};
    if (cfg.ops.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--op='", op,
                       "' is not an op; use all_reduce, all_gather, reduce_scatter, all_to_all, "
                       "broadcast or all"));
    }
  }
  if (dtype == "fp32") {
    cfg.dtype = DType::kFloat32;
  } else if (dtype == "fp16") {
    cfg.dtype = DType::kFloat16;
  } else if (dtype == "bf16") {
    cfg.dtype = DType::kBFloat16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype='", dtype, "' is not a type; use fp32, fp16 or bf16"));
  }
  constexpr int64_t kMaxBytes = int64_t{4} << 30;
  if (min_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-bytes=", min_bytes, " must be at least 1"));
  }
  if (max_bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-bytes=", max_bytes, " is over 4 GiB (every rank holds up to 2 buffers of it)"));
  }
  if (max_bytes < min_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-bytes=", max_bytes, " is below --min-bytes=", min_bytes));
  }
  {
    // All ranks live in this process, each with up to two buffers of
    // max_bytes (plus the collective's scratch; for nccl the host copies):
    // keep it within half of RAM.
    const int64_t ram = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
    const long double need = static_cast<long double>(ranks) * 3 * max_bytes;
    if (ram > 0 && need > ram / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ranks=", ranks, " x --max-bytes=", max_bytes,
          " needs about ", static_cast<int64_t>(need / (1 << 20)), " MiB in this process, more than "
          "half of this machine's ", ram >> 20, " MiB; lower --max-bytes or --ranks"));
    }
  }
  if (factor < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--factor=", factor, " must be at least 2"));
  }
  if (cfg.iters < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--iters=", cfg.iters, " must be at least 1"));
  }
  if (cfg.warmup < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--warmup=", cfg.warmup, " must be 0 or more"));
  }
  if (args.WasSet("csv") && cfg.csv.empty()) {
    return absl::InvalidArgumentError("--csv needs a file name");
  }
  for (int64_t b = min_bytes; b <= max_bytes; b *= factor) {
    cfg.sizes.push_back(static_cast<size_t>(b));
    if (b > max_bytes / factor) break;  // the next step would pass max_bytes (or overflow)
  }
  return cfg;
}

// --gpu-plugin, else libshardline_gpu.so next to this program, else in its
// Bazel runfiles (bazel-bin/worker/comm/shardline-bench-collectives.runfiles).
std::string PluginPath(const Config& cfg) {
  if (!cfg.gpu_plugin.empty()) return cfg.gpu_plugin;
  const std::string next_to = GpuPlugin::DefaultPath();
  if (::access(next_to.c_str(), R_OK) == 0) return next_to;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return next_to;
  const std::string runfiles =
      std::string(exe, n) + ".runfiles/shardline/worker/gpu/libshardline_gpu.so";
  return ::access(runfiles.c_str(), R_OK) == 0 ? runfiles : next_to;
}

int Main(int argc, char** argv) {
  // Writes to a lost peer's socket fail with EPIPE instead of killing us.
  std::signal(SIGPIPE, SIG_IGN);
  bool help = false;
  std::string usage;
  absl::StatusOr<Config> parsed =
      ParseFlags(std::vector<std::string>(argv + 1, argv + argc), &help, &usage);
  if (help && parsed.ok()) {
    std::cout << "Usage: " << kProgram << " [flags]\n"
              << "Times the Gloo (loopback TCP) or NCCL (one GPU per rank) backend's "
                 "collectives with N ranks as threads; nccl-tests layout.\n\n"
              << usage;
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << kProgram << ": " << parsed.status().message() << "\n"
              << "Run " << kProgram << " --help for the flags.\n";
    return 2;
  }
  Config& cfg = *parsed;
  std::string gpus;  // for the header
  if (cfg.nccl) {
    cfg.gpu_plugin = PluginPath(cfg);
    absl::StatusOr<DeviceMemory> mem = DeviceMemory::Load(cfg.gpu_plugin);
    absl::StatusOr<int> devices = mem.ok() ? mem->DeviceCount() : mem.status();
    if (!devices.ok()) {
      std::cerr << kProgram << ": --backend=nccl needs a GPU: " << devices.status().message()
                << "\nUse --backend gloo on this machine.\n";
      return 1;
    }
    if (cfg.ranks > *devices) {
      std::cerr << kProgram << ": --ranks=" << cfg.ranks << " but this machine has " << *devices
                << " GPU(s); NCCL allows one rank per GPU per communicator, so give --ranks 1.."
                << *devices << "\n";
      return 2;
    }
    gpus = absl::StrCat(*devices, " GPU(s) visible");
  }
  std::ofstream csv;
  if (!cfg.csv.empty()) {
    csv.open(cfg.csv);
    if (!csv) {
      std::cerr << kProgram << ": --csv='" << cfg.csv
                << "' cannot be opened for writing: " << std::strerror(errno) << "\n";
      return 2;
    }
  }

  std::vector<Step> steps;
  for (Op op : cfg.ops)
    for (size_t bytes : cfg.sizes)
      steps.push_back({op, ShapeFor(op, bytes, cfg.dtype, cfg.ranks)});

  std::vector<std::string> op_names;
  for (Op op : cfg.ops) op_names.push_back(OpName(op));
  std::cout << "# " << kProgram << ": " << cfg.ranks << " ranks as threads in one process, "
            << (cfg.nccl   ? absl::StrCat("NCCL, rank r on GPU r, device buffers (", gpus, ")")
                : cfg.tcp  ? std::string("Gloo over loopback TCP (shared memory off)")
                           : absl::StrCat("Gloo backend, shared memory between the ranks (",
                                          cfg.shm_buffer_bytes == 0
                                              ? std::string("automatic staging buffers")
                                              : absl::StrCat(cfg.shm_buffer_bytes,
                                                             "-byte staging buffers"),
                                          ")"))
            << "\n"
            << "# ops " << absl::StrJoin(op_names, ",") << "; dtype " << TypeName(cfg.dtype)
            << "; sizes " << cfg.sizes.front() << ".." << cfg.sizes.back() << " B; warmup "
            << cfg.warmup << ", iters " << cfg.iters << "; check " << (cfg.check ? "on" : "off")
            << "\n"
            << "# redop sum; broadcast root 0; all_reduce and broadcast in place, others out of "
               "place\n"
            << "# time: slowest rank, per iteration. algbw = size/time. busbw = algbw * factor "
               "(all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast "
               "1)\n#\n";
  Table table(std::cout, csv.is_open() ? &csv : nullptr);

  Results results(cfg.ranks, steps.size());
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < cfg.ranks; ++r) {
    threads.emplace_back([&, r] { RunRank(cfg, steps, store, r, results); });
  }

  int64_t total_wrong = 0;
  absl::Status first_error;
  std::vector<double> busbw_sum(cfg.ops.size(), 0);
  for (size_t k = 0; k < steps.size(); ++k) {
    const StepResult res = results.Await(k);
    if (!res.status.ok()) {
      if (first_error.ok()) {
        first_error = res.status;
        std::cerr << kProgram << ": " << res.status << "\n";
      }
      continue;
    }
    const Step& st = steps[k];
    const double busbw =
        table.Row(cfg.ranks, st.shape.count * ElementSize(cfg.dtype), st.shape.count, cfg.dtype,
                  OpName(st.op), res.time, BusFactor(st.op, cfg.ranks), res.wrong);
    busbw_sum[k / cfg.sizes.size()] += busbw;
    if (res.wrong > 0) total_wrong += res.wrong;
    if (k + 1 < steps.size() && steps[k + 1].op != st.op) std::cout << "#\n";
  }
  for (auto& t : threads) t.join();

  if (!cfg.nccl)
    std::cout << "#\n# memcpy rows: the ceiling, not a collective: the same bytes copied with "
                 "std::memcpy on one thread (busbw = algbw)\n";
  for (size_t bytes : cfg.nccl ? std::vector<size_t>() : cfg.sizes) {
    int64_t wrong;
    const absl::Duration t = TimeMemcpy(bytes, cfg.warmup, cfg.iters, cfg.check, &wrong);
    table.Row(cfg.ranks, bytes, bytes / ElementSize(cfg.dtype), cfg.dtype, "memcpy", t, 1.0, wrong);
    if (wrong > 0) total_wrong += wrong;
  }

  std::cout << "#\n";
  for (size_t i = 0; i < cfg.ops.size(); ++i) {
    std::cout << absl::StrFormat("# Avg bus bandwidth %-14s : %.3f GB/s\n", OpName(cfg.ops[i]),
                                 busbw_sum[i] / cfg.sizes.size());
  }
  if (cfg.check) {
    std::cout << "# Wrong elements : " << total_wrong << (total_wrong == 0 ? " OK" : " FAILED")
              << "\n";
  } else {
    std::cout << "# Wrong elements : N/A (run with --check)\n";
  }
  if (!first_error.ok()) {
    std::cout << "# FAILED: " << first_error << "\n";
    return 1;
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace shardline::worker

int main(int argc, char** argv) { return shardline::worker::Main(argc, argv); }

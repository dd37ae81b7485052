// shardline-bench-gloo-direct: the peer "Gloo called directly" for
// bench/collectives.py. The same measurement as shardline-bench-collectives
// (worker/comm/bench_main.cc: N ranks as threads in one process, Gloo's TCP
// transport over loopback, nccl-tests sizes, warmup, a barrier, then timed
// iterations; time = the slowest rank's elapsed time / iters) but calling
// Gloo's own API with no Shardline layer in between:
//   all_reduce     gloo::allreduce (in place, gloo::sum<float>)
//   all_gather     gloo::allgather (out of place)
//   reduce_scatter gloo::ReduceScatterHalvingDoubling<float>, built once per
//                  size and run() per iteration (Gloo has no function form)
// Bootstrap: gloo::rendezvous::HashStore, connectFullMesh.
//
//   shardline-bench-gloo-direct --ranks 2 --op all_reduce --min-bytes 4 --max-bytes 268435456
//
// Prints CSV rows to stdout in shardline-bench-collectives' --csv layout:
//   ranks,size_bytes,count,type,op,time_us,algbw_gbps,busbw_gbps,wrong
// (wrong is always N/A). Exit 0 on success, 1 when Gloo throws, 2 for bad flags.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

using Clock = std::chrono::steady_clock;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

struct Config {
  int ranks = 2;
  std::string op = "all_reduce";
  std::vector<size_t> sizes;  // bytes, as nccl-tests counts them
  int64_t iters = 20;
  int64_t warmup = 5;
};

double BusFactor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

// Elements in the nccl-tests buffer for `bytes`; for all_gather and
// reduce_scatter a whole number of per-rank pieces.
size_t CountFor(const std::string& op, size_t bytes, int n) {
  size_t count = bytes / sizeof(float);
  if (op != "all_reduce") count = count / n * n;
  return count;
}

// Runs every size on rank `rank`; stores per-size elapsed seconds / iters.
void RunRank(const Config& cfg, int rank, std::shared_ptr<gloo::rendezvous::Store> store,
             std::vector<double>* seconds, std::string* error) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, cfg.ranks);
    context->setTimeout(std::chrono::seconds(120));
    context->connectFullMesh(*store, device);
    const int n = cfg.ranks;
    std::vector<float> a, b;
    uint32_t tag = 0;
    for (size_t k = 0; k < cfg.sizes.size(); ++k) {
      const size_t count = CountFor(cfg.op, cfg.sizes[k], n);
      seconds->push_back(0);
      if (count == 0) continue;
      const size_t piece = count / n;
      std::function<void()> once;
      std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
      if (cfg.op == "all_reduce") {
        a.assign(count, 1.0f + rank);
        once = [&]() {
          gloo::AllreduceOptions opts(context);
          opts.setOutput(a.data(), count);
          opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
          opts.setTag(tag++);
          gloo::allreduce(opts);
        };
      } else if (cfg.op == "all_gather") {
        a.assign(piece, 1.0f + rank);
        b.assign(count, 0.0f);
        once = [&]() {
          gloo::AllgatherOptions opts(context);
          opts.setInput(a.data(), piece);
          opts.setOutput(b.data(), count);
          opts.setTag(tag++);
          gloo::allgather(opts);
        };
      } else {
        a.assign(count, 1.0f + rank);
        rs = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
            context, std::vector<float*>{a.data()}, static_cast<int>(count),
            std::vector<int>(n, static_cast<int>(piece)));
        once = [&]() { rs->run(); };
      }
      for (int64_t w = 0; w < cfg.warmup; ++w) once();
      {
        gloo::BarrierOptions opts(context);
        opts.setTag(tag++);
        gloo::barrier(opts);
      }
      const auto start = Clock::now();
      for (int64_t i = 0; i < cfg.iters; ++i) once();
      seconds->back() = std::chrono::duration<double>(Clock::now() - start).count() / cfg.iters;
      // Untimed: no rank tears down this size's buffers (or, after the last
      // size, its pairs) while a peer's last message to it is in flight.
      gloo::BarrierOptions opts(context);
      opts.setTag(tag++);
      gloo::barrier(opts);
    }
  } catch (const std::exception& e) {
    *error = absl::StrCat("rank ", rank, ": ", e.what());
  }
}

int Main(int argc, char** argv) {
  Config cfg;
  int64_t ranks = 2, min_bytes = 4, max_bytes = 1 << 20, factor = 2;
  bool help = false;
  shardline::ArgParser args("shardline-bench-gloo-direct");
  args.AddInt("ranks", &ranks, "ranks, each a thread (default 2)");
  args.AddString("op", &cfg.op, "all_reduce, all_gather or reduce_scatter (default all_reduce)");
  args.AddInt("min-bytes", &min_bytes, "smallest size in bytes (default 4)");
  args.AddInt("max-bytes", &max_bytes, "largest size in bytes (default 1 MiB)");
  args.AddInt("factor", &factor, "size multiplier between steps (default 2)");
  args.AddInt("iters", &cfg.iters, "timed iterations per size (default 20)");
  args.AddInt("warmup", &cfg.warmup, "untimed iterations per size (default 5)");
  args.AddBool("help", &help, "print this help");
  std::vector<std::string> tail(argv + 1, argv + argc);
  auto positional = args.Parse(tail);
  if (help) {
    std::cout << args.Usage();
    return 0;
  }
  if (!positional.ok() || !positional->empty() || ranks < 2 || ranks > 64 || min_bytes < 1 ||
      max_bytes < min_bytes || factor < 2 || cfg.iters < 1 || cfg.warmup < 0 ||
      (cfg.op != "all_reduce" && cfg.op != "all_gather" && cfg.op != "reduce_scatter")) {
    std::cerr << "shardline-bench-gloo-direct: bad flags"
              << (positional.ok() ? "" : absl::StrCat(": ", positional.status().message()))
              << "\n"
              << args.Usage();
    return 2;
  }
  cfg.ranks = static_cast<int>(ranks);
  for (int64_t s = min_bytes; s <= max_bytes; s *= factor) cfg.sizes.push_back(s);

  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::vector<double>> seconds(cfg.ranks);
  std::vector<std::string> errors(cfg.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < cfg.ranks; ++r)
    threads.emplace_back(RunRank, std::cref(cfg), r, store, &seconds[r], &errors[r]);
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) {
      std::cerr << "shardline-bench-gloo-direct: " << e << "\n";
      return 1;
    }
  }
  std::printf("ranks,size_bytes,count,type,op,time_us,algbw_gbps,busbw_gbps,wrong\n");
  for (size_t k = 0; k < cfg.sizes.size(); ++k) {
    const size_t count = CountFor(cfg.op, cfg.sizes[k], cfg.ranks);
    if (count == 0) continue;
    double t = 0;
    for (int r = 0; r < cfg.ranks; ++r) t = std::max(t, seconds[r][k]);
    const double bytes = static_cast<double>(count * sizeof(float));
    const double algbw = bytes / t / 1e9;
    std::printf("%d,%zu,%zu,fp32,%s,%.3f,%.6f,%.6f,N/A\n", cfg.ranks,
                count * sizeof(float), count, cfg.op.c_str(), t * 1e6, algbw,
                algbw * BusFactor(cfg.op, cfg.ranks));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }

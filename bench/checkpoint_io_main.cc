// shardline-bench-checkpoint-io: save and restore GB/s of the checkpoint file
// path (checkpoint/shard_io.h) for bench/checkpoint.py.
//
//   shardline-bench-checkpoint-io --dir /var/tmp/ckpt --bytes 536870912 --repeats 3
//
// The state is GPT-shaped: for each layer, the four weight matrices of a
// width-`hidden` block (qkv [3h,h], proj [h,h], fc1 [4h,h], fc2 [h,4h]), each
// three times (the parameter and AdamW's two moments, as Trainer::SaveSlices
// hands them over), layers added until `bytes` is reached (the last one cut
// short). bench/torch_checkpoint.py builds the same list (GptStateShapes).
//
// Each repeat: WriteShard (one rank, one file; fsync of file and directory as
// in training), then posix_fadvise(DONTNEED) on the file so the restore reads
// the disk rather than the page cache, then ReadRuns of every run (CRC-32C
// of every piece checked) into separate buffers, compared with the originals.
// Prints CSV to stdout: repeat,bytes,save_s,restore_s. Exit 1 on any error
// or a restored value that differs.
//
// --stepped: each repeat waits for a line on stdin (until end of input;
// --repeats is ignored), so that bench/checkpoint.py can run dd between
// the repeats of one warm process: the first save of a fresh process, just
// after it allocated the state, was measured 2-4x slower than later ones on
// the benchmark VM.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "checkpoint/shard_io.h"

namespace {

namespace ckpt = ::shardline::checkpoint;
namespace v1 = ::shardline::v1;
using Clock = std::chrono::steady_clock;

struct TensorShape {
  std::string name;
  int64_t rows, cols;
};

// Keep in step with GptStateShapes in bench/torch_checkpoint.py.
std::vector<TensorShape> GptStateShapes(int64_t bytes, int64_t h) {
  std::vector<TensorShape> out;
  const std::pair<const char*, std::pair<int64_t, int64_t>> mats[] = {
      {"attn.qkv.weight", {3 * h, h}},
      {"attn.proj.weight", {h, h}},
      {"mlp.fc1.weight", {4 * h, h}},
      {"mlp.fc2.weight", {h, 4 * h}}};
  const char* kinds[] = {"param", "exp_avg", "exp_avg_sq"};
  int64_t left = bytes / 4;
  for (int layer = 0; left > 0; ++layer) {
    for (const auto& [name, shape] : mats) {
      for (const char* kind : kinds) {
        if (left <= 0) break;
        int64_t rows = shape.first;
        const int64_t cols = shape.second;
        if (rows * cols > left) rows = (left + cols - 1) / cols;
        out.push_back({absl::StrCat("layers.", layer, ".", name, ".", kind), rows, cols});
        left -= rows * cols;
      }
    }
  }
  return out;
}

int Fail(const std::string& what) {
  std::cerr << "shardline-bench-checkpoint-io: " << what << "\n";
  return 1;
}

int Main(int argc, char** argv) {
  std::string dir;
  int64_t bytes = 64 << 20, hidden = 1024, repeats = 3;
  bool help = false, stepped = false;
  shardline::ArgParser args("shardline-bench-checkpoint-io");
  args.AddString("dir", &dir, "directory on the disk under test (required)");
  args.AddInt("bytes", &bytes, "state size in bytes (default 64 MiB)");
  args.AddInt("hidden", &hidden, "model width of the GPT-shaped state (default 1024)");
  args.AddInt("repeats", &repeats, "save+restore rounds (default 3)");
  args.AddBool("stepped", &stepped, "run one repeat per line read from stdin, until its end");
  args.AddBool("help", &help, "print this help");
  std::vector<std::string> tail(argv + 1, argv + argc);
  auto positional = args.Parse(tail);
  if (help) {
    std::cout << args.Usage();
    return 0;
  }
  if (!positional.ok() || !positional->empty() || dir.empty() || bytes < 4 || hidden < 1 ||
      repeats < 1) {
    std::cerr << "shardline-bench-checkpoint-io: bad flags (--dir is required)\n" << args.Usage();
    return 2;
  }
  const std::vector<TensorShape> shapes = GptStateShapes(bytes, hidden);
  std::vector<std::vector<float>> state(shapes.size()), back(shapes.size());
  std::vector<ckpt::LocalRun> runs, restore;
  int64_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t n = shapes[i].rows * shapes[i].cols;
    state[i].resize(n);
    back[i].assign(n, 0.0f);
    for (int64_t j = 0; j < n; ++j) state[i][j] = static_cast<float>((j * 2654435761u + i) % 65521) * 1e-3f;
    ckpt::LocalRun run;
    run.tensor = shapes[i].name;
    run.global_shape = {shapes[i].rows, shapes[i].cols};
    run.begin = 0;
    run.end = n;
    run.data = state[i].data();
    runs.push_back(run);
    run.data = back[i].data();
    restore.push_back(run);
    total += n * 4;
  }
  std::printf("repeat,bytes,save_s,restore_s\n");
  std::fflush(stdout);
  std::string line;
  for (int64_t r = 0; stepped ? static_cast<bool>(std::getline(std::cin, line)) : r < repeats;
       ++r) {
    const std::string d = absl::StrCat(dir, "/shardline-", r);
    const auto t0 = Clock::now();
    absl::StatusOr<v1::ReportShardRequest> report = ckpt::WriteShard(d, 0, runs);
    const double save_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!report.ok()) return Fail(std::string(report.status().message()));
    v1::Manifest m;
    m.set_checkpoint_id("bench");
    m.set_directory(d);
    v1::RankRecord* rec = m.add_ranks();
    rec->set_rank(0);
    *rec->mutable_files() = report->files();
    for (const v1::SavedTensor& t : report->tensors()) {
      v1::SavedTensor* dst = m.add_tensors();
      *dst = t;
      for (v1::SavedPiece& p : *dst->mutable_pieces()) p.set_rank(0);
    }
    const std::string file = absl::StrCat(d, "/", ckpt::ShardFileName(0));
    const int fd = open(file.c_str(), O_RDONLY);
    if (fd < 0) return Fail(absl::StrCat("open ", file, ": ", std::strerror(errno)));
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    const auto t1 = Clock::now();
    absl::Status s = ckpt::ReadRuns(m, d, restore);
    const double restore_s = std::chrono::duration<double>(Clock::now() - t1).count();
    if (!s.ok()) return Fail(std::string(s.message()));
    for (size_t i = 0; i < state.size(); ++i) {
      if (std::memcmp(state[i].data(), back[i].data(), state[i].size() * 4) != 0)
        return Fail(absl::StrCat("restored ", shapes[i].name, " differs from what was saved"));
      std::fill(back[i].begin(), back[i].end(), 0.0f);
    }
    unlink(file.c_str());
    rmdir(d.c_str());
    std::printf("%lld,%lld,%.6f,%.6f\n", static_cast<long long>(r), static_cast<long long>(total),
                save_s, restore_s);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }

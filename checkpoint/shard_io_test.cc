// Shard files on disk: field cases C1 and C4 through real files, tp-split
// round trips across layouts, corruption, and the asynchronous writer.
#include "checkpoint/shard_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/model.h"
#include "plan/zero.h"
#include "checkpoint/crc32c.h"
#include "testing/manifest_test_util.h"

namespace shardline::checkpoint {
namespace {

using ::testing::HasSubstr;

std::string NewDir(const std::string& name) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "-", counter++);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Distinct bit patterns (finite, both signs, varied exponents): a bitwise
// comparison then proves every element came from the right place.
std::vector<float> Values(int64_t n, uint32_t salt) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = ((static_cast<uint32_t>(i) * 2654435761u + salt) & 0x807FFFFFu) |
                          (static_cast<uint32_t>(100 + (i + salt) % 50) << 23);
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

std::string Hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08X", v);
  return text;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// What the coordinator does at commit (see MergeReports).
v1::Manifest Merge(const std::map<int, v1::ReportShardRequest>& reports) {
  v1::Manifest m = testing::MergeReports(reports);
  m.set_checkpoint_id("ckpt-test");
  m.set_step(3);
  return m;
}

LocalRun Run1D(const std::string& name, int64_t n, plan::ShardRange r, float* data) {
  LocalRun run;
  run.tensor = name;
  run.global_shape = {n};
  run.begin = r.begin;
  run.end = r.end;
  run.data = data;
  return run;
}

// Saves a 1-D tensor the way dp ranks of ZeRO with (D, A) do.
std::map<int, v1::ReportShardRequest> SaveDp(const std::string& dir, const std::string& name,
                                             std::vector<float>& values, int dp,
                                             int64_t alignment) {
  std::map<int, v1::ReportShardRequest> reports;
  const int64_t n = static_cast<int64_t>(values.size());
  for (int r = 0; r < dp; ++r) {
    const plan::ShardRange s = plan::ShardOf(n, dp, alignment, r);
    absl::StatusOr<v1::ReportShardRequest> rep =
        WriteShard(dir, r, {Run1D(name, n, s, values.data() + s.begin)});
    EXPECT_TRUE(rep.ok()) << rep.status();
    if (rep.ok()) reports[r] = *rep;
  }
  return reports;
}

// Restores a 1-D tensor at dp ranks of (D, A) and re-joins them.
std::vector<float> RestoreDp(const v1::Manifest& m, const std::string& dir,
                             const std::string& name, int64_t n, int dp, int64_t alignment) {
  std::vector<float> out(n, -1.0f);
  for (int r = 0; r < dp; ++r) {
    const plan::ShardRange s = plan::ShardOf(n, dp, alignment, r);
    std::vector<float> mine(s.size(), -2.0f);
    absl::Status st = ReadRuns(m, dir, {Run1D(name, n, s, mine.data())});
    EXPECT_TRUE(st.ok()) << st;
    std::copy(mine.begin(), mine.end(), out.begin() + s.begin);
  }
  return out;
}

// Real element counts each rank's report records for tensor `name`.
std::vector<int64_t> RecordedCounts(const std::map<int, v1::ReportShardRequest>& reports, int dp) {
  std::vector<int64_t> counts(dp, 0);
  for (const auto& [rank, rep] : reports) {
    for (const v1::SavedTensor& t : rep.tensors()) {
      for (const v1::SavedPiece& p : t.pieces()) counts[rank] += p.range().end() - p.range().begin();
    }
  }
  return counts;
}

// --- C1 -------------------------------------------------------------------

TEST(C1Test, RealCountsAndBitExactRejoin) {
  for (auto [alignment, counts] : std::vector<std::pair<int64_t, std::vector<int64_t>>>{
           {1, {29, 28}}, {2, {30, 27}}}) {
    SCOPED_TRACE(absl::StrCat("A=", alignment));
    const std::string dir = NewDir("c1");
    std::vector<float> values = Values(57, 7);
    const auto reports = SaveDp(dir, "w", values, 2, alignment);
    EXPECT_EQ(RecordedCounts(reports, 2), counts);
    // Rank 1's piece starts where rank 0's ends.
    EXPECT_EQ(reports.at(1).tensors(0).pieces(0).range().begin(), static_cast<uint64_t>(counts[0]));
    EXPECT_EQ(reports.at(1).tensors(0).pieces(0).range().end(), 57u);
    EXPECT_EQ(reports.at(1).files(0).size_bytes(), static_cast<uint64_t>(counts[1] * 4));
    const v1::Manifest m = Merge(reports);
    const VerifyReport vr = VerifyCheckpoint(m, dir);
    EXPECT_TRUE(vr.ok()) << vr.first_problem;
    EXPECT_EQ(vr.bytes_checked, 2u * 57 * 4);
    EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", 57, 1, 1), values));
    EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", 57, 2, alignment), values));
    EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", 57, 3, 4), values));
  }
}

TEST(C1Test, SweepSizesThatDoNotDivide) {
  for (int dp : {2, 3, 4}) {
    for (int64_t n : {int64_t{1}, int64_t{dp - 1}, int64_t{dp + 1}, int64_t{2 * dp - 1}}) {
      for (int64_t alignment : {1, 2}) {
        SCOPED_TRACE(absl::StrCat("N=", n, " D=", dp, " A=", alignment));
        const std::string dir = NewDir("c1-sweep");
        std::vector<float> values = Values(n, static_cast<uint32_t>(n * 10 + dp));
        const auto reports = SaveDp(dir, "w", values, dp, alignment);
        // Each rank records exactly its real elements; empty ranks write nothing.
        const std::vector<int64_t> counts = RecordedCounts(reports, dp);
        int64_t total = 0;
        for (int r = 0; r < dp; ++r) {
          const plan::ShardRange s = plan::ShardOf(n, dp, alignment, r);
          EXPECT_EQ(counts[r], s.size()) << "rank " << r;
          EXPECT_EQ(Exists(absl::StrCat(dir, "/", ShardFileName(r))), s.size() > 0) << "rank " << r;
          EXPECT_EQ(reports.at(r).files_size(), s.size() > 0 ? 1 : 0);
          total += counts[r];
        }
        EXPECT_EQ(total, n);
        const v1::Manifest m = Merge(reports);
        const VerifyReport vr = VerifyCheckpoint(m, dir);
        EXPECT_TRUE(vr.ok()) << vr.first_problem;
        EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", n, 1, 1), values));
        EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", n, dp + 1, 1), values));
      }
    }
  }
}

// --- C4 -------------------------------------------------------------------

TEST(C4Test, PaddingNeverReachesTheCheckpoint) {
  const std::string dir = NewDir("c4");
  std::vector<float> values = Values(100, 4);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(plan::ShardOf(100, 8, 16, r), (plan::ShardRange{16 * r, 16 * r + 16}));
  }
  EXPECT_EQ(plan::ShardOf(100, 8, 16, 6), (plan::ShardRange{96, 100}));
  EXPECT_EQ(plan::ShardOf(100, 8, 16, 7).size(), 0);

  const auto reports = SaveDp(dir, "w", values, 8, 16);
  EXPECT_EQ(RecordedCounts(reports, 8), (std::vector<int64_t>{16, 16, 16, 16, 16, 16, 4, 0}));
  // Rank 7 writes nothing and reports nothing.
  EXPECT_FALSE(Exists(absl::StrCat(dir, "/rank-00007.bin")));
  EXPECT_EQ(reports.at(7).files_size(), 0);
  EXPECT_EQ(reports.at(7).tensors_size(), 0);
  EXPECT_EQ(reports.at(6).files(0).path(), "rank-00006.bin");
  EXPECT_EQ(reports.at(6).files(0).size_bytes(), 16u);  // 4 real elements, no padding

  const v1::Manifest m = Merge(reports);
  ASSERT_EQ(m.tensors_size(), 1);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const v1::SavedPiece& p : m.tensors(0).pieces()) {
    ranges.emplace_back(p.range().begin(), p.range().end());
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, covered);  // no gap, no overlap
    covered = e;
  }
  EXPECT_EQ(covered, 100u);  // no overhang
  EXPECT_EQ(ranges.size(), 7u);

  const VerifyReport vr = VerifyCheckpoint(m, dir);
  EXPECT_TRUE(vr.ok()) << vr.first_problem;
  EXPECT_EQ(vr.files, 7);
  EXPECT_EQ(vr.pieces, 7);
  EXPECT_EQ(vr.tensors, 1);
  EXPECT_EQ(vr.bytes_checked, 2u * 400);
  EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", 100, 1, 1), values));
  EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", 100, 8, 16), values));
  EXPECT_TRUE(SameBits(RestoreDp(m, dir, "w", 100, 3, 1), values));
}

// --- tp splits --------------------------------------------------------------

plan::ParameterSpec Spec(const std::string& name, std::vector<int64_t> shape, int split) {
  plan::ParameterSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.tp_split_dim = split;
  return s;
}

LocalRun RunOf(const plan::ParameterSpec& spec, int tp, int tp_rank, plan::ShardRange r,
               float* data) {
  LocalRun run;
  run.tensor = spec.name;
  run.global_shape = spec.shape;
  run.split_dim = spec.tp_split_dim;
  run.tp = tp;
  run.tp_rank = tp_rank;
  run.begin = r.begin;
  run.end = r.end;
  run.data = data;
  return run;
}

// Saves every spec at (tp, dp) with ZeRO shards of the tp-local slice: rank
// = tp_rank + tp * dp_rank writes its runs of all tensors into one file.
std::map<int, v1::ReportShardRequest> SaveTp(const std::string& dir,
                                             const std::vector<plan::ParameterSpec>& specs,
                                             const std::map<std::string, std::vector<float>>& global,
                                             int tp, int dp) {
  std::map<int, v1::ReportShardRequest> reports;
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      std::vector<std::vector<float>> buffers;
      std::vector<LocalRun> runs;
      buffers.reserve(specs.size());
      for (const plan::ParameterSpec& spec : specs) {
        // A tp-replicated tensor is saved by tp rank 0 only (each element once).
        if (spec.tp_split_dim < 0 && t != 0) continue;
        const int64_t local = spec.local_numel(tp);
        const plan::ShardRange s = plan::ShardOf(local, dp, 1, d);
        std::vector<float>& b = buffers.emplace_back();
        for (int64_t i = s.begin; i < s.end; ++i) {
          b.push_back(global.at(spec.name)[spec.global_index(tp, t, i)]);
        }
        runs.push_back(RunOf(spec, tp, t, s, b.data()));
      }
      absl::StatusOr<v1::ReportShardRequest> rep = WriteShard(dir, t + tp * d, runs);
      EXPECT_TRUE(rep.ok()) << rep.status();
      if (rep.ok()) reports[t + tp * d] = *rep;
    }
  }
  return reports;
}

// Restores every spec at (tp, dp) and checks each element against the
// global tensor.
void CheckRestore(const v1::Manifest& m, const std::string& dir,
                  const std::vector<plan::ParameterSpec>& specs,
                  const std::map<std::string, std::vector<float>>& global, int tp, int dp) {
  SCOPED_TRACE(absl::StrCat("restore at tp=", tp, " dp=", dp));
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      std::vector<std::vector<float>> buffers;
      std::vector<LocalRun> runs;
      buffers.reserve(specs.size());
      for (const plan::ParameterSpec& spec : specs) {
        const plan::ShardRange s = plan::ShardOf(spec.local_numel(tp), dp, 1, d);
        buffers.emplace_back(s.size(), -1.0f);
        runs.push_back(RunOf(spec, tp, t, s, buffers.back().data()));
      }
      absl::Status st = ReadRuns(m, dir, runs);
      ASSERT_TRUE(st.ok()) << st;
      for (size_t k = 0; k < specs.size(); ++k) {
        for (int64_t i = runs[k].begin; i < runs[k].end; ++i) {
          const int64_t g = specs[k].global_index(tp, t, i);
          const float want = global.at(specs[k].name)[g];
          const float got = buffers[k][i - runs[k].begin];
          ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
              << specs[k].name << " tp_rank " << t << " dp_rank " << d << " local " << i
              << " global " << g;
        }
      }
    }
  }
}

TEST(TpSplitTest, RoundTripAcrossTpAndDp) {
  const std::vector<plan::ParameterSpec> specs = {Spec("a", {6, 4}, 0), Spec("b", {6, 4}, 1),
                                                  Spec("c", {2, 6, 4}, 1), Spec("bias", {6}, -1)};
  std::map<std::string, std::vector<float>> global;
  uint32_t salt = 1;
  for (const auto& s : specs) global[s.name] = Values(s.numel(), salt++);

  const std::string dir = NewDir("tp");
  const auto reports = SaveTp(dir, specs, global, /*tp=*/2, /*dp=*/2);
  // tp rank 1's slices in global coordinates.
  const v1::ReportShardRequest& r1 = reports.at(1);
  ASSERT_EQ(r1.tensors_size(), 3);  // "bias" only from tp rank 0
  const v1::TensorSlice& a1 = r1.tensors(0).pieces(0).slice();
  EXPECT_EQ(a1.dims(0).offset(), 3u);
  EXPECT_EQ(a1.dims(0).length(), 3u);
  EXPECT_EQ(a1.dims(1).offset(), 0u);
  EXPECT_EQ(a1.dims(1).length(), 4u);
  const v1::TensorSlice& b1 = r1.tensors(1).pieces(0).slice();
  EXPECT_EQ(b1.dims(0).offset(), 0u);
  EXPECT_EQ(b1.dims(0).length(), 6u);
  EXPECT_EQ(b1.dims(1).offset(), 2u);
  EXPECT_EQ(b1.dims(1).length(), 2u);
  EXPECT_EQ(r1.tensors(1).pieces(0).range().begin(), 0u);  // dp rank 0: [0, 6) of 12
  EXPECT_EQ(r1.tensors(1).pieces(0).range().end(), 6u);
  EXPECT_EQ(r1.tensors(1).pieces(0).byte_offset(), 6u * 4);  // after a's 6 values
  EXPECT_EQ(r1.tensors(1).global_shape(0), 6u);
  EXPECT_EQ(r1.tensors(1).dtype(), v1::DTYPE_FLOAT32);

  const v1::Manifest m = Merge(reports);
  EXPECT_TRUE(VerifyCheckpoint(m, dir).ok()) << VerifyCheckpoint(m, dir).first_problem;
  CheckRestore(m, dir, specs, global, 1, 1);
  CheckRestore(m, dir, specs, global, 2, 3);  // other dp sharding: 4 of 12 per rank
  CheckRestore(m, dir, specs, global, 2, 5);
  CheckRestore(m, dir, specs, global, 1, 4);
}

TEST(TpSplitTest, SaveAtTp1RestoreAtTp2) {
  const std::vector<plan::ParameterSpec> specs = {Spec("a", {6, 4}, 0), Spec("b", {6, 4}, 1),
                                                  Spec("c", {2, 6, 4}, 1)};
  std::map<std::string, std::vector<float>> global;
  uint32_t salt = 11;
  for (const auto& s : specs) global[s.name] = Values(s.numel(), salt++);
  const std::string dir = NewDir("tp1");
  const v1::Manifest m = Merge(SaveTp(dir, specs, global, /*tp=*/1, /*dp=*/3));
  CheckRestore(m, dir, specs, global, 2, 2);
  CheckRestore(m, dir, specs, global, 2, 1);
}

TEST(TpSplitTest, ManyRowsOfAColumnSplit) {
  // A column (dim 1) split is one global interval per row: 2048 rows here.
  const std::vector<plan::ParameterSpec> specs = {Spec("fc2", {2048, 8}, 1),
                                                  Spec("qkv", {24, 2048}, 0)};
  std::map<std::string, std::vector<float>> global;
  uint32_t salt = 21;
  for (const auto& s : specs) global[s.name] = Values(s.numel(), salt++);
  const std::string dir = NewDir("rows");
  const v1::Manifest m = Merge(SaveTp(dir, specs, global, /*tp=*/4, /*dp=*/3));
  const VerifyReport vr = VerifyCheckpoint(m, dir);
  EXPECT_TRUE(vr.ok()) << vr.first_problem;
  EXPECT_EQ(vr.bytes_checked, 2u * (2048 * 8 + 24 * 2048) * 4);
  CheckRestore(m, dir, specs, global, 2, 5);
  CheckRestore(m, dir, specs, global, 8, 1);
  CheckRestore(m, dir, specs, global, 1, 2);
}

// --- Errors and corruption ----------------------------------------------------

struct Saved {
  std::string dir;
  v1::Manifest manifest;
  std::vector<float> w, v;
};

// "w" (57, D=2) and "v" (10, D=2) in rank-00000.bin and rank-00001.bin.
Saved SaveTwo(const std::string& name) {
  Saved s;
  s.dir = NewDir(name);
  s.w = Values(57, 3);
  s.v = Values(10, 5);
  std::map<int, v1::ReportShardRequest> reports;
  for (int r = 0; r < 2; ++r) {
    const plan::ShardRange a = plan::ShardOf(57, 2, 1, r), b = plan::ShardOf(10, 2, 1, r);
    auto rep = WriteShard(s.dir, r,
                          {Run1D("w", 57, a, s.w.data() + a.begin),
                           Run1D("v", 10, b, s.v.data() + b.begin)});
    EXPECT_TRUE(rep.ok()) << rep.status();
    reports[r] = *rep;
  }
  s.manifest = Merge(reports);
  return s;
}

absl::Status ReadWhole(const Saved& s, const std::string& tensor, int64_t n) {
  std::vector<float> out(n);
  return ReadRuns(s.manifest, s.dir, {Run1D(tensor, n, {0, n}, out.data())});
}

TEST(CorruptionTest, FlippedByteIsDataLossNamingTensorAndFile) {
  const Saved s = SaveTwo("flip");
  ASSERT_TRUE(ReadWhole(s, "w", 57).ok());
  const std::string path = s.dir + "/rank-00001.bin";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(10);
    char c;
    f.read(&c, 1);
    c ^= 0x01;
    f.seekp(10);
    f.write(&c, 1);
  }
  const absl::Status st = ReadWhole(s, "w", 57);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("'w'"));
  EXPECT_THAT(st.message(), HasSubstr("rank-00001.bin"));
  EXPECT_THAT(st.message(), HasSubstr("CRC-32C"));
  // Rank 0's part alone is still readable; "v" (later in the file) too.
  std::vector<float> head(29);
  EXPECT_TRUE(ReadRuns(s.manifest, s.dir, {Run1D("w", 57, {0, 29}, head.data())}).ok());
  EXPECT_TRUE(ReadWhole(s, "v", 10).ok());
  const VerifyReport vr = VerifyCheckpoint(s.manifest, s.dir);
  EXPECT_FALSE(vr.ok());
  EXPECT_EQ(vr.problems, 2);  // the file's checksum and the piece's
  EXPECT_EQ(vr.first_problem.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(vr.first_problem.message(), HasSubstr("rank-00001.bin"));
}

TEST(CorruptionTest, TruncatedFileIsDataLoss) {
  Saved s = SaveTwo("trunc");
  const std::string path = s.dir + "/rank-00001.bin";
  ASSERT_EQ(::truncate(path.c_str(), 60), 0);
  absl::Status st = ReadWhole(s, "v", 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank-00001.bin"));
  EXPECT_THAT(st.message(), HasSubstr("'v'"));
  // Without the size records the piece bounds catch it.
  s.manifest.clear_ranks();
  st = ReadWhole(s, "v", 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("truncated"));
  EXPECT_FALSE(VerifyCheckpoint(s.manifest, s.dir).ok());
}

TEST(CorruptionTest, MissingFileIsDataLoss) {
  const Saved s = SaveTwo("missing-file");
  ASSERT_EQ(::unlink((s.dir + "/rank-00000.bin").c_str()), 0);
  const absl::Status st = ReadWhole(s, "w", 57);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank-00000.bin"));
  const VerifyReport vr = VerifyCheckpoint(s.manifest, s.dir);
  EXPECT_EQ(vr.first_problem.code(), absl::StatusCode::kDataLoss);
}

// Issue 14, defect 5: `shardctl checkpoint verify` did not flag a shard
// reached through a symlink (sub -> elsewhere, or the file itself a link);
// the reader followed it. Both now refuse it and name the link.
TEST(CorruptionTest, ShardThroughASymlinkIsFlagged) {
  Saved s = SaveTwo("symlinked");
  const std::string elsewhere = NewDir("symlinked-elsewhere");
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0755), 0);
  ASSERT_EQ(::rename((s.dir + "/rank-00001.bin").c_str(), (elsewhere + "/rank-00001.bin").c_str()),
            0);
  // The same bytes, reachable as sub/rank-00001.bin through sub -> elsewhere.
  ASSERT_EQ(::symlink(elsewhere.c_str(), (s.dir + "/sub").c_str()), 0);
  for (v1::RankRecord& r : *s.manifest.mutable_ranks()) {
    for (v1::ShardFile& f : *r.mutable_files()) {
      if (f.path() == "rank-00001.bin") f.set_path("sub/rank-00001.bin");
    }
  }
  for (v1::SavedTensor& t : *s.manifest.mutable_tensors()) {
    for (v1::SavedPiece& p : *t.mutable_pieces()) {
      if (p.file() == "rank-00001.bin") p.set_file("sub/rank-00001.bin");
    }
  }
  VerifyReport vr = VerifyCheckpoint(s.manifest, s.dir);
  EXPECT_FALSE(vr.ok());
  EXPECT_EQ(vr.first_problem.code(), absl::StatusCode::kFailedPrecondition) << vr.first_problem;
  EXPECT_THAT(vr.first_problem.message(),
              HasSubstr("checkpoint path 'sub/rank-00001.bin' of rank 1 goes through symlink "
                        "'sub'; shards must be regular files inside " + s.dir));
  absl::Status st = ReadWhole(s, "w", 57);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), HasSubstr("goes through symlink 'sub'"));
  // The shard file itself a symlink.
  ASSERT_EQ(::symlink((elsewhere + "/rank-00001.bin").c_str(), (s.dir + "/link.bin").c_str()), 0);
  for (v1::RankRecord& r : *s.manifest.mutable_ranks()) {
    for (v1::ShardFile& f : *r.mutable_files()) {
      if (f.path() == "sub/rank-00001.bin") f.set_path("link.bin");
    }
  }
  for (v1::SavedTensor& t : *s.manifest.mutable_tensors()) {
    for (v1::SavedPiece& p : *t.mutable_pieces()) {
      if (p.file() == "sub/rank-00001.bin") p.set_file("link.bin");
    }
  }
  vr = VerifyCheckpoint(s.manifest, s.dir);
  EXPECT_EQ(vr.first_problem.code(), absl::StatusCode::kFailedPrecondition) << vr.first_problem;
  EXPECT_THAT(vr.first_problem.message(), HasSubstr("goes through symlink 'link.bin'"));
}

TEST(CorruptionTest, MissingTensorIsNotFound) {
  const Saved s = SaveTwo("missing-tensor");
  const absl::Status st = ReadWhole(s, "nope", 4);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_THAT(st.message(), HasSubstr("'nope'"));
}

TEST(CorruptionTest, ShapeMismatchIsInvalidArgument) {
  const Saved s = SaveTwo("shape");
  std::vector<float> out(58);
  const absl::Status st = ReadRuns(s.manifest, s.dir, {Run1D("w", 58, {0, 58}, out.data())});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("[57]"));
}

TEST(CorruptionTest, GapIsDataLossNamingFirstMissingIndex) {
  Saved s = SaveTwo("gap");
  // Drop rank 1's piece of "w": [29, 57) is lost.
  v1::SavedTensor* w = s.manifest.mutable_tensors(0);
  ASSERT_EQ(w->name(), "w");
  w->mutable_pieces()->RemoveLast();
  const absl::Status st = ReadWhole(s, "w", 57);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("global element 29 "));
  EXPECT_THAT(st.message(), HasSubstr("'w'"));
  const VerifyReport vr = VerifyCheckpoint(s.manifest, s.dir);
  EXPECT_EQ(vr.problems, 1);
  EXPECT_THAT(vr.first_problem.message(), HasSubstr("[29, 57)"));
  EXPECT_THAT(vr.first_problem.message(), HasSubstr("gap"));
}

TEST(CorruptionTest, OverlapIsFound) {
  Saved s = SaveTwo("overlap");
  v1::SavedTensor* w = s.manifest.mutable_tensors(0);
  // Rank 1's piece claims one more element at its front: [28, 57) of a
  // file holding 28 elements is an overlap (and a bad byte length).
  v1::SavedPiece copy = w->pieces(0);
  copy.mutable_range()->set_begin(20);
  copy.mutable_range()->set_end(29);
  copy.set_byte_offset(20 * 4);
  copy.set_byte_length(9 * 4);
  std::vector<float> part(s.w.begin() + 20, s.w.begin() + 29);
  copy.set_crc32c(Crc32c(part.data(), part.size() * 4));
  *w->add_pieces() = copy;  // elements [20, 29) again, valid bytes of rank 0's file
  const VerifyReport vr = VerifyCheckpoint(s.manifest, s.dir);
  EXPECT_EQ(vr.problems, 1) << vr.first_problem;
  EXPECT_THAT(vr.first_problem.message(), HasSubstr("global element 20 "));
  EXPECT_THAT(vr.first_problem.message(), HasSubstr("overlap"));
  const absl::Status st = ReadWhole(s, "w", 57);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
}

TEST(WriteShardTest, MalformedRunsNameTheField) {
  const std::string dir = NewDir("bad");
  std::vector<float> data(8);
  auto code_and = [&](LocalRun run, const std::string& field) {
    absl::StatusOr<v1::ReportShardRequest> r = WriteShard(dir, 0, {run});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(r.status().message(), HasSubstr(field));
  };
  LocalRun ok = RunOf(Spec("m", {4, 2}, 0), 2, 1, {0, 4}, data.data());
  LocalRun r = ok;
  r.end = 5;
  code_and(r, "end");
  r = ok;
  r.tp_rank = 2;
  code_and(r, "tp_rank");
  r = ok;
  r.split_dim = 2;
  code_and(r, "split_dim");
  r = ok;
  r.tp = 3;
  code_and(r, "does not divide");
  r = ok;
  r.data = nullptr;
  code_and(r, "data");
  r = ok;
  r.tensor.clear();
  code_and(r, "tensor name");
  LocalRun other = ok;
  other.global_shape = {8, 2};
  absl::StatusOr<v1::ReportShardRequest> two = WriteShard(dir, 0, {ok, other});
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two.status().message(), HasSubstr("global_shape"));
  EXPECT_FALSE(Exists(dir));  // nothing written for a bad request
}

TEST(WriteShardTest, IoErrorNamesThePath) {
  const std::string file = NewDir("plain-file");
  std::ofstream(file) << "x";
  std::vector<float> data(4, 1.0f);
  absl::StatusOr<v1::ReportShardRequest> r =
      WriteShard(file + "/sub", 0, {Run1D("w", 4, {0, 4}, data.data())});
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(file + "/sub"));
}

TEST(WriteShardTest, FileLayoutAndChecksums) {
  const std::string dir = NewDir("layout") + "/nested/deeper";  // parents created
  std::vector<float> a = Values(5, 1), b = Values(3, 2);
  auto r = WriteShard(dir, 12, {Run1D("a", 9, {4, 9}, a.data()), Run1D("b", 3, {0, 3}, b.data()),
                                Run1D("a", 9, {0, 0}, nullptr)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->files_size(), 1);
  EXPECT_EQ(r->files(0).path(), "rank-00012.bin");
  EXPECT_EQ(r->files(0).size_bytes(), 32u);
  std::vector<float> both(a);
  both.insert(both.end(), b.begin(), b.end());
  std::ifstream in(dir + "/rank-00012.bin", std::ios::binary);
  std::vector<float> file(8);
  in.read(reinterpret_cast<char*>(file.data()), 32);
  EXPECT_TRUE(SameBits(file, both));
  EXPECT_EQ(r->files(0).crc32c(), Crc32c(both.data(), 32));
  ASSERT_EQ(r->tensors_size(), 2);  // the empty run adds no piece
  EXPECT_EQ(r->tensors(0).pieces_size(), 1);
  const v1::SavedPiece& pb = r->tensors(1).pieces(0);
  EXPECT_EQ(pb.rank(), 12u);
  EXPECT_EQ(pb.byte_offset(), 20u);
  EXPECT_EQ(pb.byte_length(), 12u);
  EXPECT_EQ(pb.crc32c(), Crc32c(b.data(), 12));
  EXPECT_EQ(pb.file(), "rank-00012.bin");
  // No temporary file is left behind.
  EXPECT_FALSE(Exists(dir + "/rank-00012.bin.tmp-" + std::to_string(::getpid()) + "-0"));
}

// Many small runs of odd lengths between a few huge ones (~26 MiB): blocks
// gather several runs and cut the huge ones, write-back is started several
// times while writing, and the reader splits the huge pieces into chunks
// on several threads.
struct BigShard {
  std::string dir;
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  v1::ReportShardRequest report;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::string bytes(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

const BigShard& SaveBigShard() {
  static const BigShard* saved = [] {
    auto* s = new BigShard;
    s->dir = NewDir("big");
    std::vector<LocalRun> runs;
    for (int i = 0; i < 320; ++i) {
      // Every 80th run is huge (~6.4 MiB: two 4 MiB read chunks, not a
      // multiple of a page); the others 1..997 elements.
      const int64_t n = i % 80 == 13 ? (int64_t{1600} << 10) + 7 * i : 1 + (i * 389) % 997;
      s->names.push_back(absl::StrCat("t", i));
      s->values.push_back(Values(n, static_cast<uint32_t>(i)));
    }
    for (int i = 0; i < 320; ++i) {
      const int64_t n = static_cast<int64_t>(s->values[i].size());
      runs.push_back(Run1D(s->names[i], n, {0, n}, s->values[i].data()));
    }
    absl::StatusOr<v1::ReportShardRequest> r = WriteShard(s->dir, 0, runs);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) s->report = *std::move(r);
    return s;
  }();
  return *saved;
}

TEST(WriteShardTest, ManyOddRunsAndHugeOnesStreamIntact) {
  const BigShard& s = SaveBigShard();
  ASSERT_EQ(s.report.files_size(), 1);
  const std::string file = ReadFile(s.dir + "/rank-00000.bin");
  uint64_t total = 0;
  for (const std::vector<float>& v : s.values) total += v.size() * 4;
  ASSERT_GT(total, uint64_t{24} << 20);
  ASSERT_EQ(file.size(), total);
  EXPECT_EQ(s.report.files(0).size_bytes(), total);
  EXPECT_EQ(s.report.files(0).crc32c(), Crc32c(file.data(), file.size()));
  ASSERT_EQ(s.report.tensors_size(), 320);
  uint64_t offset = 0;
  for (int i = 0; i < 320; ++i) {
    const v1::SavedPiece& p = s.report.tensors(i).pieces(0);
    const uint64_t bytes = s.values[i].size() * 4;
    ASSERT_EQ(p.byte_offset(), offset) << s.names[i];
    ASSERT_EQ(p.byte_length(), bytes) << s.names[i];
    ASSERT_EQ(std::memcmp(file.data() + offset, s.values[i].data(), bytes), 0) << s.names[i];
    ASSERT_EQ(p.crc32c(), Crc32c(s.values[i].data(), bytes)) << s.names[i];
    offset += bytes;
  }
}

v1::Manifest BigManifest(const BigShard& s) { return Merge({{0, s.report}}); }

TEST(ParallelReadTest, ManySmallAndAFewHugeRunsWhole) {
  const BigShard& s = SaveBigShard();
  std::vector<std::vector<float>> back(s.values.size());
  std::vector<LocalRun> runs;
  for (size_t i = 0; i < s.values.size(); ++i) {
    const int64_t n = static_cast<int64_t>(s.values[i].size());
    back[i].assign(n, -1.0f);
    runs.push_back(Run1D(s.names[i], n, {0, n}, back[i].data()));
  }
  // Reversed: the order of the runs is not the file's.
  std::reverse(runs.begin(), runs.end());
  const absl::Status st = ReadRuns(BigManifest(s), s.dir, runs);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < s.values.size(); ++i) {
    EXPECT_TRUE(SameBits(back[i], s.values[i])) << s.names[i];
  }
}

TEST(ParallelReadTest, PiecesNeededInPartsOrTwice) {
  // Per tensor: the first third and the rest into separate buffers (the
  // piece is covered exactly by two reads, checked from the buffers), the
  // middle half again (a partial need: its own verifying read), and every
  // huge tensor whole a second time (a tied copy).
  const BigShard& s = SaveBigShard();
  std::vector<std::vector<float>> back;
  std::vector<std::pair<size_t, plan::ShardRange>> want;  // tensor, range
  for (size_t i = 0; i < s.values.size(); ++i) {
    const int64_t n = static_cast<int64_t>(s.values[i].size());
    want.push_back({i, {0, n / 3}});
    want.push_back({i, {n / 3, n}});
    want.push_back({i, {n / 4, n / 4 + n / 2}});
    if (n > 1000) want.push_back({i, {0, n}});
  }
  back.reserve(want.size());
  std::vector<LocalRun> runs;
  for (const auto& [i, r] : want) {
    const int64_t n = static_cast<int64_t>(s.values[i].size());
    back.emplace_back(r.size(), -1.0f);
    runs.push_back(Run1D(s.names[i], n, r, back.back().data()));
  }
  const absl::Status st = ReadRuns(BigManifest(s), s.dir, runs);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t k = 0; k < want.size(); ++k) {
    const auto& [i, r] = want[k];
    const std::vector<float> expect(s.values[i].begin() + r.begin, s.values[i].begin() + r.end);
    EXPECT_TRUE(SameBits(back[k], expect)) << s.names[i] << " [" << r.begin << ", " << r.end << ")";
  }
}

TEST(ParallelReadTest, AliasingRunsAreFilledToo) {
  // Two runs into the same memory (a caller's tied tensor): read one after
  // the other, never by two threads at once.
  const BigShard& s = SaveBigShard();
  size_t huge = 0;
  while (s.values[huge].size() < 1000) ++huge;
  const int64_t n = static_cast<int64_t>(s.values[huge].size());
  std::vector<float> back(n, -1.0f);
  const std::vector<LocalRun> runs = {Run1D(s.names[huge], n, {0, n}, back.data()),
                                      Run1D(s.names[huge], n, {0, n}, back.data())};
  const absl::Status st = ReadRuns(BigManifest(s), s.dir, runs);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(SameBits(back, s.values[huge]));
}

// A copy of the big shard whose byte `at` is flipped.
std::string CorruptCopy(const BigShard& s, const std::string& name, uint64_t at) {
  const std::string dir = NewDir(name);
  EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0);
  std::string bytes = ReadFile(s.dir + "/rank-00000.bin");
  bytes[at] ^= 0x10;
  std::ofstream(dir + "/rank-00000.bin", std::ios::binary) << bytes;
  return dir;
}

TEST(ParallelReadTest, CorruptionInAHugePieceReadWholeIsDataLoss) {
  const BigShard& s = SaveBigShard();
  const v1::Manifest m = BigManifest(s);
  size_t huge = 0;
  while (s.values[huge].size() < 1000) ++huge;
  const v1::SavedPiece& p = s.report.tensors(static_cast<int>(huge)).pieces(0);
  // A byte in its second 4 MiB chunk: found by combining the chunks' CRCs.
  const std::string dir = CorruptCopy(s, "big-flip", p.byte_offset() + (uint64_t{5} << 20) + 3);
  std::vector<std::vector<float>> back(s.values.size());
  std::vector<LocalRun> runs;
  for (size_t i = 0; i < s.values.size(); ++i) {
    const int64_t n = static_cast<int64_t>(s.values[i].size());
    back[i].resize(n);
    runs.push_back(Run1D(s.names[i], n, {0, n}, back[i].data()));
  }
  absl::Status st = ReadRuns(m, dir, runs);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("'" + s.names[huge] + "': piece 0"));
  EXPECT_THAT(st.message(), HasSubstr("rank-00000.bin"));
  EXPECT_THAT(st.message(), HasSubstr("CRC-32C"));
  EXPECT_THAT(st.message(), HasSubstr(Hex32(p.crc32c())));
  // Needed in part, the piece is still verified whole.
  const int64_t n = static_cast<int64_t>(s.values[huge].size());
  std::vector<float> head(10);
  st = ReadRuns(m, dir, {Run1D(s.names[huge], n, {0, 10}, head.data())});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr(s.names[huge]));
  // The other tensors read fine.
  runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(huge));
  st = ReadRuns(m, dir, runs);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(ParallelReadTest, TheFirstProblemInTheRunsOrderIsReported) {
  // A corrupt piece needed before a missing tensor: the corruption (as when
  // the runs were read one after another); after it: the missing tensor.
  const BigShard& s = SaveBigShard();
  const v1::SavedPiece& p = s.report.tensors(5).pieces(0);
  const std::string dir = CorruptCopy(s, "big-first", p.byte_offset());
  const v1::Manifest m = BigManifest(s);
  std::vector<std::vector<float>> back(s.values.size());
  std::vector<LocalRun> runs;
  for (size_t i = 0; i < s.values.size(); ++i) {
    const int64_t n = static_cast<int64_t>(s.values[i].size());
    back[i].resize(n);
    runs.push_back(Run1D(s.names[i], n, {0, n}, back[i].data()));
  }
  std::vector<float> none(4);
  std::vector<LocalRun> first = runs;
  first.insert(first.begin() + 30, Run1D("nope", 4, {0, 4}, none.data()));
  absl::Status st = ReadRuns(m, dir, first);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("'t5'"));
  std::vector<LocalRun> second = runs;
  second.insert(second.begin() + 3, Run1D("nope", 4, {0, 4}, none.data()));
  st = ReadRuns(m, dir, second);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_THAT(st.message(), HasSubstr("'nope'"));
}

TEST(ParallelReadTest, TruncatedInAHugePieceIsDataLoss) {
  const BigShard& s = SaveBigShard();
  size_t huge = 0;
  while (s.values[huge].size() < 1000) ++huge;
  const v1::SavedPiece& p = s.report.tensors(static_cast<int>(huge)).pieces(0);
  const std::string dir = CorruptCopy(s, "big-trunc", 0);
  ASSERT_EQ(::truncate((dir + "/rank-00000.bin").c_str(),
                       static_cast<off_t>(p.byte_offset() + (uint64_t{5} << 20))),
            0);
  const int64_t n = static_cast<int64_t>(s.values[huge].size());
  std::vector<float> back(n);
  v1::Manifest m = BigManifest(s);
  absl::Status st = ReadRuns(m, dir, {Run1D(s.names[huge], n, {0, n}, back.data())});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("the manifest records"));
  m.clear_ranks();  // no recorded size: the piece's bounds catch it
  st = ReadRuns(m, dir, {Run1D(s.names[huge], n, {0, n}, back.data())});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("truncated"));
  EXPECT_THAT(st.message(), HasSubstr(s.names[huge]));
}

TEST(ParallelReadTest, LargeTpSplitsAcrossLayouts) {
  // ~14 MiB over two files: a column split read row by row from both
  // (each piece covered exactly by 1024 reads), and at other layouts in
  // parts (verified by their own reads), on several threads.
  const std::vector<plan::ParameterSpec> specs = {Spec("cols", {1024, 1536}, 1),
                                                  Spec("rows", {2048, 1024}, 0)};
  std::map<std::string, std::vector<float>> global;
  for (const plan::ParameterSpec& spec : specs) {
    global[spec.name] = Values(spec.numel(), static_cast<uint32_t>(spec.name.size()));
  }
  const std::string dir = NewDir("tp-large");
  const v1::Manifest m = Merge(SaveTp(dir, specs, global, /*tp=*/2, /*dp=*/1));
  CheckRestore(m, dir, specs, global, 1, 1);
  CheckRestore(m, dir, specs, global, 2, 1);
  CheckRestore(m, dir, specs, global, 4, 3);
}

// --- Async ----------------------------------------------------------------

TEST(AsyncShardWriterTest, WritesTheValuesAtStart) {
  const std::string dir = NewDir("async");
  std::vector<float> values = Values(1000, 9);
  const std::vector<float> original = values;
  AsyncShardWriter writer;
  EXPECT_EQ(writer.Wait().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(writer.Start(dir, 3, {Run1D("w", 1000, {0, 1000}, values.data())}).ok());
  std::fill(values.begin(), values.end(), 0.0f);  // training moves on at once
  EXPECT_TRUE(writer.InFlight());
  EXPECT_EQ(writer.Start(dir, 3, {Run1D("w", 1000, {0, 1000}, values.data())}).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<v1::ReportShardRequest> r = writer.Wait();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(writer.InFlight());
  EXPECT_EQ(r->files(0).crc32c(), Crc32c(original.data(), 4000));
  std::vector<float> back(1000);
  ASSERT_TRUE(ReadRuns(Merge({{3, *r}}), dir, {Run1D("w", 1000, {0, 1000}, back.data())}).ok());
  EXPECT_TRUE(SameBits(back, original));
  // Same result as the synchronous writer.
  std::vector<float> again = original;
  auto sync = WriteShard(NewDir("sync"), 3, {Run1D("w", 1000, {0, 1000}, again.data())});
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ(sync->SerializeAsString(), r->SerializeAsString());
  // Idle again: a second save works; bad runs fail at Start.
  EXPECT_EQ(writer.Start(dir, 3, {Run1D("w", 1000, {0, 1001}, values.data())}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(writer.Start(NewDir("async2"), 4, {Run1D("w", 1000, {0, 1000}, values.data())}).ok());
  // The destructor waits for this one.
}

}  // namespace
}  // namespace shardline::checkpoint

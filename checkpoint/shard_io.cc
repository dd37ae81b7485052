#include "checkpoint/shard_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/confined_dir.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/geometry.h"
#include "common/files.h"

namespace shardline::checkpoint {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "shard files hold little-endian fp32; a big-endian host would need byte swaps");
static_assert(sizeof(float) == 4, "fp32 is 4 bytes");

constexpr uint64_t kFloatBytes = 4;
// Largest single read and the checksum buffer (bytes).
constexpr size_t kIoChunk = size_t{1} << 30;
constexpr size_t kCrcBuffer = size_t{4} << 20;

// Saving (bytes). The file is written in blocks of kWriteBlock at offsets
// that are multiples of it (one writev gathers small runs; a large run is
// cut at the boundaries), each block checksummed just before it is written
// so that the copy into the page cache reads cache-warm memory. Every
// kWritebackWindow written, write-back of that window is started
// (sync_file_range), so the disk works while the next blocks are copied
// instead of only at the final fsync. The writer does not wait for it:
// measured on a shared 2-core VM, waiting for write-back more than 64 or
// 256 MiB behind made saves slower (median 0.7-0.9x dd against 1.2-1.3x
// without); the kernel's dirty-page limits bound the memory instead, as
// they do for any buffered writer.
constexpr uint64_t kWriteBlock = uint64_t{4} << 20;
constexpr uint64_t kWritebackWindow = uint64_t{8} << 20;

// Restoring. ReadRuns plans every read first, then runs them as chunks of
// at most kReadChunk bytes on up to kMaxReadThreads threads (the caller's
// included), one per kReadBytesPerThread bytes to read.
constexpr uint64_t kReadChunk = uint64_t{4} << 20;
constexpr uint64_t kReadBytesPerThread = uint64_t{4} << 20;
constexpr int kMaxReadThreads = 4;

std::string Hex(uint32_t v) { return absl::StrFormat("0x%08X", v); }

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// --- Slice geometry --------------------------------------------------------

// A hyperrectangle of a tensor's global shape and its decomposition into
// "rows": maximal runs of slice elements that are contiguous in the global
// row-major order. Dimension k is the innermost one the slice does not hold
// whole; every dimension after k is whole, so a row is length[k] * (the
// product of the later dimensions) elements, and there is one row per index
// of the dimensions before k.
struct SliceGeom {
  std::vector<int64_t> shape;   // global, elements per dimension
  std::vector<int64_t> offset;  // per dimension
  std::vector<int64_t> length;  // per dimension
  std::vector<int64_t> stride;  // global row-major strides (elements)
  int64_t numel = 1;            // elements of the slice
  int k = 0;                    // see above (0 for a 0-d tensor)
  int64_t row = 1;              // elements per row

  void Finish() {
    const int rank = static_cast<int>(shape.size());
    stride.assign(rank, 1);
    for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
    numel = 1;
    for (int64_t l : length) numel *= l;
    k = rank == 0 ? 0 : rank - 1;
    while (k > 0 && length[k] == shape[k]) --k;
    row = 1;
    for (int d = k; d < rank; ++d) row *= length[d];
  }

  // Global index of the first element of row `r`.
  int64_t RowStart(int64_t r) const {
    int64_t g = 0;
    if (shape.empty()) return 0;
    g += offset[k] * stride[k];
    for (int d = k - 1; d >= 0; --d) {
      const int64_t idx = r % length[d];
      r /= length[d];
      g += (offset[d] + idx) * stride[d];
    }
    return g;
  }

  // Calls f(global_begin, global_end, local_begin) for the global intervals
  // of slice elements [b, e), in slice order.
  template <typename F>
  void ForEachInterval(int64_t b, int64_t e, F&& f) const {
    if (b >= e || row == 0) return;
    for (int64_t r = b / row; r * row < e; ++r) {
      const int64_t lb = std::max(b, r * row);
      const int64_t le = std::min(e, (r + 1) * row);
      const int64_t g = RowStart(r) + (lb - r * row);
      f(g, g + (le - lb), lb);
    }
  }
};

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SliceGeom GeomOfRun(const LocalRun& run) {
  SliceGeom g;
  g.shape = run.global_shape;
  g.offset.assign(g.shape.size(), 0);
  g.length = g.shape;
  if (run.split_dim >= 0) {
    const int64_t part = g.shape[run.split_dim] / run.tp;
    g.offset[run.split_dim] = part * run.tp_rank;
    g.length[run.split_dim] = part;
  }
  g.Finish();
  return g;
}

// --- Validation ------------------------------------------------------------

std::string RunName(const LocalRun& run) { return absl::StrCat("run of tensor '", run.tensor, "'"); }

absl::Status ValidateRunsTogether(const std::vector<LocalRun>& runs) {
  std::map<std::string, const LocalRun*> first;
  for (const LocalRun& run : runs) {
    if (absl::Status s = ValidateRun(run); !s.ok()) return s;
    auto [it, inserted] = first.emplace(run.tensor, &run);
    if (!inserted && it->second->global_shape != run.global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "runs of tensor '", run.tensor, "' disagree on global_shape: ",
          ShapeText(it->second->global_shape), " vs ", ShapeText(run.global_shape),
          "; every run of one tensor must give its whole (unsplit) shape"));
    }
  }
  return absl::OkStatus();
}

// A manifest path must stay inside the checkpoint directory.
absl::Status ValidateRelativePath(const std::string& path, const std::string& what) {
  if (path.empty() || path[0] == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " file '", path, "' must be a non-empty path relative to the checkpoint directory"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " file '", path, "' must not contain '..'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ShapeOf(const v1::SavedTensor& t) {
  std::vector<int64_t> shape;
  for (uint64_t d : t.global_shape()) {
    if (d > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) * 1024) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has dimension ", d,
                                                     ", beyond what a checkpoint can hold"));
    }
    shape.push_back(static_cast<int64_t>(d));
  }
  return shape;
}

// Checks one piece against its tensor and returns its slice geometry.
absl::StatusOr<SliceGeom> GeomOfPiece(const v1::SavedTensor& t, const std::vector<int64_t>& shape,
                                      const v1::SavedPiece& p, int index, uint64_t element_bytes) {
  const std::string where = absl::StrCat("tensor '", t.name(), "' piece ", index, " (file '",
                                         p.file(), "')");
  if (p.slice().dims_size() != static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": slice has ", p.slice().dims_size(),
                                                   " dims; the global shape ", ShapeText(shape),
                                                   " has ", shape.size()));
  }
  SliceGeom g;
  g.shape = shape;
  for (int d = 0; d < p.slice().dims_size(); ++d) {
    const v1::DimSlice& ds = p.slice().dims(d);
    if (ds.offset() > static_cast<uint64_t>(shape[d]) ||
        ds.length() > static_cast<uint64_t>(shape[d]) - ds.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": slice dim ", d, " [", ds.offset(), ", ", ds.offset() + ds.length(),
          ") lies outside [0, ", shape[d], ")"));
    }
    g.offset.push_back(static_cast<int64_t>(ds.offset()));
    g.length.push_back(static_cast<int64_t>(ds.length()));
  }
  g.Finish();
  if (p.range().begin() >= p.range().end() ||
      p.range().end() > static_cast<uint64_t>(g.numel)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": range [", p.range().begin(), ", ",
                                                   p.range().end(), ") must be non-empty within [0, ",
                                                   g.numel, ") (the slice's elements)"));
  }
  const uint64_t want = (p.range().end() - p.range().begin()) * element_bytes;
  if (p.byte_length() != want) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": byte_length ", p.byte_length(),
                                                   " should be ", want, " (elements x ",
                                                   element_bytes, " bytes)"));
  }
  if (absl::Status s = ValidateRelativePath(p.file(), where); !s.ok()) return s;
  return g;
}

// --- POSIX helpers -----------------------------------------------------------

// mkdir -p; the parent of every directory it creates is fsync'ed so that the
// new entries survive a crash.
absl::Status MakeDirs(const std::string& directory) {
  std::string path;
  for (absl::string_view part : absl::StrSplit(directory, '/')) {
    if (path.empty() && directory[0] == '/') path = "/";
    if (part.empty()) continue;
    const std::string parent = path.empty() ? "." : path;
    if (!path.empty() && path.back() != '/') path += '/';
    path.append(part.data(), part.size());
    if (::mkdir(path.c_str(), 0755) == 0) {
      if (absl::Status s = FsyncDirectory(parent); !s.ok()) return s;
    } else if (errno != EEXIST) {
      return FileError(errno, "cannot create checkpoint directory", path);
    }
  }
  struct stat st;
  if (::stat(directory.c_str(), &st) != 0) {
    return FileError(errno, "cannot stat checkpoint directory", directory);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory '", directory, "' exists and is not a directory"));
  }
  return absl::OkStatus();
}

// Appends bytes to a file in aligned blocks and streams them to the disk
// (see kWriteBlock). Not thread-safe; one per file being written.
class BlockWriter {
 public:
  BlockWriter(int fd, const std::string& path) : fd_(fd), path_(path) {}

  // Bytes that still fit in the current block (1..kWriteBlock).
  uint64_t RoomInBlock() const { return kWriteBlock - (offset_ + pending_) % kWriteBlock; }

  // Queues `bytes` at `p` (kept by pointer until written: the memory must
  // stay valid until the block is full or Finish) and writes every block it
  // completes.
  absl::Status Append(const char* p, uint64_t bytes) {
    while (bytes > 0) {
      const uint64_t n = std::min(bytes, RoomInBlock());
      iov_.push_back({const_cast<char*>(p), static_cast<size_t>(n)});
      pending_ += n;
      p += n;
      bytes -= n;
      if ((offset_ + pending_) % kWriteBlock == 0 || iov_.size() >= kMaxIov) {
        if (absl::Status s = WriteBlock(); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // Writes the last, partial block. Durability is the caller's fsync.
  absl::Status Finish() { return WriteBlock(); }

 private:
  static constexpr size_t kMaxIov = 512;  // below IOV_MAX (1024 on Linux)

  absl::Status WriteBlock() {
    size_t first = 0;
    while (first < iov_.size()) {
      const ssize_t n = ::writev(fd_, iov_.data() + first, static_cast<int>(iov_.size() - first));
      if (n < 0) {
        if (errno == EINTR) continue;
        return FileError(errno, "cannot write", path_);
      }
      if (n == 0) return FileError(EIO, "cannot write (no progress)", path_);
      offset_ += static_cast<uint64_t>(n);
      pending_ -= static_cast<uint64_t>(n);
      for (size_t left = static_cast<size_t>(n); left > 0;) {  // drop what was written
        iovec& v = iov_[first];
        const size_t used = std::min(left, v.iov_len);
        v.iov_base = static_cast<char*>(v.iov_base) + used;
        v.iov_len -= used;
        left -= used;
        if (v.iov_len == 0) ++first;
      }
      while (first < iov_.size() && iov_[first].iov_len == 0) ++first;
    }
    iov_.clear();
    return StreamToDisk();
  }

  // Starts write-back of the newest window. An error found in it is
  // returned (fsync would report it too). A file system that cannot do it
  // makes it a no-op (the final fsync writes everything).
  absl::Status StreamToDisk() {
    if (!streaming_ || offset_ - started_ < kWritebackWindow) return absl::OkStatus();
    if (!SyncRange(started_, offset_ - started_, SYNC_FILE_RANGE_WRITE)) return Unstreamed();
    started_ = offset_;
    return absl::OkStatus();
  }

  bool SyncRange(uint64_t from, uint64_t bytes, unsigned flags) {
    int r;
    do {
      r = ::sync_file_range(fd_, static_cast<off64_t>(from), static_cast<off64_t>(bytes), flags);
    } while (r != 0 && errno == EINTR);
    return r == 0;
  }

  absl::Status Unstreamed() {
    if (errno == EINVAL || errno == ESPIPE || errno == ENOSYS || errno == EOPNOTSUPP) {
      streaming_ = false;  // not supported here: the final fsync writes it all
      return absl::OkStatus();
    }
    return FileError(errno, "cannot write back", path_);
  }

  const int fd_;
  const std::string& path_;
  std::vector<iovec> iov_;  // the current block's parts, not yet written
  uint64_t pending_ = 0;    // bytes in iov_
  uint64_t offset_ = 0;     // bytes written to the file
  uint64_t started_ = 0;    // [0, started_) handed to write-back
  bool streaming_ = true;
};

// Reads exactly `bytes` at `offset`; DataLoss if the file ends first.
absl::Status PreadAll(int fd, char* p, uint64_t bytes, uint64_t offset, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n =
        ::pread(fd, p, std::min<uint64_t>(bytes, kIoChunk), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, "cannot read", path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", path, "' ends at byte ",
                                              offset, " but ", bytes, " more bytes were expected"));
    }
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> CrcOfRange(int fd, uint64_t offset, uint64_t bytes,
                                    const std::string& path, std::vector<char>& buffer,
                                    uint64_t* bytes_read) {
  buffer.resize(kCrcBuffer);
  uint32_t crc = 0;
  while (bytes > 0) {
    const uint64_t n = std::min<uint64_t>(bytes, buffer.size());
    if (absl::Status s = PreadAll(fd, buffer.data(), n, offset, path); !s.ok()) return s;
    crc = Crc32c(buffer.data(), n, crc);
    offset += n;
    bytes -= n;
    if (bytes_read != nullptr) *bytes_read += n;
  }
  return crc;
}

// Open checkpoint files of one call, by relative path; closed on destruction.
// The directory is opened once; every file below it is opened without
// following symlinks (checkpoint/confined_dir.h).
class FileCache {
 public:
  using File = ConfinedDir::File;

  FileCache(const v1::Manifest& manifest, std::string directory)
      : directory_(std::move(directory)) {
    for (const v1::RankRecord& r : manifest.ranks()) {
      for (const v1::ShardFile& f : r.files()) recorded_size_[f.path()] = f.size_bytes();
    }
  }

  // `user` names who needs it, for messages (e.g. "tensor 'w'").
  absl::StatusOr<const File*> Open(const std::string& rel, const std::string& user) {
    auto it = files_.find(rel);
    if (it != files_.end()) return &it->second;
    std::string symlink;
    absl::StatusOr<File> f = absl::NotFoundError(absl::StrCat("no directory ", directory_));
    if (!dir_.has_value()) {
      absl::StatusOr<ConfinedDir> d = ConfinedDir::Open(directory_);
      if (d.ok()) dir_ = *std::move(d);
      if (!d.ok()) f = d.status();
    }
    if (dir_.has_value()) f = dir_->OpenFile(rel, &symlink);
    if (!symlink.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint path '", rel, "' of ", user, " goes through symlink '", symlink,
          "'; shards must be regular files inside ", directory_));
    }
    if (f.status().code() == absl::StatusCode::kNotFound) {
      return absl::DataLossError(absl::StrCat("checkpoint file of ", user,
                                              " is missing: ", f.status().message()));
    }
    if (!f.ok()) return f.status();
    auto rec = recorded_size_.find(rel);
    if (rec != recorded_size_.end() && rec->second != f->size()) {
      return absl::DataLossError(absl::StrCat("checkpoint file '", f->path(), "' of ", user,
                                              " is ", f->size(), " bytes; the manifest records ",
                                              rec->second));
    }
    return &files_.emplace(rel, *std::move(f)).first->second;
  }

 private:
  const std::string directory_;
  std::optional<ConfinedDir> dir_;
  absl::flat_hash_map<std::string, uint64_t> recorded_size_;
  std::map<std::string, File> files_;
};

// --- Reading -----------------------------------------------------------------

// One piece's global interval: slice elements [local_begin, local_begin +
// (gend - gbegin)) of piece `piece` are global elements [gbegin, gend).
struct Interval {
  int64_t gbegin = 0;
  int64_t gend = 0;
  int piece = 0;
  int64_t local_begin = 0;
};

struct PieceState {
  const v1::SavedPiece* piece = nullptr;
  SliceGeom geom;
  // Set by the Reader when the piece is first used:
  const FileCache::File* file = nullptr;
  const v1::SavedTensor* tensor = nullptr;
  int index = 0;              // in tensor->pieces()
  std::vector<size_t> reads;  // its planned reads, in the runs' order
  uint64_t order = 0;         // see ReadTask::order
  bool chained = false;       // `chain` covers it exactly
  std::vector<size_t> chain;  // reads whose CRCs make up the piece's
  // The tasks whose CRCs, combined in this order, are the piece's.
  std::vector<std::pair<size_t, size_t>> crc_tasks;  // (first, count)
};

struct TensorIndex {
  const v1::SavedTensor* tensor = nullptr;
  std::vector<int64_t> shape;
  std::vector<PieceState> pieces;
  std::vector<Interval> intervals;  // sorted by gbegin, disjoint
};

absl::StatusOr<std::unique_ptr<TensorIndex>> BuildIndex(const v1::SavedTensor& t) {
  auto index = std::make_unique<TensorIndex>();
  index->tensor = &t;
  absl::StatusOr<std::vector<int64_t>> shape = ShapeOf(t);
  if (!shape.ok()) return shape.status();
  index->shape = *std::move(shape);
  if (t.dtype() != v1::DTYPE_FLOAT32) {
    return absl::UnimplementedError(absl::StrCat("tensor '", t.name(), "' is stored as ",
                                                 v1::DType_Name(t.dtype()),
                                                 "; only DTYPE_FLOAT32 can be restored"));
  }
  for (int i = 0; i < t.pieces_size(); ++i) {
    absl::StatusOr<SliceGeom> g = GeomOfPiece(t, index->shape, t.pieces(i), i, kFloatBytes);
    if (!g.ok()) return g.status();
    const v1::SavedPiece& p = t.pieces(i);
    g->ForEachInterval(static_cast<int64_t>(p.range().begin()),
                       static_cast<int64_t>(p.range().end()),
                       [&](int64_t gb, int64_t ge, int64_t lb) {
                         index->intervals.push_back({gb, ge, i, lb});
                       });
    index->pieces.push_back({&p, *std::move(g)});
  }
  std::sort(index->intervals.begin(), index->intervals.end(),
            [](const Interval& a, const Interval& b) { return a.gbegin < b.gbegin; });
  for (size_t i = 1; i < index->intervals.size(); ++i) {
    const Interval& a = index->intervals[i - 1];
    const Interval& b = index->intervals[i];
    if (b.gbegin < a.gend) {
      return absl::DataLossError(absl::StrCat(
          "tensor '", t.name(), "': global element ", b.gbegin, " is saved twice (pieces ",
          a.piece, " in '", t.pieces(a.piece).file(), "' and ", b.piece, " in '",
          t.pieces(b.piece).file(), "'); the manifest is inconsistent"));
    }
  }
  return index;
}

// One pread into a run's memory: bytes [offset, offset + bytes) of a
// piece's file, all inside that piece. Adjacent reads (same piece,
// consecutive bytes, consecutive destination) are merged when planned.
struct PlannedRead {
  PieceState* piece = nullptr;
  uint64_t offset = 0;  // in the file
  char* dest = nullptr;
  uint64_t bytes = 0;
  bool checksum = false;  // part of the piece's chain: its CRC is computed
  size_t first_task = 0;  // its chunks are tasks [first_task, first_task + tasks)
  size_t tasks = 0;
};

// A chunk of at most kReadChunk bytes, run by one thread: a pread into the
// run's memory (and the CRC-32C of what arrived when `checksum`), or, with
// no destination, a read into the thread's scratch buffer to checksum a
// piece that is only partly needed.
struct ReadTask {
  const FileCache::File* file = nullptr;
  int file_index = 0;  // files in order of first use: tasks run by (file, offset)
  uint64_t offset = 0;
  uint64_t bytes = 0;
  char* dest = nullptr;
  bool checksum = false;
  // Which problem is reported when there are several: the lowest order, as
  // if the runs were read one after another, each piece verified when first
  // used. Reads of the k-th planned read have order 2k + 1; checking a piece
  // first used by the k-th read (and reading it to check it) has order 2k.
  uint64_t order = 0;
  uint64_t piece_order = 0;  // the order of its piece's check
  // Results, written only by the thread that ran the task and read after
  // the threads are joined.
  bool done = false;
  uint32_t crc = 0;
  absl::Status status;
};

class Reader {
 public:
  Reader(const v1::Manifest& manifest, const std::string& directory)
      : manifest_(manifest), files_(manifest, directory) {
    for (const v1::SavedTensor& t : manifest.tensors()) by_name_.emplace(t.name(), &t);
  }

  // Plans the reads that fill `run` (nothing is read yet). Errors as
  // ReadRuns' that need no file contents: a missing tensor or file, a
  // malformed or truncated piece, a gap in the pieces.
  absl::Status Plan(const LocalRun& run) {
    absl::StatusOr<TensorIndex*> index = Index(run.tensor);
    if (!index.ok()) return index.status();
    TensorIndex& ix = **index;
    if (ix.shape != run.global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", run.tensor, "': the run's global_shape ", ShapeText(run.global_shape),
          " differs from the checkpoint's ", ShapeText(ix.shape),
          "; restore with the model config the checkpoint was saved with"));
    }
    const SliceGeom geom = GeomOfRun(run);
    absl::Status status;
    char* const base = reinterpret_cast<char*>(run.data);
    geom.ForEachInterval(run.begin, run.end, [&](int64_t gb, int64_t ge, int64_t lb) {
      if (status.ok()) status = PlanInterval(ix, gb, ge, base + (lb - run.begin) * kFloatBytes);
    });
    return status;
  }

  // Runs every planned read and checks every used piece's CRC-32C. Returns
  // the first problem in the runs' order, `planned` (Plan's error, after
  // everything planned before it) being the last.
  absl::Status Execute(absl::Status planned) {
    std::vector<ReadTask> tasks = MakeTasks();
    RunTasks(tasks);
    uint64_t best_order = std::numeric_limits<uint64_t>::max();
    absl::Status best = std::move(planned);
    auto consider = [&](uint64_t order, absl::Status s) {
      if (order < best_order) {
        best_order = order;
        best = std::move(s);
      }
    };
    for (const ReadTask& t : tasks) {
      if (!t.status.ok()) consider(t.order, t.status);
    }
    for (PieceState* ps : used_) {
      uint32_t crc = 0;
      bool complete = true;  // every task ran and read its bytes
      for (const auto& [first, count] : ps->crc_tasks) {
        for (size_t i = first; i < first + count && complete; ++i) {
          complete = tasks[i].done && tasks[i].status.ok();
          if (complete) crc = Crc32cCombine(crc, tasks[i].crc, tasks[i].bytes);
        }
      }
      // Incomplete: skipped after a failure, or a read error that says why.
      if (!complete || crc == ps->piece->crc32c()) continue;
      const v1::SavedPiece& p = *ps->piece;
      consider(ps->order,
               absl::DataLossError(absl::StrCat(
                   "tensor '", ps->tensor->name(), "': piece ", ps->index, " in file '",
                   ps->file->path(), "' (bytes [", p.byte_offset(), ", ",
                   p.byte_offset() + p.byte_length(), ")) has CRC-32C ", Hex(crc),
                   " but the manifest records ", Hex(p.crc32c()), ": the checkpoint is corrupt")));
    }
    return best;
  }

 private:
  absl::StatusOr<TensorIndex*> Index(const std::string& name) {
    auto it = indexes_.find(name);
    if (it != indexes_.end()) return it->second.get();
    auto t = by_name_.find(name);
    if (t == by_name_.end()) {
      return absl::NotFoundError(absl::StrCat("tensor '", name, "' is not in checkpoint '",
                                              manifest_.checkpoint_id(), "' (step ",
                                              manifest_.step(), ")"));
    }
    absl::StatusOr<std::unique_ptr<TensorIndex>> built = BuildIndex(*t->second);
    if (!built.ok()) return built.status();
    return (indexes_[name] = *std::move(built)).get();
  }

  // Plans global elements [gb, ge) of `ix` into `dest`.
  absl::Status PlanInterval(TensorIndex& ix, int64_t gb, int64_t ge, char* dest) {
    const auto& iv = ix.intervals;
    auto it = std::upper_bound(iv.begin(), iv.end(), gb,
                               [](int64_t g, const Interval& x) { return g < x.gbegin; });
    if (it != iv.begin() && std::prev(it)->gend > gb) --it;
    int64_t cur = gb;
    while (cur < ge) {
      if (it == iv.end() || it->gbegin > cur) {
        return absl::DataLossError(absl::StrCat(
            "tensor '", ix.tensor->name(), "': global element ", cur,
            " is in no saved piece of checkpoint '", manifest_.checkpoint_id(),
            "' (a rank's shard is missing from the manifest)"));
      }
      PieceState& ps = ix.pieces[it->piece];
      if (absl::Status s = Use(ix, it->piece); !s.ok()) return s;
      const int64_t n = std::min(ge, it->gend) - cur;
      const int64_t local = it->local_begin + (cur - it->gbegin);
      const uint64_t offset =
          ps.piece->byte_offset() +
          static_cast<uint64_t>(local - static_cast<int64_t>(ps.piece->range().begin())) *
              kFloatBytes;
      AddRead(ps, offset, dest + (cur - gb) * kFloatBytes, static_cast<uint64_t>(n) * kFloatBytes);
      cur += n;
      ++it;
    }
    return absl::OkStatus();
  }

  void AddRead(PieceState& ps, uint64_t offset, char* dest, uint64_t bytes) {
    if (!reads_.empty()) {
      PlannedRead& last = reads_.back();
      if (last.piece == &ps && offset == last.offset + last.bytes &&
          dest == last.dest + last.bytes) {
        last.bytes += bytes;
        return;
      }
    }
    ps.reads.push_back(reads_.size());
    reads_.push_back({&ps, offset, dest, bytes});
  }

  // The first time a piece is needed: opens its file and checks its bounds.
  absl::Status Use(TensorIndex& ix, int i) {
    PieceState& ps = ix.pieces[i];
    if (ps.file != nullptr) return absl::OkStatus();
    const v1::SavedPiece& p = *ps.piece;
    const std::string user = absl::StrCat("tensor '", ix.tensor->name(), "'");
    absl::StatusOr<const FileCache::File*> file = files_.Open(p.file(), user);
    if (!file.ok()) return file.status();
    if (p.byte_offset() > (*file)->size() ||
        p.byte_length() > (*file)->size() - p.byte_offset()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", (*file)->path(), "' is ", (*file)->size(), " bytes but ", user,
          " piece ", i, " needs bytes [", p.byte_offset(), ", ", p.byte_offset() + p.byte_length(),
          "): the file is truncated"));
    }
    if (file_index_.emplace(*file, static_cast<int>(file_index_.size())).second) {
      // Advice only: a larger read-ahead window for the chunks to come.
      ::posix_fadvise((*file)->fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    ps.file = *file;
    ps.tensor = ix.tensor;
    ps.index = i;
    used_.push_back(&ps);
    return absl::OkStatus();
  }

  // Chooses how each used piece is verified and cuts the reads into tasks.
  // A piece whose reads cover its bytes exactly (one after another, from its
  // first byte to its last: the common case of the same layout, which reads
  // each piece whole) is verified from the run's memory after the read, so
  // each byte is read once; otherwise (needed partly) its whole byte range
  // is also read into a scratch buffer to verify it, as before the reads.
  std::vector<ReadTask> MakeTasks() {
    for (PieceState* ps : used_) {
      std::vector<size_t> order = ps->reads;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (reads_[a].offset != reads_[b].offset) return reads_[a].offset < reads_[b].offset;
        return reads_[a].bytes > reads_[b].bytes;
      });
      uint64_t cursor = ps->piece->byte_offset();
      std::vector<size_t> chain;
      for (size_t r : order) {
        if (reads_[r].offset < cursor) continue;  // a second copy of read bytes
        if (reads_[r].offset > cursor) break;     // a gap
        chain.push_back(r);
        cursor += reads_[r].bytes;
      }
      ps->chained = cursor == ps->piece->byte_offset() + ps->piece->byte_length();
      if (ps->chained) {
        for (size_t r : chain) reads_[r].checksum = true;
        ps->chain = std::move(chain);
      }
    }
    std::vector<ReadTask> tasks;
    auto add = [&](const PieceState& ps, uint64_t offset, uint64_t bytes, char* dest, bool checksum,
                   uint64_t order) {
      const int file_index = file_index_.at(ps.file);
      for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = std::min(bytes - done, kReadChunk);
        ReadTask& t = tasks.emplace_back();
        t.file = ps.file;
        t.file_index = file_index;
        t.offset = offset + done;
        t.bytes = n;
        t.dest = dest == nullptr ? nullptr : dest + done;
        t.checksum = checksum;
        t.order = order;
        t.piece_order = ps.order;
        done += n;
      }
    };
    for (size_t k = 0; k < reads_.size(); ++k) {
      PlannedRead& r = reads_[k];
      PieceState& ps = *r.piece;
      if (ps.reads.front() == k) {  // first use: the piece's check comes here
        ps.order = 2 * k;
        if (!ps.chained) {
          const size_t first = tasks.size();
          add(ps, ps.piece->byte_offset(), ps.piece->byte_length(), nullptr, true, ps.order);
          ps.crc_tasks.emplace_back(first, tasks.size() - first);
        }
      }
      r.first_task = tasks.size();
      add(ps, r.offset, r.bytes, r.dest, r.checksum, 2 * k + 1);
      r.tasks = tasks.size() - r.first_task;
    }
    for (PieceState* ps : used_) {
      for (size_t r : ps->chain) ps->crc_tasks.emplace_back(reads_[r].first_task, reads_[r].tasks);
    }
    return tasks;
  }

  // Runs the tasks on up to kMaxReadThreads threads (this one included),
  // in file and offset order so that the disk sees nearly sequential reads.
  // A task ordered after a failed one is skipped unless its piece is checked
  // before the failure, so that the first problem is found whatever the
  // timing.
  static void RunTasks(std::vector<ReadTask>& tasks) {
    std::vector<size_t> sequence(tasks.size());
    for (size_t i = 0; i < sequence.size(); ++i) sequence[i] = i;
    std::sort(sequence.begin(), sequence.end(), [&](size_t a, size_t b) {
      const ReadTask& x = tasks[a];
      const ReadTask& y = tasks[b];
      if (x.file_index != y.file_index) return x.file_index < y.file_index;
      return x.offset < y.offset;
    });
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> failed{std::numeric_limits<uint64_t>::max()};  // lowest failed order
    auto work = [&tasks, &sequence, &next, &failed] {
      std::unique_ptr<char[]> scratch;  // for checksum-only tasks
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < sequence.size();) {
        ReadTask& t = tasks[sequence[i]];
        // piece_order <= order: a task is skipped only when its piece's
        // check comes after the failure.
        if (t.piece_order > failed.load(std::memory_order_relaxed)) continue;
        char* into = t.dest;
        if (into == nullptr) {
          if (scratch == nullptr) scratch = std::make_unique<char[]>(kReadChunk);
          into = scratch.get();
        }
        t.status = PreadAll(t.file->fd(), into, t.bytes, t.offset, t.file->path());
        if (t.status.ok() && t.checksum) t.crc = Crc32c(into, t.bytes);
        t.done = true;
        if (!t.status.ok()) {
          uint64_t seen = failed.load(std::memory_order_relaxed);
          while (t.order < seen &&
                 !failed.compare_exchange_weak(seen, t.order, std::memory_order_relaxed)) {
          }
        }
      }
    };
    std::vector<std::thread> threads;
    const int want = ReadThreads(tasks);
    for (int i = 1; i < want; ++i) {
      try {
        threads.emplace_back(work);
      } catch (const std::system_error&) {
        break;  // no more threads to be had: fewer do the work
      }
    }
    work();
    for (std::thread& t : threads) t.join();
  }

  // One thread per kReadBytesPerThread, at most kMaxReadThreads; one when
  // two tasks' destinations overlap (runs may alias: then they are filled
  // one after another, as a single thread would).
  static int ReadThreads(const std::vector<ReadTask>& tasks) {
    uint64_t bytes = 0;
    std::vector<std::pair<uintptr_t, uintptr_t>> dests;
    for (const ReadTask& t : tasks) {
      bytes += t.bytes;
      if (t.dest != nullptr) {
        const auto at = reinterpret_cast<uintptr_t>(t.dest);
        dests.emplace_back(at, at + t.bytes);
      }
    }
    const uint64_t by_size = (bytes + kReadBytesPerThread - 1) / kReadBytesPerThread;
    const int want = static_cast<int>(
        std::min<uint64_t>({static_cast<uint64_t>(kMaxReadThreads), by_size, tasks.size()}));
    if (want <= 1) return 1;
    std::sort(dests.begin(), dests.end());
    for (size_t i = 1; i < dests.size(); ++i) {
      if (dests[i].first < dests[i - 1].second) return 1;
    }
    return want;
  }

  const v1::Manifest& manifest_;
  FileCache files_;
  absl::flat_hash_map<std::string, const v1::SavedTensor*> by_name_;
  absl::flat_hash_map<std::string, std::unique_ptr<TensorIndex>> indexes_;
  std::vector<PlannedRead> reads_;                               // in the runs' order
  std::vector<PieceState*> used_;                                // in order of first use
  absl::flat_hash_map<const FileCache::File*, int> file_index_;  // in order of first use
};

std::atomic<uint64_t> temp_counter{0};

}  // namespace

// --- Public API --------------------------------------------------------------

absl::Status ValidateRun(const LocalRun& run) {
  if (run.tensor.empty()) {
    return absl::InvalidArgumentError("run has an empty tensor name; give the checkpoint name");
  }
  const int rank = static_cast<int>(run.global_shape.size());
  for (int d = 0; d < rank; ++d) {
    if (run.global_shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(RunName(run), ": global_shape ",
                                                     ShapeText(run.global_shape),
                                                     " has a negative dimension ", d));
    }
  }
  if (run.split_dim < -1 || run.split_dim >= rank) {
    return absl::InvalidArgumentError(absl::StrCat(RunName(run), ": split_dim ", run.split_dim,
                                                   " must be -1 or in [0, ", rank, ")"));
  }
  if (run.split_dim >= 0) {
    if (run.tp < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(RunName(run), ": tp ", run.tp, " must be >= 1"));
    }
    if (run.tp_rank < 0 || run.tp_rank >= run.tp) {
      return absl::InvalidArgumentError(absl::StrCat(RunName(run), ": tp_rank ", run.tp_rank,
                                                     " must be in [0, ", run.tp, ")"));
    }
    if (run.global_shape[run.split_dim] % run.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          RunName(run), ": tp ", run.tp, " does not divide global_shape[", run.split_dim,
          "] = ", run.global_shape[run.split_dim]));
    }
  }
  int64_t local = Numel(run.global_shape);
  if (run.split_dim >= 0) local /= run.tp;
  if (run.begin < 0 || run.begin > run.end || run.end > local) {
    return absl::InvalidArgumentError(absl::StrCat(RunName(run), ": [begin, end) = [", run.begin,
                                                   ", ", run.end, ") must satisfy 0 <= begin <= end <= ",
                                                   local, " (the tp-local slice's elements)"));
  }
  if (run.end > run.begin && run.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(RunName(run), ": data is null for ", run.end - run.begin, " elements"));
  }
  return absl::OkStatus();
}

std::string ShardFileName(int rank) { return absl::StrFormat("rank-%05d.bin", rank); }

absl::StatusOr<v1::ReportShardRequest> WriteShard(const std::string& directory, int rank,
                                                  const std::vector<LocalRun>& runs) {
  if (rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " must be >= 0"));
  }
  if (directory.empty()) {
    return absl::InvalidArgumentError("checkpoint directory is empty; pass BeginCheckpoint's");
  }
  if (absl::Status s = ValidateRunsTogether(runs); !s.ok()) return s;
  v1::ReportShardRequest report;
  const bool any = std::any_of(runs.begin(), runs.end(),
                               [](const LocalRun& r) { return r.end > r.begin; });
  if (!any) return report;
  if (absl::Status s = MakeDirs(directory); !s.ok()) return s;

  const std::string name = ShardFileName(rank);
  const std::string path = absl::StrCat(directory, "/", name);
  const std::string temp = absl::StrCat(path, ".tmp-", ::getpid(), "-", temp_counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, "cannot create", temp);
  auto fail = [&](absl::Status s, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(temp.c_str());
    return s;
  };

  std::map<std::string, v1::SavedTensor*> tensors;
  BlockWriter writer(fd, temp);
  uint64_t offset = 0;
  uint32_t file_crc = 0;
  for (const LocalRun& run : runs) {
    if (run.end == run.begin) continue;
    const uint64_t bytes = static_cast<uint64_t>(run.end - run.begin) * kFloatBytes;
    const char* p = reinterpret_cast<const char*>(run.data);
    // Each byte is checksummed once, block by block just before its write;
    // the file's checksum is the pieces' combined.
    uint32_t crc = 0;
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min(bytes - done, writer.RoomInBlock());
      crc = Crc32c(p + done, n, crc);
      if (absl::Status s = writer.Append(p + done, n); !s.ok()) return fail(s, true);
      done += n;
    }
    file_crc = Crc32cCombine(file_crc, crc, bytes);

    v1::SavedTensor*& t = tensors[run.tensor];
    if (t == nullptr) {
      t = report.add_tensors();
      t->set_name(run.tensor);
      t->set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : run.global_shape) t->add_global_shape(static_cast<uint64_t>(d));
    }
    const SliceGeom g = GeomOfRun(run);
    v1::SavedPiece* piece = t->add_pieces();
    piece->set_rank(static_cast<uint32_t>(rank));
    for (size_t d = 0; d < g.shape.size(); ++d) {
      v1::DimSlice* ds = piece->mutable_slice()->add_dims();
      ds->set_offset(static_cast<uint64_t>(g.offset[d]));
      ds->set_length(static_cast<uint64_t>(g.length[d]));
    }
    piece->mutable_range()->set_begin(static_cast<uint64_t>(run.begin));
    piece->mutable_range()->set_end(static_cast<uint64_t>(run.end));
    piece->set_file(name);
    piece->set_byte_offset(offset);
    piece->set_byte_length(bytes);
    piece->set_crc32c(crc);
    offset += bytes;
  }
  if (absl::Status s = writer.Finish(); !s.ok()) return fail(s, true);
  if (::fsync(fd) != 0) {
    return fail(FileError(errno, "cannot fsync", temp), true);
  }
  if (::close(fd) != 0) {
    return fail(FileError(errno, "cannot close", temp), false);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    return fail(FileError(errno, absl::StrCat("cannot rename to '", path, "':"), temp),
                false);
  }
  if (absl::Status s = FsyncDirectory(directory); !s.ok()) return s;
  v1::ShardFile* file = report.add_files();
  file->set_path(name);
  file->set_size_bytes(offset);
  file->set_crc32c(file_crc);
  return report;
}

AsyncShardWriter::~AsyncShardWriter() {
  std::thread t;
  {
    absl::MutexLock lock(&mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

absl::Status AsyncShardWriter::Start(const std::string& directory, int rank,
                                     const std::vector<LocalRun>& runs) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kIdle) {
    return absl::FailedPreconditionError(
        "a checkpoint save is already in flight (or not yet collected); call Wait() first");
  }
  if (rank < 0) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " must be >= 0"));
  if (absl::Status s = ValidateRunsTogether(runs); !s.ok()) return s;
  // Own copy of the values; the runs point into it.
  struct Copy {
    std::vector<float> values;
    std::vector<LocalRun> runs;
  };
  auto copy = std::make_shared<Copy>();
  size_t total = 0;
  for (const LocalRun& r : runs) total += static_cast<size_t>(r.end - r.begin);
  copy->values.resize(total);
  copy->runs = runs;
  size_t at = 0;
  for (LocalRun& r : copy->runs) {
    const size_t n = static_cast<size_t>(r.end - r.begin);
    if (n > 0) std::memcpy(copy->values.data() + at, r.data, n * sizeof(float));
    r.data = copy->values.data() + at;
    at += n;
  }
  if (thread_.joinable()) thread_.join();  // a finished earlier writer
  state_ = State::kWriting;
  result_.reset();
  thread_ = std::thread([this, copy, directory, rank] {
    absl::StatusOr<v1::ReportShardRequest> r = WriteShard(directory, rank, copy->runs);
    absl::MutexLock lock(&mu_);
    result_ = std::move(r);
    state_ = State::kDone;
  });
  return absl::OkStatus();
}

absl::StatusOr<v1::ReportShardRequest> AsyncShardWriter::Wait() {
  std::thread t;
  absl::StatusOr<v1::ReportShardRequest> result;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kIdle) {
      return absl::FailedPreconditionError("no checkpoint save was started; call Start() first");
    }
    mu_.Await(absl::Condition(
        +[](State* s) { return *s != State::kWriting; }, &state_));
    if (state_ != State::kDone) {
      return absl::FailedPreconditionError("the save's result was collected by another Wait()");
    }
    result = std::move(*result_);
    result_.reset();
    state_ = State::kIdle;
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
  return result;
}

bool AsyncShardWriter::InFlight() const {
  absl::MutexLock lock(&mu_);
  return state_ != State::kIdle;
}

absl::Status ReadRuns(const v1::Manifest& manifest, const std::string& directory,
                      const std::vector<LocalRun>& runs) {
  for (const LocalRun& run : runs) {
    if (absl::Status s = ValidateRun(run); !s.ok()) return s;
  }
  Reader reader(manifest, directory);
  absl::Status planned;
  for (const LocalRun& run : runs) {
    planned = reader.Plan(run);
    if (!planned.ok()) break;
  }
  return reader.Execute(std::move(planned));
}

VerifyReport VerifyCheckpoint(const v1::Manifest& manifest, const std::string& directory) {
  VerifyReport report;
  auto problem = [&](absl::Status s) {
    if (report.problems++ == 0) report.first_problem = std::move(s);
  };
  std::vector<char> buffer;
  FileCache files(manifest, directory);

  // Files: size and whole-file checksum.
  absl::flat_hash_map<std::string, int> listed;
  for (const v1::RankRecord& r : manifest.ranks()) {
    for (const v1::ShardFile& f : r.files()) {
      ++report.files;
      if (++listed[f.path()] > 1) {
        problem(absl::DataLossError(
            absl::StrCat("file '", f.path(), "' is listed by more than one rank record")));
        continue;
      }
      if (absl::Status s = ValidateRelativePath(f.path(), absl::StrCat("rank ", r.rank()));
          !s.ok()) {
        problem(s);
        continue;
      }
      absl::StatusOr<const FileCache::File*> file =
          files.Open(f.path(), absl::StrCat("rank ", r.rank()));
      if (!file.ok()) {
        problem(file.status());
        continue;
      }
      absl::StatusOr<uint32_t> crc =
          CrcOfRange((*file)->fd(), 0, (*file)->size(), (*file)->path(), buffer,
                     &report.bytes_checked);
      if (!crc.ok()) {
        problem(crc.status());
      } else if (*crc != f.crc32c()) {
        problem(absl::DataLossError(absl::StrCat("checkpoint file '", (*file)->path(),
                                                 "' has CRC-32C ", Hex(*crc),
                                                 " but the manifest records ", Hex(f.crc32c()))));
      }
    }
  }

  // Tensors: pieces and coverage.
  absl::flat_hash_map<std::string, int> names;
  for (const v1::SavedTensor& t : manifest.tensors()) {
    ++report.tensors;
    if (++names[t.name()] > 1) {
      problem(absl::DataLossError(absl::StrCat("tensor '", t.name(), "' is listed twice")));
      continue;
    }
    absl::StatusOr<std::vector<int64_t>> shape = ShapeOf(t);
    if (!shape.ok()) {
      problem(shape.status());
      continue;
    }
    const uint64_t element_bytes = DTypeBytes(t.dtype());
    if (element_bytes == 0) {
      problem(absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has dtype ",
                                                      v1::DType_Name(t.dtype()),
                                                      ", which has no element size")));
      continue;
    }
    std::vector<Interval> intervals;
    bool complete = true;  // every piece was readable, so coverage is meaningful
    for (int i = 0; i < t.pieces_size(); ++i) {
      ++report.pieces;
      const v1::SavedPiece& p = t.pieces(i);
      absl::StatusOr<SliceGeom> g = GeomOfPiece(t, *shape, p, i, element_bytes);
      if (!g.ok()) {
        problem(g.status());
        complete = false;
        continue;
      }
      g->ForEachInterval(static_cast<int64_t>(p.range().begin()),
                         static_cast<int64_t>(p.range().end()),
                         [&](int64_t gb, int64_t ge, int64_t lb) {
                           intervals.push_back({gb, ge, i, lb});
                         });
      if (!listed.empty() && !listed.contains(p.file())) {
        problem(absl::DataLossError(absl::StrCat("tensor '", t.name(), "' piece ", i, " is in '",
                                                 p.file(), "', which no rank record lists")));
      }
      const std::string user = absl::StrCat("tensor '", t.name(), "'");
      absl::StatusOr<const FileCache::File*> file = files.Open(p.file(), user);
      if (!file.ok()) {
        problem(file.status());
        continue;
      }
      if (p.byte_offset() > (*file)->size() ||
          p.byte_length() > (*file)->size() - p.byte_offset()) {
        problem(absl::DataLossError(absl::StrCat(
            "checkpoint file '", (*file)->path(), "' is ", (*file)->size(), " bytes but ", user,
            " piece ", i, " needs bytes [", p.byte_offset(), ", ",
            p.byte_offset() + p.byte_length(), ")")));
        continue;
      }
      absl::StatusOr<uint32_t> crc = CrcOfRange((*file)->fd(), p.byte_offset(), p.byte_length(),
                                                (*file)->path(), buffer, &report.bytes_checked);
      if (!crc.ok()) {
        problem(crc.status());
      } else if (*crc != p.crc32c()) {
        problem(absl::DataLossError(absl::StrCat(
            user, ": piece ", i, " in file '", (*file)->path(), "' has CRC-32C ", Hex(*crc),
            " but the manifest records ", Hex(p.crc32c()))));
      }
    }
    if (!complete) continue;
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval& a, const Interval& b) { return a.gbegin < b.gbegin; });
    const int64_t numel = Numel(*shape);
    int64_t covered = 0;  // [0, covered) seen so far
    bool reported = false;
    for (const Interval& iv : intervals) {
      if (iv.gbegin > covered) {
        problem(absl::DataLossError(absl::StrCat("tensor '", t.name(), "': global elements [",
                                                 covered, ", ", iv.gbegin,
                                                 ") are in no saved piece (a gap)")));
        reported = true;
        break;
      }
      if (iv.gbegin < covered) {
        problem(absl::DataLossError(absl::StrCat(
            "tensor '", t.name(), "': global element ", iv.gbegin,
            " is in more than one saved piece (an overlap; piece ", iv.piece, " in '",
            t.pieces(iv.piece).file(), "')")));
        reported = true;
        break;
      }
      covered = iv.gend;
    }
    if (!reported && covered < numel) {
      problem(absl::DataLossError(absl::StrCat("tensor '", t.name(), "': global elements [",
                                               covered, ", ", numel,
                                               ") are in no saved piece (a gap)")));
    }
  }
  return report;
}

}  // namespace shardline::checkpoint

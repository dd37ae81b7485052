// Checkpoint shard I/O (docs/ARCHITECTURE.md "Checkpoints"; checkpoint.proto): what one
// rank writes, how any later layout reads it back, and how a committed
// checkpoint is verified.
//
//   // Save (every rank, into BeginCheckpoint's directory):
//   absl::StatusOr<v1::ReportShardRequest> report = WriteShard(dir, rank, runs);
//   // ... fill fence/checkpoint_id/rng_state/data_cursor, ReportShard ...
//   // Restore (every rank of the new layout, after GetManifest):
//   absl::Status s = ReadRuns(manifest, manifest.directory(), restore_runs);
//
// A LocalRun is one contiguous run of one tensor's tp-local slice; it says
// nothing about the trainer (see trainer_state.h for Trainer::StateSlice).
// Files hold raw little-endian IEEE fp32 values, one run after another; the
// manifest's pieces say where each run lives in global coordinates, so
// restoring is interval intersection in the tensor's global row-major index
// space and works across tp, pp, dp and zero_stage changes.
#ifndef SHARDLINE_CHECKPOINT_SHARD_IO_H_
#define SHARDLINE_CHECKPOINT_SHARD_IO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shardline/v1/checkpoint.pb.h"
#include "shardline/v1/common.pb.h"

namespace shardline::checkpoint {

namespace v1 = ::shardline::v1;

// Elements [begin, end) of the row-major order of one tensor's tp-local
// slice, living at `data` (end - begin fp32 values).
//
// The tp-local slice is the hyperrectangle of `global_shape` that tp rank
// `tp_rank` holds: along `split_dim`, indices [tp_rank * g / tp,
// (tp_rank + 1) * g / tp) with g = global_shape[split_dim]; every other
// dimension whole. With split_dim = -1 the slice is the whole tensor (tp and
// tp_rank are then ignored).
struct LocalRun {
  std::string tensor;                 // checkpoint tensor name
  std::vector<int64_t> global_shape;  // elements per dimension, outermost first
  int split_dim = -1;                 // the tp-split dimension, or -1
  int tp = 1;                         // tensor-parallel degree, >= 1
  int tp_rank = 0;                    // 0 <= tp_rank < tp
  int64_t begin = 0;                  // first element in the slice (elements)
  int64_t end = 0;                    // one past the last (elements)
  float* data = nullptr;              // end - begin values; may be null if empty
};

// InvalidArgument naming the field when `run` is malformed: empty tensor
// name, a negative dimension, split_dim outside [-1, rank), tp < 1, tp_rank
// outside [0, tp), tp not dividing the split dimension, begin/end outside
// [0, slice elements] or begin > end, or null data for a non-empty run.
absl::Status ValidateRun(const LocalRun& run);

// The file name (relative to the checkpoint directory) rank `rank` writes:
// "rank-00003.bin".
std::string ShardFileName(int rank);

// Writes rank `rank`'s runs into ONE file `directory`/ShardFileName(rank),
// the runs' fp32 bytes back to back in the order given, and returns what the
// rank reports: `files` (path relative to `directory`, size, CRC-32C of the
// whole file) and `tensors` (one SavedTensor per tensor name in order of
// first appearance: DTYPE_FLOAT32, global shape, one piece per non-empty run
// with slice = the tp-local hyperrectangle in global coordinates, range =
// [begin, end), byte range and CRC-32C; piece rank = `rank`). The caller
// fills fence, checkpoint_id, rng_state and data_cursor.
//
// Durable and atomic: written to a temporary name in `directory`, fsync'ed,
// renamed, then the directory is fsync'ed; `directory` is created with its
// parents when missing. A rank whose runs are all empty writes no file and
// reports nothing (a rank whose shard is all padding: field case C4).
//
// Written in 4 MiB blocks at 4 MiB-aligned offsets (small runs gathered
// into one writev), each byte checksummed once (the file's CRC-32C is the
// pieces' combined); write-back to the disk is started every 8 MiB
// (sync_file_range, not waited for), so the disk works while later runs
// are copied instead of only at the fsync.
//
// Errors: InvalidArgument for a negative rank or a malformed run (see
// ValidateRun), or runs of one tensor with different global shapes; for I/O
// failures the errno's status (PermissionDenied, ResourceExhausted for a
// full disk, NotFound, Unavailable, ...) with the path and errno text
// ("cannot write", "cannot write back" for an error found during write-back,
// "cannot fsync", ...); the temporary file is removed.
//
// Thread-safe (distinct ranks may write into one directory concurrently).
// The runs' data must not change during the call.
absl::StatusOr<v1::ReportShardRequest> WriteShard(const std::string& directory, int rank,
                                                  const std::vector<LocalRun>& runs);

// WriteShard on a background thread, so training continues while the shard
// is written: Start copies the runs' values into host memory it owns (the
// caller may modify or free the originals as soon as Start returns) and
// returns; Wait returns what WriteShard would have.
//
//   IDLE --Start ok--> WRITING --write done--> DONE --Wait--> IDLE
//          (Wait blocks while WRITING)
//
// Thread-safe: every method may be called from any thread. One save at a
// time. The destructor waits for a save in flight (its result is dropped).
class AsyncShardWriter {
 public:
  AsyncShardWriter() = default;
  ~AsyncShardWriter();
  AsyncShardWriter(const AsyncShardWriter&) = delete;
  AsyncShardWriter& operator=(const AsyncShardWriter&) = delete;

  // Copies `runs` (end - begin floats each; memory: their total size) and
  // starts writing them. Errors: FailedPrecondition when a save was started
  // and not yet collected by Wait; InvalidArgument as WriteShard, reported
  // here at once (nothing is started).
  absl::Status Start(const std::string& directory, int rank, const std::vector<LocalRun>& runs)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the started save finishes and returns its result (then the
  // writer is idle again). FailedPrecondition when no save was started.
  absl::StatusOr<v1::ReportShardRequest> Wait() ABSL_LOCKS_EXCLUDED(mu_);

  // True between a successful Start and the matching Wait.
  bool InFlight() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kIdle, kWriting, kDone };
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  std::optional<absl::StatusOr<v1::ReportShardRequest>> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

// Fills every run's data from the checkpoint `manifest` whose files lie in
// `directory` (normally manifest.directory()). Each run is mapped to global
// row-major index intervals (one per row when a non-leading dimension is
// split) and intersected with the saved pieces' intervals (sorted per
// tensor, binary-searched); only the needed byte ranges are read (pread).
// Every piece used is verified once per call by its CRC-32C over its whole
// byte range. When reads into the runs tile the piece from its first byte
// to its last, each starting where another ends (the same layout reads
// every piece whole; a piece may also be split between runs), it is
// checksummed from the runs' memory as the bytes arrive, so each byte is
// read once; otherwise (needed only in part, e.g. at another dp or tp) it
// is also read whole, into a scratch buffer, to verify it. The restoring
// layout may differ from the saving one in tp, pp, dp and zero_stage. Runs
// may overlap (e.g. a tied copy) and may be empty.
//
// The reads are planned first and then run in chunks of at most 4 MiB, in
// file-offset order, on min(4, ceil(bytes to read / 4 MiB)) threads (the
// calling thread is one of them; all are joined before the call returns),
// or on the calling thread alone when two runs' buffers overlap; memory:
// a 4 MiB scratch buffer per thread that verifies a piece needed in part.
// Files are advised POSIX_FADV_SEQUENTIAL. When several problems exist, the one
// reported is the first that reading the runs one after another would meet
// (each piece checked at its first use), whatever the threads' timing.
//
// Errors:
//   InvalidArgument: a malformed run (ValidateRun); a run whose global shape
//     differs from the manifest's; a malformed piece (bad slice, range or
//     byte length; a file path that is absolute or has "..").
//   NotFound: a run's tensor is not in the manifest.
//   Unimplemented: a needed tensor is not stored as DTYPE_FLOAT32.
//   DataLoss: a needed element is covered by no piece (names the tensor and
//     the first missing global index) or by two; a file is missing or shorter
//     than a piece or than its ShardFile.size_bytes; a piece's CRC-32C
//     differs (names tensor, file, expected and actual checksums).
//   Other errno statuses (PermissionDenied, Unavailable) for I/O failures.
// On error the runs' contents are unspecified (reads planned before the
// problem may have been done).
// Thread-safe; the runs' buffers must not be touched during the call.
absl::Status ReadRuns(const v1::Manifest& manifest, const std::string& directory,
                      const std::vector<LocalRun>& runs);

// What VerifyCheckpoint found.
struct VerifyReport {
  uint64_t bytes_checked = 0;  // bytes read and checksummed (files + pieces)
  int64_t files = 0;           // ShardFile records checked
  int64_t tensors = 0;         // SavedTensors checked
  int64_t pieces = 0;          // SavedPieces checked
  int64_t problems = 0;        // problems found (0 when sound)
  // The first problem (OK when none): DataLoss for a missing/short/corrupt
  // file or piece, a gap or an overlap in a tensor's coverage;
  // InvalidArgument for a malformed record; PermissionDenied etc. for I/O.
  absl::Status first_problem;
  bool ok() const { return problems == 0; }
};

// Re-reads every file the manifest's ranks list (size and whole-file
// CRC-32C) and every piece (bounds, byte length, CRC-32C), and checks that
// the pieces of each tensor cover [0, numel) of its global row-major index
// space exactly once: no gap, no overlap, nothing beyond the shape. Reads
// every byte (cost: about twice the checkpoint's size). Never fails itself:
// every finding goes into the report. Thread-safe.
VerifyReport VerifyCheckpoint(const v1::Manifest& manifest, const std::string& directory);

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_SHARD_IO_H_

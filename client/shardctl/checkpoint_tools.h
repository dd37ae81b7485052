// shardctl's file work on a committed checkpoint (docs/ARCHITECTURE.md "Checkpoints"):
// verify every shard file and piece against the manifest's checksums, and
// consolidate the sharded state into ONE unsharded safetensors file. Both
// run where the checkpoint directory is visible; the manifest comes from the
// coordinator (GetManifest) or from <dir>/manifest.json (ReadManifestJson),
// which the coordinator writes next to the shards at commit.
//
//   absl::StatusOr<v1::Manifest> m = ReadManifestJson("/ckpt/ckpt-step000000000010-gen1");
//   absl::StatusOr<std::string> ok = VerifyCheckpointFiles(*m, dir);   // text for humans
//   absl::StatusOr<ConsolidateResult> r = ConsolidateCheckpoint(*m, dir, "model.safetensors", {});
//
// The safetensors file (https://github.com/huggingface/safetensors):
//   8 bytes   little-endian uint64 N, the header's length (bytes)
//   N bytes   JSON: {"<tensor>": {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
//             padded with spaces to a multiple of 8 bytes
//   the data  each tensor's fp32 values, row-major, little-endian, back to
//             back in the order of the tensors' names (sorted); offsets are
//             bytes from the start of the data
// __metadata__ values are strings (safetensors allows nothing else): job_id,
// checkpoint_id, step, generation, data_cursor, seed, and the model config
// (num_layers, hidden_size, num_heads, ffn_hidden_size, vocab_size,
// seq_length). Tensors keep their checkpoint names: parameters by name,
// AdamW moments "<parameter>/exp_avg" and "<parameter>/exp_avg_sq", fp32
// masters "<parameter>/master".
//
// Thread-compatible: no shared state.
#ifndef SHARDLINE_CLIENT_CHECKPOINT_TOOLS_H_
#define SHARDLINE_CLIENT_CHECKPOINT_TOOLS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardline/v1/checkpoint.pb.h"

namespace shardline::shardctl {

namespace v1 = ::shardline::v1;

// Reads <directory>/manifest.json (protobuf JSON of a v1.Manifest). Errors:
// NotFound: no such file (names it; is this a checkpoint directory, e.g.
// <root>/ckpt-step000000000010-gen1?); DataLoss: it does not parse.
absl::StatusOr<v1::Manifest> ReadManifestJson(const std::string& directory);

// For a checkpoint directory the coordinator named (Manifest.directory:
// <base>/<job>/<checkpoint id>, <base> being spec.checkpoint.directory):
// that neither <job> nor <checkpoint id> is a symlink (a worker may have
// planted one; the files read must be inside <base>/<job>). A directory
// that does not exist passes (the reader reports the missing files).
// Errors: FailedPrecondition naming the symlink; InvalidArgument for a
// directory not of that shape.
absl::Status CheckCheckpointDirectory(const std::string& directory);

// Runs worker::checkpoint::VerifyCheckpoint over the files in `directory`
// and returns one line for humans: "checkpoint ID (step S): OK: T tensors,
// F files, P pieces, B bytes checked". A shard path through a symlink is a
// problem (FailedPrecondition naming it). Errors: DataLoss with the first
// problem (it names the tensor or file), the number of problems and what
// was checked; the first problem's own code when it is an I/O error
// (PermissionDenied, Unavailable, ...).
absl::StatusOr<std::string> VerifyCheckpointFiles(const v1::Manifest& manifest,
                                                  const std::string& directory);

struct ConsolidateOptions {
  // Also write the optimizer state (AdamW moments, fp32 masters); by
  // default only the parameters.
  bool optimizer = false;
};

struct ConsolidateResult {
  int64_t tensors = 0;       // tensors written
  uint64_t data_bytes = 0;   // bytes of tensor data written
  uint64_t file_bytes = 0;   // size of the file (header included)
};

// Reads every selected tensor whole from the checkpoint's pieces (ReadRuns
// with one whole-tensor run each, so every piece used is checksummed) and
// writes them as one safetensors file `out_path` (see the file comment):
// written to a temporary name next to it and renamed, so a reader never sees
// a partial file. Memory: one tensor at a time. Errors: ReadRuns's
// (DataLoss for a corrupt or missing piece, naming tensor and file;
// Unimplemented for a tensor not stored as fp32); InvalidArgument when the
// selection is empty; Unavailable / PermissionDenied when `out_path` cannot
// be written (names it).
absl::StatusOr<ConsolidateResult> ConsolidateCheckpoint(const v1::Manifest& manifest,
                                                        const std::string& directory,
                                                        const std::string& out_path,
                                                        const ConsolidateOptions& options);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_CHECKPOINT_TOOLS_H_

// The coordinator's file work for checkpoints (docs/ARCHITECTURE.md "Checkpoints"):
// checking that the files ranks reported are on disk, writing the committed
// manifest next to the shards, moving LATEST, and deleting the directories
// of expired and aborted checkpoints. No gRPC, no registry state: the
// coordinator's checkpoint flow (server/checkpoint_flow.cc) calls these
// around CheckpointRegistry.
//
//   CheckpointRegistryOptions options;
//   options.verify_files = VerifyShardFiles;         // at commit
//   ...
//   WriteManifestFile(root, *result.committed_manifest);   // then
//   WriteLatestFile(root, result.committed_manifest->checkpoint_id());
//   for (const ExpiredCheckpoint& x : result.expired) RemoveCheckpointDirectory(root, x.directory);
//
// Layout of a job's checkpoint root (CheckpointConfig.directory):
//
//   <root>/LATEST                      "<checkpoint_id>\n" of the newest committed
//   <root>/<checkpoint_id>/manifest.json   protobuf JSON of its v1.Manifest
//   <root>/<checkpoint_id>/rank-*.bin  the ranks' shard files (written by workers)
//
// Both files are replaced atomically: a temp file in the same directory,
// fsync, rename, fsync of the directory. A reader sees the old or the new
// content, never a torn one, also after a power cut.
//
// Deletion is confined to the root: a directory is removed only when it is
// <root>/<one path component> (no "..", not the root itself), is not a
// symlink, and its parent resolves (realpath) to the root's real path. Links
// inside it are removed, never followed.
//
// Thread-safety: the functions are thread-safe in themselves; callers
// serialize writers of one root (two writers of LATEST race on which rename
// lands last).
#ifndef SHARDLINE_CHECKPOINT_CHECKPOINT_FILES_H_
#define SHARDLINE_CHECKPOINT_CHECKPOINT_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shardline/v1/checkpoint.pb.h"

namespace shardline::checkpoint {

inline constexpr absl::string_view kManifestFileName = "manifest.json";
inline constexpr absl::string_view kLatestFileName = "LATEST";

// The verify_files hook of CheckpointRegistryOptions: every ShardFile of
// every rank exists under manifest.directory() as a regular file of exactly
// size_bytes. Cheap: one stat per file, no reads (checksums are the
// restoring reader's job). Errors: DataLoss naming the rank, the file and
// what is wrong (missing, not a regular file, other size); InvalidArgument
// for an absolute or ".." path (the registry rejects those earlier).
absl::Status VerifyShardFiles(const shardline::v1::Manifest& manifest);

// Checks that `directory` is a checkpoint directory of `root` that may be
// written or deleted (see the file comment) and returns its normalized
// path. Errors: InvalidArgument: root not absolute, or `directory` not
// <root>/<one component> lexically; FailedPrecondition: `directory` is a
// symlink or not a directory, or its parent resolves outside the root.
absl::StatusOr<std::string> CheckpointDirectoryUnder(absl::string_view root,
                                                     absl::string_view directory);

// Writes <manifest.directory()>/manifest.json (protobuf JSON, field names as
// in the proto) atomically, creating the directory if no rank did (a rank
// with no real elements writes nothing). `root` as for
// CheckpointDirectoryUnder. Errors: those of CheckpointDirectoryUnder;
// Unavailable when a file operation fails (names it and errno).
absl::Status WriteManifestFile(absl::string_view root, const shardline::v1::Manifest& manifest);

// Reads <directory>/manifest.json back (protobuf JSON of a v1.Manifest;
// unknown fields are skipped, so a newer writer's manifest reads). The one
// reader of manifest.json: the coordinator's repair and shardctl --dir use
// it. Errors: NotFound "no file '<path>'"; DataLoss: it does not parse;
// FileError (common/files.h) when it cannot be read.
absl::StatusOr<shardline::v1::Manifest> ReadManifestFile(absl::string_view directory);

// Writes <root>/LATEST = checkpoint_id + "\n" atomically (creating the root
// if needed). Errors: InvalidArgument: root not absolute, id empty or not
// one path component; Unavailable: a file operation failed.
absl::Status WriteLatestFile(absl::string_view root, absl::string_view checkpoint_id);

// The checkpoint id in <root>/LATEST (without the newline). Errors:
// NotFound: no LATEST; Unavailable: it cannot be read.
absl::StatusOr<std::string> ReadLatestFile(absl::string_view root);

// Removes `directory` and everything in it after CheckpointDirectoryUnder
// accepted it. A directory that does not exist is OK (already gone).
// Errors: those of CheckpointDirectoryUnder (nothing removed);
// Unavailable: removal failed part way (names the error).
absl::Status RemoveCheckpointDirectory(absl::string_view root, absl::string_view directory);

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_CHECKPOINT_FILES_H_

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
// Confinement: a job's checkpoint root <root> is <base>/<job>, where <base>
// is spec.checkpoint.directory (the operator's; symlinks in it are
// followed, e.g. to a mounted volume). Workers can write below <base>, so
// nothing below it is trusted: <job>, the checkpoint directories and every
// shard path are resolved one component at a time without following
// symlinks (checkpoint/confined_dir.h), for every read, write, rename and
// delete here. A job root, checkpoint directory or shard path through a
// symlink is refused with FailedPrecondition naming it; links inside a
// directory being deleted are removed, never followed.
//
// Deletion is crash-safe (RemoveCheckpointDirectory): the directory is
// first renamed to the tombstone "<root>/.deleting-<id>" (durably), then
// deleted; a crash part way leaves a tombstone, never a half-deleted
// checkpoint directory that still looks valid. CleanUpCheckpointRoot, at
// the coordinator's start, removes tombstones, stray temp files and the
// orphaned checkpoint directories its caller names.
//
// Thread-safety: the functions are thread-safe in themselves; callers
// serialize writers of one root (two writers of LATEST race on which rename
// lands last).
#ifndef SHARDLINE_CHECKPOINT_CHECKPOINT_FILES_H_
#define SHARDLINE_CHECKPOINT_CHECKPOINT_FILES_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/confined_dir.h"
#include "shardline/v1/checkpoint.pb.h"

namespace shardline::checkpoint {

inline constexpr absl::string_view kManifestFileName = "manifest.json";
inline constexpr absl::string_view kLatestFileName = "LATEST";

// Temp files of the atomic writes start with "." (ConfinedDir); a
// directory being deleted is renamed to kTombstonePrefix + its name first.
inline constexpr absl::string_view kTombstonePrefix = ".deleting-";

// The verify_files hook of CheckpointRegistryOptions: every ShardFile of
// every rank exists under manifest.directory() (= <root>/<checkpoint id>,
// confined as in the file comment) as a regular file of exactly
// size_bytes. Cheap: one open and fstat per file, no reads (checksums are
// the restoring reader's job). Errors: DataLoss naming the rank, the file
// and what is wrong (missing, not a regular file, other size);
// FailedPrecondition "checkpoint path 'sub/passwd' of rank 3 goes through
// symlink 'sub'; shards must be regular files inside <root>" (also for a
// symlinked job root or checkpoint directory); InvalidArgument for an
// absolute or ".." path (the registry rejects those earlier).
absl::Status VerifyShardFiles(const shardline::v1::Manifest& manifest);

// Opens the job root <base>/<job> = `root` (absolute, no ".."): <base>
// following symlinks, <job> not (see the file comment); with `create`
// missing directories are made. Errors: InvalidArgument: root not absolute
// or with ".."; FailedPrecondition: <job> is a symlink or not a directory;
// NotFound when it does not exist (without `create`); FileError's.
absl::StatusOr<ConfinedDir> OpenJobRoot(absl::string_view root, bool create);

// Opens `directory` = <root>/<one component> below OpenJobRoot(root),
// without following a symlink. Errors: InvalidArgument: `directory` not
// <root>/<one component> lexically; then OpenJobRoot's and ConfinedDir's
// (FailedPrecondition for a symlink; NotFound when missing, without
// `create`).
absl::StatusOr<ConfinedDir> OpenCheckpointDirectory(absl::string_view root,
                                                    absl::string_view directory, bool create);

// Checks that `directory` is a checkpoint directory of `root` that may be
// written or deleted and returns its normalized path. A directory that does
// not exist yet is accepted. Errors: InvalidArgument: root not absolute, or
// `directory` not <root>/<one component> lexically; FailedPrecondition:
// the job root or `directory` is a symlink or not a directory.
absl::StatusOr<std::string> CheckpointDirectoryUnder(absl::string_view root,
                                                     absl::string_view directory);

// Writes <manifest.directory()>/manifest.json (protobuf JSON, field names as
// in the proto) atomically, creating the directory if no rank did (a rank
// with no real elements writes nothing). `root` as for
// OpenCheckpointDirectory. Errors: those of OpenCheckpointDirectory;
// Unavailable when a file operation fails (names it and errno).
absl::Status WriteManifestFile(absl::string_view root, const shardline::v1::Manifest& manifest);

// Reads <directory>/manifest.json back (protobuf JSON of a v1.Manifest;
// unknown fields are skipped, so a newer writer's manifest reads).
// `directory` itself is trusted (shardctl --dir: the user's argument);
// manifest.json must be a regular file, not a symlink. Errors: NotFound
// "no file '<path>'"; DataLoss: it does not parse; FailedPrecondition: a
// symlink or not a regular file; FileError (common/files.h) when it cannot
// be read.
absl::StatusOr<shardline::v1::Manifest> ReadManifestFile(absl::string_view directory);

// The same for the coordinator: `directory` confined below `root` as for
// OpenCheckpointDirectory. Errors: those of OpenCheckpointDirectory and of
// the overload above.
absl::StatusOr<shardline::v1::Manifest> ReadManifestFile(absl::string_view root,
                                                         absl::string_view directory);

// Writes <root>/LATEST = checkpoint_id + "\n" atomically (creating the root
// if needed). Errors: InvalidArgument: root not absolute, id empty or not
// one path component; FailedPrecondition: the job root is a symlink;
// Unavailable: a file operation failed.
absl::Status WriteLatestFile(absl::string_view root, absl::string_view checkpoint_id);

// The checkpoint id in <root>/LATEST (without the newline). Errors:
// NotFound: no LATEST (or no root); FailedPrecondition: a symlinked root or
// LATEST; Unavailable: it cannot be read.
absl::StatusOr<std::string> ReadLatestFile(absl::string_view root);

// Removes <root>/LATEST (a symlink named LATEST is removed, not followed).
// No root or no LATEST: OK. Errors: OpenJobRoot's; FileError's.
absl::Status RemoveLatestFile(absl::string_view root);

// Removes `directory` and everything in it after CheckpointDirectoryUnder
// accepted it: renamed to <root>/.deleting-<name> (fsync'ed), then deleted
// (a tombstone left by an earlier crash of the same name is deleted
// first). A directory that does not exist is OK (already gone); `existed`
// (optional) says whether there was one. Errors: those of
// CheckpointDirectoryUnder (nothing removed); Unavailable: removal failed
// part way (names the error; a tombstone may remain, which
// CleanUpCheckpointRoot removes).
absl::Status RemoveCheckpointDirectory(absl::string_view root, absl::string_view directory,
                                       bool* existed = nullptr);

// At start, for one job root (nothing when it does not exist): removes
// every tombstone (".deleting-*", any type), every stray temp file of an
// atomic write (".LATEST.tmp-*" in the root, ".manifest.json.tmp-*" in its
// directories) and every directory whose name `is_orphan` accepts (the
// caller's rule; see server/checkpoint_flow.h). Call it only when no
// writer of the root is running (the temp files of a running write would
// be removed). Symlinks are removed, never followed. Returns what was
// removed (names relative to the root). Errors: OpenJobRoot's; the first
// removal that failed (the rest is still tried).
absl::StatusOr<std::vector<std::string>> CleanUpCheckpointRoot(
    absl::string_view root, const std::function<bool(const std::string& name)>& is_orphan);

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_CHECKPOINT_FILES_H_

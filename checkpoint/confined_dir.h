// The one safe way to touch files below a checkpoint directory: a directory
// opened once, and every path below it resolved one component at a time
// relative to the descriptor of the one before, without following symlinks
// (openat(O_NOFOLLOW | O_DIRECTORY) per directory, O_NOFOLLOW for the file,
// fstatat(AT_SYMLINK_NOFOLLOW), unlinkat/renameat relative to the
// descriptor). Workers can write below the checkpoint directory; a symlink
// one of them plants (<dir>/<job> -> /victim, sub -> /etc) therefore cannot
// redirect a read, write, rename or delete of the coordinator or shardctl
// outside it, and swapping a checked directory for a symlink later changes
// nothing (what was opened stays opened). The coordinator's checkpoint files
// (checkpoint/checkpoint_files.h) and the shard reader and verifier
// (checkpoint/shard_io.h) go through it.
//
//   absl::StatusOr<ConfinedDir> root = ConfinedDir::Open("/ckpt", "job-1", /*create=*/true);
//   absl::Status s = root->WriteFileAtomically("LATEST", "ckpt-x\n");
//   std::string symlink;
//   absl::StatusOr<ConfinedDir::File> f = root->OpenFile("ckpt-x/rank-00000.bin", &symlink);
//
// Relative paths: components separated by '/', empty components ignored;
// "." or ".." components and absolute paths are InvalidArgument. A symlink
// anywhere on the way is FailedPrecondition "'<dir>/<rel>' goes through
// symlink '<prefix>'; refusing to follow it" (and the out-parameter
// `symlink`, where offered, is set to <prefix>, the relative path of the
// link, so callers can name it in their own words). Other errors are
// FileError's (common/files.h): NotFound when a component is missing, etc.
//
// Thread-compatible: one object per user; distinct objects (also of the
// same directory) may be used concurrently. Move-only; closes its
// descriptor on destruction.
#ifndef SHARDLINE_CHECKPOINT_CONFINED_DIR_H_
#define SHARDLINE_CHECKPOINT_CONFINED_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::checkpoint {

class ConfinedDir {
 public:
  // A regular file opened read-only below the directory. Move-only.
  class File {
   public:
    File() = default;
    File(int fd, uint64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}
    File(File&& other) noexcept { *this = std::move(other); }
    File& operator=(File&& other) noexcept;
    ~File();
    int fd() const { return fd_; }
    uint64_t size() const { return size_; }            // bytes, at open (fstat)
    const std::string& path() const { return path_; }  // full path, for messages

   private:
    int fd_ = -1;
    uint64_t size_ = 0;
    std::string path_;
  };

  enum class Type { kDirectory, kRegular, kSymlink, kOther };
  struct Entry {
    std::string name;
    Type type = Type::kOther;
  };

  // Opens `path` (symlinks IN it are followed: it is the
  // operator's choice, e.g. a mounted volume) and then `below` relative to
  // it without following symlinks. With `create`, missing directories are
  // made (mode 0755; `path` with its parents, each component of `below`
  // with its parent fsync'ed). Errors: InvalidArgument: `path` empty,
  // `below` malformed (see the file comment); FailedPrecondition:
  // a symlink or a non-directory on the way; FileError's otherwise.
  static absl::StatusOr<ConfinedDir> Open(const std::string& path, absl::string_view below = "",
                                          bool create = false);

  ConfinedDir(ConfinedDir&& other) noexcept { *this = std::move(other); }
  ConfinedDir& operator=(ConfinedDir&& other) noexcept;
  ConfinedDir(const ConfinedDir&) = delete;
  ConfinedDir& operator=(const ConfinedDir&) = delete;
  ~ConfinedDir();

  // The path it was opened by (for messages; never used to open anything).
  const std::string& path() const { return path_; }

  // The directory `rel` below this one (see Open for `create`).
  absl::StatusOr<ConfinedDir> Sub(absl::string_view rel, bool create = false) const;

  // The regular file `rel`. Errors: those of the file comment (with
  // `symlink` set when a symlink was refused); FailedPrecondition "... is
  // not a regular file" for a directory, FIFO, device, ...
  absl::StatusOr<File> OpenFile(absl::string_view rel, std::string* symlink = nullptr) const;

  // The whole of the regular file `rel`. NotFound "no file '<path>'" when
  // it (or a directory on the way) does not exist; OpenFile's errors.
  absl::StatusOr<std::string> ReadFile(absl::string_view rel) const;

  // What is at `rel` (not following a final symlink); NotFound when
  // nothing is.
  absl::StatusOr<Type> TypeOf(absl::string_view rel) const;

  // Replaces the entry `name` (one component) of this directory by
  // `contents` atomically and durably: a temp file ".<name>.tmp-<pid>-<n>"
  // (O_EXCL, O_NOFOLLOW, mode `mode`), write, fsync, renameat over `name`
  // (a symlink named `name` is replaced, never followed), fsync of this
  // directory. On failure the temp file is removed. Errors: FileError's.
  absl::Status WriteFileAtomically(absl::string_view name, absl::string_view contents,
                                   int mode = 0644) const;

  // Removes the entry `name` (one component; a symlink is removed, not
  // followed). A directory is removed with everything in it, depth first,
  // every level opened with O_NOFOLLOW. Already gone: OK. Errors:
  // FileError's (part of a tree may be gone).
  absl::Status Remove(absl::string_view name) const;

  // renameat(from, to) within this directory (one component each), then
  // fsync of the directory. Errors: FileError's.
  absl::Status Rename(absl::string_view from, absl::string_view to) const;

  // The entries of this directory (not "." and ".."), in no order; types
  // from fstatat(AT_SYMLINK_NOFOLLOW). Errors: FileError's.
  absl::StatusOr<std::vector<Entry>> List() const;

 private:
  ConfinedDir(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  std::string path_;
};

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_CONFINED_DIR_H_

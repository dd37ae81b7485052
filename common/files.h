// Files as every layer uses them: errno as an absl::Status, fsync of a
// directory, a file replaced atomically, a whole file read.
//
//   if (::open(...) < 0) return FileError(errno, "cannot open", path);
//   absl::Status s = WriteFileAtomically("/ckpt/job", "LATEST", "ckpt-7\n");
//
// Thread-safe (no state; WriteFileAtomically's temp names are unique per
// process and call).
#ifndef SHARDLINE_COMMON_FILES_H_
#define SHARDLINE_COMMON_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline {

// The one errno -> Status mapping of the project: the code is
// absl::ErrnoToStatusCode(err) (ENOENT NotFound, EACCES/EPERM
// PermissionDenied, ENOSPC ResourceExhausted, EEXIST AlreadyExists, EAGAIN
// Unavailable, ENOTDIR/EISDIR FailedPrecondition, ...) except that what
// Abseil calls Unknown (EIO and the like) is Unavailable; the message
// "<what> '<path>': <strerror(err)> (errno <err>)", e.g.
//   "cannot open 'x/manifest.json': No such file or directory (errno 2)".
absl::Status FileError(int err, absl::string_view what, absl::string_view path);

// fsync(2) of a directory, so that entries created, renamed or removed in it
// survive a crash. Errors: FileError of open(2) or fsync(2).
absl::Status FsyncDirectory(const std::string& directory);

// Replaces <directory>/<name> by `contents` so that a reader sees the old or
// the new contents, never a mix, even across a crash: a temp file
// ".<name>.tmp-<pid>-<n>" in `directory` (mode `mode`, O_EXCL), write,
// fsync, rename over the target, fsync of `directory`. Creates `directory`
// (and its parents) when missing. On failure the temp file is removed.
// Errors: FileError of the failing call (the path it names).
absl::Status WriteFileAtomically(const std::string& directory, absl::string_view name,
                                 absl::string_view contents, int mode = 0644);

// WriteFileAtomically relative to an open directory: every step (create
// the temp file with O_EXCL | O_NOFOLLOW, write, fsync, renameat over
// `name`, fsync of the directory) goes through `dir_fd`, so no path is
// resolved again (checkpoint/confined_dir.h builds on it). `dir_path` only
// names the directory in messages; `name` is one path component. Errors:
// FileError of the failing call (the path it names).
absl::Status WriteFileAtomicallyAt(int dir_fd, const std::string& dir_path,
                                   absl::string_view name, absl::string_view contents,
                                   int mode = 0644);

// The whole file. Errors: NotFound "no file '<path>'" when it does not
// exist; FileError of open(2)/read(2) otherwise.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace shardline

#endif  // SHARDLINE_COMMON_FILES_H_

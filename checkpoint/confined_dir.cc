#include "checkpoint/confined_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"

namespace shardline::checkpoint {
namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// The components of a relative path, or InvalidArgument.
absl::StatusOr<std::vector<std::string>> Components(absl::string_view rel) {
  if (!rel.empty() && rel.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("path '", rel, "' is absolute; expected a path relative to the directory"));
  }
  std::vector<std::string> parts = absl::StrSplit(rel, '/', absl::SkipEmpty());
  for (const std::string& p : parts) {
    if (p == "." || p == ".." || p.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("path '", rel, "' has a '", p, "' component; refusing it"));
    }
  }
  return parts;
}

// One component, for the calls that take an entry name.
absl::Status CheckName(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != absl::string_view::npos ||
      name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not one path component (an entry name)"));
  }
  return absl::OkStatus();
}

std::string Join(const std::string& dir, absl::string_view rel) {
  if (rel.empty()) return dir;
  return dir == "/" ? absl::StrCat("/", rel) : absl::StrCat(dir, "/", rel);
}

// The first n components, joined.
std::string Prefix(const std::vector<std::string>& parts, size_t n) {
  return absl::StrJoin(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(n), "/");
}

absl::Status SymlinkError(const std::string& dir, const std::vector<std::string>& parts, size_t i,
                          std::string* symlink) {
  const std::string prefix = Prefix(parts, i + 1);
  if (symlink != nullptr) *symlink = prefix;
  return absl::FailedPreconditionError(absl::StrCat("'", Join(dir, absl::StrJoin(parts, "/")),
                                                    "' goes through symlink '", prefix,
                                                    "'; refusing to follow it"));
}

// Why openat(parent, name, O_NOFOLLOW...) failed with `err`: a symlink, a
// non-directory where a directory was wanted, or the errno itself.
absl::Status OpenFailure(int parent, int err, const std::string& dir,
                         const std::vector<std::string>& parts, size_t i, bool want_dir,
                         std::string* symlink) {
  struct stat st;
  if (::fstatat(parent, parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) return SymlinkError(dir, parts, i, symlink);
    if (want_dir && !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", Join(dir, Prefix(parts, i + 1)), "' is not a directory"));
    }
  }
  return FileError(err, "cannot open", Join(dir, Prefix(parts, i + 1)));
}

// Opens parts[0, n) below `start` as directories, one at a time; returns
// the last one's descriptor (a duplicate of `start` when n == 0).
absl::StatusOr<int> WalkDirs(int start, const std::string& dir,
                             const std::vector<std::string>& parts, size_t n, bool create,
                             std::string* symlink) {
  int fd = ::fcntl(start, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return FileError(errno, "cannot duplicate the descriptor of", dir);
  for (size_t i = 0; i < n; ++i) {
    int next = ::openat(fd, parts[i].c_str(), kDirFlags);
    if (next < 0 && errno == ENOENT && create) {
      if (::mkdirat(fd, parts[i].c_str(), 0755) != 0 && errno != EEXIST) {
        const int err = errno;
        ::close(fd);
        return FileError(err, "cannot create directory", Join(dir, Prefix(parts, i + 1)));
      }
      ::fsync(fd);  // the new entry survives a crash
      next = ::openat(fd, parts[i].c_str(), kDirFlags);
    }
    if (next < 0) {
      absl::Status s = OpenFailure(fd, errno, dir, parts, i, /*want_dir=*/true, symlink);
      ::close(fd);
      return s;
    }
    ::close(fd);
    fd = next;
  }
  return fd;
}

absl::Status RemoveAt(int parent, const std::string& name, const std::string& path) {
  struct stat st;
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return FileError(errno, "cannot stat", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent, name.c_str(), 0) != 0 && errno != ENOENT) {
      return FileError(errno, "cannot remove", path);
    }
    return absl::OkStatus();
  }
  const int fd = ::openat(parent, name.c_str(), kDirFlags);
  if (fd < 0) return FileError(errno, "cannot open directory", path);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return FileError(err, "cannot list", path);
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  absl::Status status;
  for (const std::string& n : names) {
    if (absl::Status s = RemoveAt(::dirfd(d), n, absl::StrCat(path, "/", n)); !s.ok()) {
      status = s;
      break;
    }
  }
  ::closedir(d);
  if (!status.ok()) return status;
  if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return FileError(errno, "cannot remove directory", path);
  }
  return absl::OkStatus();
}

}  // namespace

ConfinedDir::File& ConfinedDir::File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
  }
  return *this;
}

ConfinedDir::File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

ConfinedDir& ConfinedDir::operator=(ConfinedDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

ConfinedDir::~ConfinedDir() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<ConfinedDir> ConfinedDir::Open(const std::string& path, absl::string_view below,
                                              bool create) {
  if (path.empty()) return absl::InvalidArgumentError("empty directory path");
  std::string normal = std::filesystem::path(path).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  int fd = ::open(normal.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    std::error_code ec;
    std::filesystem::create_directories(normal, ec);
    if (ec) return FileError(ec.value(), "cannot create directory", normal);
    fd = ::open(normal.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd < 0) return FileError(errno, "cannot open directory", normal);
  ConfinedDir base(fd, normal);
  if (below.empty()) return base;
  return base.Sub(below, create);
}

absl::StatusOr<ConfinedDir> ConfinedDir::Sub(absl::string_view rel, bool create) const {
  absl::StatusOr<std::vector<std::string>> parts = Components(rel);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<int> fd = WalkDirs(fd_, path_, *parts, parts->size(), create, nullptr);
  if (!fd.ok()) return fd.status();
  return ConfinedDir(*fd, Join(path_, absl::StrJoin(*parts, "/")));
}

absl::StatusOr<ConfinedDir::File> ConfinedDir::OpenFile(absl::string_view rel,
                                                        std::string* symlink) const {
  absl::StatusOr<std::vector<std::string>> parts = Components(rel);
  if (!parts.ok()) return parts.status();
  if (parts->empty()) return absl::InvalidArgumentError("empty file path");
  const size_t last = parts->size() - 1;
  absl::StatusOr<int> dir = WalkDirs(fd_, path_, *parts, last, false, symlink);
  if (!dir.ok()) return dir.status();
  const std::string full = Join(path_, absl::StrJoin(*parts, "/"));
  // O_NONBLOCK: a FIFO planted under the name must not hang the open.
  const int fd = ::openat(*dir, (*parts)[last].c_str(),
                          O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    absl::Status s = OpenFailure(*dir, errno, path_, *parts, last, /*want_dir=*/false, symlink);
    ::close(*dir);
    return s;
  }
  ::close(*dir);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return FileError(err, "cannot stat", full);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", full, "' is not a regular file"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return File(fd, static_cast<uint64_t>(st.st_size), full);
}

absl::StatusOr<std::string> ConfinedDir::ReadFile(absl::string_view rel) const {
  absl::StatusOr<File> file = OpenFile(rel);
  if (!file.ok()) {
    if (file.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat("no file '", Join(path_, rel), "'"));
    }
    return file.status();
  }
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(file->fd(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, "cannot read", file->path());
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<ConfinedDir::Type> ConfinedDir::TypeOf(absl::string_view rel) const {
  absl::StatusOr<std::vector<std::string>> parts = Components(rel);
  if (!parts.ok()) return parts.status();
  if (parts->empty()) return Type::kDirectory;
  const size_t last = parts->size() - 1;
  absl::StatusOr<int> dir = WalkDirs(fd_, path_, *parts, last, false, nullptr);
  if (!dir.ok()) return dir.status();
  struct stat st;
  const int rc = ::fstatat(*dir, (*parts)[last].c_str(), &st, AT_SYMLINK_NOFOLLOW);
  const int err = errno;
  ::close(*dir);
  if (rc != 0) return FileError(err, "cannot stat", Join(path_, rel));
  if (S_ISLNK(st.st_mode)) return Type::kSymlink;
  if (S_ISDIR(st.st_mode)) return Type::kDirectory;
  if (S_ISREG(st.st_mode)) return Type::kRegular;
  return Type::kOther;
}

absl::Status ConfinedDir::WriteFileAtomically(absl::string_view name, absl::string_view contents,
                                              int mode) const {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  return ::shardline::WriteFileAtomicallyAt(fd_, path_, name, contents, mode);
}

absl::Status ConfinedDir::Remove(absl::string_view name) const {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  return RemoveAt(fd_, std::string(name), Join(path_, name));
}

absl::Status ConfinedDir::Rename(absl::string_view from, absl::string_view to) const {
  if (absl::Status s = CheckName(from); !s.ok()) return s;
  if (absl::Status s = CheckName(to); !s.ok()) return s;
  if (::renameat(fd_, std::string(from).c_str(), fd_, std::string(to).c_str()) != 0) {
    return FileError(errno, absl::StrCat("cannot rename to '", Join(path_, to), "'"),
                     Join(path_, from));
  }
  if (::fsync(fd_) != 0) return FileError(errno, "cannot fsync directory", path_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ConfinedDir::Entry>> ConfinedDir::List() const {
  const int fd = ::openat(fd_, ".", kDirFlags);
  if (fd < 0) return FileError(errno, "cannot open directory", path_);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return FileError(err, "cannot list", path_);
  }
  std::vector<Entry> out;
  while (const dirent* e = ::readdir(d)) {
    Entry entry;
    entry.name = e->d_name;
    if (entry.name == "." || entry.name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      entry.type = S_ISLNK(st.st_mode)   ? Type::kSymlink
                   : S_ISDIR(st.st_mode) ? Type::kDirectory
                   : S_ISREG(st.st_mode) ? Type::kRegular
                                         : Type::kOther;
    }
    out.push_back(std::move(entry));
  }
  ::closedir(d);
  return out;
}

}  // namespace shardline::checkpoint

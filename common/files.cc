#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace shardline {

absl::Status FileError(int err, absl::string_view what, absl::string_view path) {
  absl::StatusCode code = absl::ErrnoToStatusCode(err);
  // EIO and the rest that Abseil calls Unknown: the device or file system
  // failed, which a caller may retry later or elsewhere.
  if (code == absl::StatusCode::kUnknown) code = absl::StatusCode::kUnavailable;
  return absl::Status(code,
                      absl::StrCat(what, " '", path, "': ", std::strerror(err), " (errno ", err,
                                   ")"));
}

absl::Status FsyncDirectory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "cannot open directory", directory);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return FileError(err, "cannot fsync directory", directory);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& directory, absl::string_view name,
                                 absl::string_view contents, int mode) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) return FileError(ec.value(), "cannot create directory", directory);
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return FileError(errno, "cannot open directory", directory);
  absl::Status s = WriteFileAtomicallyAt(dir_fd, directory, name, contents, mode);
  ::close(dir_fd);
  return s;
}

absl::Status WriteFileAtomicallyAt(int dir_fd, const std::string& dir_path,
                                   absl::string_view name, absl::string_view contents, int mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string target = absl::StrCat(dir_path, "/", name);
  const std::string temp_name =
      absl::StrCat(".", name, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  const std::string temp = absl::StrCat(dir_path, "/", temp_name);
  const int fd = ::openat(dir_fd, temp_name.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return FileError(errno, "cannot create", temp);
  auto fail = [&](absl::string_view what, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlinkat(dir_fd, temp_name.c_str(), 0);
    return FileError(err, what, temp);
  };
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write", errno, true);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("cannot fsync", errno, true);
  if (::close(fd) != 0) return fail("cannot close", errno, false);
  if (::renameat(dir_fd, temp_name.c_str(), dir_fd, std::string(name).c_str()) != 0) {
    return fail(absl::StrCat("cannot rename to '", target, "'"), errno, false);
  }
  if (::fsync(dir_fd) != 0) return FileError(errno, "cannot fsync directory", dir_path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no file '", path, "'"));
    return FileError(err, "cannot open", path);
  }
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return FileError(err, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace shardline

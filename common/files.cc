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
  static std::atomic<uint64_t> counter{0};
  const std::string target = absl::StrCat(directory, "/", name);
  const std::string temp =
      absl::StrCat(directory, "/.", name, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return FileError(errno, "cannot create", temp);
  auto fail = [&](absl::string_view what, int err) {
    ::close(fd);
    ::unlink(temp.c_str());
    return FileError(err, what, temp);
  };
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("cannot fsync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return FileError(err, "cannot close", temp);
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return FileError(err, absl::StrCat("cannot rename to '", target, "'"), temp);
  }
  return FsyncDirectory(directory);
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

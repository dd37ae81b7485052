#include "checkpoint/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::shardline::v1;

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

absl::Status FileError(absl::string_view what, absl::string_view path, int err) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", ErrnoText(err)));
}

// One path component: not empty, ".", ".." and without '/'.
bool IsOneComponent(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos && name.find('\0') == absl::string_view::npos;
}

// `path` lexically normalized, without a trailing '/' (except "/").
std::string Normal(absl::string_view path) {
  std::string s = fs::path(std::string(path)).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool HasDotDot(absl::string_view path) {
  for (const fs::path& part : fs::path(std::string(path))) {
    if (part == "..") return true;
  }
  return false;
}

// The real path of an existing `path`, or an error naming it.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr) return FileError("cannot resolve", path, errno);
  std::string out(real);
  ::free(real);
  return out;
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return FileError("cannot fsync directory", dir, err);
  return absl::OkStatus();
}

// Replaces <dir>/<name> by `contents`: temp file in `dir`, fsync, rename,
// fsync of `dir`. Creates `dir` (and its parents) if missing.
absl::Status WriteFileAtomically(const std::string& dir, absl::string_view name,
                                 absl::string_view contents) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
  }
  static std::atomic<uint64_t> counter{0};
  const std::string target = absl::StrCat(dir, "/", name);
  const std::string temp =
      absl::StrCat(dir, "/.", name, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("cannot create", temp, errno);
  auto fail = [&](absl::string_view what, int err) {
    ::close(fd);
    ::unlink(temp.c_str());
    return FileError(what, temp, err);
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
    return FileError("cannot close", temp, err);
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return FileError(absl::StrCat("cannot rename to '", target, "'"), temp, err);
  }
  return FsyncDirectory(dir);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no file '", path, "'"));
    return FileError("cannot open", path, err);
  }
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat("cannot read '", path, "'"));
  return s.str();
}

}  // namespace

absl::Status VerifyShardFiles(const v1::Manifest& manifest) {
  const std::string dir = manifest.directory();
  for (const v1::RankRecord& rank : manifest.ranks()) {
    for (const v1::ShardFile& f : rank.files()) {
      if (f.path().empty() || f.path()[0] == '/' || HasDotDot(f.path())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d reported file \"%s\", which is not a relative path inside the checkpoint "
            "directory",
            rank.rank(), f.path()));
      }
      const std::string path = absl::StrCat(dir, "/", f.path());
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) {
        const int err = errno;
        if (err == ENOENT || err == ENOTDIR) {
          return absl::DataLossError(absl::StrFormat(
              "rank %d reported file \"%s\" (%d bytes), but %s does not exist", rank.rank(),
              f.path(), f.size_bytes(), path));
        }
        return absl::DataLossError(absl::StrFormat("rank %d reported file \"%s\", but %s: %s",
                                                   rank.rank(), f.path(), path, ErrnoText(err)));
      }
      if (!S_ISREG(st.st_mode)) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d reported file \"%s\", but %s is not a regular file", rank.rank(), f.path(),
            path));
      }
      if (static_cast<uint64_t>(st.st_size) != f.size_bytes()) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d reported file \"%s\" of %d bytes, but %s has %d bytes", rank.rank(),
            f.path(), f.size_bytes(), path, static_cast<int64_t>(st.st_size)));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointDirectoryUnder(absl::string_view root,
                                                     absl::string_view directory) {
  if (root.empty() || root[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root '", root, "' is not an absolute path"));
  }
  if (HasDotDot(root) || HasDotDot(directory)) {
    return absl::InvalidArgumentError(absl::StrCat("refusing path with '..': root '", root,
                                                   "', directory '", directory, "'"));
  }
  const std::string normal_root = Normal(root);
  const std::string normal_dir = Normal(directory);
  const fs::path dir_path(normal_dir);
  if (dir_path.parent_path().string() != normal_root ||
      !IsOneComponent(dir_path.filename().string())) {
    return absl::InvalidArgumentError(absl::StrCat("directory '", directory,
                                                   "' is not a checkpoint directory directly "
                                                   "under the job's checkpoint root '",
                                                   root, "'"));
  }
  struct stat st;
  if (::lstat(normal_dir.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", normal_dir, "' is a symlink; refusing to touch it"));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", normal_dir, "' exists and is not a directory"));
    }
  }
  // The root itself may be a symlink (e.g. to a mounted volume); what
  // matters is that the checkpoint directory's parent is that same place.
  if (::lstat(normal_root.c_str(), &st) == 0) {
    absl::StatusOr<std::string> real_root = RealPath(normal_root);
    if (!real_root.ok()) return real_root.status();
    absl::StatusOr<std::string> real_parent = RealPath(dir_path.parent_path().string());
    if (!real_parent.ok()) return real_parent.status();
    if (*real_parent != *real_root) {
      return absl::FailedPreconditionError(absl::StrCat("'", normal_dir, "' resolves to '",
                                                        *real_parent, "/...', outside '",
                                                        *real_root, "'"));
    }
  }
  return normal_dir;
}

absl::Status WriteManifestFile(absl::string_view root, const v1::Manifest& manifest) {
  absl::StatusOr<std::string> dir = CheckpointDirectoryUnder(root, manifest.directory());
  if (!dir.ok()) return dir.status();
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto printed = google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (!printed.ok()) {
    return absl::InternalError(
        absl::StrCat("manifest to JSON failed: ", printed.message().as_string()));
  }
  return WriteFileAtomically(*dir, kManifestFileName, json);
}

absl::StatusOr<v1::Manifest> ReadManifestFile(absl::string_view directory) {
  const std::string path = absl::StrCat(Normal(directory), "/", kManifestFileName);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  v1::Manifest manifest;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*text, &manifest);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' does not parse as a manifest: ", parsed.message().as_string()));
  }
  return manifest;
}

absl::Status WriteLatestFile(absl::string_view root, absl::string_view checkpoint_id) {
  if (root.empty() || root[0] != '/' || HasDotDot(root)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root '", root, "' is not an absolute path without '..'"));
  }
  if (!IsOneComponent(checkpoint_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint id '", checkpoint_id, "' is not one path component"));
  }
  return WriteFileAtomically(Normal(root), kLatestFileName, absl::StrCat(checkpoint_id, "\n"));
}

absl::StatusOr<std::string> ReadLatestFile(absl::string_view root) {
  absl::StatusOr<std::string> text =
      ReadWholeFile(absl::StrCat(Normal(root), "/", kLatestFileName));
  if (!text.ok()) return text.status();
  return std::string(absl::StripAsciiWhitespace(*text));
}

absl::Status RemoveCheckpointDirectory(absl::string_view root, absl::string_view directory) {
  absl::StatusOr<std::string> dir = CheckpointDirectoryUnder(root, directory);
  if (!dir.ok()) return dir.status();
  std::error_code ec;
  fs::remove_all(*dir, ec);  // removes links inside, never follows them
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot remove checkpoint directory '", *dir, "': ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace shardline::checkpoint

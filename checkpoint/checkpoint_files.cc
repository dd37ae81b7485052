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
#include "common/files.h"
#include "google/protobuf/util/json_util.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::shardline::v1;

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
  if (real == nullptr) return FileError(errno, "cannot resolve", path);
  std::string out(real);
  ::free(real);
  return out;
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
        return absl::DataLossError(
            absl::StrFormat("rank %d reported file \"%s\", but %s", rank.rank(), f.path(),
                            FileError(err, "cannot stat", path).message()));
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
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  v1::Manifest manifest;
  // Fields this version does not know are skipped: a manifest written by a
  // newer coordinator still reads (forward compatibility); what is read is
  // checked by its users (VerifyCheckpoint, the restore planner).
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*text, &manifest, options);
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
      ReadFileToString(absl::StrCat(Normal(root), "/", kLatestFileName));
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

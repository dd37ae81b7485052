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
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

// `root` checked (absolute, no ".."), normalized, split into the trusted
// base and the job component.
absl::StatusOr<std::pair<std::string, std::string>> SplitRoot(absl::string_view root) {
  if (root.empty() || root[0] != '/' || HasDotDot(root)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root '", root, "' is not an absolute path without '..'"));
  }
  const fs::path normal(Normal(root));
  if (!IsOneComponent(normal.filename().string())) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root '", root, "' is not <checkpoint directory>/<job>"));
  }
  return std::make_pair(normal.parent_path().string(), normal.filename().string());
}

// The checkpoint directory's name, after checking that `directory` is
// <root>/<one component> lexically.
absl::StatusOr<std::string> CheckpointName(absl::string_view root, absl::string_view directory) {
  if (root.empty() || root[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root '", root, "' is not an absolute path"));
  }
  if (HasDotDot(root) || HasDotDot(directory)) {
    return absl::InvalidArgumentError(absl::StrCat("refusing path with '..': root '", root,
                                                   "', directory '", directory, "'"));
  }
  const fs::path dir_path(Normal(directory));
  if (dir_path.parent_path().string() != Normal(root) ||
      !IsOneComponent(dir_path.filename().string())) {
    return absl::InvalidArgumentError(absl::StrCat("directory '", directory,
                                                   "' is not a checkpoint directory directly "
                                                   "under the job's checkpoint root '",
                                                   root, "'"));
  }
  return dir_path.filename().string();
}

absl::StatusOr<v1::Manifest> ParseManifest(const ConfinedDir& dir) {
  absl::StatusOr<std::string> text = dir.ReadFile(kManifestFileName);
  if (!text.ok()) return text.status();
  v1::Manifest manifest;
  // Fields this version does not know are skipped: a manifest written by a
  // newer coordinator still reads (forward compatibility); what is read is
  // checked by its users (VerifyCheckpoint, the restore planner).
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*text, &manifest, options);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("'", dir.path(), "/", kManifestFileName,
                                            "' does not parse as a manifest: ",
                                            parsed.message().as_string()));
  }
  return manifest;
}

}  // namespace

absl::StatusOr<ConfinedDir> OpenJobRoot(absl::string_view root, bool create) {
  absl::StatusOr<std::pair<std::string, std::string>> split = SplitRoot(root);
  if (!split.ok()) return split.status();
  return ConfinedDir::Open(split->first, split->second, create);
}

absl::StatusOr<ConfinedDir> OpenCheckpointDirectory(absl::string_view root,
                                                    absl::string_view directory, bool create) {
  absl::StatusOr<std::string> name = CheckpointName(root, directory);
  if (!name.ok()) return name.status();
  absl::StatusOr<ConfinedDir> job_root = OpenJobRoot(root, create);
  if (!job_root.ok()) return job_root.status();
  return job_root->Sub(*name, create);
}

absl::Status VerifyShardFiles(const v1::Manifest& manifest) {
  const std::string dir = Normal(manifest.directory());
  const std::string root = fs::path(dir).parent_path().string();
  std::optional<ConfinedDir> opened;
  for (const v1::RankRecord& rank : manifest.ranks()) {
    for (const v1::ShardFile& f : rank.files()) {
      if (f.path().empty() || f.path()[0] == '/' || HasDotDot(f.path())) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d reported file \"%s\", which is not a relative path inside the checkpoint "
            "directory",
            rank.rank(), f.path()));
      }
      const std::string path = absl::StrCat(dir, "/", f.path());
      auto missing = [&] {
        return absl::DataLossError(
            absl::StrFormat("rank %d reported file \"%s\" (%d bytes), but %s does not exist",
                            rank.rank(), f.path(), f.size_bytes(), path));
      };
      if (!opened) {
        absl::StatusOr<ConfinedDir> d = OpenCheckpointDirectory(root, dir, /*create=*/false);
        if (d.status().code() == absl::StatusCode::kNotFound) return missing();
        if (!d.ok()) {
          return absl::Status(d.status().code(),
                              absl::StrFormat("rank %d reported file \"%s\", but %s; shards must "
                                              "be regular files inside %s",
                                              rank.rank(), f.path(), d.status().message(), root));
        }
        opened = *std::move(d);
      }
      std::string symlink;
      absl::StatusOr<ConfinedDir::File> file = opened->OpenFile(f.path(), &symlink);
      if (!symlink.empty()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "checkpoint path '%s' of rank %d goes through symlink '%s'; shards must be regular "
            "files inside %s",
            f.path(), rank.rank(), symlink, root));
      }
      if (file.status().code() == absl::StatusCode::kNotFound) return missing();
      if (file.status().code() == absl::StatusCode::kFailedPrecondition) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d reported file \"%s\", but %s is not a regular file", rank.rank(), f.path(),
            path));
      }
      if (!file.ok()) {
        return absl::DataLossError(absl::StrFormat("rank %d reported file \"%s\", but %s",
                                                   rank.rank(), f.path(),
                                                   file.status().message()));
      }
      if (file->size() != f.size_bytes()) {
        return absl::DataLossError(absl::StrFormat(
            "rank %d reported file \"%s\" of %d bytes, but %s has %d bytes", rank.rank(),
            f.path(), f.size_bytes(), path, file->size()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointDirectoryUnder(absl::string_view root,
                                                     absl::string_view directory) {
  absl::StatusOr<std::string> name = CheckpointName(root, directory);
  if (!name.ok()) return name.status();
  absl::StatusOr<ConfinedDir> job_root = OpenJobRoot(root, /*create=*/false);
  if (job_root.status().code() == absl::StatusCode::kNotFound) return Normal(directory);
  if (!job_root.ok()) return job_root.status();
  absl::StatusOr<ConfinedDir::Type> type = job_root->TypeOf(*name);
  if (type.ok() && *type == ConfinedDir::Type::kSymlink) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", Normal(directory), "' is a symlink; refusing to touch it"));
  }
  if (type.ok() && *type != ConfinedDir::Type::kDirectory) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", Normal(directory), "' exists and is not a directory"));
  }
  if (!type.ok() && type.status().code() != absl::StatusCode::kNotFound) return type.status();
  return Normal(directory);
}

absl::Status WriteManifestFile(absl::string_view root, const v1::Manifest& manifest) {
  absl::StatusOr<ConfinedDir> dir =
      OpenCheckpointDirectory(root, manifest.directory(), /*create=*/true);
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
  return dir->WriteFileAtomically(kManifestFileName, json);
}

absl::StatusOr<v1::Manifest> ReadManifestFile(absl::string_view directory) {
  absl::StatusOr<ConfinedDir> dir = ConfinedDir::Open(Normal(directory));
  if (dir.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat("no file '", Normal(directory), "/", kManifestFileName, "'"));
  }
  if (!dir.ok()) return dir.status();
  return ParseManifest(*dir);
}

absl::StatusOr<v1::Manifest> ReadManifestFile(absl::string_view root,
                                              absl::string_view directory) {
  absl::StatusOr<ConfinedDir> dir = OpenCheckpointDirectory(root, directory, /*create=*/false);
  if (dir.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat("no file '", Normal(directory), "/", kManifestFileName, "'"));
  }
  if (!dir.ok()) return dir.status();
  return ParseManifest(*dir);
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
  absl::StatusOr<ConfinedDir> dir = OpenJobRoot(root, /*create=*/true);
  if (!dir.ok()) return dir.status();
  return dir->WriteFileAtomically(kLatestFileName, absl::StrCat(checkpoint_id, "\n"));
}

absl::StatusOr<std::string> ReadLatestFile(absl::string_view root) {
  absl::StatusOr<ConfinedDir> dir = OpenJobRoot(root, /*create=*/false);
  if (dir.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat("no file '", Normal(root), "/", kLatestFileName, "'"));
  }
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::string> text = dir->ReadFile(kLatestFileName);
  if (!text.ok()) return text.status();
  return std::string(absl::StripAsciiWhitespace(*text));
}

absl::Status RemoveLatestFile(absl::string_view root) {
  absl::StatusOr<ConfinedDir> dir = OpenJobRoot(root, /*create=*/false);
  if (dir.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  if (!dir.ok()) return dir.status();
  return dir->Remove(kLatestFileName);
}

absl::Status RemoveCheckpointDirectory(absl::string_view root, absl::string_view directory,
                                       bool* existed) {
  if (existed != nullptr) *existed = false;
  absl::StatusOr<std::string> checked = CheckpointDirectoryUnder(root, directory);
  if (!checked.ok()) return checked.status();
  absl::StatusOr<ConfinedDir> job_root = OpenJobRoot(root, /*create=*/false);
  if (job_root.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  if (!job_root.ok()) return job_root.status();
  const std::string name = fs::path(*checked).filename().string();
  const std::string tombstone = absl::StrCat(kTombstonePrefix, name);
  auto unavailable = [&](const absl::Status& s) {
    return absl::UnavailableError(
        absl::StrCat("cannot remove checkpoint directory '", *checked, "': ", s.message()));
  };
  // A tombstone of the same name from an interrupted earlier removal.
  if (absl::Status s = job_root->Remove(tombstone); !s.ok()) return unavailable(s);
  absl::Status renamed = job_root->Rename(name, tombstone);
  if (renamed.code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  if (!renamed.ok()) return unavailable(renamed);
  if (existed != nullptr) *existed = true;
  // Links inside are removed, never followed (ConfinedDir::Remove).
  if (absl::Status s = job_root->Remove(tombstone); !s.ok()) return unavailable(s);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CleanUpCheckpointRoot(
    absl::string_view root, const std::function<bool(const std::string& name)>& is_orphan) {
  absl::StatusOr<ConfinedDir> job_root = OpenJobRoot(root, /*create=*/false);
  if (job_root.status().code() == absl::StatusCode::kNotFound) {
    return std::vector<std::string>();
  }
  if (!job_root.ok()) return job_root.status();
  absl::StatusOr<std::vector<ConfinedDir::Entry>> entries = job_root->List();
  if (!entries.ok()) return entries.status();
  const std::string latest_temp = absl::StrCat(".", kLatestFileName, ".tmp-");
  const std::string manifest_temp = absl::StrCat(".", kManifestFileName, ".tmp-");
  std::vector<std::string> removed;
  absl::Status first_error;
  auto remove = [&](const ConfinedDir& dir, const std::string& name, const std::string& shown) {
    absl::Status s = dir.Remove(name);
    if (s.ok()) {
      removed.push_back(shown);
    } else if (first_error.ok()) {
      first_error = s;
    }
  };
  for (const ConfinedDir::Entry& e : *entries) {
    if (absl::StartsWith(e.name, kTombstonePrefix) || absl::StartsWith(e.name, latest_temp)) {
      remove(*job_root, e.name, e.name);
    } else if (e.type == ConfinedDir::Type::kDirectory && is_orphan(e.name)) {
      remove(*job_root, e.name, e.name);
    } else if (e.type == ConfinedDir::Type::kDirectory) {
      absl::StatusOr<ConfinedDir> sub = job_root->Sub(e.name);
      if (!sub.ok()) continue;
      absl::StatusOr<std::vector<ConfinedDir::Entry>> inside = sub->List();
      if (!inside.ok()) continue;
      for (const ConfinedDir::Entry& f : *inside) {
        if (absl::StartsWith(f.name, manifest_temp)) {
          remove(*sub, f.name, absl::StrCat(e.name, "/", f.name));
        }
      }
    }
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

}  // namespace shardline::checkpoint

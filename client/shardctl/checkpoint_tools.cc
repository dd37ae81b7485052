#include "client/shardctl/checkpoint_tools.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "checkpoint/checkpoint_files.h"
#include "common/files.h"
#include "checkpoint/shard_io.h"

namespace shardline::shardctl {
namespace {

namespace ckpt = ::shardline::checkpoint;

// Optimizer-state tensors are "<parameter>/<state>" (checkpoint.proto).
bool IsOptimizerState(const std::string& name) {
  return absl::EndsWith(name, "/exp_avg") || absl::EndsWith(name, "/exp_avg_sq") ||
         absl::EndsWith(name, "/master");
}

}  // namespace

absl::StatusOr<v1::Manifest> ReadManifestJson(const std::string& directory) {
  absl::StatusOr<v1::Manifest> manifest = checkpoint::ReadManifestFile(directory);
  if (manifest.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat(manifest.status().message(),
                     "; --dir is one checkpoint's directory, e.g. "
                     "<checkpoint root>/ckpt-step000000000010-gen1"));
  }
  return manifest;
}

absl::Status CheckCheckpointDirectory(const std::string& directory) {
  std::string dir = directory;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.find_last_of('/');
  if (slash == std::string::npos || slash == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint directory '", directory, "' is not <checkpoint directory>/<job>/<id>"));
  }
  absl::StatusOr<ckpt::ConfinedDir> opened =
      ckpt::OpenCheckpointDirectory(dir.substr(0, slash), dir, /*create=*/false);
  if (opened.ok() || opened.status().code() == absl::StatusCode::kNotFound) {
    return absl::OkStatus();
  }
  return opened.status();
}

absl::StatusOr<std::string> VerifyCheckpointFiles(const v1::Manifest& manifest,
                                                  const std::string& directory) {
  const ckpt::VerifyReport report = ckpt::VerifyCheckpoint(manifest, directory);
  const std::string checked =
      absl::StrCat(report.tensors, " tensors, ", report.files, " files, ", report.pieces,
                   " pieces, ", report.bytes_checked, " bytes checked");
  const std::string what =
      absl::StrCat("checkpoint ", manifest.checkpoint_id(), " (step ", manifest.step(), ")");
  if (report.ok()) return absl::StrCat(what, ": OK: ", checked, " in ", directory);
  const absl::Status& first = report.first_problem;
  absl::StatusCode code = first.code();
  // A malformed record or a gap is damage too; I/O errors keep their code.
  if (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
      code == absl::StatusCode::kOk || code == absl::StatusCode::kOutOfRange) {
    code = absl::StatusCode::kDataLoss;
  }
  return absl::Status(code, absl::StrCat(what, " in ", directory, " is damaged: ", first.message(),
                                         " (", report.problems, " problem",
                                         report.problems == 1 ? "" : "s", " found; ", checked,
                                         ")"));
}

absl::StatusOr<ConsolidateResult> ConsolidateCheckpoint(const v1::Manifest& manifest,
                                                        const std::string& directory,
                                                        const std::string& out_path,
                                                        const ConsolidateOptions& options) {
  // Sorted by name (the safetensors convention; stable output).
  std::map<std::string, const v1::SavedTensor*> selected;
  for (const v1::SavedTensor& t : manifest.tensors()) {
    if (!options.optimizer && IsOptimizerState(t.name())) continue;
    selected[t.name()] = &t;
  }
  if (selected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", manifest.checkpoint_id(),
                                                   " has no tensors to consolidate"));
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["job_id"] = manifest.job_id();
  meta["checkpoint_id"] = manifest.checkpoint_id();
  meta["step"] = std::to_string(manifest.step());
  meta["generation"] = std::to_string(manifest.generation());
  meta["data_cursor"] = std::to_string(manifest.data_cursor());
  meta["seed"] = std::to_string(manifest.seed());
  const v1::ModelConfig& m = manifest.model();
  meta["num_layers"] = std::to_string(m.num_layers());
  meta["hidden_size"] = std::to_string(m.hidden_size());
  meta["num_heads"] = std::to_string(m.num_heads());
  meta["ffn_hidden_size"] = std::to_string(m.ffn_hidden_size());
  meta["vocab_size"] = std::to_string(m.vocab_size());
  meta["seq_length"] = std::to_string(m.seq_length());
  meta["optimizer_state"] = options.optimizer ? "true" : "false";
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const auto& [name, t] : selected) {
    uint64_t numel = 1;
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (uint64_t d : t->global_shape()) {
      numel *= d;
      shape.push_back(d);
    }
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = "F32";
    entry["shape"] = shape;
    entry["data_offsets"] = {offset, offset + numel * sizeof(float)};
    header[name] = entry;
    offset += numel * sizeof(float);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  const std::string tmp = absl::StrCat(out_path, ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return FileError(errno, "cannot create", tmp);
  auto fail = [&](absl::Status s) {
    std::fclose(f);
    std::remove(tmp.c_str());
    return s;
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(text.data(), 1, n, f) != n) {
    return fail(FileError(errno, "cannot write", tmp));
  }
  ConsolidateResult result;
  std::vector<float> buffer;
  for (const auto& [name, t] : selected) {
    ckpt::LocalRun run;
    run.tensor = name;
    int64_t numel = 1;
    for (uint64_t d : t->global_shape()) {
      run.global_shape.push_back(static_cast<int64_t>(d));
      numel *= static_cast<int64_t>(d);
    }
    run.split_dim = -1;  // the whole tensor (tp = 1)
    run.begin = 0;
    run.end = numel;
    buffer.assign(static_cast<size_t>(numel), 0.0f);
    run.data = buffer.empty() ? nullptr : buffer.data();
    if (absl::Status s = ckpt::ReadRuns(manifest, directory, {run}); !s.ok()) {
      return fail(absl::Status(s.code(), absl::StrCat("checkpoint ", manifest.checkpoint_id(),
                                                      ": ", s.message())));
    }
    // Files hold little-endian fp32, as does safetensors; this host too.
    static_assert(sizeof(float) == 4);
    if (!buffer.empty() &&
        std::fwrite(buffer.data(), sizeof(float), buffer.size(), f) != buffer.size()) {
      return fail(FileError(errno, "cannot write", tmp));
    }
    ++result.tensors;
    result.data_bytes += buffer.size() * sizeof(float);
  }
  if (std::fflush(f) != 0) return fail(FileError(errno, "cannot write", tmp));
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    return FileError(errno, "cannot write", tmp);
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
    absl::Status s = FileError(errno, "cannot rename to", out_path);
    std::remove(tmp.c_str());
    return s;
  }
  result.file_bytes = 8 + n + result.data_bytes;
  return result;
}

}  // namespace shardline::shardctl

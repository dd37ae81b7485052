#include "worker/train/data.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/files.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace shardline::worker::train {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
// Separates the training-window stream from other users of the same seed
// (e.g. init.cc's weights): the ASCII bytes "datatrai".
constexpr uint64_t kTrainSalt = 0x6461746174726169ULL;
// Validation window stride in bytes (the 1000th prime).
constexpr uint64_t kValidationStride = 7919;

// Output k (0-based) of the SplitMix64 generator seeded with `seed`
// (Steele, Lea, Flood, OOPSLA'14): counter-based, so any k is O(1).
uint64_t SplitMix64(uint64_t seed, uint64_t k) {
  uint64_t z = seed + (k + 1) * kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void CopyWindow(const std::string& bytes, int64_t start, int64_t seq, int32_t* tokens,
                int32_t* targets) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + start;
  for (int64_t i = 0; i < seq; ++i) {
    tokens[i] = p[i];
    targets[i] = p[i + 1];
  }
}

}  // namespace

Corpus::Corpus(std::string bytes, int64_t train_size)
    : bytes_(std::move(bytes)), train_size_(train_size) {}

absl::StatusOr<Corpus> Corpus::FromBytes(std::string bytes, double validation_fraction) {
  if (!(validation_fraction >= 0.0 && validation_fraction <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat("validation_fraction=", validation_fraction,
                                                   " is outside [0, 0.5]; use e.g. 0.1"));
  }
  if (bytes.empty()) {
    return absl::InvalidArgumentError("the corpus is empty (0 bytes); it needs text to train on");
  }
  const int64_t size = static_cast<int64_t>(bytes.size());
  const int64_t validation =
      static_cast<int64_t>(std::floor(static_cast<double>(size) * validation_fraction));
  return Corpus(std::move(bytes), size - validation);
}

absl::StatusOr<Corpus> Corpus::Load(const std::string& path, double validation_fraction) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    return FileError(err, "cannot open corpus", path);
  }
  std::string bytes;
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, got);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) {
    return FileError(err, "cannot read corpus", path);
  }
  absl::StatusOr<Corpus> corpus = FromBytes(std::move(bytes), validation_fraction);
  if (!corpus.ok()) {
    return absl::Status(corpus.status().code(),
                        absl::StrCat(path, ": ", corpus.status().message()));
  }
  return corpus;
}

int64_t Corpus::train_size() const { return train_size_; }

int64_t Corpus::validation_size() const {
  return static_cast<int64_t>(bytes_.size()) - train_size_;
}

absl::Status Corpus::CheckSequenceLength(int64_t seq) const {
  const bool train_ok = train_size() > seq;
  const bool validation_ok = validation_size() == 0 || validation_size() > seq;
  if (seq < 1 || !train_ok || !validation_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_length=", seq, " does not fit the corpus: need 1 <= seq_length < train_size=",
        train_size(), " and < validation_size=", validation_size(),
        " (unless it is 0); use a shorter seq_length, a larger file or another "
        "validation_fraction"));
  }
  return absl::OkStatus();
}

void Corpus::TrainSample(uint64_t seed, int64_t index, int64_t seq, int32_t* tokens,
                         int32_t* targets) const {
  const uint64_t windows = static_cast<uint64_t>(train_size_ - seq);
  const uint64_t start = SplitMix64(seed ^ kTrainSalt, static_cast<uint64_t>(index)) % windows;
  CopyWindow(bytes_, static_cast<int64_t>(start), seq, tokens, targets);
}

void Corpus::ValidationSample(int64_t index, int64_t seq, int32_t* tokens,
                              int32_t* targets) const {
  const uint64_t windows = static_cast<uint64_t>(validation_size() - seq);
  const unsigned __int128 product =
      static_cast<unsigned __int128>(static_cast<uint64_t>(index)) * kValidationStride;
  const uint64_t start = static_cast<uint64_t>(product % windows);
  CopyWindow(bytes_, train_size_ + static_cast<int64_t>(start), seq, tokens, targets);
}

}  // namespace shardline::worker::train

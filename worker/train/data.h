// Byte-level language-modelling data over one text file (docs/ARCHITECTURE.md "Data").
//
//   absl::StatusOr<Corpus> c = Corpus::Load("data/tinyshakespeare.txt", 0.1);
//   std::vector<int32_t> x(64), y(64);
//   c->TrainSample(/*seed=*/1234, /*index=*/k, /*seq=*/64, x.data(), y.data());
//
// Tokens are bytes (vocabulary 256). The last `validation_fraction` of the file
// is the validation split, the rest the training split: validation_size =
// floor(file_size * validation_fraction) (tiny-Shakespeare at 0.1: 111,539 of
// 1,115,394 bytes), train_size = file_size - validation_size. Training sample
// k is a pure function of (seed, k): a window of seq bytes starting at
// SplitMix64(seed ^ 0x6461746174726169, k) mod (train_size - seq), where
// SplitMix64(s, k) is output k (0-based) of the SplitMix64 generator seeded
// with s, with targets the next bytes; so the data cursor is one number (the
// next global sample index) and any dp size sees the same global batches.
// Every target lies inside the training split. Validation samples are fixed
// windows of the validation split (sample i starts at train_size +
// (i * 7919) mod (validation_size - seq); 7919 is prime), independent of the
// seed.
//
// Immutable after Load; thread-safe.
#ifndef SHARDLINE_WORKER_TRAIN_DATA_H_
#define SHARDLINE_WORKER_TRAIN_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::worker::train {

class Corpus {
 public:
  // Reads the whole file. Errors: NotFound / PermissionDenied when it cannot
  // be opened (names the path); InvalidArgument when validation_fraction is
  // outside [0, 0.5] or the file is empty.
  static absl::StatusOr<Corpus> Load(const std::string& path, double validation_fraction);
  // The same over bytes in memory (tests). Errors as Load.
  static absl::StatusOr<Corpus> FromBytes(std::string bytes, double validation_fraction);

  int64_t train_size() const;       // bytes in the training split
  int64_t validation_size() const;  // bytes in the validation split

  // Checks that windows of `seq` tokens fit: InvalidArgument naming
  // seq_length and the split sizes unless seq >= 1 and train_size() > seq (and
  // validation_size() > seq when validation_size() > 0).
  absl::Status CheckSequenceLength(int64_t seq) const;

  // tokens[0..seq) and targets[0..seq) (targets[i] = the byte after tokens[i])
  // of training sample `index` (>= 0). Precondition: CheckSequenceLength(seq).
  void TrainSample(uint64_t seed, int64_t index, int64_t seq, int32_t* tokens,
                   int32_t* targets) const;
  // The same for validation sample `index`. Precondition: validation_size() > seq.
  void ValidationSample(int64_t index, int64_t seq, int32_t* tokens, int32_t* targets) const;

 private:
  Corpus(std::string bytes, int64_t train_size);
  std::string bytes_;
  int64_t train_size_ = 0;
};

}  // namespace shardline::worker::train

#endif  // SHARDLINE_WORKER_TRAIN_DATA_H_

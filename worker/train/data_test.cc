#include "worker/train/data.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::worker::train {
namespace {

using ::testing::HasSubstr;

constexpr char kCorpusPath[] = "data/tinyshakespeare.txt";
constexpr int64_t kCorpusBytes = 1115394;

// n pseudo-random bytes (top byte of an LCG): 16-byte windows are unique, so a
// test can find where a sample came from.
std::string Text(int64_t n) {
  std::string s;
  s.reserve(static_cast<size_t>(n));
  uint32_t x = 12345;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    s.push_back(static_cast<char>(x >> 24));
  }
  return s;
}

// The offset of tokens[0..seq) in `bytes`, checking that it is unique.
int64_t Locate(const std::string& bytes, const std::vector<int32_t>& tokens) {
  std::string needle;
  for (int32_t t : tokens) needle.push_back(static_cast<char>(t));
  const size_t first = bytes.find(needle);
  EXPECT_NE(first, std::string::npos);
  EXPECT_EQ(bytes.find(needle, first + 1), std::string::npos) << "window not unique";
  return static_cast<int64_t>(first);
}

TEST(CorpusTest, SplitSizes) {
  absl::StatusOr<Corpus> c = Corpus::FromBytes(Text(1000), 0.1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_size(), 900);
  EXPECT_EQ(c->validation_size(), 100);
  // floor(1003 * 0.1) = 100: the validation split rounds down.
  c = Corpus::FromBytes(Text(1003), 0.1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->validation_size(), 100);
  EXPECT_EQ(c->train_size(), 903);
  c = Corpus::FromBytes(Text(10), 0.0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->train_size(), 10);
  EXPECT_EQ(c->validation_size(), 0);
  c = Corpus::FromBytes(Text(11), 0.5);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->validation_size(), 5);
}

TEST(CorpusTest, BadArguments) {
  for (double f : {-0.01, 0.51, 1.0, std::nan("")}) {
    absl::StatusOr<Corpus> c = Corpus::FromBytes(Text(100), f);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("validation_fraction")) << f;
  }
  absl::StatusOr<Corpus> empty = Corpus::FromBytes("", 0.1);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty"));

  absl::StatusOr<Corpus> missing = Corpus::Load("no/such/dir/corpus.txt", 0.1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no/such/dir/corpus.txt"));

  absl::StatusOr<Corpus> bad = Corpus::Load(kCorpusPath, 0.7);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("validation_fraction"));
}

TEST(CorpusTest, CheckSequenceLength) {
  absl::StatusOr<Corpus> c = Corpus::FromBytes(Text(100), 0.1);  // 90 + 10
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->CheckSequenceLength(9).ok());
  for (int64_t seq : {10, 50, 90, 0, -1}) {
    absl::Status s = c->CheckSequenceLength(seq);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << seq;
    EXPECT_THAT(std::string(s.message()), HasSubstr("seq_length=" + std::to_string(seq)));
    EXPECT_THAT(std::string(s.message()), HasSubstr("train_size=90"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("validation_size=10"));
  }
  // Without a validation split only the training split limits seq.
  c = Corpus::FromBytes(Text(100), 0.0);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->CheckSequenceLength(99).ok());
  EXPECT_FALSE(c->CheckSequenceLength(100).ok());
}

TEST(CorpusTest, TrainSamplesAreShiftedWindowsOfTheTrainingSplit) {
  const std::string bytes = Text(4000);
  absl::StatusOr<Corpus> c = Corpus::FromBytes(bytes, 0.25);  // 3000 + 1000
  ASSERT_TRUE(c.ok());
  constexpr int64_t kSeq = 16;
  std::vector<int32_t> x(kSeq), y(kSeq), x2(kSeq), y2(kSeq);
  std::set<int64_t> starts;
  for (int64_t k = 0; k < 200; ++k) {
    c->TrainSample(99, k, kSeq, x.data(), y.data());
    const int64_t start = Locate(bytes, x);
    EXPECT_GE(start, 0);
    EXPECT_LT(start, 3000 - kSeq);  // the last target is inside the split
    for (int64_t i = 0; i < kSeq; ++i) {
      EXPECT_EQ(x[static_cast<size_t>(i)], static_cast<unsigned char>(bytes[start + i]));
      EXPECT_EQ(y[static_cast<size_t>(i)], static_cast<unsigned char>(bytes[start + i + 1]));
    }
    starts.insert(start);
    // A pure function of (seed, index).
    c->TrainSample(99, k, kSeq, x2.data(), y2.data());
    EXPECT_EQ(x2, x);
    EXPECT_EQ(y2, y);
  }
  // 200 draws from 2984 starts: expect about 193 distinct; require most.
  EXPECT_GT(starts.size(), 180u);

  // Another seed gives other windows (allowing a chance collision or two).
  int same = 0;
  for (int64_t k = 0; k < 50; ++k) {
    c->TrainSample(99, k, kSeq, x.data(), y.data());
    c->TrainSample(100, k, kSeq, x2.data(), y2.data());
    same += x == x2;
  }
  EXPECT_LE(same, 2);
}

TEST(CorpusTest, ValidationSamplesLieInTheValidationTail) {
  const std::string bytes = Text(4000);
  absl::StatusOr<Corpus> c = Corpus::FromBytes(bytes, 0.25);
  ASSERT_TRUE(c.ok());
  constexpr int64_t kSeq = 16;
  std::vector<int32_t> x(kSeq), y(kSeq);
  for (int64_t i = 0; i < 30; ++i) {
    c->ValidationSample(i, kSeq, x.data(), y.data());
    const int64_t start = Locate(bytes, x);
    // start = 3000 + (i * 7919) mod (1000 - 16).
    EXPECT_EQ(start, 3000 + (i * 7919) % 984) << i;
    EXPECT_EQ(y.back(), static_cast<unsigned char>(bytes[start + kSeq]));
  }
  c->ValidationSample(int64_t{1} << 62, kSeq, x.data(), y.data());  // no overflow
  EXPECT_GE(Locate(bytes, x), 3000);
}

TEST(CorpusTest, TinyShakespeare) {
  absl::StatusOr<Corpus> c = Corpus::Load(kCorpusPath, 0.1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_size() + c->validation_size(), kCorpusBytes);
  EXPECT_EQ(c->validation_size(), 111539);  // floor(111,539.4)
  EXPECT_EQ(c->train_size(), 1003855);
  ASSERT_TRUE(c->CheckSequenceLength(256).ok());
  std::vector<int32_t> x(256), y(256);
  c->TrainSample(1234, 0, 256, x.data(), y.data());
  for (size_t i = 0; i + 1 < x.size(); ++i) EXPECT_EQ(y[i], x[i + 1]);

  // Unigram entropy in nats per byte: the loss of a model that knows only
  // byte frequencies, the first plateau of training.
  std::ifstream in(kCorpusPath, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), kCorpusBytes);
  std::array<int64_t, 256> counts{};
  for (char ch : bytes) ++counts[static_cast<unsigned char>(ch)];
  double entropy = 0;
  int distinct = 0;
  for (int64_t n : counts) {
    if (n == 0) continue;
    ++distinct;
    const double p = static_cast<double>(n) / static_cast<double>(bytes.size());
    entropy -= p * std::log(p);
  }
  std::printf("tinyshakespeare: %d distinct bytes, unigram entropy %.4f nats/byte "
              "(uniform over 256: %.4f)\n",
              distinct, entropy, std::log(256.0));
  EXPECT_GT(entropy, 3.2);
  EXPECT_LT(entropy, 3.4);
  EXPECT_EQ(distinct, 65);
}

}  // namespace
}  // namespace shardline::worker::train

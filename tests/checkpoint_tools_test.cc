// `shardctl checkpoint verify --dir` and `consolidate --dir` on a real
// checkpoint: two ranks (dp=2, ZeRO-3, so every tensor is in two pieces in
// two files) of the real trainer save with WriteShard, the reports are merged
// into a manifest.json the way the coordinator commits one, and the shardctl
// binary verifies it, consolidates it into a safetensors file that must hold
// every parameter bit for bit as Trainer::Parameter gives it at tp=1, and
// names the tensor and file once a byte of a shard is flipped.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "plan/model.h"
#include "testing/manifest_test_util.h"
#include "checkpoint/shard_io.h"
#include "worker/checkpoint/trainer_state.h"
#include "worker/train/test_util.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using worker::FromStateSlices;
using worker::train::Trainer;
using worker::train::TrainingOptions;

constexpr int kSteps = 2;

TrainingOptions Options() {
  TrainingOptions o;
  o.model.num_layers = 2;
  o.model.hidden_size = 16;
  o.model.num_heads = 4;
  o.model.vocab_size = 256;
  o.model.seq_length = 16;
  o.parallel.tp = 1;
  o.parallel.pp = 1;
  o.parallel.dp = 2;
  o.parallel.zero_stage = 3;
  o.parallel.micro_batch_size = 2;
  o.parallel.micro_batches = 2;
  o.learning_rate = {.learning_rate = 1e-2, .min_learning_rate = 1e-3, .warmup_steps = 1,
                     .total_steps = 4};
  o.adamw = {.beta1 = 0.9, .beta2 = 0.99, .epsilon = 1e-8, .weight_decay = 0.1};
  return o;
}

struct Result {
  int rc = -1;
  std::string all;  // stdout and stderr
};

Result RunCommand(const std::string& command) {
  Result r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), p)) > 0) r.all.append(buffer.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Shardctl(const std::string& args) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/shardline/client/shardctl/shardctl ", args);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A parsed safetensors file: the header and the data section.
struct SafeTensors {
  nlohmann::json header;
  std::string data;
};

SafeTensors ParseSafeTensors(const std::string& bytes) {
  SafeTensors st;
  EXPECT_GE(bytes.size(), 8u);
  if (bytes.size() < 8) return st;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  EXPECT_EQ(n % 8, 0u) << "header length " << n;
  EXPECT_LE(8 + n, bytes.size());
  st.header = nlohmann::json::parse(bytes.substr(8, n));
  st.data = bytes.substr(8 + n);
  return st;
}

class CheckpointToolsTest : public ::testing::Test {
 protected:
  // One checkpoint for the whole suite: training is the slow part.
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt-step2"));
    parameters_ = new std::map<std::string, std::vector<float>>();
    fs::remove_all(*dir_);
    absl::Mutex mu;
    std::map<int, v1::ReportShardRequest> reports;
    const TrainingOptions options = Options();
    const auto specs = *plan::GptParameters(options.model);
    worker::train::testing::Train(options, kSteps, [&](int rank, Trainer& t) {
      absl::StatusOr<std::vector<Trainer::StateSlice>> slices = t.SaveSlices();
      ASSERT_TRUE(slices.ok()) << slices.status();
      absl::StatusOr<v1::ReportShardRequest> r =
          checkpoint::WriteShard(*dir_, rank, FromStateSlices(*slices));
      ASSERT_TRUE(r.ok()) << r.status();
      // ZeRO-3: every rank of the dp group takes part in the gather.
      std::map<std::string, std::vector<float>> mine;
      for (const plan::ParameterSpec& spec : specs) {
        absl::StatusOr<std::vector<float>> value = t.Parameter(spec.name);
        ASSERT_TRUE(value.ok()) << spec.name << ": " << value.status();
        mine[spec.name] = *std::move(value);
      }
      absl::MutexLock lock(&mu);
      reports[rank] = *std::move(r);
      if (rank == 0) *parameters_ = std::move(mine);
    });
    ASSERT_EQ(reports.size(), 2u);
    ASSERT_EQ(parameters_->size(), specs.size());

    // The coordinator's commit: rank records and every rank's pieces by tensor.
    v1::Manifest m = checkpoint::testing::MergeReports(reports);
    m.set_checkpoint_id("ckpt-step000000000002-gen1");
    m.set_job_id("tools");
    m.set_step(kSteps);
    m.set_generation(1);
    m.set_state(v1::CHECKPOINT_STATE_COMMITTED);
    m.set_directory(*dir_);
    m.set_dp(2);
    m.set_world_size(2);
    m.set_data_cursor(kSteps * 8);
    m.mutable_model()->set_num_layers(options.model.num_layers);
    m.mutable_model()->set_hidden_size(options.model.hidden_size);
    m.mutable_model()->set_num_heads(options.model.num_heads);
    m.mutable_model()->set_vocab_size(options.model.vocab_size);
    m.mutable_model()->set_seq_length(options.model.seq_length);
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(m, &json, print).ok());
    std::ofstream(*dir_ + "/manifest.json") << json;
  }

  static std::string* dir_;
  static std::map<std::string, std::vector<float>>* parameters_;
};

std::string* CheckpointToolsTest::dir_ = nullptr;
std::map<std::string, std::vector<float>>* CheckpointToolsTest::parameters_ = nullptr;

TEST_F(CheckpointToolsTest, VerifyConsolidateAndDetectAFlippedByte) {
  ASSERT_FALSE(HasFatalFailure());
  const std::string& dir = *dir_;
  Result r = RunCommand(Shardctl(absl::StrCat("checkpoint verify --dir ", dir)));
  ASSERT_EQ(r.rc, 0) << r.all;
  const size_t tensors = 3 * parameters_->size();  // weights and both AdamW moments
  EXPECT_THAT(r.all, HasSubstr(absl::StrCat("checkpoint ckpt-step000000000002-gen1 (step 2): OK: ",
                                            tensors, " tensors, 2 files, ")));

  // Weights only, by default: each bit for bit as the trainer holds it.
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/model.safetensors");
  r = RunCommand(Shardctl(absl::StrCat("checkpoint consolidate --dir ", dir, " --out ", out)));
  ASSERT_EQ(r.rc, 0) << r.all;
  EXPECT_THAT(r.all, HasSubstr(absl::StrCat("wrote ", parameters_->size(), " tensors")));
  SafeTensors st = ParseSafeTensors(ReadFile(out));
  ASSERT_TRUE(st.header.contains("__metadata__"));
  const nlohmann::json& meta = st.header["__metadata__"];
  EXPECT_EQ(meta["step"], "2");
  EXPECT_EQ(meta["job_id"], "tools");
  EXPECT_EQ(meta["checkpoint_id"], "ckpt-step000000000002-gen1");
  EXPECT_EQ(meta["hidden_size"], "16");
  EXPECT_EQ(meta["num_layers"], "2");
  EXPECT_EQ(st.header.size(), parameters_->size() + 1);
  const auto specs = *plan::GptParameters(Options().model);
  uint64_t expected_offset = 0;  // sorted by name, back to back
  for (const auto& [name, value] : *parameters_) {
    ASSERT_TRUE(st.header.contains(name)) << name;
    const nlohmann::json& t = st.header[name];
    EXPECT_EQ(t["dtype"], "F32");
    for (const plan::ParameterSpec& spec : specs) {
      if (spec.name == name) EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), spec.shape);
    }
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    EXPECT_EQ(begin, expected_offset) << name;
    ASSERT_EQ(end - begin, value.size() * sizeof(float)) << name;
    ASSERT_LE(end, st.data.size());
    EXPECT_EQ(std::memcmp(st.data.data() + begin, value.data(), end - begin), 0)
        << name << " differs from Trainer::Parameter";
    expected_offset = end;
  }
  EXPECT_EQ(expected_offset, st.data.size());

  // A tiny reader in Python (no numpy): the file loads and the first value of
  // the first tensor matches.
  if (RunCommand("python3 --version").rc == 0) {
    const std::string script =
        "import json,struct,sys\n"
        "b=open(sys.argv[1],'rb').read()\n"
        "n=struct.unpack('<Q',b[:8])[0]\n"
        "h=json.loads(b[8:8+n])\n"
        "meta=h.pop('__metadata__')\n"
        "names=sorted(h)\n"
        "t=h[names[0]]\n"
        "s,e=t['data_offsets']\n"
        "v=struct.unpack('<f',b[8+n+s:8+n+s+4])[0]\n"
        "assert e-s==4*eval('*'.join(map(str,t['shape'])) or '1')\n"
        "print(meta['step'],names[0],repr(v))\n";
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/read.py");
    std::ofstream(path) << script;
    r = RunCommand(absl::StrCat("python3 ", path, " ", out));
    ASSERT_EQ(r.rc, 0) << r.all;
    const auto& [first_name, first_value] = *parameters_->begin();
    EXPECT_THAT(r.all, HasSubstr(absl::StrCat("2 ", first_name, " ")));
    EXPECT_NEAR(std::stod(r.all.substr(r.all.rfind(' ') + 1)), first_value[0],
                1e-6 * std::abs(first_value[0]) + 1e-30);
  }

  // --optimizer adds both moments of every parameter.
  const std::string with_moments = absl::StrCat(std::getenv("TEST_TMPDIR"), "/full.safetensors");
  r = RunCommand(Shardctl(
      absl::StrCat("checkpoint consolidate --dir ", dir, " --out ", with_moments, " --optimizer")));
  ASSERT_EQ(r.rc, 0) << r.all;
  st = ParseSafeTensors(ReadFile(with_moments));
  EXPECT_EQ(st.header.size(), tensors + 1);
  const std::string some = parameters_->begin()->first;
  EXPECT_TRUE(st.header.contains(some + "/exp_avg"));
  EXPECT_TRUE(st.header.contains(some + "/exp_avg_sq"));

  // Usage errors.
  r = RunCommand(Shardctl(absl::StrCat("checkpoint consolidate --dir ", dir)));
  EXPECT_EQ(r.rc, 2) << r.all;
  EXPECT_THAT(r.all, HasSubstr("--out"));
  r = RunCommand(Shardctl(absl::StrCat("checkpoint verify --dir ", dir, "/nope")));
  EXPECT_EQ(r.rc, 2) << r.all;
  EXPECT_THAT(r.all, HasSubstr("manifest.json"));

  // Flip one byte in the middle of rank 1's file: verify and consolidate
  // both fail with DataLoss (exit 1) naming the file; consolidate names the
  // tensor whose piece is corrupt; nothing is left at --out.
  const std::string shard = dir + "/rank-00001.bin";
  std::string bytes = ReadFile(shard);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  r = RunCommand(Shardctl(absl::StrCat("checkpoint verify --dir ", dir)));
  EXPECT_EQ(r.rc, 1) << r.all;
  EXPECT_THAT(r.all, HasSubstr("shardctl checkpoint verify: checkpoint "
                               "ckpt-step000000000002-gen1 (step 2) in "));
  EXPECT_THAT(r.all, HasSubstr("is damaged"));
  EXPECT_THAT(r.all, HasSubstr("rank-00001.bin"));
  const std::string broken = absl::StrCat(std::getenv("TEST_TMPDIR"), "/broken.safetensors");
  r = RunCommand(Shardctl(absl::StrCat("checkpoint consolidate --dir ", dir, " --out ", broken,
                                " --optimizer")));
  EXPECT_EQ(r.rc, 1) << r.all;
  EXPECT_THAT(r.all, HasSubstr("rank-00001.bin"));
  EXPECT_FALSE(fs::exists(broken));
  EXPECT_FALSE(fs::exists(broken + ".tmp"));
}

}  // namespace
}  // namespace shardline

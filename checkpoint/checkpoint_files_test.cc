#include "checkpoint/checkpoint_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::shardline::v1;
using ::testing::HasSubstr;

// A fresh directory under TEST_TMPDIR.
std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/files-", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return fs::path(dir).lexically_normal().string();
}

void WriteBytes(const std::string& path, size_t n) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << std::string(n, 'x');
}

v1::Manifest TwoRankManifest(const std::string& dir) {
  v1::Manifest m;
  m.set_checkpoint_id(fs::path(dir).filename().string());
  m.set_job_id("j");
  m.set_step(10);
  m.set_generation(2);
  m.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  m.set_directory(dir);
  m.set_data_cursor(40);
  for (uint32_t r = 0; r < 2; ++r) {
    v1::RankRecord* rank = m.add_ranks();
    rank->set_rank(r);
    v1::ShardFile* f = rank->add_files();
    f->set_path(absl::StrCat("rank-", r, ".bin"));
    f->set_size_bytes(100 + r);
    f->set_crc32c(7);
  }
  v1::SavedTensor* t = m.add_tensors();
  t->set_name("w");
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_global_shape(3);
  return m;
}

TEST(CheckpointFilesTest, VerifyShardFilesChecksExistenceAndSize) {
  const std::string root = FreshDir("verify");
  const std::string dir = root + "/ckpt-a";
  v1::Manifest m = TwoRankManifest(dir);
  EXPECT_EQ(VerifyShardFiles(m).code(), absl::StatusCode::kDataLoss);
  WriteBytes(dir + "/rank-0.bin", 100);
  absl::Status missing = VerifyShardFiles(m);
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.message(), HasSubstr("rank 1 reported file \"rank-1.bin\""));
  EXPECT_THAT(missing.message(), HasSubstr("does not exist"));
  WriteBytes(dir + "/rank-1.bin", 99);
  absl::Status short_file = VerifyShardFiles(m);
  EXPECT_EQ(short_file.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(short_file.message(), HasSubstr("of 101 bytes, but"));
  WriteBytes(dir + "/rank-1.bin", 101);
  EXPECT_TRUE(VerifyShardFiles(m).ok());
  fs::create_directories(dir + "/sub");
  m.mutable_ranks(1)->mutable_files(0)->set_path("sub");
  EXPECT_THAT(VerifyShardFiles(m).message(), HasSubstr("not a regular file"));
  m.mutable_ranks(1)->mutable_files(0)->set_path("../x");
  EXPECT_EQ(VerifyShardFiles(m).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointFilesTest, ManifestAndLatestRoundTrip) {
  const std::string root = FreshDir("roundtrip");
  const v1::Manifest m = TwoRankManifest(root + "/ckpt-b");  // directory not created yet
  ASSERT_TRUE(WriteManifestFile(root, m).ok());
  absl::StatusOr<v1::Manifest> back = ReadManifestFile(m.directory());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), m.SerializeAsString());
  EXPECT_EQ(ReadLatestFile(root).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteLatestFile(root, "ckpt-b").ok());
  std::ifstream in(root + "/LATEST");
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(raw, "ckpt-b\n");
  ASSERT_TRUE(WriteLatestFile(root, "ckpt-c").ok());
  EXPECT_EQ(*ReadLatestFile(root), "ckpt-c");
  // No temp files left behind.
  for (const auto& e : fs::directory_iterator(root)) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
  }
  EXPECT_EQ(WriteLatestFile(root, "../x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteLatestFile("relative", "x").code(), absl::StatusCode::kInvalidArgument);
  // A manifest naming a directory outside the root is not written.
  v1::Manifest outside = m;
  outside.set_directory(root + "-other/ckpt-b");
  EXPECT_EQ(WriteManifestFile(root, outside).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(root + "-other"));
}

TEST(CheckpointFilesTest, RemoveStaysInsideTheRoot) {
  const std::string base = FreshDir("remove");
  const std::string root = base + "/root";
  const std::string outside = base + "/outside";
  WriteBytes(root + "/ckpt-1/rank-0.bin", 8);
  WriteBytes(outside + "/precious.bin", 8);
  WriteBytes(root + "/keep.txt", 1);

  // Lexically outside, the root itself, nested deeper, with "..".
  for (const std::string& bad :
       {outside, root, root + "/ckpt-1/rank-0.bin-dir/x", root + "/../outside",
        root + "/ckpt-1/..", std::string("relative/ckpt-1"), base + "/root2/ckpt-1"}) {
    absl::Status s = RemoveCheckpointDirectory(root, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
  }
  EXPECT_EQ(RemoveCheckpointDirectory("relative", "relative/x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoveCheckpointDirectory(root + "/..", outside).code(),
            absl::StatusCode::kInvalidArgument);

  // A symlink named like a checkpoint directory, pointing outside.
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/ckpt-link").c_str()), 0);
  absl::Status link = RemoveCheckpointDirectory(root, root + "/ckpt-link");
  EXPECT_EQ(link.code(), absl::StatusCode::kFailedPrecondition) << link;
  // A regular file is not a checkpoint directory.
  EXPECT_EQ(RemoveCheckpointDirectory(root, root + "/keep.txt").code(),
            absl::StatusCode::kFailedPrecondition);
  // A link inside a checkpoint directory is removed, not followed.
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/ckpt-1/escape").c_str()), 0);
  ASSERT_TRUE(RemoveCheckpointDirectory(root, root + "/ckpt-1/").ok());
  EXPECT_FALSE(fs::exists(root + "/ckpt-1"));
  EXPECT_TRUE(fs::exists(outside + "/precious.bin"));
  EXPECT_TRUE(fs::exists(root + "/keep.txt"));
  EXPECT_TRUE(fs::is_symlink(root + "/ckpt-link"));
  // Already gone is fine.
  EXPECT_TRUE(RemoveCheckpointDirectory(root, root + "/ckpt-1").ok());

  // A root reached through a symlink: its checkpoint directories are still
  // removable through the link's path.
  const std::string via = base + "/via";
  ASSERT_EQ(::symlink(root.c_str(), via.c_str()), 0);
  WriteBytes(root + "/ckpt-2/rank-0.bin", 8);
  ASSERT_TRUE(RemoveCheckpointDirectory(via, via + "/ckpt-2").ok());
  EXPECT_FALSE(fs::exists(root + "/ckpt-2"));
  EXPECT_TRUE(fs::exists(outside + "/precious.bin"));
}

}  // namespace
}  // namespace shardline::checkpoint

#include "checkpoint/checkpoint_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
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

  // A job root reached through a symlink is refused (a worker can plant
  // one below the checkpoint directory); a symlinked base above it (the
  // operator's checkpoint directory, e.g. a mounted volume) is followed.
  const std::string via = base + "/via";
  ASSERT_EQ(::symlink(root.c_str(), via.c_str()), 0);
  WriteBytes(root + "/ckpt-2/rank-0.bin", 8);
  absl::Status through = RemoveCheckpointDirectory(via, via + "/ckpt-2");
  EXPECT_EQ(through.code(), absl::StatusCode::kFailedPrecondition) << through;
  EXPECT_THAT(through.message(), HasSubstr("goes through symlink 'via'"));
  EXPECT_TRUE(fs::exists(root + "/ckpt-2/rank-0.bin"));
  const std::string volume = FreshDir("remove-volume");
  ASSERT_EQ(::symlink(base.c_str(), (volume + "/mnt").c_str()), 0);
  bool existed = false;
  ASSERT_TRUE(
      RemoveCheckpointDirectory(volume + "/mnt/root", volume + "/mnt/root/ckpt-2", &existed).ok());
  EXPECT_TRUE(existed);
  EXPECT_FALSE(fs::exists(root + "/ckpt-2"));
  EXPECT_FALSE(fs::exists(root + "/.deleting-ckpt-2"));
  EXPECT_TRUE(fs::exists(outside + "/precious.bin"));
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Issue 14, defect 5, first attack: <dir>/<job_id> -> /victim. Before the
// fix the coordinator overwrote /victim/LATEST, created
// /victim/ckpt-*/manifest.json and deleted /victim/ckpt-*.
TEST(CheckpointFilesTest, SymlinkedJobRootRedirectsNoWrite) {
  const std::string base = FreshDir("attack-root");
  const std::string victim = base + "/victim";
  WriteBytes(victim + "/ckpt-old/rank-0.bin", 8);
  std::ofstream(victim + "/LATEST") << "precious\n";
  fs::create_directories(base + "/dir");
  const std::string root = base + "/dir/job-1";
  ASSERT_EQ(::symlink(victim.c_str(), root.c_str()), 0);

  absl::Status latest = WriteLatestFile(root, "ckpt-new");
  EXPECT_EQ(latest.code(), absl::StatusCode::kFailedPrecondition) << latest;
  EXPECT_THAT(latest.message(), HasSubstr("goes through symlink 'job-1'"));
  v1::Manifest m = TwoRankManifest(root + "/ckpt-new");
  EXPECT_EQ(WriteManifestFile(root, m).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RemoveCheckpointDirectory(root, root + "/ckpt-old").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RemoveLatestFile(root).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadLatestFile(root).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(VerifyShardFiles(m).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CleanUpCheckpointRoot(root, [](const std::string&) { return true; }).status().code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(ReadAll(victim + "/LATEST"), "precious\n");
  EXPECT_FALSE(fs::exists(victim + "/ckpt-new"));
  EXPECT_TRUE(fs::exists(victim + "/ckpt-old/rank-0.bin"));
  EXPECT_TRUE(fs::is_symlink(root));
}

// Issue 14, defect 5, second attack: a shard path through a symlink
// (sub -> /etc, file sub/passwd) passed the commit check (stat follows).
TEST(CheckpointFilesTest, ShardPathThroughSymlinkIsRefused) {
  const std::string base = FreshDir("attack-shard");
  const std::string etc = base + "/etc";
  WriteBytes(etc + "/passwd", 101);
  const std::string dir = base + "/dir/job/ckpt-a";
  WriteBytes(dir + "/rank-0.bin", 100);
  ASSERT_EQ(::symlink(etc.c_str(), (dir + "/sub").c_str()), 0);
  v1::Manifest m = TwoRankManifest(dir);
  m.mutable_ranks(1)->set_rank(3);
  m.mutable_ranks(1)->mutable_files(0)->set_path("sub/passwd");
  absl::Status s = VerifyShardFiles(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("checkpoint path 'sub/passwd' of rank 3 goes through symlink 'sub'; "
                        "shards must be regular files inside " +
                        base + "/dir/job"));
  // A shard file that is itself a symlink.
  ASSERT_EQ(::symlink((etc + "/passwd").c_str(), (dir + "/rank-1.bin").c_str()), 0);
  m.mutable_ranks(1)->mutable_files(0)->set_path("rank-1.bin");
  s = VerifyShardFiles(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("goes through symlink 'rank-1.bin'"));
  // The checkpoint directory itself a symlink to a look-alike.
  const std::string elsewhere = base + "/elsewhere";
  WriteBytes(elsewhere + "/rank-0.bin", 100);
  WriteBytes(elsewhere + "/rank-1.bin", 101);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (base + "/dir/job/ckpt-b").c_str()), 0);
  v1::Manifest b = TwoRankManifest(base + "/dir/job/ckpt-b");
  s = VerifyShardFiles(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("goes through symlink 'ckpt-b'"));
  EXPECT_EQ(ReadManifestFile(base + "/dir/job", base + "/dir/job/ckpt-b").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Issue 14, defect 9: what a crash during retention or a LATEST write
// leaves behind is removed at start; known checkpoints stay.
TEST(CheckpointFilesTest, CleanUpRemovesTombstonesTempFilesAndOrphans) {
  const std::string root = FreshDir("cleanup") + "/job";
  WriteBytes(root + "/.deleting-ckpt-1/rank-0.bin", 8);   // crash while deleting
  WriteBytes(root + "/.LATEST.tmp-123-0", 7);             // crash while moving LATEST
  WriteBytes(root + "/ckpt-2/manifest.json", 10);         // crash before the directory went
  WriteBytes(root + "/ckpt-3/manifest.json", 10);         // known
  WriteBytes(root + "/ckpt-3/.manifest.json.tmp-9-1", 3);  // crash while writing manifest.json
  WriteBytes(root + "/LATEST", 7);
  absl::StatusOr<std::vector<std::string>> removed =
      CleanUpCheckpointRoot(root, [](const std::string& name) { return name == "ckpt-2"; });
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ::testing::UnorderedElementsAre(".deleting-ckpt-1", ".LATEST.tmp-123-0",
                                                        "ckpt-2",
                                                        "ckpt-3/.manifest.json.tmp-9-1"));
  EXPECT_FALSE(fs::exists(root + "/.deleting-ckpt-1"));
  EXPECT_FALSE(fs::exists(root + "/.LATEST.tmp-123-0"));
  EXPECT_FALSE(fs::exists(root + "/ckpt-2"));
  EXPECT_TRUE(fs::exists(root + "/ckpt-3/manifest.json"));
  EXPECT_FALSE(fs::exists(root + "/ckpt-3/.manifest.json.tmp-9-1"));
  EXPECT_TRUE(fs::exists(root + "/LATEST"));
  // A missing root is nothing to clean.
  absl::StatusOr<std::vector<std::string>> none =
      CleanUpCheckpointRoot(root + "-none", [](const std::string&) { return true; });
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace shardline::checkpoint

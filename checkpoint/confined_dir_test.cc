#include "checkpoint/confined_dir.h"

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
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/confined-", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return fs::path(dir).lexically_normal().string();
}

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ConfinedDirTest, OpensReadsAndWritesBelowWithoutLinks) {
  const std::string base = FreshDir("plain");
  absl::StatusOr<ConfinedDir> root = ConfinedDir::Open(base, "job/ckpt-1", /*create=*/true);
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->path(), base + "/job/ckpt-1");
  ASSERT_TRUE(root->WriteFileAtomically("manifest.json", "{}").ok());
  EXPECT_EQ(Read(base + "/job/ckpt-1/manifest.json"), "{}");
  Write(base + "/job/ckpt-1/sub/rank-0.bin", "12345");
  absl::StatusOr<ConfinedDir::File> f = root->OpenFile("sub/rank-0.bin");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 5u);
  EXPECT_EQ(*root->ReadFile("sub//rank-0.bin"), "12345");
  EXPECT_EQ(root->ReadFile("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(root->OpenFile("../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root->OpenFile("/etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root->OpenFile("sub").status().code(), absl::StatusCode::kFailedPrecondition);
  // No temp file is left by the atomic write.
  absl::StatusOr<std::vector<ConfinedDir::Entry>> entries = root->List();
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 2u);  // manifest.json, sub
}

TEST(ConfinedDirTest, RefusesEverySymlinkOnTheWay) {
  const std::string base = FreshDir("links");
  const std::string victim = base + "/victim";
  Write(victim + "/secret", "s");
  fs::create_directories(base + "/dir/job");
  ASSERT_EQ(::symlink(victim.c_str(), (base + "/dir/linked").c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), (base + "/dir/job/sub").c_str()), 0);
  ASSERT_EQ(::symlink((victim + "/secret").c_str(), (base + "/dir/job/file").c_str()), 0);

  // A symlinked directory below the base.
  absl::StatusOr<ConfinedDir> linked = ConfinedDir::Open(base + "/dir", "linked", true);
  EXPECT_EQ(linked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(linked.status().message(), HasSubstr("goes through symlink 'linked'"));
  absl::StatusOr<ConfinedDir> job = ConfinedDir::Open(base + "/dir", "job");
  ASSERT_TRUE(job.ok()) << job.status();
  // A file through a symlinked directory, and a symlinked file.
  std::string symlink;
  absl::StatusOr<ConfinedDir::File> through = job->OpenFile("sub/secret", &symlink);
  EXPECT_EQ(through.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(symlink, "sub");
  symlink.clear();
  EXPECT_EQ(job->OpenFile("file", &symlink).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(symlink, "file");
  EXPECT_EQ(job->Sub("sub", /*create=*/true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*job->TypeOf("sub"), ConfinedDir::Type::kSymlink);

  // Writing over a symlink replaces the link, never the target.
  ASSERT_TRUE(job->WriteFileAtomically("file", "new").ok());
  EXPECT_EQ(Read(victim + "/secret"), "s");
  EXPECT_FALSE(fs::is_symlink(base + "/dir/job/file"));
  // Removing a link or a tree holding one never touches the target.
  ASSERT_EQ(::symlink(victim.c_str(), (base + "/dir/job/tree-link").c_str()), 0);
  Write(base + "/dir/job/tree/a/b", "x");
  ASSERT_EQ(::symlink(victim.c_str(), (base + "/dir/job/tree/a/escape").c_str()), 0);
  ASSERT_TRUE(job->Remove("tree").ok());
  ASSERT_TRUE(job->Remove("tree-link").ok());
  ASSERT_TRUE(job->Remove("sub").ok());
  EXPECT_FALSE(fs::exists(base + "/dir/job/tree"));
  EXPECT_FALSE(fs::is_symlink(base + "/dir/job/sub"));
  EXPECT_EQ(Read(victim + "/secret"), "s");
  EXPECT_TRUE(job->Remove("gone").ok());
  // Rename within the directory.
  ASSERT_TRUE(job->Rename("file", "file2").ok());
  EXPECT_EQ(Read(base + "/dir/job/file2"), "new");
}

}  // namespace
}  // namespace shardline::checkpoint

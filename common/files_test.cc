#include "common/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(t != nullptr ? t : "/tmp") + "/files_test-" +
                    std::to_string(::getpid()) + "-" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(dir);
  return dir;
}

TEST(FileErrorTest, CodeFollowsErrnoAndMessageNamesPathAndErrno) {
  const absl::Status missing = FileError(ENOENT, "cannot open", "a/b");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "cannot open 'a/b': No such file or directory (errno 2)");
  EXPECT_EQ(FileError(EACCES, "x", "p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(FileError(ENOSPC, "x", "p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FileError(EIO, "x", "p").code(), absl::StatusCode::kUnavailable);
}

TEST(WriteFileAtomicallyTest, CreatesDirectoriesReplacesAndLeavesNoTempFile) {
  const std::string dir = TempDir() + "/a/b";
  ASSERT_TRUE(WriteFileAtomically(dir, "LATEST", "one\n").ok());
  ASSERT_TRUE(WriteFileAtomically(dir, "LATEST", "two\n", 0600).ok());
  absl::StatusOr<std::string> read = ReadFileToString(dir + "/LATEST");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "two\n");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "LATEST");
  }
  EXPECT_EQ(entries, 1);
  struct stat st;
  ASSERT_EQ(::stat((dir + "/LATEST").c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0600u & ~mask);
}

TEST(WriteFileAtomicallyTest, FailureNamesTheDirectory) {
  const std::string dir = TempDir();
  fs::create_directories(dir);
  ASSERT_TRUE(WriteFileAtomically(dir, "file", "x").ok());
  // A directory that is a regular file cannot be created.
  const absl::Status s = WriteFileAtomically(dir + "/file/sub", "LATEST", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir + "/file/sub"));
}

TEST(ReadFileToStringTest, MissingFileIsNotFound) {
  const absl::StatusOr<std::string> r = ReadFileToString(TempDir() + "/none");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("no file"));
}

TEST(FsyncDirectoryTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(FsyncDirectory(TempDir() + "/none").code(), absl::StatusCode::kNotFound);
  const std::string dir = TempDir();
  fs::create_directories(dir);
  EXPECT_TRUE(FsyncDirectory(dir).ok());
}

}  // namespace
}  // namespace shardline

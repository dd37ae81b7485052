// A rank living in a fork()ed child process is SIGKILLed while the other
// ranks (threads of this process) are inside a collective with it: they must
// fail with Unavailable naming the dead rank, well before the op timeout
// (over TCP the closed connection tells them; in shared memory the dead
// process, through its pidfd).
//
// The ranks bootstrap through a test-only file-backed Store (the in-memory
// store cannot cross fork()). The child is forked before this process starts
// any thread.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

// Keys are files in `dir` (hex-encoded names), written atomically by
// rename(); readers poll. Add is not needed by Gloo's rendezvous.
class FileStore : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key);
    const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f << value;
      if (!f) return absl::UnavailableError("write " + tmp);
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) return absl::UnavailableError("rename " + tmp);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      std::ifstream f(Path(key), std::ios::binary);
      if (f) {
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
      }
      if (absl::Now() > deadline) return absl::DeadlineExceededError("key " + key);
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  absl::StatusOr<int64_t> Add(const std::string&, int64_t) override {
    return absl::UnimplementedError("FileStore::Add");
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    for (const auto& k : keys) {
      auto v = Get(k, timeout);
      if (!v.ok()) return v.status();
    }
    return absl::OkStatus();
  }

 private:
  std::string Path(const std::string& key) const {
    return absl::StrCat(dir_, "/", absl::BytesToHexString(key));
  }
  std::string dir_;
};

TEST(GlooPeerDeathTest, SigkilledPeerIsUnavailableNamingItsRank) {
  char tmpl[] = "/tmp/shardline_filestore_XXXXXX";
  const char* base = getenv("TEST_TMPDIR");
  std::string dir_template = base ? absl::StrCat(base, "/fsXXXXXX") : tmpl;
  std::vector<char> buf(dir_template.begin(), dir_template.end());
  buf.push_back('\0');
  ASSERT_NE(mkdtemp(buf.data()), nullptr);
  const std::string dir = buf.data();
  constexpr int kSize = 3, kVictim = 1;
  GlooOptions options = testing::TestOptions(absl::Seconds(60));

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 1: connect, then stay silent inside nothing until killed.
    auto backend = CreateGlooBackend(std::make_shared<FileStore>(dir), kVictim, kSize, options);
    if (!backend.ok()) _exit(3);
    for (;;) pause();
  }

  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kSize);
  std::vector<absl::Duration> took(kSize);
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      auto backend = CreateGlooBackend(std::make_shared<FileStore>(dir), r, kSize, options);
      if (!backend.ok()) {
        results[r] = backend.status();
        return;
      }
      std::vector<float> data(1 << 16, 1.0f);
      auto work = (*backend)->AllReduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
      const absl::Time start = absl::Now();
      results[r] = work->Wait(absl::Seconds(90));
      took[r] = absl::Now() - start;
    });
  }
  // Let the survivors connect and block in the all_reduce, then kill rank 1.
  absl::SleepFor(absl::Seconds(1));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus)) << "child exited early with " << WEXITSTATUS(wstatus);
  for (auto& t : threads) t.join();
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kUnavailable)
        << "rank " << r << ": " << results[r];
    EXPECT_NE(results[r].message().find("lost peer rank 1"), std::string::npos)
        << "rank " << r << ": " << results[r];
    EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardline::worker

// A rank living in a fork()ed child process is SIGKILLed while the other
// ranks (threads of this process) are inside a collective with it: they must
// fail with Unavailable naming the dead rank, well before the op timeout
// (over TCP the closed connection tells them; in shared memory the dead
// process, through its pidfd).
//
// The ranks bootstrap through the test-only file-backed Store (the in-memory
// store cannot cross fork()). The child is forked before this process starts
// any thread.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

using ::shardline::worker::testing::FileStore;
using ::shardline::worker::testing::TempDir;

TEST(GlooPeerDeathTest, SigkilledPeerIsUnavailableNamingItsRank) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
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

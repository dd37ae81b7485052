// Shared memory with ranks in separate processes: a rank in a fork()ed child
// is SIGKILLed while the others (threads of this process) run collectives
// with it, in a group on one host and in a group over two (simulated) hosts;
// every survivor fails with Unavailable naming the dead rank (a killed
// process cannot close a socket or say goodbye in the segment: its pidfd
// tells), and no segment name is left in /dev/shm. A segment whose creator
// was killed before it unlinked the name (during bootstrap) is removed by
// the next group created on this host.
//
// The ranks bootstrap through the test-only file-backed Store. Each child is
// forked before the test starts any thread.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/shm_segment.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"

namespace shardline::worker {
namespace {

using ::shardline::worker::testing::FileStore;
using ::shardline::worker::testing::TempDir;

// Names in /dev/shm of segments created by process `pid` (any namespace).
std::vector<std::string> SegmentsOf(pid_t pid) {
  std::vector<std::string> out;
  struct stat st;
  if (::stat("/proc/self/ns/pid", &st) != 0) return out;
  const std::string prefix = absl::StrCat("shardline-", st.st_ino, "-", pid, "-");
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (struct dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

GlooOptions Options(const std::string& host) {
  GlooOptions o;
  o.timeout = absl::Seconds(60);
  o.connect_timeout = absl::Seconds(30);
  o.host = host;
  return o;
}

// Ranks 0..size-1 with hosts `host_of`; rank `victim` runs in a child
// process that all_reduces until it is SIGKILLed; the others, threads here,
// all_reduce until their first failure, which must be Unavailable naming
// the victim.
void KillOneRankMidCollective(const std::vector<std::string>& host_of, int victim) {
  // As every Shardline program does: a write to the dead peer's socket
  // fails with EPIPE instead of killing this process.
  std::signal(SIGPIPE, SIG_IGN);
  const int size = static_cast<int>(host_of.size());
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  constexpr size_t kCount = size_t{1} << 20;  // 4 MiB: several chunks per call
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto backend =
        CreateGlooBackend(std::make_shared<FileStore>(dir), victim, size, Options(host_of[victim]));
    if (!backend.ok()) _exit(3);
    if (!(*backend)->Transport().shared_memory) _exit(4);
    std::vector<float> data(kCount, 1.0f);
    for (;;) {
      if (!(*backend)->AllReduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum)->Wait().ok())
        _exit(5);
    }
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(size);
  std::vector<int> completed(size, 0);
  std::atomic<int> connected{0}, failed{0};
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    threads.emplace_back([&, r] {
      auto backend =
          CreateGlooBackend(std::make_shared<FileStore>(dir), r, size, Options(host_of[r]));
      if (!backend.ok()) {
        results[r] = backend.status();
        ++connected;
        ++failed;
        return;
      }
      ++connected;
      std::vector<float> data(kCount, 1.0f);
      for (;;) {
        absl::Status s = (*backend)
                             ->AllReduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum)
                             ->Wait(absl::Seconds(120));
        if (!s.ok()) {
          results[r] = s;
          break;
        }
        ++completed[r];
      }
      // Keep this backend until every survivor has failed (see RunRanks).
      ++failed;
      while (failed.load() < size - 1) absl::SleepFor(absl::Milliseconds(5));
    });
  }
  // Let the group connect and run a few collectives, then kill the victim.
  while (connected.load() < size - 1) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus)) << "child exited early with " << WEXITSTATUS(wstatus);
  for (auto& t : threads) t.join();
  const std::string name = absl::StrCat("lost peer rank ", victim);
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(results[r].code(), absl::StatusCode::kUnavailable)
        << "rank " << r << " (after " << completed[r] << " all_reduces): " << results[r];
    const std::string msg(results[r].message());
    std::cout << "rank " << r << ": " << results[r] << "\n";
    EXPECT_TRUE(absl::StrContains(msg, name + ":") || absl::StrContains(msg, name + ")"))
        << "rank " << r << ": " << msg;
  }
  // Names were unlinked at bootstrap: nothing of either process is left.
  EXPECT_THAT(SegmentsOf(child), ::testing::IsEmpty());
  EXPECT_THAT(SegmentsOf(getpid()), ::testing::IsEmpty());
}

TEST(ShmPeerDeathTest, SigkilledRankOnThisHostIsUnavailableNamingIt) {
  KillOneRankMidCollective({"H", "H", "H"}, 1);
}

TEST(ShmPeerDeathTest, SigkilledHostLeaderOfAGroupOverTwoHosts) {
  // Host B is ranks 2 (its leader, killed) and 3; host A ranks 0 and 1.
  KillOneRankMidCollective({"A", "A", "B", "B"}, 2);
}

TEST(ShmPeerDeathTest, SigkilledRankBehindItsHostLeader) {
  KillOneRankMidCollective({"A", "A", "B", "B"}, 1);
}

TEST(ShmPeerDeathTest, SegmentOfACreatorKilledDuringBootstrapIsRemovedByTheNext) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // As a host leader between creating its segment and the other ranks
    // mapping it: the name exists, nobody will unlink it.
    close(ready[0]);
    auto seg = shm::Segment::Create(shm::SegmentName("killed", 7), 2, 4096, 7);
    const char byte = seg.ok() ? 1 : 0;
    if (write(ready[1], &byte, 1) != 1) _exit(3);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  ASSERT_EQ(byte, 1) << "the child could not create its segment";
  ASSERT_EQ(SegmentsOf(child).size(), 1u);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_EQ(SegmentsOf(child).size(), 1u);  // leaked, for now
  // The next group on this host (its leader creates a segment) removes it.
  testing::RunRanks(2, [](int, Backend& b) {
    EXPECT_TRUE(b.Transport().shared_memory);
    SL_EXPECT_OK_WORK(b.Barrier());
  }, Options(""));
  EXPECT_THAT(SegmentsOf(child), ::testing::IsEmpty());
  // A running creator's segment is never removed.
  const std::string mine = shm::SegmentName("alive", 8);
  auto seg = shm::Segment::Create(mine, 2, 4096, 8);
  ASSERT_TRUE(seg.ok()) << seg.status();
  shm::ReapStaleSegments();
  EXPECT_TRUE(shm::Segment::Open(mine, 2, 4096, 8).ok());
  EXPECT_TRUE(shm::Segment::Unlink(mine).ok());
}

}  // namespace
}  // namespace shardline::worker

// Test helpers: run N ranks as threads, each with a real Gloo backend (over
// shared memory, or loopback TCP: TestsUseTcp), bootstrapped through one
// shared in-memory store.
#ifndef SHARDLINE_WORKER_COMM_TEST_UTIL_H_
#define SHARDLINE_WORKER_COMM_TEST_UTIL_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"

namespace shardline::worker::testing {

// The transport the multi-rank tests run on: shared memory (every rank is
// on this host), unless the test binary runs with
// SHARDLINE_TEST_TRANSPORT=tcp (the *_tcp_test targets in BUILD), which
// turns it off so that the same tests cover Gloo over TCP.
inline bool TestsUseTcp() {
  const char* t = std::getenv("SHARDLINE_TEST_TRANSPORT");
  return t != nullptr && std::string(t) == "tcp";
}

inline GlooOptions TestOptions(absl::Duration timeout = absl::Seconds(30)) {
  GlooOptions o;
  o.timeout = timeout;
  o.connect_timeout = absl::Seconds(30);
  if (TestsUseTcp()) o.shared_memory = GlooOptions::SharedMemory::kOff;
  return o;
}

// Runs fn(rank, backend) on `size` threads. Each thread first creates its
// backend on `store` (a fresh in-memory store when null). No backend is
// destroyed before every rank's fn has returned: destroying one closes its
// sockets, and a close with bytes still unread sends a TCP reset that makes
// the peer drop data it has not read yet (a rank whose part of a collective
// ended early, e.g. an empty reduce_scatter piece, then broke a slower
// peer's read: "Connection reset by peer"), as a job ends its collectives
// before it tears its communicators down.
// `after_destroy(rank)` (optional) runs on the rank's thread once its backend
// is destroyed; a test that gives it watches destruction itself, so its
// ranks destroy their backends as soon as their fn returns (no waiting).
inline void RunRanks(int size, const std::function<void(int, Backend&)>& fn,
                     GlooOptions options = TestOptions(), std::shared_ptr<Store> store = nullptr,
                     const std::function<void(int)>& after_destroy = nullptr) {
  if (store == nullptr) store = NewInMemoryStore();
  absl::Mutex mu;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      {
        auto backend = CreateGlooBackend(store, r, size, options);
        if (backend.ok()) fn(r, **backend);
        absl::MutexLock lock(&mu);
        ++finished;
        auto all_finished = [&finished, size] { return finished >= size; };
        if (!after_destroy) mu.Await(absl::Condition(&all_finished));
        ASSERT_TRUE(backend.ok()) << "rank " << r << ": " << backend.status();
      }
      if (after_destroy) after_destroy(r);
    });
  }
  for (auto& t : threads) t.join();
}

// A Store whose keys are files in `dir` (hex-encoded names), written
// atomically by rename(); readers poll. For ranks in fork()ed processes (the
// in-memory store cannot cross fork()). Add is not implemented (Gloo's
// rendezvous does not need it).
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

// A fresh directory under TEST_TMPDIR (else /tmp); "" if it cannot be made.
inline std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(base != nullptr ? base : "/tmp", "/shardline_XXXXXX");
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

// Waits (bounded) and asserts success.
#define SL_EXPECT_OK_WORK(work)                \
  do {                                         \
    auto _s = (work)->Wait(absl::Seconds(60)); \
    EXPECT_TRUE(_s.ok()) << _s;                \
  } while (0)

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_WORKER_COMM_TEST_UTIL_H_

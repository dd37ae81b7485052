#include "server/state_store.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

MATCHER_P2(IsRecord, key, value, "") { return arg.key == key && arg.value == value; }

// A fresh path under the test's temp dir, unique within this process.
std::string NewDbPath() {
  static std::atomic<int> counter{0};
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = absl::StrCat(info->test_suite_name(), "_", info->name());
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return absl::StrCat(::testing::TempDir(), "/", name, "_", getpid(), "_", counter++, ".db");
}

std::unique_ptr<StateStore> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

std::vector<Record> ScanOrDie(const StateStore& store, absl::string_view kind) {
  absl::StatusOr<std::vector<Record>> records = store.Scan(kind);
  EXPECT_TRUE(records.ok()) << records.status();
  return records.ok() ? *std::move(records) : std::vector<Record>{};
}

// Runs `sql` on a raw SQLite connection (to set up foreign or tampered files).
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// ---------------------------------------------------------------------------
// Behaviour both implementations share.

struct StoreFactory {
  std::string name;
  // Opens a store; `path` is a fresh file path (ignored by the memory store).
  std::function<std::unique_ptr<StateStore>(const std::string& path)> open;
  bool durable;
};

class StateStoreTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override {
    path_ = NewDbPath();
    store_ = GetParam().open(path_);
    ASSERT_NE(store_, nullptr);
  }

  std::string path_;
  std::unique_ptr<StateStore> store_;
};

TEST_P(StateStoreTest, EmptyStoreScansEmpty) {
  EXPECT_THAT(ScanOrDie(*store_, "job"), IsEmpty());
}

TEST_P(StateStoreTest, PutGetOverwriteDelete) {
  ASSERT_TRUE(store_->Write({Mutation::Put("job", "j1", "v1")}).ok());
  EXPECT_THAT(ScanOrDie(*store_, "job"), ElementsAre(IsRecord("j1", "v1")));

  ASSERT_TRUE(store_->Write({Mutation::Put("job", "j1", "v2")}).ok());
  std::vector<Record> jobs = ScanOrDie(*store_, "job");
  ASSERT_THAT(jobs, ElementsAre(IsRecord("j1", "v2")));
  EXPECT_EQ(jobs[0].kind, "job");

  ASSERT_TRUE(store_->Write({Mutation::Delete("job", "j1")}).ok());
  EXPECT_THAT(ScanOrDie(*store_, "job"), IsEmpty());

  // Deleting a missing key (and a missing kind) is OK.
  EXPECT_TRUE(store_->Write({Mutation::Delete("job", "j1")}).ok());
  EXPECT_TRUE(store_->Write({Mutation::Delete("nokind", "x")}).ok());
  // An empty batch is a no-op.
  EXPECT_TRUE(store_->Write({}).ok());
}

TEST_P(StateStoreTest, KindsAreSeparate) {
  ASSERT_TRUE(store_
                  ->Write({Mutation::Put("job", "k", "job-value"),
                           Mutation::Put("member", "k", "member-value"),
                           Mutation::Put("jobs", "k", "jobs-value")})
                  .ok());
  EXPECT_THAT(ScanOrDie(*store_, "job"), ElementsAre(IsRecord("k", "job-value")));
  EXPECT_THAT(ScanOrDie(*store_, "member"), ElementsAre(IsRecord("k", "member-value")));
  EXPECT_THAT(ScanOrDie(*store_, "jobs"), ElementsAre(IsRecord("k", "jobs-value")));
  EXPECT_THAT(ScanOrDie(*store_, "jo"), IsEmpty());
  ASSERT_TRUE(store_->Write({Mutation::Delete("member", "k")}).ok());
  EXPECT_THAT(ScanOrDie(*store_, "job"), ElementsAre(IsRecord("k", "job-value")));
  EXPECT_THAT(ScanOrDie(*store_, "member"), IsEmpty());
}

TEST_P(StateStoreTest, ScanIsOrderedBytewise) {
  // Inserted out of order; includes uppercase (< lowercase), a prefix, an
  // embedded NUL and a byte >= 0x80 (must sort last, i.e. unsigned).
  const std::string nul_key("a\0b", 3);
  ASSERT_TRUE(store_
                  ->Write({Mutation::Put("k", "b", "2"), Mutation::Put("k", "\xff", "5"),
                           Mutation::Put("k", "ab", "4"), Mutation::Put("k", nul_key, "3"),
                           Mutation::Put("k", "a", "1"), Mutation::Put("k", "B", "0")})
                  .ok());
  EXPECT_THAT(ScanOrDie(*store_, "k"),
              ElementsAre(IsRecord("B", "0"), IsRecord("a", "1"), IsRecord(nul_key, "3"),
                          IsRecord("ab", "4"), IsRecord("b", "2"), IsRecord("\xff", "5")));
}

TEST_P(StateStoreTest, MutationsApplyInOrderWithinABatch) {
  ASSERT_TRUE(store_
                  ->Write({Mutation::Put("k", "x", "first"), Mutation::Put("k", "x", "second"),
                           Mutation::Put("k", "y", "gone"), Mutation::Delete("k", "y"),
                           Mutation::Delete("k", "z"), Mutation::Put("k", "z", "back")})
                  .ok());
  EXPECT_THAT(ScanOrDie(*store_, "k"), ElementsAre(IsRecord("x", "second"), IsRecord("z", "back")));
}

TEST_P(StateStoreTest, InvalidMutationAppliesNothing) {
  ASSERT_TRUE(store_->Write({Mutation::Put("job", "keep", "old")}).ok());

  absl::Status s = store_->Write({Mutation::Put("job", "new", "v"),
                                  Mutation::Put("job", "keep", "overwritten"),
                                  Mutation::Delete("job", "keep"), Mutation::Put("job", "", "x")});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("mutation 3"));
  EXPECT_THAT(s.message(), HasSubstr("empty key"));

  s = store_->Write({Mutation::Put("job", "new", "v"), Mutation::Delete("", "keep")});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("empty kind"));

  EXPECT_THAT(ScanOrDie(*store_, "job"), ElementsAre(IsRecord("keep", "old")));
  EXPECT_THAT(ScanOrDie(*store_, ""), IsEmpty());
}

TEST_P(StateStoreTest, BinaryAndLargeValuesRoundTrip) {
  const std::string with_nuls("\0a\0\0b\xff\x80\0", 8);
  std::string mib(1 << 20, '\0');
  for (size_t i = 0; i < mib.size(); ++i) mib[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  ASSERT_TRUE(store_
                  ->Write({Mutation::Put("blob", "empty", ""), Mutation::Put("blob", "mib", mib),
                           Mutation::Put("blob", "nuls", with_nuls)})
                  .ok());
  std::vector<Record> got = ScanOrDie(*store_, "blob");
  ASSERT_THAT(got, SizeIs(3));
  EXPECT_EQ(got[0].key, "empty");
  EXPECT_EQ(got[0].value, "");
  EXPECT_EQ(got[1].key, "mib");
  EXPECT_EQ(got[1].value.size(), mib.size());
  EXPECT_TRUE(got[1].value == mib) << "1 MiB value differs";
  EXPECT_EQ(got[2].key, "nuls");
  EXPECT_EQ(got[2].value, with_nuls);
}

TEST_P(StateStoreTest, ConcurrentWritersAllLand) {
  constexpr int kThreads = 8;
  constexpr int kWritesPerThread = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWritesPerThread; ++i) {
        absl::Status s = store_->Write(
            {Mutation::Put("w", absl::StrFormat("t%02d/%04d", t, i), absl::StrCat(t * 10000 + i)),
             Mutation::Put("last", absl::StrFormat("t%02d", t), absl::StrCat(i))});
        if (!s.ok()) {
          ADD_FAILURE() << s;
          ++failures;
        }
        // Readers interleave with writers and always see whole batches.
        if (i % 10 == 0 && !store_->Scan("last").ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);

  std::vector<Record> all = ScanOrDie(*store_, "w");
  ASSERT_THAT(all, SizeIs(kThreads * kWritesPerThread));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kWritesPerThread; ++i) {
      const Record& r = all[t * kWritesPerThread + i];
      EXPECT_EQ(r.key, absl::StrFormat("t%02d/%04d", t, i));
      EXPECT_EQ(r.value, absl::StrCat(t * 10000 + i));
    }
  }
  std::vector<Record> last = ScanOrDie(*store_, "last");
  ASSERT_THAT(last, SizeIs(kThreads));
  for (const Record& r : last) EXPECT_EQ(r.value, absl::StrCat(kWritesPerThread - 1));
}

INSTANTIATE_TEST_SUITE_P(
    Stores, StateStoreTest,
    ::testing::Values(
        StoreFactory{"Memory", [](const std::string&) { return NewMemoryStore(); }, false},
        StoreFactory{"Sqlite", [](const std::string& path) { return OpenOrDie(path); }, true}),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// SQLite only: persistence, foreign files, errors, crashes.

TEST(SqliteStoreTest, ReopenSeesEverything) {
  const std::string path = NewDbPath();
  const std::string big(300 * 1024, 'z');
  {
    std::unique_ptr<StateStore> store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store
                    ->Write({Mutation::Put("job", "j1", "a"), Mutation::Put("job", "j2", big),
                             Mutation::Put("member", "m1", std::string("x\0y", 3))})
                    .ok());
    ASSERT_TRUE(store->Write({Mutation::Delete("job", "j1"), Mutation::Put("job", "j3", "c")}).ok());
  }
  std::unique_ptr<StateStore> store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(ScanOrDie(*store, "job"), ElementsAre(IsRecord("j2", big), IsRecord("j3", "c")));
  EXPECT_THAT(ScanOrDie(*store, "member"), ElementsAre(IsRecord("m1", std::string("x\0y", 3))));
  // And it is still writable.
  EXPECT_TRUE(store->Write({Mutation::Put("job", "j4", "d")}).ok());
}

TEST(SqliteStoreTest, UsesWalAndOurSchema) {
  const std::string path = NewDbPath();
  ASSERT_NE(OpenOrDie(path), nullptr);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  auto one_text = [db](const char* sql) {
    sqlite3_stmt* stmt = nullptr;
    std::string out = "<error>";
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
    return out;
  };
  EXPECT_EQ(one_text("PRAGMA journal_mode"), "wal");  // persistent in the file
  EXPECT_EQ(one_text("SELECT value FROM meta WHERE name = 'format'"), "shardline-state/1");
  EXPECT_EQ(one_text("SELECT group_concat(name, ',') FROM "
                     "(SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name)"),
            "meta,records");
  sqlite3_close(db);
}

TEST(SqliteStoreTest, GarbageFileIsDataLoss) {
  const std::string path = NewDbPath();
  {
    std::ofstream f(path, std::ios::binary);
    for (int i = 0; i < 200; ++i) f << "this is not a database, it is line " << i << "\n";
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

// A refused file that is not an SQLite database (text, or empty) keeps its
// mode: only a state file is made private (0600).
TEST(SqliteStoreTest, RefusedNonDatabaseFilesKeepTheirMode) {
  for (const std::string& content : {std::string(), std::string("hello, not a database\n")}) {
    const std::string path = NewDbPath();
    {
      std::ofstream f(path, std::ios::binary);
      f << content;
    }
    ASSERT_EQ(chmod(path.c_str(), 0644), 0);
    absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0644u) << "content '" << content << "'";
  }
}

TEST(SqliteStoreTest, TruncatedDatabaseIsDataLoss) {
  const std::string path = NewDbPath();
  {
    std::unique_ptr<StateStore> store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Write({Mutation::Put("job", "j1", std::string(20000, 'x'))}).ok());
  }  // closing checkpoints the WAL into the main file and removes the WAL
  // Cut the file inside its first page (the schema page).
  ASSERT_EQ(truncate(path.c_str(), 1000), 0);
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(SqliteStoreTest, ForeignSqliteDatabaseIsDataLoss) {
  const std::string path = NewDbPath();
  RawExec(path, "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT);"
                "INSERT INTO users(name) VALUES('alice');");
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  EXPECT_THAT(store.status().message(), HasSubstr("not a Shardline state database"));

  // The foreign file was not modified (no tables added).
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master", -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(stmt, 0), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST(SqliteStoreTest, WrongFormatMarkerIsDataLoss) {
  const std::string path = NewDbPath();
  ASSERT_NE(OpenOrDie(path), nullptr);
  RawExec(path, "UPDATE meta SET value = 'shardline-state/99' WHERE name = 'format'");
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("shardline-state/99"));

  RawExec(path, "DELETE FROM meta");
  store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("format marker"));
}

TEST(SqliteStoreTest, MissingDirectoryIsUnavailableNamingPath) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/no-such-dir-", getpid(), "/nested/state.db");
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

// A failure in the middle of a batch (after some mutations reached SQLite)
// rolls the whole batch back and leaves the store usable. The failure is
// injected with a trigger added behind the store's back.
TEST(SqliteStoreTest, FailureMidBatchRollsBack) {
  const std::string path = NewDbPath();
  std::unique_ptr<StateStore> store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write({Mutation::Put("job", "keep", "old")}).ok());
  RawExec(path,
          "CREATE TRIGGER poison BEFORE INSERT ON records WHEN NEW.key = 'poison' "
          "BEGIN SELECT RAISE(ABORT, 'injected failure'); END;");

  absl::Status s = store->Write({Mutation::Put("job", "a", "1"), Mutation::Delete("job", "keep"),
                                 Mutation::Put("job", "poison", "x"), Mutation::Put("job", "b", "2")});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("injected failure"));
  EXPECT_THAT(s.message(), HasSubstr("mutation 2"));
  EXPECT_THAT(ScanOrDie(*store, "job"), ElementsAre(IsRecord("keep", "old")));

  // The connection is not left inside a transaction.
  ASSERT_TRUE(store->Write({Mutation::Put("job", "c", "3")}).ok());
  // A second connection while the first is open: not exclusive (the first
  // one holds the file's lock).
  absl::StatusOr<std::unique_ptr<StateStore>> second =
      OpenSqliteStore(path, SqliteStoreOptions{/*exclusive=*/false});
  ASSERT_TRUE(second.ok()) << second.status();
  std::unique_ptr<StateStore> reopened = *std::move(second);
  ASSERT_NE(reopened, nullptr);
  EXPECT_THAT(ScanOrDie(*reopened, "job"), ElementsAre(IsRecord("c", "3"), IsRecord("keep", "old")));
}

// Another connection holding the write lock past the busy timeout (5 s) makes
// Write fail with Unavailable, applying nothing; once released, writes work.
TEST(SqliteStoreTest, LockedDatabaseIsUnavailable) {
  const std::string path = NewDbPath();
  std::unique_ptr<StateStore> store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);

  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  const absl::Time start = absl::Now();
  absl::Status s = store->Write({Mutation::Put("job", "j", "v")});
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_GE(waited, absl::Seconds(4)) << "busy timeout not applied";
  // Reads are not blocked by a writer in WAL mode.
  EXPECT_THAT(ScanOrDie(*store, "job"), IsEmpty());
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);

  ASSERT_TRUE(store->Write({Mutation::Put("job", "j", "v")}).ok());
  EXPECT_THAT(ScanOrDie(*store, "job"), ElementsAre(IsRecord("j", "v")));
}

// Two stores (two connections, as two processes would have) on one file:
// the busy timeout serializes them and every write lands. The second is not
// exclusive (the first holds the file's flock), which also shows that the
// flock does not get in the way of SQLite's own (fcntl) locks.
TEST(SqliteStoreTest, TwoConnectionsWritingConcurrently) {
  const std::string path = NewDbPath();
  std::unique_ptr<StateStore> a = OpenOrDie(path);
  absl::StatusOr<std::unique_ptr<StateStore>> opened_b =
      OpenSqliteStore(path, SqliteStoreOptions{/*exclusive=*/false});
  ASSERT_TRUE(opened_b.ok()) << opened_b.status();
  std::unique_ptr<StateStore> b = *std::move(opened_b);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kWrites = 100;
  auto writer = [&](StateStore* store, const std::string& prefix) {
    for (int i = 0; i < kWrites; ++i) {
      absl::Status s = store->Write({Mutation::Put("k", absl::StrFormat("%s%04d", prefix, i), "v")});
      EXPECT_TRUE(s.ok()) << s;
    }
  };
  std::thread ta(writer, a.get(), "a");
  std::thread tb(writer, b.get(), "b");
  ta.join();
  tb.join();
  EXPECT_THAT(ScanOrDie(*a, "k"), SizeIs(2 * kWrites));
  EXPECT_THAT(ScanOrDie(*b, "k"), SizeIs(2 * kWrites));
}

// ---------------------------------------------------------------------------
// One exclusive store per file, whatever path reaches it (issue 14 defect
// 10: the coordinator locked "<--state>.lock" by path string, so a second
// one started through a symlink or a hard link and the two diverged).

void ExpectHeldByUs(const absl::StatusOr<std::unique_ptr<StateStore>>& second,
                    const std::string& path) {
  ASSERT_FALSE(second.ok()) << "a second exclusive store opened " << path;
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(path));
  EXPECT_THAT(second.status().message(), HasSubstr("held by another coordinator"));
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("(pid ", getpid(), ")")));
}

TEST(SqliteStoreLockTest, SecondStoreOnTheSamePathIsRefused) {
  const std::string path = NewDbPath();
  std::unique_ptr<StateStore> first = OpenOrDie(path);
  ASSERT_NE(first, nullptr);
  ExpectHeldByUs(OpenSqliteStore(path), path);
  // The first one is unaffected.
  EXPECT_TRUE(first->Write({Mutation::Put("job", "j", "v")}).ok());
}

TEST(SqliteStoreLockTest, SecondStoreThroughASymlinkIsRefused) {
  const std::string path = NewDbPath();
  const std::string link = path + ".symlink";
  std::unique_ptr<StateStore> first = OpenOrDie(path);
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0) << std::strerror(errno);
  ExpectHeldByUs(OpenSqliteStore(link), link);
}

TEST(SqliteStoreLockTest, SecondStoreThroughAHardLinkIsRefused) {
  const std::string path = NewDbPath();
  const std::string other_name = path + ".hardlink";
  std::unique_ptr<StateStore> first = OpenOrDie(path);
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(link(path.c_str(), other_name.c_str()), 0) << std::strerror(errno);
  ExpectHeldByUs(OpenSqliteStore(other_name), other_name);
  // And the other way round: opened first by the hard link's name.
  first.reset();
  std::unique_ptr<StateStore> by_link = OpenOrDie(other_name);
  ASSERT_NE(by_link, nullptr);
  ExpectHeldByUs(OpenSqliteStore(path), path);
}

TEST(SqliteStoreLockTest, AnotherProcessIsRefusedUntilTheHolderCloses) {
  const std::string path = NewDbPath();
  std::unique_ptr<StateStore> first = OpenOrDie(path);
  ASSERT_NE(first, nullptr);
  auto child_open_code = [&path]() {
    const pid_t child = fork();
    if (child == 0) {
      absl::StatusOr<std::unique_ptr<StateStore>> s = OpenSqliteStore(path);
      _exit(s.ok() ? 0 : static_cast<int>(s.status().code()));
    }
    int wstatus = 0;
    EXPECT_EQ(waitpid(child, &wstatus, 0), child);
    return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  };
  EXPECT_EQ(child_open_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  first.reset();  // closing releases the lock
  EXPECT_EQ(child_open_code(), 0);
  EXPECT_NE(OpenOrDie(path), nullptr);
}

// ---------------------------------------------------------------------------
// File modes (issue 14 defect 3: state.db, -wal and -shm were 0644).

int ModeOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

// Sets the umask for a scope.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(umask(mask)) {}
  ~ScopedUmask() { umask(old_); }

 private:
  mode_t old_;
};

TEST(SqliteStoreModeTest, NewFilesAreOwnerOnly) {
  ScopedUmask mask(022);
  const std::string path = NewDbPath();
  std::unique_ptr<StateStore> store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write({Mutation::Put("token", "j", "secret")}).ok());
  // While open (WAL mode), all three files exist.
  for (const std::string& file : {path, path + "-wal", path + "-shm"}) {
    EXPECT_EQ(ModeOf(file), 0600) << file;
  }
  // The old coordinator's separate lock file is gone with the path lock.
  EXPECT_EQ(ModeOf(path + ".lock"), -1);
}

TEST(SqliteStoreModeTest, ExistingWorldReadableFilesAreTightened) {
  ScopedUmask mask(022);
  const std::string path = NewDbPath();
  {
    // As an older coordinator left them: 0644, with -wal and -shm (a
    // connection left open, as after kill -9).
    std::unique_ptr<StateStore> old = OpenOrDie(path);
    ASSERT_NE(old, nullptr);
  }
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "INSERT INTO records VALUES('k', 'x', 'v')", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  ASSERT_EQ(ModeOf(path + "-wal"), 0644);
  ASSERT_EQ(ModeOf(path + "-shm"), 0644);
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      OpenSqliteStore(path, SqliteStoreOptions{/*exclusive=*/true});
  ASSERT_TRUE(store.ok()) << store.status();
  for (const std::string& file : {path, path + "-wal", path + "-shm"}) {
    EXPECT_EQ(ModeOf(file), 0600) << file;
  }
  EXPECT_THAT(ScanOrDie(**store, "k"), ElementsAre(IsRecord("x", "v")));
  sqlite3_close(raw);
}

// ---------------------------------------------------------------------------
// An empty file (issue 14 defect 12: a 0-byte state file silently started
// empty, every job forgotten).

TEST(SqliteStoreTest, EmptyFileIsRefusedUnlessAskedToInitialise) {
  const std::string path = NewDbPath();
  { std::ofstream touch(path); }
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  EXPECT_THAT(store.status().message(), HasSubstr("empty (0-byte) file"));
  EXPECT_THAT(store.status().message(), HasSubstr("--init-state"));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the refused file was modified";

  SqliteStoreOptions init;
  init.initialize_empty = true;
  store = OpenSqliteStore(path, init);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Write({Mutation::Put("job", "j", "v")}).ok());
  store = absl::UnknownError("closed");
  // Now a state database: opens without the option.
  std::unique_ptr<StateStore> reopened = OpenOrDie(path);
  ASSERT_NE(reopened, nullptr);
  EXPECT_THAT(ScanOrDie(*reopened, "job"), ElementsAre(IsRecord("j", "v")));
}

TEST(SqliteStoreTest, MissingFileIsCreatedNonEmpty) {
  const std::string path = NewDbPath();
  ASSERT_EQ(ModeOf(path), -1);
  { ASSERT_NE(OpenOrDie(path), nullptr); }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  // Creating writes SQLite's header at once, so the store never leaves a
  // file that the check above would refuse.
  EXPECT_GT(st.st_size, 0);
  EXPECT_NE(OpenOrDie(path), nullptr);
}

TEST(SqliteStoreTest, DirectoryIsRefused) {
  const std::string path = NewDbPath();
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

// kill -9 in the middle of a stream of batches: every batch the child saw
// acknowledged is present after reopening, and no batch is partly visible.
// Several rounds on one file, each child resuming where the last one's
// committed state ends, so WAL recovery runs after each kill, and the kill
// lands at different points (after different numbers of acks, plus a delay).
constexpr int kRecordsPerBatch = 20;

std::string BatchKey(int batch, int r) { return absl::StrFormat("%06d/%02d", batch, r); }
std::string BatchValue(int batch, int r) {
  return std::string(512 + 37 * r, static_cast<char>('a' + (batch + r) % 26));
}

// Child process body: never returns. No gtest assertions here; problems are
// reported by exit code (the parent expects death by SIGKILL).
[[noreturn]] void WriteBatchesUntilKilled(const std::string& path, int first_batch, int ack_fd,
                                          pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(10);
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore(path);
  if (!store.ok()) _exit(11);
  for (int batch = first_batch; batch < first_batch + 1000000; ++batch) {
    std::vector<Mutation> mutations;
    for (int r = 0; r < kRecordsPerBatch; ++r) {
      mutations.push_back(Mutation::Put("batch", BatchKey(batch, r), BatchValue(batch, r)));
    }
    // "last" and exactly one "prevN" must always agree.
    mutations.push_back(Mutation::Put("meta", "last", absl::StrCat(batch)));
    if (batch > 0) mutations.push_back(Mutation::Delete("meta", absl::StrCat("prev", batch - 1)));
    mutations.push_back(Mutation::Put("meta", absl::StrCat("prev", batch), "x"));
    if (!(*store)->Write(mutations).ok()) _exit(12);
    if (write(ack_fd, &batch, sizeof(batch)) != sizeof(batch)) _exit(13);
  }
  _exit(14);
}

// Checks the whole database: batches 0..N all complete, nothing else.
// Returns N (-1 when empty).
int CheckBatchesAreWhole(const std::string& path) {
  std::unique_ptr<StateStore> store = OpenOrDie(path);
  if (store == nullptr) return -2;
  std::vector<Record> meta = ScanOrDie(*store, "meta");
  std::vector<Record> records = ScanOrDie(*store, "batch");
  if (meta.empty()) {
    EXPECT_THAT(records, IsEmpty());
    return -1;
  }
  EXPECT_THAT(meta, SizeIs(2));
  if (meta.size() != 2) return -2;
  EXPECT_EQ(meta[0].key, "last");
  const int last = std::stoi(meta[0].value);
  EXPECT_EQ(meta[1].key, absl::StrCat("prev", last)) << "meta records from different batches";
  EXPECT_THAT(records, SizeIs((last + 1) * kRecordsPerBatch)) << "partial or missing batch";
  if (records.size() != static_cast<size_t>((last + 1) * kRecordsPerBatch)) return -2;
  for (int batch = 0; batch <= last; ++batch) {
    for (int r = 0; r < kRecordsPerBatch; ++r) {
      const Record& rec = records[batch * kRecordsPerBatch + r];
      if (rec.key != BatchKey(batch, r) || rec.value != BatchValue(batch, r)) {
        ADD_FAILURE() << "batch " << batch << " record " << r << " wrong: key " << rec.key;
        return -2;
      }
    }
  }
  return last;
}

TEST(SqliteStoreTest, DurableAcrossKill9) {
  const std::string path = NewDbPath();
  struct Round {
    int kill_after_acks;
    absl::Duration extra_delay;
  };
  const Round rounds[] = {{1, absl::ZeroDuration()},     {40, absl::ZeroDuration()},
                          {7, absl::Microseconds(300)},  {25, absl::Milliseconds(1)},
                          {3, absl::Microseconds(1500)}, {60, absl::Milliseconds(3)}};
  int committed = -1;  // last batch known present
  for (const Round& round : rounds) {
    SCOPED_TRACE(absl::StrCat("round killing after ", round.kill_after_acks, " acks"));
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t parent = getpid();
    const pid_t child = fork();
    ASSERT_GE(child, 0) << "fork: " << errno;
    if (child == 0) {
      close(fds[0]);
      WriteBatchesUntilKilled(path, committed + 1, fds[1], parent);
    }
    close(fds[1]);

    auto read_ack = [&](int* batch) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, /*timeout_ms=*/30000) <= 0) return false;
      return read(fds[0], batch, sizeof(*batch)) == sizeof(*batch);
    };
    int max_acked = committed;
    for (int i = 0; i < round.kill_after_acks; ++i) {
      int batch;
      if (!read_ack(&batch)) break;
      EXPECT_EQ(batch, max_acked + 1);
      max_acked = batch;
    }
    absl::SleepFor(round.extra_delay);
    kill(child, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "child did not die from SIGKILL; exit code "
        << (WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
    ASSERT_EQ(max_acked, committed + round.kill_after_acks) << "child stopped acknowledging";
    // Acks written before the kill but not read yet (the write end is closed now).
    for (int batch; read(fds[0], &batch, sizeof(batch)) == sizeof(batch);) {
      EXPECT_EQ(batch, max_acked + 1);
      max_acked = batch;
    }
    close(fds[0]);

    const int present = CheckBatchesAreWhole(path);
    ASSERT_GE(present, max_acked) << "an acknowledged batch was lost";
    // At most one batch past the last ack: committed, then killed before the ack.
    EXPECT_LE(present, max_acked + 1);
    std::printf("kill -9 after %d acknowledged batches; %d present\n", max_acked + 1, present + 1);
    committed = present;
  }
}

}  // namespace
}  // namespace shardline::server

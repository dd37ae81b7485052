// The two StateStore implementations: SQLite (durable) and in-memory.
//
// SQLite layout (format "shardline-state/1"):
//   meta(name TEXT PRIMARY KEY, value TEXT)  -- ('format', kFormat)
//   records(kind TEXT, key TEXT, value BLOB, PRIMARY KEY(kind, key))
// kind and key are bound as TEXT with explicit lengths, so any bytes are
// kept as-is and the BINARY collation (memcmp, shorter-prefix first) orders
// them bytewise, the same as std::string in the memory store.
#include "server/state_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace shardline::server {
namespace {

// Written into meta on creation; any other value means the file is not ours
// (or is from an incompatible version).
constexpr char kFormat[] = "shardline-state/1";
// How long a write waits for another connection's write lock.
constexpr int kBusyTimeoutMs = 5000;

}  // namespace

absl::Status ValidateMutations(const std::vector<Mutation>& mutations) {
  for (size_t i = 0; i < mutations.size(); ++i) {
    const Mutation& m = mutations[i];
    if (m.kind.empty() || m.key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mutation ", i, " of ", mutations.size(), " has an empty ",
          m.kind.empty() ? "kind" : "key", " (kind=\"", m.kind, "\", key=\"", m.key,
          "\"); every record needs a non-empty kind and key; nothing was applied"));
    }
  }
  return absl::OkStatus();
}

namespace {

// ---------------------------------------------------------------------------
// Memory store.

class MemoryStore final : public StateStore {
 public:
  absl::Status Write(const std::vector<Mutation>& mutations) override ABSL_LOCKS_EXCLUDED(mu_) {
    // Validating everything first makes the batch all-or-nothing: applying
    // to std::map cannot fail after this (short of bad_alloc).
    if (absl::Status s = ValidateMutations(mutations); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    for (const Mutation& m : mutations) {
      if (m.value.has_value()) {
        records_[m.kind][m.key] = *m.value;
      } else {
        auto it = records_.find(m.kind);
        if (it == records_.end()) continue;
        it->second.erase(m.key);
        if (it->second.empty()) records_.erase(it);
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Record>> Scan(absl::string_view kind) const override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<Record> out;
    auto it = records_.find(std::string(kind));
    if (it == records_.end()) return out;
    out.reserve(it->second.size());
    for (const auto& [key, value] : it->second) out.push_back({it->first, key, value});
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  // kind -> key -> value; std::string's ordering is bytewise (unsigned).
  std::map<std::string, std::map<std::string, std::string>> records_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// SQLite store.

// Maps a SQLite result code to our status codes and says what to do.
// `db` may be null (then only the code's generic text is used). Call before
// anything else touches `db`, since sqlite3_errmsg reports the latest call.
absl::Status SqliteError(int rc, sqlite3* db, const std::string& path, absl::string_view what) {
  const char* reason = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  const std::string detail = absl::StrCat("state database ", path, ": ", what, " failed: ",
                                          reason, " (SQLite code ", rc, ")");
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(absl::StrCat(
          detail, "; the file is not a Shardline state database or is corrupt: restore it from a "
                  "backup, or move it aside to start with empty state"));
    case SQLITE_TOOBIG:
      return absl::InvalidArgumentError(absl::StrCat(
          detail, "; a kind, key or value is larger than SQLite's limit (about 1 GB): store "
                  "large data elsewhere and keep a reference here"));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(absl::StrCat(
          detail, "; another process held the database lock for more than ", kBusyTimeoutMs,
          " ms: make sure only one coordinator uses this file, then retry"));
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
    case SQLITE_PROTOCOL:
    case SQLITE_NOMEM:
    case SQLITE_NOLFS:
      return absl::UnavailableError(absl::StrCat(
          detail, "; check that the directory exists and is writable and that the disk has "
                  "space, then retry"));
    default:
      return absl::InternalError(detail);
  }
}

// Owns one prepared statement.
class Statement {
 public:
  Statement() = default;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }  // finalize(nullptr) is a no-op

  sqlite3_stmt** out() { return &stmt_; }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// Resets a statement and drops its bindings (which point into caller-owned
// strings) when a scope ends, on every path.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ResetOnExit() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

 private:
  sqlite3_stmt* stmt_;
};

// Binds as TEXT with an explicit length (no NUL termination needed, bytes
// kept as-is). SQLITE_STATIC: the caller keeps `s` alive until reset.
int BindText(sqlite3_stmt* stmt, int index, absl::string_view s) {
  static const char kEmpty = 0;
  return sqlite3_bind_text64(stmt, index, s.empty() ? &kEmpty : s.data(), s.size(),
                             SQLITE_STATIC, SQLITE_UTF8);
}

// Zero-length blobs must get a non-null pointer, or SQLite stores NULL.
int BindBlob(sqlite3_stmt* stmt, int index, absl::string_view s) {
  static const char kEmpty = 0;
  return sqlite3_bind_blob64(stmt, index, s.empty() ? &kEmpty : s.data(), s.size(),
                             SQLITE_STATIC);
}

std::string ColumnBytes(sqlite3_stmt* stmt, int col, bool blob) {
  const void* p = blob ? sqlite3_column_blob(stmt, col)
                       : static_cast<const void*>(sqlite3_column_text(stmt, col));
  const int n = sqlite3_column_bytes(stmt, col);
  if (p == nullptr || n <= 0) return std::string();
  return std::string(static_cast<const char*>(p), static_cast<size_t>(n));
}

// Thread-safe: one connection, every use under mu_.
class SqliteStore final : public StateStore {
 public:
  // Takes ownership of `db` and of `file_fd` (the database file, flock'ed
  // when the store is exclusive; -1: none).
  SqliteStore(std::string path, sqlite3* db, int file_fd)
      : path_(std::move(path)), db_(db), file_fd_(file_fd) {}
  ~SqliteStore() override {
    // Statements first: sqlite3_close refuses while any are unfinalized.
    begin_.reset();
    commit_.reset();
    rollback_.reset();
    upsert_.reset();
    delete_.reset();
    scan_.reset();
    sqlite3_close(db_);
    // Only after SQLite closed its descriptors: closing any descriptor of
    // the file drops every fcntl lock this process holds on it, SQLite's
    // included. Closing it releases the flock.
    if (file_fd_ >= 0) close(file_fd_);
  }

  // Sets pragmas, creates or checks the schema, and prepares statements.
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Write(const std::vector<Mutation>& mutations) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<Record>> Scan(absl::string_view kind) const override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status ExecLocked(const char* sql, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PrepareLocked(const char* sql, std::unique_ptr<Statement>* stmt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // In one transaction: creates the tables in an empty database, or checks
  // the format marker of an existing one.
  absl::Status InitSchemaLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateOrCheckSchemaLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(const Mutation& m, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rolls back if a transaction is still open (SQLite rolls back by itself
  // after some errors, e.g. SQLITE_FULL or SQLITE_IOERR).
  void RollbackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ErrorLocked(int rc, absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return SqliteError(rc, db_, path_, what);
  }

  const std::string path_;
  mutable absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  const int file_fd_;
  std::unique_ptr<Statement> begin_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Statement> commit_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Statement> rollback_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Statement> upsert_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Statement> delete_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Statement> scan_ ABSL_GUARDED_BY(mu_);
};

absl::Status SqliteStore::ExecLocked(const char* sql, absl::string_view what) {
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return ErrorLocked(rc, what);
  return absl::OkStatus();
}

absl::Status SqliteStore::PrepareLocked(const char* sql, std::unique_ptr<Statement>* stmt) {
  *stmt = std::make_unique<Statement>();
  int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, (*stmt)->out(), nullptr);
  if (rc != SQLITE_OK) return ErrorLocked(rc, absl::StrCat("preparing \"", sql, "\""));
  return absl::OkStatus();
}

absl::Status SqliteStore::Init() {
  absl::MutexLock lock(&mu_);
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);

  // The first statement that reads the file: a non-database fails here with
  // SQLITE_NOTADB. journal_mode answers with the mode actually in effect.
  {
    Statement wal;
    int rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, wal.out(), nullptr);
    if (rc == SQLITE_OK) rc = sqlite3_step(wal.get());
    if (rc != SQLITE_ROW) return ErrorLocked(rc, "switching to WAL journal mode");
    const std::string mode = ColumnBytes(wal.get(), 0, /*blob=*/false);
    if (mode != "wal") {
      return absl::UnavailableError(absl::StrCat(
          "state database ", path_, ": SQLite kept journal mode \"", mode,
          "\" instead of \"wal\"; put the file on a local file system that supports "
          "shared-memory mapping (not NFS), then retry"));
    }
  }
  // FULL: every commit fsyncs the WAL, so an OK Write survives power loss.
  if (absl::Status s = ExecLocked("PRAGMA synchronous=FULL", "setting synchronous=FULL");
      !s.ok()) {
    return s;
  }
  // Deleted rows are overwritten, not left in free pages: a migrated
  // plain-text token (server/coordinator.cc, Recover) must not stay readable
  // in the file once its row is gone.
  if (absl::Status s = ExecLocked("PRAGMA secure_delete=ON", "setting secure_delete=ON");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = InitSchemaLocked(); !s.ok()) return s;

  for (auto [sql, stmt] : {
           std::pair{"BEGIN IMMEDIATE", &begin_},
           std::pair{"COMMIT", &commit_},
           std::pair{"ROLLBACK", &rollback_},
           std::pair{"INSERT INTO records(kind, key, value) VALUES(?1, ?2, ?3) "
                     "ON CONFLICT(kind, key) DO UPDATE SET value = excluded.value",
                     &upsert_},
           std::pair{"DELETE FROM records WHERE kind = ?1 AND key = ?2", &delete_},
           std::pair{"SELECT key, value FROM records WHERE kind = ?1 ORDER BY key", &scan_},
       }) {
    if (absl::Status s = PrepareLocked(sql, stmt); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::InitSchemaLocked() {
  // IMMEDIATE so two processes opening a new file at once cannot both
  // create the schema.
  if (absl::Status s = ExecLocked("BEGIN IMMEDIATE", "starting the schema transaction");
      !s.ok()) {
    return s;
  }
  absl::Status status = CreateOrCheckSchemaLocked();
  if (!status.ok()) {
    RollbackLocked();
    return status;
  }
  int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    status = ErrorLocked(rc, "committing the schema");
    RollbackLocked();
  }
  return status;
}

absl::Status SqliteStore::CreateOrCheckSchemaLocked() {
  Statement count;
  int rc = sqlite3_prepare_v2(
      db_, "SELECT count(*), count(CASE WHEN name = 'meta' THEN 1 END) FROM sqlite_master", -1,
      count.out(), nullptr);
  if (rc == SQLITE_OK) rc = sqlite3_step(count.get());
  if (rc != SQLITE_ROW) return ErrorLocked(rc, "reading the schema");
  const int64_t objects = sqlite3_column_int64(count.get(), 0);
  const bool has_meta = sqlite3_column_int64(count.get(), 1) > 0;

  if (objects == 0) {  // New (or empty) database: create ours.
    return ExecLocked(absl::StrCat("CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);"
                                   "CREATE TABLE records(kind TEXT NOT NULL, key TEXT NOT NULL, "
                                   "value BLOB NOT NULL, PRIMARY KEY(kind, key));"
                                   "INSERT INTO meta(name, value) VALUES('format', '",
                                   kFormat, "');")
                          .c_str(),
                      "creating the schema");
  }
  if (!has_meta) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path_,
        " is a SQLite database but not a Shardline state database (it has no meta table); "
        "point --state at a new file or at a Shardline state database"));
  }
  Statement format;
  rc = sqlite3_prepare_v2(db_, "SELECT value FROM meta WHERE name = 'format'", -1, format.out(),
                          nullptr);
  if (rc == SQLITE_OK) rc = sqlite3_step(format.get());
  if (rc == SQLITE_DONE) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path_,
        " has a meta table without a format marker, so it is not a Shardline state database "
        "or is damaged; restore it from a backup or point --state at a new file"));
  }
  if (rc != SQLITE_ROW) return ErrorLocked(rc, "reading the format marker");
  const std::string found = ColumnBytes(format.get(), 0, /*blob=*/false);
  if (found != kFormat) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path_, " has format \"", found, "\" but this coordinator reads \"",
        kFormat, "\"; use the Shardline version that wrote it, or point --state at a new file"));
  }
  return absl::OkStatus();
}

void SqliteStore::RollbackLocked() {
  if (sqlite3_get_autocommit(db_)) return;  // nothing open
  if (rollback_ != nullptr) {
    ResetOnExit reset(rollback_->get());
    sqlite3_step(rollback_->get());
  } else {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
}

absl::Status SqliteStore::ApplyLocked(const Mutation& m, size_t index) {
  sqlite3_stmt* stmt = m.value.has_value() ? upsert_->get() : delete_->get();
  ResetOnExit reset(stmt);
  int rc = BindText(stmt, 1, m.kind);
  if (rc == SQLITE_OK) rc = BindText(stmt, 2, m.key);
  if (rc == SQLITE_OK && m.value.has_value()) rc = BindBlob(stmt, 3, *m.value);
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt);
  if (rc != SQLITE_DONE) {
    return ErrorLocked(rc, absl::StrCat(m.value.has_value() ? "put" : "delete", " (mutation ",
                                        index, ", kind \"", m.kind, "\")"));
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Write(const std::vector<Mutation>& mutations) {
  if (absl::Status s = ValidateMutations(mutations); !s.ok()) return s;
  if (mutations.empty()) return absl::OkStatus();

  absl::MutexLock lock(&mu_);
  {
    ResetOnExit reset(begin_->get());
    int rc = sqlite3_step(begin_->get());
    if (rc != SQLITE_DONE) return ErrorLocked(rc, "starting a write transaction");
  }
  for (size_t i = 0; i < mutations.size(); ++i) {
    if (absl::Status s = ApplyLocked(mutations[i], i); !s.ok()) {
      RollbackLocked();
      return s;
    }
  }
  ResetOnExit reset(commit_->get());
  int rc = sqlite3_step(commit_->get());
  if (rc != SQLITE_DONE) {
    absl::Status s = ErrorLocked(rc, "committing a write transaction");
    RollbackLocked();
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Record>> SqliteStore::Scan(absl::string_view kind) const {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = scan_->get();
  ResetOnExit reset(stmt);
  std::vector<Record> out;
  // One statement is one implicit read transaction: a consistent snapshot.
  int rc = BindText(stmt, 1, kind);
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    rc = sqlite3_step(stmt);
    if (rc != SQLITE_ROW) break;
    out.push_back({std::string(kind), ColumnBytes(stmt, 0, /*blob=*/false),
                   ColumnBytes(stmt, 1, /*blob=*/true)});
  }
  if (rc != SQLITE_DONE) {
    return ErrorLocked(rc, absl::StrCat("scanning kind \"", kind, "\""));
  }
  return out;
}

// Closes a descriptor at scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

absl::Status OpenError(int err, absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(
      "state database ", path, ": ", what, " failed: ", std::strerror(err), " (errno ", err,
      "); check that the directory exists and is writable, then retry"));
}

// The pid holding a flock(2) on the inode `st`, from /proc/locks (Linux:
// "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF", the
// device numbers in hex); nullopt when it cannot be told.
std::optional<long> FlockHolder(const struct stat& st) {
  std::ifstream in("/proc/locks");
  const std::string device =
      absl::StrCat(absl::Hex(major(st.st_dev), absl::kZeroPad2), ":",
                   absl::Hex(minor(st.st_dev), absl::kZeroPad2), ":", st.st_ino);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // Waiters are listed as "1: -> FLOCK ..."; only holders count.
    if (f.size() < 6 || f[1] != "FLOCK" || f[5] != device) continue;
    long pid = 0;
    if (absl::SimpleAtoi(f[4], &pid) && pid > 0) return pid;
  }
  return std::nullopt;
}

// Sets `path` to 0600 when group or others have any access. A missing file
// is fine (SQLite creates -wal and -shm with the database file's mode).
absl::Status RestrictMode(int fd, const std::string& path) {
  struct stat st;
  const int rc = fd >= 0 ? fstat(fd, &st) : stat(path.c_str(), &st);
  if (rc != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return OpenError(errno, absl::StrCat("stat of ", path), path);
  }
  if ((st.st_mode & 077) == 0) return absl::OkStatus();
  const int changed = fd >= 0 ? fchmod(fd, 0600) : chmod(path.c_str(), 0600);
  if (changed != 0) {
    const int err = errno;
    return absl::PermissionDeniedError(absl::StrCat(
        "state database file ", path, " is open to group or others (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), ") and chmod 0600 failed: ",
        std::strerror(err),
        "; it holds job tokens: run the coordinator as the file's owner, or chmod 600 it"));
  }
  return absl::OkStatus();
}

// Opens (creating 0600 when missing) the database file and, when
// exclusive, flocks it, before SQLite opens it. Returns the descriptor.
absl::StatusOr<int> OpenStateFile(const std::string& path, const SqliteStoreOptions& options) {
  bool created = false;
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      created = true;
    } else if (errno == EEXIST) {  // another process created it just now
      fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    }
  }
  if (fd < 0) return OpenError(errno, "opening", path);
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return OpenError(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state database ", path, " is not a regular file; point --state at a file"));
  }
  if (options.exclusive && flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return OpenError(err, "flock", path);
    const std::optional<long> holder = FlockHolder(st);
    return absl::FailedPreconditionError(absl::StrCat(
        "state database ", path, " (inode ", st.st_ino, ") is held by another coordinator",
        holder.has_value() ? absl::StrCat(" (pid ", *holder, ")") : std::string(),
        " through this or another path (a symlink or hard link reaches the same file); two "
        "coordinators on one state file would diverge: stop the other one first, or give this "
        "one another state file"));
  }
  // Paths of the -wal and -shm files: SQLite derives them from the resolved
  // database path.
  char resolved[PATH_MAX];
  const std::string real = realpath(path.c_str(), resolved) != nullptr ? resolved : path;
  if (!created && st.st_size == 0 && !options.initialize_empty) {
    // SQLite would take it for a new database; a committed -wal beside it
    // (a crash right after creation) is still a database to recover.
    struct stat wal;
    if (stat((real + "-wal").c_str(), &wal) != 0 || wal.st_size == 0) {
      return absl::DataLossError(absl::StrCat(
          "state database ", path, " is an empty (0-byte) file, not a Shardline state database: "
          "a coordinator never leaves its state file empty, so it was truncated or created by "
          "something else; restore it from a backup, or, to start with empty state (every job "
          "forgotten), delete it or start the coordinator once with --init-state"));
    }
  }
  if (!created && st.st_size > 0) {
    // Refused before RestrictMode: a file that is not an SQLite database
    // keeps its mode (only a state file is made private).
    char header[16] = {};
    const ssize_t n = pread(fd, header, sizeof(header), 0);
    if (n != static_cast<ssize_t>(sizeof(header)) ||
        std::memcmp(header, "SQLite format 3", sizeof(header)) != 0) {
      return absl::DataLossError(absl::StrCat(
          "state database ", path, " is not an SQLite database (its first bytes are not "
          "SQLite's header), so not a Shardline state database: restore it from a backup, or "
          "point --state at another file (a missing one starts with empty state)"));
    }
  }
  if (absl::Status s = RestrictMode(fd, path); !s.ok()) return s;
  for (const char* suffix : {"-wal", "-shm"}) {
    if (absl::Status s = RestrictMode(-1, real + suffix); !s.ok()) return s;
  }
  return closer.release();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStore(const std::string& path,
                                                             SqliteStoreOptions options) {
  absl::StatusOr<int> file = OpenStateFile(path, options);
  if (!file.ok()) return file.status();
  FdCloser closer(*file);
  struct stat locked;
  if (fstat(closer.get(), &locked) != 0) return OpenError(errno, "fstat", path);
  sqlite3* db = nullptr;
  // NOMUTEX: SqliteStore serializes all use of the connection itself.
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteError(rc, db, path, "opening");
    sqlite3_close(db);  // a handle is returned even on failure; close(nullptr) is a no-op
    return s;
  }
  // The store owns both from here (it closes the descriptor after SQLite's).
  auto store = std::make_unique<SqliteStore>(path, db, closer.release());
  // SQLite opened the path again: it must still name the locked file.
  struct stat now;
  if (stat(path.c_str(), &now) != 0 || now.st_dev != locked.st_dev ||
      now.st_ino != locked.st_ino) {
    return absl::UnavailableError(absl::StrCat(
        "state database ", path, " was replaced while it was being opened; retry"));
  }
  if (absl::Status s = store->Init(); !s.ok()) return s;
  return store;
}

std::unique_ptr<StateStore> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace shardline::server

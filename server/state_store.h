// Durable storage for the coordinator's state: jobs, members, generations,
// committed checkpoints. A small record store (kind, key) → bytes with
// atomic, durable batches; the coordinator serializes its own records
// (protobuf) into the values.
//
//   absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStore("/var/lib/shardline/state.db");
//   (*store)->Write({Mutation::Put("job", "j1", bytes), Mutation::Delete("kv", "old")});
//   absl::StatusOr<std::vector<Record>> jobs = (*store)->Scan("job");
//
// Implementations are thread-safe.
#ifndef SHARDLINE_SERVER_STATE_STORE_H_
#define SHARDLINE_SERVER_STATE_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::server {

struct Record {
  std::string kind;   // record type, e.g. "job", "member", "checkpoint"
  std::string key;    // unique within kind
  std::string value;  // opaque bytes
};

struct Mutation {
  std::string kind;
  std::string key;
  std::optional<std::string> value;  // nullopt deletes (deleting a missing key is OK)

  static Mutation Put(std::string kind, std::string key, std::string value) {
    return {std::move(kind), std::move(key), std::move(value)};
  }
  static Mutation Delete(std::string kind, std::string key) {
    return {std::move(kind), std::move(key), std::nullopt};
  }
};

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Applies every mutation, in order, as one atomic transaction that is
  // durable (on stable storage, surviving kill -9 and power loss for the
  // SQLite store) when this returns OK. Errors:
  //   Unavailable: the storage could not be written (disk full, I/O error,
  //     database locked past its busy timeout); nothing was applied.
  //   InvalidArgument: an empty kind or key.
  virtual absl::Status Write(const std::vector<Mutation>& mutations) = 0;

  // Every record of `kind`, ordered by key (bytewise). Errors: Unavailable
  // as above; DataLoss if the storage is corrupt.
  virtual absl::StatusOr<std::vector<Record>> Scan(absl::string_view kind) const = 0;
};

// InvalidArgument naming the first mutation with an empty kind or key
// ("... nothing was applied"); what every StateStore's Write checks first.
absl::Status ValidateMutations(const std::vector<Mutation>& mutations);

struct SqliteStoreOptions {
  // Hold an exclusive flock(2) on the database file itself (its inode, so
  // whatever path, symlink or hard link reaches it) for the life of the
  // store: a second exclusive store on the same file, in this process or
  // another (a second coordinator), is refused with FailedPrecondition
  // naming the path and the holder's pid (from /proc/locks, when readable).
  // SQLite's own locks are fcntl(2) locks, which do not conflict with
  // flock(2) on Linux's local file systems. false: take no lock (tools and
  // tests that share the file on purpose; SQLite's busy timeout serializes
  // their writes).
  bool exclusive = true;
  // Accept an existing 0-byte file as a new, empty state database (the
  // coordinator's --init-state). Otherwise such a file is refused: a store
  // never leaves its file empty (creating it writes SQLite's header at
  // once), so an empty one was truncated or made by something else.
  bool initialize_empty = false;
};

// SQLite (Debian's libsqlite3) at `path`, created if missing: WAL journal,
// synchronous=FULL, one table. A missing file is created mode 0600; an
// existing one, and its -wal and -shm files, are set to 0600 when group or
// others had any access (SQLite creates -wal and -shm with the database
// file's mode), since the records include job tokens. Errors:
//   Unavailable: the file cannot be opened or created (the message names
//     the path and the reason: SQLite's, or strerror's);
//   FailedPrecondition: another exclusive store (another coordinator)
//     holds the file (see SqliteStoreOptions::exclusive); or `path` is not
//     a regular file;
//   DataLoss: the file is not a Shardline state database or is corrupt,
//     including an existing 0-byte file unless options.initialize_empty
//     (the message says how to start fresh);
//   PermissionDenied: the mode of the file (or of its -wal / -shm) could
//     not be changed to 0600.
absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStore(const std::string& path,
                                                             SqliteStoreOptions options = {});

// In memory, for tests and `--state memory`; nothing survives the process.
std::unique_ptr<StateStore> NewMemoryStore();

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_STATE_STORE_H_

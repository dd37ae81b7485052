// Store: the key-value rendezvous a communicator group bootstraps through.
//
//   std::shared_ptr<Store> store = NewInMemoryStore();      // tests: shared by rank threads
//   auto group = PrefixStore(store, "gen7/tp0/");           // per-group scoping
//   group->Set("rank0", "addr");  auto v = group->Get("rank1", absl::Seconds(30));
//
// Modeled on c10d's Store. Values are opaque bytes. Keys are flat strings;
// scoping is done by PrefixStore, never by the caller concatenating prefixes.
//
// Thread-safety: every implementation is safe to call from many threads at
// once (ranks running as threads share one in-memory store).
#ifndef SHARDLINE_WORKER_COMM_STORE_H_
#define SHARDLINE_WORKER_COMM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline::worker {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, overwriting any previous value, and wakes every
  // Get/Wait blocked on it. Possible errors:
  //   Aborted: the store's generation ended (the group is being torn down).
  //   Unavailable: a remote store could not be reached; retry.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // Returns the value of `key`, blocking until it is set or `timeout` passes.
  // Possible errors:
  //   DeadlineExceeded: `key` was not set within `timeout` (message names key).
  //   Aborted: the store's generation ended while waiting.
  //   Unavailable: a remote store could not be reached; retry.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (a missing key
  // counts as 0; the value is stored as decimal text) and returns the new
  // value. Possible errors:
  //   InvalidArgument: `key` holds a value that is not a decimal int64.
  //   Aborted, Unavailable: as for Set.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Blocks until every key in `keys` is set, or `timeout` passes.
  // Possible errors:
  //   DeadlineExceeded: some key was still unset at `timeout` (message names
  //     the first missing key).
  //   Aborted, Unavailable: as for Get.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

// A process-local store backed by a map and a condition variable. Shared by
// rank threads in tests. Never returns Unavailable.
std::shared_ptr<Store> NewInMemoryStore();

// A view of `base` in which every key is prefixed by `prefix` (e.g.
// "gen7/group/2,3/"). Two groups with different prefixes never see each
// other's keys, so a group bootstrapping does not block ranks outside it.
std::shared_ptr<Store> PrefixStore(std::shared_ptr<Store> base, std::string prefix);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COMM_STORE_H_

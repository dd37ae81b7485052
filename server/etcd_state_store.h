// The coordinator's state in etcd (--state etcd://...): the StateStore of
// server/state_store.h over etcd's KV, with every write fenced by the
// leader election (server/leader_election.h).
//
//   EtcdStoreOptions options;
//   options.prefix = "/shardline/";
//   options.fence_key = "/shardline/leader";
//   options.fence_revision = term.revision;  // create revision of our leader key
//   absl::StatusOr<std::unique_ptr<StateStore>> store = OpenEtcdStore(etcd, options);
//
// Keys: record (kind, key) is PREFIX "state/" kind "/" key; its value the
// record's bytes (a '%' or '/' in kind is written %25 / %2F, so one kind's
// keys never fall under another's). PREFIX "format" holds kEtcdStateFormat,
// written by the first coordinator on an empty prefix and checked by every
// later one; PREFIX "leader" and PREFIX "replicas/..." are the election's
// (server/leader_election.h).
//
// Fencing: Write is one etcd Txn whose compare says that fence_key's
// create_revision is still fence_revision, i.e. the leader key this replica
// created is still there; a replica that lost the election (its lease
// expired while it was paused or cut off, and another created the key)
// can no longer change the state. A batch with more mutations than
// max_txn_ops - 1, or with more than max_txn_bytes of keys and values, is
// split into several fenced Txns, applied in order; the coordinator's
// batches stay below that (each holds one job's records). Within a batch,
// only the last mutation of a record counts (etcd refuses a Txn that
// changes one key twice; the result is the same). Writes are serialized.
//
// Thread-safety: thread-safe.
#ifndef SHARDLINE_SERVER_ETCD_STATE_STORE_H_
#define SHARDLINE_SERVER_ETCD_STATE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "etcd/client.h"
#include "server/state_store.h"

namespace shardline::server {

struct EtcdStoreOptions {
  // Ends with '/' (etcd/url.h EtcdUrl::prefix).
  std::string prefix;
  // The leader key, and the create revision it must still have for a write
  // to apply; fence_revision 0 writes unfenced (tools and tests only).
  std::string fence_key;
  int64_t fence_revision = 0;
  // etcd's --max-txn-ops (128 by default): the most operations of one Txn.
  int max_txn_ops = 128;
  // The most bytes of keys and values in one Txn: below etcd's
  // --max-request-bytes (1.5 MiB by default) with room for the framing.
  int64_t max_txn_bytes = 1 << 20;
  // Called (outside any lock of the store) when a Write failed: `fenced`
  // true when the fence compare failed (another replica leads), false when
  // etcd could not be written (unreachable, no quorum). The coordinator's
  // memory is then ahead of its durable state, so the replica stops
  // leading (server/replica.h). May be null.
  std::function<void(const absl::Status& error, bool fenced)> on_write_failed;
};

// The value of PREFIX "format".
inline constexpr char kEtcdStateFormat[] = "shardline-state-v1";

// Checks (or, on an empty prefix, writes) PREFIX "format". `etcd` is not
// owned and must outlive the store. Errors:
//   InvalidArgument: prefix empty or not ending with '/'; fence_revision
//     negative, or positive with no fence_key; max_txn_ops below 2 or
//     max_txn_bytes below 1;
//   FailedPrecondition: PREFIX "format" holds another value (another
//     version's data, or not Shardline's: the message shows the value and
//     says to use another prefix), or keys other than PREFIX "leader" and
//     PREFIX "replicas/..." exist under the prefix without it (not
//     Shardline's);
//   FailedPrecondition "fenced: ..." when the format is to be written and
//     the fence compare fails;
//   Unavailable / DeadlineExceeded: etcd unreachable (the client's message).
absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStore(etcd::Client* etcd,
                                                          EtcdStoreOptions options);

// Write errors (StateStore::Write): FailedPrecondition "fenced: ..." when
// the fence compare failed (nothing applied), Unavailable when etcd could
// not be written (nothing applied, or, for a split batch, the Txns before
// the failing one), InvalidArgument for an empty kind or key.
// Scan reads one consistent snapshot (etcd::Client::RangePrefix).

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_ETCD_STATE_STORE_H_

// Leader election of coordinator replicas on etcd: one lease per replica,
// one leader key per state prefix.
//
//   ElectionOptions options;
//   options.prefix = "/shardline/";             // etcd/url.h EtcdUrl::prefix
//   options.self.set_replica_id("coord-a");
//   options.self.set_address("10.0.0.1:7070");
//   LeaderElection election(etcd, options);
//   election.Start({.elected = [](const LeaderTerm& t) { ... serve ... },
//                   .deposed = [](const std::string& why) { ... stop serving ... }});
//
// How (etcd 3.4's KV and Lease APIs, the same scheme as etcd's own
// concurrency/election package):
//   * Each replica holds a lease of `lease_ttl` (granted at start, kept
//     alive every lease_ttl / 3) and registers itself under PREFIX
//     "replicas/" replica_id (a v1::Replica, attached to the lease, so it
//     disappears with the process).
//   * Campaign: while PREFIX "leader" does not exist, a Txn "if the key's
//     create revision is 0, put it with our v1::Replica, attached to our
//     lease" makes at most one replica the leader. Its term is that key's
//     create revision (LeaderTerm::revision): every state write of the term
//     is a Txn that compares it (server/etcd_state_store.h), so a replica
//     that lost the key can write nothing, however long it was paused.
//   * A follower reads the leader key every poll_interval (a linearizable
//     Range) and campaigns as soon as it is gone: when the leader's lease
//     expires (it died, paused or lost etcd) or it resigned (LeaseRevoke).
//   * A leader stops serving (LeaseValid() turns false) once lease_ttl has
//     passed since the last keep-alive that succeeded was sent: etcd may
//     then have expired the lease, and stopping at that time, before any
//     other replica can be elected, is what keeps two leaders from serving
//     at once (given clocks that run at the same rate). It is not deposed
//     for that alone: etcd keeps a lease while it has no raft leader (and
//     renews every lease when a new one is elected), so when a keep-alive
//     succeeds again the lease never expired, nobody else was elected, and
//     the same term serves on. It is deposed, and `deposed` is called,
//     when: a keep-alive says its lease is gone (TTL 0); the leader key is
//     no longer ours; or Resign() (a state write failed). It then revokes its lease (so that
//     another replica is elected at once, not after the TTL), takes a new
//     one and for lease_ttl only follows, giving the others the first
//     chance, before it stands again.
// Failover time after the leader dies: at most lease_ttl (expiry) + etcd's
// expiry check (500 ms in etcd 3.4) + poll_interval + one Txn.
//
// Thread-safety: thread-safe. One thread (started by Start) runs the
// election and calls the callbacks, one at a time and never with a lock of
// this class held; they may call Leader(), Resign() and Status() but not
// Stop().
#ifndef SHARDLINE_SERVER_LEADER_ELECTION_H_
#define SHARDLINE_SERVER_LEADER_ELECTION_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/client.h"
#include "shardline/v1/replica.pb.h"

namespace shardline::server {

struct ElectionOptions {
  // Ends with '/'.
  std::string prefix;
  // This replica: replica_id and address must be set (start_time is set by
  // Start; role and leader_since are kept up to date).
  v1::Replica self;
  // etcd raises a TTL below its minimum (2 s with its default election
  // timeout) to that minimum; whole seconds.
  absl::Duration lease_ttl = absl::Seconds(2);
  // How often a follower looks at the leader key.
  absl::Duration poll_interval = absl::Milliseconds(100);
};

// What the elected replica writes with (server/etcd_state_store.h's fence).
struct LeaderTerm {
  std::string leader_key;  // PREFIX "leader"
  int64_t revision = 0;    // the leader key's create revision
  int64_t lease = 0;       // the lease the key is attached to
  absl::Time since;        // when this replica was elected
};

struct ElectionCallbacks {
  std::function<void(const LeaderTerm&)> elected;
  std::function<void(const std::string& reason)> deposed;
};

class LeaderElection {
 public:
  // `etcd` is not owned and must outlive this.
  LeaderElection(etcd::Client* etcd, ElectionOptions options);
  ~LeaderElection();  // Stop()
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Starts the election thread. Call once.
  void Start(ElectionCallbacks callbacks);

  // Stops campaigning; a leader is deposed (`deposed` is called with
  // "shutting down") and revokes its lease, so another replica takes over
  // at once. Blocks until the thread ended. Idempotent.
  void Stop();

  // Stop leading now (a state write failed, see
  // EtcdStoreOptions::on_write_failed): the election thread calls
  // `deposed` with `reason` soon after. Only sets a flag: safe to call with
  // any lock held. No effect unless leading.
  void Resign(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // The leader as last read (nullopt: none known, or a follower that could
  // not read etcd for lease_ttl), and whether it is this replica.
  std::optional<v1::Replica> Leader() const ABSL_LOCKS_EXCLUDED(mu_);
  bool leading() const ABSL_LOCKS_EXCLUDED(mu_);
  // Leading, and less than lease_ttl since the last successful keep-alive
  // was sent: the time up to which no other replica can have been elected.
  // Exact even while the election thread is blocked in a call to etcd or
  // the process was paused (SIGSTOP): the replica's server gates every
  // call and tick on it (server/replica.h).
  bool LeaseValid() const ABSL_LOCKS_EXCLUDED(mu_);
  // This replica as it is registered (role, start_time, leader_since), and
  // why it is not leading or following when it is a candidate (the last
  // etcd error, e.g. "etcd at ...: connection refused").
  v1::Replica Self() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string LastError() const ABSL_LOCKS_EXCLUDED(mu_);

  // Every replica registered on the prefix, the leader first, then by id.
  // Errors: the etcd client's.
  absl::StatusOr<std::vector<v1::Replica>> Replicas() const;

  std::string leader_key() const { return options_.prefix + "leader"; }
  const ElectionOptions& options() const { return options_; }

 private:
  void Loop();
  // One round as a candidate or follower; returns a term when elected.
  std::optional<LeaderTerm> Campaign();
  // Keeps the term alive until it ends; returns why it ended.
  std::string Lead(const LeaderTerm& term);
  // The leader key's record, when it is a replica's with a valid address;
  // else nullopt, logged once, and LastError says so.
  std::optional<v1::Replica> ParseLeader(const etcdserverpb::KeyValue& kv);
  void NoteRead() ABSL_LOCKS_EXCLUDED(mu_);
  // Notes the leader read from etcd (nullopt: none) as a follower.
  void Follow(const std::optional<v1::Replica>& leader) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EnsureLease();
  absl::Status KeepAlive();
  absl::Status Register();
  void SetError(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps until `until` or Stop/Resign; true when stopping.
  bool SleepUntil(absl::Time until) ABSL_LOCKS_EXCLUDED(mu_);

  etcd::Client* const etcd_;
  ElectionOptions options_;
  ElectionCallbacks callbacks_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string resign_ ABSL_GUARDED_BY(mu_);  // non-empty: Resign was called
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::Replica> leader_ ABSL_GUARDED_BY(mu_);
  v1::Replica self_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // of the leader key
  // valid_until_ while leading, else the minimum (Unix nanoseconds): what
  // LeaseValid() reads without the lock, on every call the replica serves.
  std::atomic<int64_t> serving_until_ns_{std::numeric_limits<int64_t>::min()};
  void UpdateServingUntil() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Only the election thread touches these.
  int64_t lease_ = 0;
  absl::Time last_keepalive_sent_;                    // of the last keep-alive that succeeded
  absl::Time campaign_after_ = absl::InfinitePast();  // deposed: stand again from then
  bool foreign_leader_logged_ = false;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LEADER_ELECTION_H_

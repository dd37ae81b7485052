// A coordinator replica: one of several shardline-coordinator processes on
// one etcd state prefix (--state etcd://...), of which the elected one
// serves (proto/shardline/v1/coordinator.proto "Replicas").
//
//   ReplicaOptions options;
//   options.prefix = url.prefix;  options.state = url.ToString();
//   options.self.set_replica_id("coord-a");  options.self.set_address("10.0.0.1:7070");
//   options.server.listen_address = "0.0.0.0:7070";
//   absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Start(etcd, election_etcd,
//   options);
//   ... until SIGTERM ...
//   (*replica)->Shutdown();
//
// Roles (server/leader_election.h elects):
//   * Follower (or candidate): a small gRPC server on the listen address
//     answers every RPC of the four v1 services with UNAVAILABLE "not the
//     leader: the leader is HOST:PORT ..." and the kLeaderMetadataKey
//     trailing metadata (common/grpc_status.h), and serves
//     CoordinatorService.GetStatus.
//   * Leader: for its term it builds the whole coordinator afresh — the
//     state store on etcd fenced by the term (server/etcd_state_store.h),
//     a Coordinator recovered from it (Coordinator::Recover: every member
//     keeps its state and rank and gets a fresh heartbeat clock, so no
//     worker is evicted for the time the switch took), an empty Rendezvous
//     (key-values live in the leader's memory: a job caught mid-rendezvous
//     re-forms), the CheckpointRegistry — and serves them with a
//     CoordinatorServer on the same address. Every call and every Tick is
//     gated on LeaderElection::LeaseValid(), so a replica that was paused
//     past its lease answers nothing and judges no heartbeat before it
//     notices it was deposed.
//   * Deposed (lease lost or not renewed in time, a state write refused or
//     failed: EtcdStoreOptions::on_write_failed resigns): the term's
//     server shuts down at once (open calls and streams end with
//     UNAVAILABLE; the workers' sessions are not closed as failures), its
//     components are dropped, and it is a follower again.
//
// Thread-safety: thread-safe. The election thread builds and drops terms;
// gRPC threads call the servers.
#ifndef SHARDLINE_SERVER_REPLICA_H_
#define SHARDLINE_SERVER_REPLICA_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/client.h"
#include "metrics/metrics.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "server/leader_election.h"
#include "server/rpc/coordinator_server.h"
#include "server/rpc/coordinator_service.h"
#include "shardline/v1/replica.pb.h"

namespace shardline::server {

struct ReplicaOptions {
  // The state prefix (ends with '/') and the --state URL, for GetStatus.
  std::string prefix;
  std::string state;
  // This replica's replica_id and the address clients reach it at.
  v1::Replica self;
  absl::Duration lease_ttl = absl::Seconds(2);
  absl::Duration poll_interval = absl::Milliseconds(100);
  // etcd's --max-txn-ops (EtcdStoreOptions::max_txn_ops).
  int max_txn_ops = 128;
  // The leader's server (listen_address, TLS, admin token, ...): gate,
  // status and state are set by the replica.
  ServerOptions server;
  CoordinatorOptions coordinator;
  CheckpointRegistryOptions checkpoints;
};

class Replica {
 public:
  // Checks the prefix's format (OpenEtcdStore without a fence: an empty
  // prefix gets the format key), binds the listen address as a follower and
  // starts the election. `etcd` (state, status) and `election_etcd` (the
  // election's keep-alives, with a timeout well under lease_ttl: a
  // keep-alive must not outlast the lease) are not owned and must outlive
  // the replica. Errors: OpenEtcdStore's (FailedPrecondition for another
  // version's data or foreign keys under the prefix, Unavailable when etcd
  // cannot be reached); Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Replica>> Start(etcd::Client* etcd,
                                                        etcd::Client* election_etcd,
                                                        ReplicaOptions options);
  ~Replica();  // Shutdown()
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // "HOST:PORT" bound (the listen host, the real port).
  const std::string& address() const { return address_; }
  // Calls and job gauges of whichever term serves (for the metrics port).
  metrics::Metrics* metrics() { return &metrics_; }
  // CoordinatorService.GetStatus's answer.
  v1::CoordinatorStatus Status() const;
  bool leading() const { return election_->leading(); }

  // Stops the election (a leader revokes its lease, so another replica is
  // elected at once), then the term and the follower server. Idempotent.
  void Shutdown();

 private:
  struct Term;
  class NotLeaderService;
  explicit Replica(etcd::Client* etcd, ReplicaOptions options);
  void OnElected(const LeaderTerm& term);
  void OnDeposed(const std::string& reason);
  absl::Status StartFollowerServer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopFollowerServer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE "not the leader ..." with the leader's address (for the
  // follower's answers and the leader's gate); `leader` gets its address
  // ("" when none is known).
  absl::Status NotLeader(std::string* leader) const;

  etcd::Client* const etcd_;
  const ReplicaOptions options_;
  std::string address_;  // set by Start
  std::unique_ptr<LeaderElection> election_;
  metrics::Metrics metrics_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // The follower's server and its two services (new ones for each server).
  std::unique_ptr<rpc::CoordinatorServiceImpl> status_service_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<NotLeaderService> not_leader_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Server> follower_server_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Term> term_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_REPLICA_H_

// The coordinator's gRPC server: the four v1 services of
// proto/shardline/v1/coordinator.proto over the state machine (Coordinator),
// the Rendezvous and the CheckpointRegistry, the periodic Tick, and the
// server's lifecycle. The pieces:
//   server/rpc/call.h                the call runner, handler pool, auth and
//                                    wait helpers every adapter shares;
//   server/rpc/job_service.h         JobService;
//   server/rpc/worker_service.h      WorkerService (Session in
//                                    server/rpc/session_stream.h);
//   server/rpc/rendezvous_service.h  RendezvousService;
//   server/rpc/checkpoint_service.h  CheckpointService;
//   server/checkpoint_flow.h         the transport-free checkpoint workflow
//                                    (rules, files, restore fallback).
// Each adapter's header lists its methods' errors and says which run on
// gRPC's sync API and which on the callback API.
//
//   RealClock clock;
//   std::unique_ptr<StateStore> store = NewMemoryStore();
//   Coordinator coordinator(&clock, store.get());
//   Rendezvous rendezvous(&clock);
//   auto checkpoints = CheckpointRegistry::Create(store.get(), &clock);
//   ServerOptions options;
//   options.listen_address = "127.0.0.1:0";
//   absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(
//       {&coordinator, &rendezvous, checkpoints->get(), /*metrics=*/nullptr}, options);
//   // ... clients talk to (*server)->address() ...
//   (*server)->Shutdown();
//
// Threads:
//   * Sync API (ReportError, LeaveJob, CompleteJob; every
//     JobService method but WatchJob; every CheckpointService method;
//     KvNumKeys): one
//     sync-server thread per call in flight, at most
//     ServerOptions::max_threads (beyond: RESOURCE_EXHAUSTED).
//   * Callback API (JoinJob, GetAssignment, Heartbeat; KvSet, KvGet, KvAdd,
//     KvCompareAndSet, KvWait, KvDelete, Barrier; Session; WatchJob): gRPC's own threads accept the call;
//     the body runs on a HandlerPool of 4 threads, never waiting on gRPC's
//     threads (which would stall every connection's I/O while a body waits
//     for the coordinator's lock): the fenced KV calls, the start of the
//     waiting ones and Heartbeat run on the receiving thread only when the
//     coordinator's lock is free at once (CallRunner::RunInlineOrPooled,
//     server/rpc/call.h), else on the pool. An open Session or WatchJob stream holds no
//     thread (server/rpc/session_stream.h, watch_stream.h), nor does a
//     GetAssignment that waits (server/rpc/worker_service.h), a KvGet
//     with wait, a KvWait or a Barrier arrival
//     (server/rpc/rendezvous_service.h).
//   * The Tick thread: Coordinator::Tick every tick_interval, its ended
//     generations passed on; and every kRendezvousSweepInterval
//     (SweepRendezvous) the rendezvous state of jobs that finished without
//     a GenerationEnded (COMPLETED, FAILED) is dropped, and that of jobs
//     the coordinator no longer knows is forgotten.
//
// What the server adds to the components:
//   * CoordinatorService.GetStatus (server/rpc/coordinator_service.h).
//   * ServerOptions::gate before every call and Tick.
//   * The request's limits first on every call (server/limits.h:
//     INVALID_ARGUMENT naming an over-long field), then authentication
//     (UNAUTHENTICATED / PERMISSION_DENIED), then INVALID_ARGUMENT for an
//     empty job_id, then
//     the component's answer, mapped 1:1 onto the gRPC code (ToGrpcStatus,
//     common/grpc_status.h).
//   * Every GenerationEnded the coordinator returns (CloseSession,
//     ReportError, LeaveJob, DrainWorker, a commit that grows the job, Tick)
//     is passed on outside any lock (PassOn): Rendezvous::EndGeneration
//     (DropJob instead for a job that reached a terminal phase, so that its
//     waiting calls hear the job is gone, not "re-join") and
//     CheckpointFlow::AbortPendingCheckpoint. CancelJob drops the job's
//     rendezvous state and aborts its pending checkpoint.
//   * Checkpoint files and the restore fallback: server/checkpoint_flow.h.
//     At Start, before serving, CheckpointFlow::RecoverCheckpointFiles.
//   * Waiting calls (GetAssignment with wait, KvGet with wait, KvWait,
//     Barrier) end at the earlier of the request's timeout (defaults and
//     limits per the proto) and the gRPC deadline (an alarm), or at once
//     when the caller cancels; none holds a thread while it waits.
//   * Requests and responses up to kMaxMessageBytes; larger ones are
//     RESOURCE_EXHAUSTED (gRPC's own check).
//
// Shutdown: new calls get UNAVAILABLE; the Tick thread stops; open Session
// streams end with UNAVAILABLE *without* CloseSession (the coordinator is
// going away, not the worker: after a restart the worker reconnects and
// carries on in the same generation); every blocked rendezvous call is ended
// by Rendezvous::DropJob of every job (so the Rendezvous must not outlive
// this server in use); the gRPC server then shuts down with a 2 s grace.
//
// Thread-safety: CoordinatorServer is thread-safe.
#ifndef SHARDLINE_SERVER_RPC_COORDINATOR_SERVER_H_
#define SHARDLINE_SERVER_RPC_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "metrics/metrics.h"
#include "server/checkpoint_flow.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "server/rendezvous.h"
#include "server/rpc/call.h"
#include "server/rpc/watch_stream.h"
#include "shardline/v1/replica.pb.h"
#include "spec/job_spec.h"

namespace shardline::server {

namespace rpc {
class SessionStreams;
class JobServiceImpl;
class WorkerServiceImpl;
class RendezvousServiceImpl;
class CheckpointServiceImpl;
class CoordinatorServiceImpl;
}  // namespace rpc

// The components the services adapt. Not owned; all must outlive the server.
struct ServiceDeps {
  Coordinator* coordinator = nullptr;         // required
  Rendezvous* rendezvous = nullptr;           // required
  CheckpointRegistry* checkpoints = nullptr;  // required
  metrics::Metrics* metrics = nullptr;        // optional
};

struct ServerOptions {
  // host:port; port 0 picks a free port (see CoordinatorServer::address()).
  std::string listen_address = "127.0.0.1:7070";
  // nullptr: plaintext (grpc::InsecureServerCredentials()).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Empty: no authentication (local tests only; see coordinator.proto).
  std::string admin_token;
  // How often Coordinator::Tick runs; zero or less: never (tests that tick
  // by hand).
  absl::Duration tick_interval = absl::Milliseconds(100);
  // Open WatchJob streams per job and in all (server/rpc/watch_stream.h);
  // one more is RESOURCE_EXHAUSTED.
  rpc::WatchLimits watch_limits;
  // gRPC keepalive pings from the server, so half-open connections break
  // (and their Session with them). The timeout is longer than any
  // heartbeat_timeout a job may set (spec/job_spec.h), so a process that is
  // merely stalled (SIGSTOP, swapping) is judged by its job's
  // heartbeat_timeout (HEARTBEAT_TIMEOUT), not by the keepalive.
  absl::Duration keepalive_time = absl::Seconds(5);
  absl::Duration keepalive_timeout = spec::kMaxHeartbeatTimeout + absl::Minutes(1);
  // Most threads of the sync server (one per concurrent sync-API call);
  // calls beyond get RESOURCE_EXHAUSTED.
  int max_threads = 16384;
  // Asked before every call of the four v1 services and every Tick; a
  // non-OK answer is the call's answer and the Tick is skipped (a replica
  // whose lease is not confirmed, server/replica.h); once it is OK again,
  // every member gets a fresh heartbeat clock before the next Tick
  // (Coordinator::RestartHeartbeatClocks). Null: always serve.
  std::function<absl::Status()> gate;
  // CoordinatorService.GetStatus's answer. Null: this process alone, as
  // the LEADER, with `state` as the state backend and listen address.
  std::function<v1::CoordinatorStatus()> status;
  std::string state = "memory";  // "memory", "sqlite:PATH", "etcd://..."
};

// TLS for the server from PEM files (the coordinator's --tls-cert,
// --tls-key, --tls-client-ca). `client_ca_file` non-empty: mutual TLS,
// every client must present a certificate signed by that CA. Each file is
// checked as common/tls_files.h says, and the key against the certificate,
// so that a bad file is named with its reason at start. Errors (each
// naming the flag and the file): InvalidArgument: cert_file or key_file
// empty, a file that is empty, not PEM, PEM of the wrong kind, unparsable,
// or a key that is not the certificate's; NotFound: a missing file;
// PermissionDenied / Unavailable: a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file,
    const std::string& client_ca_file);

// "HOST:PORT" of a server that listens on `listen_address` and got `port`
// (the real one when the address asked for port 0).
std::string BoundAddress(const std::string& listen_address, int port);

// The gauges of every job for Metrics (generation, members by state).
std::vector<metrics::JobSnapshot> SnapshotJobs(const Coordinator& coordinator);

// A running gRPC server. Lifecycle: Start → serving → Shutdown (or
// destruction, which shuts down).
class CoordinatorServer {
 public:
  // Recovers the checkpoint files, starts the services and the Tick thread.
  // Errors: InvalidArgument when a required dependency is missing;
  // Unavailable when the address cannot be bound (the message names it).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(ServiceDeps deps,
                                                                   ServerOptions options);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // The bound address, "HOST:PORT" with the listen address's host and the
  // real port (never 0).
  const std::string& address() const { return address_; }
  int port() const { return port_; }

  // Passes generations that ended on to the rendezvous and the checkpoint
  // flow (done by the services and the Tick thread; exposed for callers
  // that drive the coordinator directly). Logs one line per generation.
  void PassOn(const std::vector<GenerationEnded>& ended);

  // Finished-job retention (CoordinatorOptions::finished_job_retention,
  // max_finished_jobs): for each job Coordinator::FinishedJobsToPrune names,
  // drops its checkpoint records (CheckpointRegistry::ForgetJob; files on
  // disk stay), its rendezvous state, then the job (Coordinator::PruneJob).
  // A job that cannot be pruned yet (a call waits on it, a checkpoint is
  // committing) is tried again at the next call. Run by the Tick thread
  // after every Tick; returns how many jobs were pruned.
  int PruneFinishedJobs();

  // Drops the rendezvous state of every job that holds some and is
  // terminal (Rendezvous::DropJob), or is unknown to the coordinator
  // (Rendezvous::ForgetJob). The Tick thread calls it every
  // kRendezvousSweepInterval; exposed for tests.
  static constexpr absl::Duration kRendezvousSweepInterval = absl::Seconds(1);
  void SweepRendezvous();

  // The open WatchJob streams (for tests).
  const rpc::WatchStreams& watches() const { return *watches_; }

  // See the file comment. Idempotent; blocks until every handler returned.
  void Shutdown();

 private:
  explicit CoordinatorServer(ServiceDeps deps);
  void TickLoop(absl::Duration interval, std::function<absl::Status()> gate);

  const ServiceDeps deps_;
  // Declared in the order they are built; destroyed in reverse (the gRPC
  // server first, the call runner and its pool last).
  std::unique_ptr<rpc::CallRunner> calls_;
  std::unique_ptr<CheckpointFlow> flow_;
  std::unique_ptr<rpc::SessionStreams> sessions_;
  std::unique_ptr<rpc::WatchStreams> watches_;
  std::unique_ptr<rpc::JobServiceImpl> job_service_;
  std::unique_ptr<rpc::WorkerServiceImpl> worker_service_;
  std::unique_ptr<rpc::RendezvousServiceImpl> rendezvous_service_;
  std::unique_ptr<rpc::CheckpointServiceImpl> checkpoint_service_;
  std::unique_ptr<rpc::CoordinatorServiceImpl> coordinator_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_ = 0;
  google::protobuf::Timestamp start_time_;
  absl::Notification stop_tick_;
  std::thread tick_thread_;
  std::once_flag shutdown_once_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_RPC_COORDINATOR_SERVER_H_

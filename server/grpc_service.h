// The coordinator's gRPC plumbing: the four v1 services of
// proto/shardline/v1/coordinator.proto (JobService, WorkerService,
// RendezvousService, CheckpointService) as synchronous gRPC services over the
// state machine (Coordinator), the Rendezvous and the CheckpointRegistry,
// plus authentication (server/auth.h), metrics (server/metrics.h), the
// periodic Tick and the server's lifecycle.
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
// What the adapter adds to the components (coordinator.proto is the spec):
//   * Authentication first on every call (UNAUTHENTICATED / PERMISSION_DENIED),
//     then INVALID_ARGUMENT for an empty job_id, then the component's answer.
//   * Fenced rendezvous and checkpoint calls: Coordinator::CheckFence, then
//     the component with the fence's job_id and generation.
//   * Every GenerationEnded the coordinator returns (CloseSession, ReportError,
//     LeaveJob, Tick) is passed on outside any lock: Rendezvous::EndGeneration
//     and CheckpointRegistry::AbortPending (an aborted checkpoint is then
//     noted with Coordinator::NoteCheckpointAborted). CancelJob drops the
//     job's rendezvous state and aborts its pending checkpoint.
//   * A committed checkpoint (ReportShard or CommitCheckpoint) is noted with
//     Coordinator::NoteCheckpointCommitted (the next generation's restore
//     point).
//   * Checkpoint files (server/checkpoint_files.h), under the job's
//     checkpoint root spec.checkpoint.directory. Order at commit: the
//     registry makes the manifest durable in the store (and runs its
//     verify_files hook, which main.cc sets to VerifyShardFiles), then the
//     committing ReportShard writes <checkpoint dir>/manifest.json
//     atomically, then moves <root>/LATEST (only while the registry still
//     names that checkpoint the newest), then deletes the directories of the
//     checkpoints retention expired — all before it answers COMMITTED. If a
//     file write fails the checkpoint is still committed (the store decides;
//     GetManifest and Assignment.restore serve it): the failure is logged,
//     LATEST stays where it was and expired directories are kept (LATEST may
//     name one); the next start repairs manifest.json and LATEST.
//     Every abort (AbortCheckpoint, a failed commit, CommitCheckpoint with
//     ranks missing, a generation ending, CancelJob) deletes the aborted
//     checkpoint's directory. At Start, before serving, the directories of
//     every ABORTED checkpoint are deleted (so a save that was PENDING when
//     the previous coordinator died leaves nothing) and manifest.json /
//     LATEST of each job's newest committed checkpoint are rewritten when
//     missing or behind. Nothing outside the root is ever deleted
//     (RemoveCheckpointDirectory refuses it). Two jobs must not share a
//     checkpoint root (ids are unique per job only).
//     A checkpoint a restore found corrupt (a DATA_LOSS ReportError) is
//     marked unusable by the coordinator's fallback in the registry, the
//     marks' only owner (server/unusable_marks.h), and LATEST moves back to
//     the newest usable committed checkpoint at once (or is removed when
//     none is left); ListCheckpoints and GetManifest carry the mark's
//     reason (unusable_reason).
//   * Blocking calls (GetAssignment with wait, KvGet with wait, KvWait,
//     Barrier) end at the earlier of the request's timeout (defaults and
//     limits per the proto) and the gRPC deadline. GetAssignment, KvGet and
//     KvWait wait in slices of at most kWaitSlice, so a cancelled caller or
//     a shutdown frees their thread promptly.
//   * Session runs on gRPC's callback API, so an open stream holds no
//     thread: OpenSession with a waker; each queued message wakes a pool
//     thread, which pulls it (NextSessionMessage, no wait) and starts the
//     write, one write in flight per stream. A cancelled stream (the client
//     went away, noticed when gRPC reports it, not polled) or a failed write
//     calls CloseSession (the worker is LOST at once). A second Session of
//     the same incarnation replaces the open one, which ends ABORTED. The
//     stream ends OK after a STOP directive or once the member has LEFT, and
//     UNAVAILABLE at once when the server shuts down (no one declared lost).
//   * Heartbeat, KvSet, KvAdd, KvCompareAndSet, KvDelete and KvGet without
//     wait also run on the callback API, their bodies on a pool of 4 threads
//     (never on gRPC's own threads, which would stall every connection's I/O
//     while a body waits for the coordinator's lock); a KvGet that waits
//     gets a thread of its own. The other RPCs use the sync server.
//   * WatchJob: replay, then WaitEvents in rounds of poll_interval; ends OK
//     after the PhaseChanged to a terminal phase. OUT_OF_RANGE for an
//     after_sequence outside [oldest retained - 1, newest];
//     RESOURCE_EXHAUSTED when events the watcher had not received yet were
//     dropped from the coordinator's retention (reconnect with
//     after_sequence = last received).
//   * Without an admin token, CreateJob returns an empty worker_token.
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
// Errors: every RPC answers with the absl::Status of the component mapped
// 1:1 onto the gRPC code (ToGrpcStatus), plus the codes above.
//
// Thread-safety: CoordinatorServer is thread-safe. Handlers run on gRPC's
// sync-server threads (one per in-flight call; an open Session holds one).
#ifndef SHARDLINE_SERVER_GRPC_SERVICE_H_
#define SHARDLINE_SERVER_GRPC_SERVICE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "server/checkpoint_registry.h"
#include "server/coordinator.h"
#include "spec/job_spec.h"
#include "metrics/metrics.h"
#include "server/rendezvous.h"

namespace shardline::server {

// coordinator.proto kMaxMessageBytes: largest request or response (bytes).
inline constexpr int kMaxMessageBytes = 64 * 1024 * 1024;
// GetAssignmentRequest.timeout: default and maximum.
inline constexpr absl::Duration kDefaultAssignmentTimeout = absl::Minutes(5);
inline constexpr absl::Duration kMaxAssignmentTimeout = absl::Hours(1);
// Longest single wait inside a sliced blocking call (see the file comment).
inline constexpr absl::Duration kWaitSlice = absl::Milliseconds(500);

// The components the services adapt. Not owned; all must outlive the server.
struct ServiceDeps {
  Coordinator* coordinator = nullptr;         // required
  Rendezvous* rendezvous = nullptr;           // required
  CheckpointRegistry* checkpoints = nullptr;  // required
  metrics::Metrics* metrics = nullptr;                 // optional
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
  // One round of the WatchJob loop (how fast a cancelled watcher is
  // noticed).
  absl::Duration poll_interval = absl::Milliseconds(100);
  // gRPC keepalive pings from the server, so half-open connections break
  // (and their Session with them). The timeout is longer than any
  // heartbeat_timeout a job may set (job_spec.h), so a process that is
  // merely stalled (SIGSTOP, swapping) is judged by its job's
  // heartbeat_timeout (HEARTBEAT_TIMEOUT), not by the keepalive.
  absl::Duration keepalive_time = absl::Seconds(5);
  absl::Duration keepalive_timeout = spec::kMaxHeartbeatTimeout + absl::Minutes(1);
  // Most threads of the sync server (one per concurrent call, blocking
  // waits included); calls beyond get RESOURCE_EXHAUSTED.
  int max_threads = 16384;
  // Most KvGet calls waiting for a key at once (each holds a thread);
  // beyond, KvGet with wait is RESOURCE_EXHAUSTED at once.
  int max_waiting_gets = 4096;
};

// TLS for the server from PEM files. `client_ca_file` non-empty: mutual TLS,
// every client must present a certificate signed by that CA. Errors:
// InvalidArgument: cert_file or key_file empty; NotFound / Unavailable when a
// file cannot be read (names it).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file,
    const std::string& client_ca_file);

// The gauges of every job for Metrics (generation, members by state).
std::vector<metrics::JobSnapshot> SnapshotJobs(const Coordinator& coordinator);

class Services;  // grpc_service.cc

// A running gRPC server. Lifecycle: Start → serving → Shutdown (or
// destruction, which shuts down).
class CoordinatorServer {
 public:
  // Starts the services and the Tick thread. Errors: InvalidArgument when a
  // required dependency is missing; Unavailable when the address cannot be
  // bound (the message names it).
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
  // registry (done by the services and the Tick thread; exposed for callers
  // that drive the coordinator directly).
  void PassOn(const std::vector<GenerationEnded>& ended);

  // See the file comment. Idempotent; blocks until every handler returned.
  void Shutdown();

 private:
  CoordinatorServer() = default;
  void TickLoop(absl::Duration interval);

  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_ = 0;
  absl::Notification stop_tick_;
  std::thread tick_thread_;
  std::once_flag shutdown_once_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_GRPC_SERVICE_H_

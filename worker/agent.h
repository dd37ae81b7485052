// WorkerAgent: a worker process's mirror of its membership in one job. It
// joins, keeps the Session stream open on its own thread, heartbeats on
// another, and turns everything the coordinator says into an assignment to
// wait for and a queue of directives.
//
//   WorkerAgentOptions options;  // connection, job_id, worker_id, device...
//   RealClock clock;
//   absl::StatusOr<std::unique_ptr<WorkerAgent>> agent = WorkerAgent::Create(
//       options, *client::ConnectCoordinator(options.connection), &clock);
//   absl::Status s = (*agent)->Connect();          // JoinJob + Session + heartbeats
//   absl::StatusOr<v1::Assignment> a = (*agent)->WaitForAssignment(absl::Minutes(5));
//   ... build communicators under (*agent)->fence() ...
//   std::optional<v1::Directive> d = (*agent)->NextDirective(absl::Seconds(1));
//
// Lifecycle (the coordinator's view of this incarnation in brackets):
//
//   Create --Connect--> joined [JOINING] --assignment--> running [ACTIVE|SPARE]
//                          ^                                   |
//                          |   RESTART_AT_GENERATION (stream) or ABORTED
//                          |   (heartbeat, GetAssignment, ReportError)
//                          |                                   v
//                          +-- JoinJob, same incarnation -- generation over [FENCED]
//   any --Leave--> left [LEFT]          any --destroy--> stream breaks [LOST]
//
// When a generation ends the agent (1) marks it over (generation_over()) and
// cancels its GenerationToken (calls still blocked in that generation's
// rendezvous end at once), (2) queues a RESTART_AT_GENERATION directive and calls the directive
// callback, so the process can abort its communicators, (3) re-joins the new
// generation with the same incarnation, after which WaitForAssignment returns
// the new generation's assignment. A directive synthesized from ABORTED names
// generation old+1 (a lower bound; the real one is generation() after the
// re-join).
//
// Directives: RESTART_AT_GENERATION, CHECKPOINT and STOP are queued once each
// as they arrive (CONTINUE, the heartbeat's usual answer, is not queued).
// The callback, if set, runs on an agent thread with no agent lock held;
// callbacks are serialized, so it must not block for long (abort and return).
// A terminal job (FAILED_PRECONDITION, or STOP) is delivered as STOP once.
//
// Destroying the agent without Leave() closes its stream like a dying
// process: the coordinator declares it LOST at once.
//
// Seams: the agent talks to the coordinator only through a
// client::WorkerClient (client/worker_client.h) and waits only on its Clock
// (common/clock.h), so its unit tests run on testing/fake_worker_client.h
// and a FakeClock. It hands its rendezvous and checkpoint clients and its
// clock to the worker's stores and checkpointer (rendezvous(),
// checkpoints(), clock()).
//
// Retries: UNAVAILABLE answers (JoinJob, GetAssignment) and a broken Session
// stream are retried with jittered exponential backoff (options.backoff,
// common/backoff.h), so the workers of a job do not all come back in
// lockstep after a coordinator restart.
//
// Thread-safety: thread-safe. One mutex guards the state; no RPC and no
// callback runs while it is held.
#ifndef SHARDLINE_WORKER_AGENT_H_
#define SHARDLINE_WORKER_AGENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/coordinator_client.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::worker {

namespace v1 = ::shardline::v1;

struct WorkerAgentOptions {
  // Where the coordinator is (named in messages) and the deadline of each
  // short call (a heartbeat's deadline is at least its interval and at most
  // half the job's heartbeat_timeout). The clients given to the agent are
  // built from the same options.
  client::ConnectionOptions connection;
  std::string job_id;
  // Stable slot name, e.g. "node3:cuda:1"; 1..128 printable ASCII bytes.
  std::string worker_id;
  // 0: a random non-zero 64-bit number, new for every agent (process start).
  uint64_t incarnation = 0;
  // Host name for listings; empty: gethostname().
  std::string host;
  // "cpu" or "cuda:<n>".
  std::string device = "cpu";
  // UNSPECIFIED lets the coordinator pick from the device.
  v1::Backend backend = v1::BACKEND_UNSPECIFIED;
  // How long Connect keeps retrying an unreachable coordinator.
  absl::Duration connect_timeout = absl::Seconds(10);
  // False: no heartbeats (tests simulating a hung worker).
  bool send_heartbeats = true;
  // Retries of UNAVAILABLE and of a broken Session stream: 100 ms doubling
  // to 2 s, half of each delay random.
  BackoffOptions backoff;
  // Where the agent says that the coordinator stopped accepting heartbeats
  // (the first failure of a run of them, with its status) and that it
  // accepts them again (how many failed, over how long): one line each, so
  // a worker declared lost shows whether its heartbeats were sent and what
  // they met. Called on the heartbeat thread; empty: not said.
  std::function<void(absl::string_view)> log;
};


// A random non-zero 64-bit incarnation.
uint64_t RandomIncarnation();

// Start the reason of the STOP the agent delivers itself when the
// coordinator no longer knows the job it joined, e.g. it was restarted on
// another --state file: it refuses the job's worker token (UNAUTHENTICATED
// or PERMISSION_DENIED on a heartbeat), or, with the admin token or no
// auth, answers a re-join with NOT_FOUND. Both start with kRefusedPrefix;
// the worker exits 1 on it.
inline constexpr char kRefusedPrefix[] = "refused: ";
inline constexpr char kTokenRefusedPrefix[] = "refused: the coordinator no longer accepts this "
                                              "worker's token (was it restarted on another "
                                              "--state file?): ";
inline constexpr char kJobUnknownPrefix[] = "refused: the coordinator no longer knows this job "
                                            "(was it restarted on another --state file?): ";

class WorkerAgent {
 public:
  using DirectiveCallback = std::function<void(const v1::Directive&)>;
  // What the rank's heartbeats of `generation` report (progress.proto
  // RankProgress): the training thread's activity, its communicators'
  // operations, the latest step's timing.
  using ProgressSource = std::function<v1::RankProgress(uint64_t generation)>;

  // Checks the options and makes an agent (nothing is sent before
  // Connect). `clients.workers` is the agent's own; `clients.rendezvous` and
  // `clients.checkpoints` are only handed out (rendezvous(), checkpoints())
  // and may be null when unused; `clock` is not owned and must outlive the
  // agent. InvalidArgument: job_id or worker_id empty, no workers client.
  static absl::StatusOr<std::unique_ptr<WorkerAgent>> Create(WorkerAgentOptions options,
                                                             client::CoordinatorClients clients,
                                                             const Clock* clock);
  WorkerAgent(WorkerAgentOptions options, client::CoordinatorClients clients,
              const Clock* clock);
  ~WorkerAgent();  // Stops the threads; does not Leave (the stream breaks).

  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  // Joins the job, opens the Session stream (waits for SessionOpened) and
  // starts heartbeating. Possible errors:
  //   Unavailable: the coordinator could not be reached within
  //     connect_timeout (the message names the address and --coordinator /
  //     SHARDLINE_COORDINATOR).
  //   NotFound: no such job (names it and --job).
  //   Unauthenticated / PermissionDenied: the token is missing or wrong
  //     (names --token / SHARDLINE_TOKEN).
  //   InvalidArgument: worker_id, device or backend refused (coordinator's
  //     message).
  //   FailedPrecondition: the job is finished, or the backend differs from
  //     the job's other workers; also when called twice.
  absl::Status Connect() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns this worker's assignment for the current generation, waiting for
  // it to form; across a generation change it waits for the re-join and
  // returns the new generation's. Possible errors:
  //   DeadlineExceeded: no assignment within `timeout`.
  //   FailedPrecondition: not connected, left, or the job stopped (STOP).
  //   Unauthenticated, PermissionDenied, NotFound: as for Connect.
  absl::StatusOr<v1::Assignment> WaitForAssignment(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // The fence to put in every call: (job, worker_id, incarnation,
  // generation()).
  v1::Fence fence() const ABSL_LOCKS_EXCLUDED(mu_);
  // The generation this worker belongs to (its latest JoinJob's).
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // True from the moment the current generation is known to be over until
  // the re-join succeeds.
  bool generation_over() const ABSL_LOCKS_EXCLUDED(mu_);
  // True once STOP was delivered (or the job is terminal).
  bool stopped() const ABSL_LOCKS_EXCLUDED(mu_);
  // The token of `generation`: cancelled the moment this agent learns that
  // generation is over (RESTART_AT_GENERATION, an ABORTED answer, its
  // session declared lost, STOP, Leave, destruction), before the directive
  // callback runs. Already cancelled when `generation` is not the current,
  // live one. Give it to Communicators::Build so a build blocked in the
  // rendezvous returns Aborted at once.
  std::shared_ptr<client::CancelToken> GenerationToken(uint64_t generation)
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t incarnation() const { return incarnation_; }
  const std::string& worker_id() const { return options_.worker_id; }
  const std::string& job_id() const { return options_.job_id; }
  // The job spec from the latest JoinJob (heartbeat interval, timeouts...).
  v1::JobSpec spec() const ABSL_LOCKS_EXCLUDED(mu_);
  // For the worker's stores and checkpointer: the clients of the same
  // coordinator given at construction, and the agent's clock.
  const std::shared_ptr<client::RendezvousClient>& rendezvous() const {
    return clients_.rendezvous;
  }
  const std::shared_ptr<client::CheckpointClient>& checkpoints() const {
    return clients_.checkpoints;
  }
  const Clock* clock() const { return clock_; }
  const client::ConnectionOptions& connection() const { return options_.connection; }

  // The next queued directive, waiting up to `timeout`; nullopt if none.
  std::optional<v1::Directive> NextDirective(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Called for every queued directive (see the file comment). Set before
  // Connect; nullptr clears it.
  void SetDirectiveCallback(DirectiveCallback callback) ABSL_LOCKS_EXCLUDED(mu_);

  // What the next heartbeats report: optimizer steps done and what the
  // worker is doing. This is the one place a worker's activity is reported:
  // the daemon sets WAITING (no assignment yet, or a spare),
  // BUILDING_COMMUNICATORS, then READY once its communicators are built and
  // checked; the trainer, when it runs steps, sets TRAINING (CHECKPOINTING,
  // RESTORING, DONE likewise). Report only what is true: the coordinator
  // shows it in ListMembers, and counts READY and later states as the
  // worker having succeeded in its generation (see Coordinator::
  // kMaxConsecutiveErrorGenerations). A change of state is heartbeated at
  // once rather than at the next interval.
  void SetProgress(uint64_t step, v1::WorkerState state) ABSL_LOCKS_EXCLUDED(mu_);
  // The numbers the next heartbeats carry (the latest step's loss and
  // throughput); the coordinator turns them into StepProgress events.
  void SetMetrics(const v1::StepMetrics& metrics) ABSL_LOCKS_EXCLUDED(mu_);

  // The source of every heartbeat's progress report (HeartbeatRequest.
  // progress). The heartbeat thread calls it when it builds a heartbeat,
  // with no agent lock held, and only while this worker holds a rank: it
  // has the current generation's assignment and that assignment is not a
  // spare's (a spare, a worker waiting for its assignment or re-joining
  // sends no progress). It must be cheap and must not call into the agent.
  // Progress reports ride on the heartbeats the interval and SetProgress's
  // state changes send: a change of activity sends none. Set before Connect
  // (or any time); nullptr clears it.
  void SetProgressSource(ProgressSource source) ABSL_LOCKS_EXCLUDED(mu_);

  // Reports a failure this worker saw (ReportError) and returns the
  // coordinator's directive (RESTART_AT_GENERATION, or STOP); the generation
  // is then over as above. `code` must not be OK. `generation`: the one the
  // failure happened in (default: the current one); a report for a
  // generation that has already ended is refused by the coordinator
  // (Aborted) instead of ending the next one. Possible errors:
  //   Aborted: the generation had already ended (handled as a restart).
  //   FailedPrecondition: this worker is a spare or not assigned.
  //   InvalidArgument: peer_rank >= world_size.
  absl::StatusOr<v1::Directive> ReportError(absl::StatusCode code, const std::string& message,
                                            const std::string& operation,
                                            std::optional<uint32_t> peer_rank,
                                            std::optional<uint64_t> generation = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Leaves the job for good and stops the threads. Harmless twice. Errors:
  // Unavailable when the coordinator could not be told (the stream is then
  // closed anyway, so it sees this worker as lost).
  absl::Status Leave(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A client's error, with the hint to check --job for the coordinator's
  // "no job" NotFound.
  absl::Status WithJobHint(absl::Status status) const;

  // JoinJob until success, a non-retryable error or `deadline` (UNAVAILABLE
  // is retried with backoff). On success records generation and spec.
  absl::StatusOr<v1::JoinJobResponse> JoinWithRetry(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  void SessionLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void HandleDirective(const v1::Directive& d) ABSL_LOCKS_EXCLUDED(mu_);

  // The generation `old_generation` is over: mark it, deliver `directive`,
  // re-join. No-op when it is not the current one or is already over.
  void EndGeneration(uint64_t old_generation, const v1::Directive& directive)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Delivers STOP (once): queue + callback.
  void DeliverStop(const std::string& reason, v1::JobPhase phase) ABSL_LOCKS_EXCLUDED(mu_);
  // Delivers the STOP of a coordinator that no longer knows this worker's
  // job (kTokenRefusedPrefix for UNAUTHENTICATED / PERMISSION_DENIED,
  // kJobUnknownPrefix for NOT_FOUND when `not_found_means_unknown_job`)
  // and returns true; false for any other status.
  bool StopIfJobForgotten(const absl::Status& status, bool not_found_means_unknown_job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `d` and calls the callback, outside mu_.
  void Deliver(const v1::Directive& d) ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);

  // Cancels the current generation's token (outside mu_).
  void CancelGenerationToken(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Sleeps up to `d`, returning early (true) when stopping.
  bool SleepUnlessStopping(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  v1::Fence FenceLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopThreads() ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerAgentOptions options_;
  const uint64_t incarnation_;
  const client::CoordinatorClients clients_;
  client::WorkerClient* const workers_;  // clients_.workers
  const Clock* const clock_;

  // Serializes directive callbacks: held while one runs, never while
  // taking it with mu_ held (a callback may call into the agent).
  absl::Mutex callback_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // threads must exit
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // STOP delivered
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool generation_over_ ABSL_GUARDED_BY(mu_) = false;
  // Token of generation_ (null until asked for); see GenerationToken.
  std::shared_ptr<client::CancelToken> generation_token_ ABSL_GUARDED_BY(mu_);
  v1::JobSpec spec_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  v1::WorkerState state_ ABSL_GUARDED_BY(mu_) = v1::WORKER_STATE_WAITING;
  std::optional<v1::StepMetrics> metrics_ ABSL_GUARDED_BY(mu_);
  // SetProgress changed the state: the heartbeat thread sends one now.
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_checkpoint_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::Directive> directives_ ABSL_GUARDED_BY(mu_);
  DirectiveCallback callback_ ABSL_GUARDED_BY(mu_);
  ProgressSource progress_source_ ABSL_GUARDED_BY(mu_);
  // Session stream: the open stream (to cancel it), and whether
  // SessionOpened arrived / the first attempt failed.
  client::SessionStream* session_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool session_opened_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> session_first_error_ ABSL_GUARDED_BY(mu_);

  std::thread session_thread_;
  std::thread heartbeat_thread_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_AGENT_H_

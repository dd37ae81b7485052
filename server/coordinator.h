// The coordinator's state machine: jobs, membership, generations and
// fencing, failure detection, assignments. No gRPC in it (server/rpc/
// adapts it); requests and answers are v1 API messages. Rendezvous and
// checkpoint state live in their own components; this class validates the
// fence, then the adapter calls them.
//
//   FakeClock clock;
//   std::unique_ptr<StateStore> store = NewMemoryStore();
//   Coordinator coordinator(&clock, store.get(), CoordinatorOptions{});
//   coordinator.CreateJob(request);            // PENDING at generation 1
//   coordinator.JoinJob(join);                 // JOINING
//   ... min_workers joined and (max_workers joined or last_call passed) ...
//   coordinator.Tick();                        // RUNNING(1), assignments out
//
// Job phases (docs/ARCHITECTURE.md "Coordinator state machine"):
//
//   PENDING --min workers--> RUNNING(g) --lost/left/error/grow--> RECOVERING(g+1)
//      |                        |    ^                                 |
//      |                        |    +-------- re-formed --------------+
//      +--cancel--> CANCELLED <-+--> COMPLETED (every rank DONE;   FAILED (below
//                                      external: CompleteJob, or   min_workers past
//                                      every rank left)            join_timeout)
//
// "grow": a checkpoint committed while spares make a larger world fit
// (NoteCheckpointCommitted), or, in an external job, a join below
// max_workers (JoinJob); "lost/left/error": a rank was lost, left (not in
// an external job) or reported an error (failure detection below).
//
// Member states are v1::MemberState (JOINING, ACTIVE, SPARE, FENCED, LOST,
// LEFT). When a generation ends every ACTIVE and SPARE member becomes FENCED
// and is told RESTART_AT_GENERATION; it re-joins with JoinJob (same
// incarnation) and waits for the new assignment.
//
// Failure detection, three ways: CloseSession (the worker's Session stream
// broke: noticed at once), Tick() finding no heartbeat for heartbeat_timeout
// (hangs, partitions, SIGSTOP), and ReportError from a worker.
// A worker whose error reports keep ending generations is excluded after
// kMaxConsecutiveErrorGenerations of them (see there), so that one broken
// worker (e.g. it cannot bind its interface) cannot re-form the job forever.
//
// Durability: every change of a job, a member or a generation is written to
// the StateStore before the call returns; heartbeats are not (a restarted
// coordinator gives every member a fresh heartbeat clock). After a restart
// (Recover), workers reconnect their sessions and carry on in the same
// generation when nothing else changed.
//
// Thread-safety: thread-safe. One mutex (mu_) guards all state. While it is
// held the coordinator writes to the StateStore (so that the store sees the
// changes in the order they are made), reads the Clock, logs to stderr and
// runs session wakers (see OpenSession); it never calls the rendezvous or
// checkpoint components or gRPC: the adapter does that after the call
// returns (GenerationEnded). The blocking calls (WaitEvents, GetAssignment,
// NextSessionMessage) release it while they wait; Recover reads the store
// before taking it.
//
// Layout: the class is defined across coordinator.cc (core, JobService,
// checkpoint notes), coordinator_formation.cc, coordinator_membership.cc,
// coordinator_failure.cc, coordinator_worker.cc and
// coordinator_persistence.cc; its records (coordinator_records.h) hold an
// EventLog (event_log.h) per job and a SessionOutbox (session_outbox.h) per
// member, and formation.h decides who gets which rank.
#ifndef SHARDLINE_SERVER_COORDINATOR_H_
#define SHARDLINE_SERVER_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/auth.h"
#include "server/progress_monitor.h"
#include "server/state_store.h"
#include "server/unusable_marks.h"
#include "shardline/v1/events.pb.h"
#include "shardline/v1/job.pb.h"
#include "shardline/v1/plan.pb.h"
#include "shardline/v1/session.pb.h"
#include "shardline/v1/whatif.pb.h"

namespace shardline::server {

struct CoordinatorOptions {
  // Unfinished (not COMPLETED, FAILED or CANCELLED) jobs at once.
  int max_jobs = 1024;
  // Events kept per job for WatchJob replays.
  int max_events_per_job = 10000;
  // Longest wait any blocking call accepts.
  absl::Duration max_wait = absl::Hours(1);
  // Finished-job retention (FinishedJobsToPrune): a COMPLETED, FAILED or
  // CANCELLED job is forgotten once its last change (Job.update_time) is
  // older than this (<= 0: never for its age), and the oldest finished jobs
  // beyond max_finished_jobs are forgotten at once (<= 0: no cap).
  absl::Duration finished_job_retention = absl::Hours(7 * 24);
  int max_finished_jobs = 1000;
};

// Which credential a JoinJob came with (the adapter's Principal).
enum class JoinedBy {
  kTrusted,      // the admin token, or authentication off
  kJobToken,     // the job's worker token: may join only a new incarnation
  kMemberToken,  // the member token of the joining incarnation itself
};

// What a valid fence resolves to.
struct FencedWorker {
  std::string job_id;
  std::string worker_id;
  uint64_t incarnation = 0;
  uint64_t generation = 0;
  bool active = false;     // has a rank (else a spare or still joining)
  int rank = -1;           // when active
  int world_size = 0;      // of the generation, once formed
};

// Something that happens to the job's workers or checkpoints when a
// generation ends; the adapter passes these to the rendezvous and checkpoint
// components (outside the coordinator's lock).
struct GenerationEnded {
  std::string job_id;
  uint64_t generation = 0;  // the generation that ended
  std::string reason;
};

// FailedPrecondition "job <id> is an external job (spec.external): it has no
// plan; ..." : GetPlan's, GetShardOwner's and BeginCheckpoint's answer for
// an external job (job.proto ExternalWorkload).
absl::Status NoPlanOfExternalJob(const std::string& job_id);

class Coordinator {
 public:
  // A worker incarnation whose own ReportError ends this many consecutive
  // generations of its job, with no success in between, is excluded: it
  // becomes LOST (LOSS_REASON_REPEATED_ERRORS, the detail names its last
  // error), the job re-forms without it, and its JoinJob answers
  // FailedPrecondition (a new process of the slot may join). If the others
  // cannot form a generation the job FAILS at once, naming the worker and
  // its error. "Success" is a heartbeat from the worker, ACTIVE in its
  // generation, reporting a step beyond the one the generation started from
  // (it trained): it resets the count. Earlier states (READY, RESTORING)
  // do not, since what fails every time may come after them. In an external
  // job (no steps of its own to judge by) any heartbeat of the rank in its
  // generation counts as success.
  // Generations that end for another reason neither count nor reset.
  static constexpr int kMaxConsecutiveErrorGenerations = 3;

  // `clock` and `store` are not owned and must outlive the coordinator.
  Coordinator(Clock* clock, StateStore* store, CoordinatorOptions options = {});
  ~Coordinator();

  // Loads every job and member from the store (after a restart). Members
  // keep their states and ranks; each gets a fresh heartbeat clock and no
  // open session. A state file of an older version that holds plain-text
  // worker tokens (records of kind "token") is migrated: each becomes its
  // SHA-256 ("token_sha256") and the plain text is deleted, in one write.
  // Errors: Unavailable / DataLoss from the store.
  absl::Status Recover();

  // Gives every member a fresh heartbeat clock, as Recover does: for a
  // coordinator replica that could not serve for a while (its lease was not
  // confirmed, server/replica.h), during which the workers' heartbeats were
  // refused, not missing.
  void RestartHeartbeatClocks();

  // Credentials (server/auth.h). The coordinator stores only SHA-256 hashes
  // of worker tokens and member tokens. UseCredentials registers every
  // job's and member's hash with `auth` (not owned; null detaches) and keeps
  // it up to date from then on: CreateJob registers the new job's token,
  // JoinJob of a new incarnation its member token. While `auth` is attached
  // and enabled, JoinJob issues member tokens. Called with this
  // coordinator's lock held, `auth` never calls back (lock order:
  // coordinator, then Authenticator). Call it before serving and detach
  // before `auth` is destroyed.
  void UseCredentials(Authenticator* auth);

  // --- JobService --------------------------------------------------------

  // Creates a job in PENDING at generation 1 and a fresh worker token
  // (returned once: only its hash is kept). An empty job_id gets a fresh
  // "job-<8 hex digits>".
  // InvalidArgument: malformed job_id (1..63 of [a-z0-9-], starting with a
  //   letter, not ending with '-') or spec (ResolveJobSpec's message names the field).
  // AlreadyExists: job_id exists with another spec (same spec: returns it,
  //   with an empty worker_token: the token is shown only at creation).
  // ResourceExhausted: max_jobs unfinished jobs exist.
  absl::StatusOr<v1::CreateJobResponse> CreateJob(const v1::CreateJobRequest& request);
  // NotFound: no such job.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) const;
  // job.proto ListJobsRequest: newest create_time first; page_size 0 means
  // 50, above 1000 means 1000. InvalidArgument: a malformed page_token, or
  // one from a call with other phases.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) const;
  // Moves the job to CANCELLED (idempotent); every worker gets STOP.
  // InvalidArgument: reason over 1024 bytes or with control characters.
  // NotFound. FailedPrecondition: already COMPLETED or FAILED.
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request);
  absl::StatusOr<v1::ListMembersResponse> ListMembers(const std::string& job_id) const;
  // How many hangs the coordinator found in the job (HangDetected events,
  // all generations) since this process started: the metrics' counter
  // shardline_job_hangs_detected_total. NotFound: no such job.
  absl::StatusOr<uint64_t> HangsDetected(const std::string& job_id) const;
  // The plan of the current generation. FailedPrecondition: not formed yet,
  // or an external job (NoPlanOfExternalJob: it never has one).
  absl::StatusOr<v1::Plan> GetPlan(const std::string& job_id) const;
  // NotFound: job or parameter. InvalidArgument: element outside the tensor.
  // FailedPrecondition: no generation formed yet; an external job.
  absl::StatusOr<v1::GetShardOwnerResponse> GetShardOwner(
      const v1::GetShardOwnerRequest& request) const;
  // What losing request.lose_worker_ids at once would do (whatif.proto),
  // changing nothing (coordinator_whatif.cc). Predicted by the rules a real
  // loss goes through: a loss ends the generation only when the worker is
  // ACTIVE in a RUNNING job (LoseMemberLocked); every other member that the
  // end fences (ACTIVE, SPARE, JOINING) is taken to re-join, as a healthy
  // worker does at once, and FormWorld (formation.h) forms the next
  // generation of them with the ranks they carry (survivors keep their
  // order, then spares by join time); the next generation restores
  // job.last_checkpoint. Losses of a worker that is not live (LOST, LEFT)
  // change nothing. Not predicted: workers that would join meanwhile, or a
  // survivor too slow to re-join before the last call.
  // InvalidArgument: lose_worker_ids empty, or naming a worker twice (the
  //   count, kMaxWhatIfWorkers, is the adapter's check: server/limits.h).
  // NotFound: no job, or a worker_id that never joined it (named).
  // FailedPrecondition: the job is COMPLETED, FAILED or CANCELLED; an
  //   external job (no plan to re-form by); no generation formed yet
  //   (PENDING, or RECOVERING: ask again once it is RUNNING).
  absl::StatusOr<v1::WhatIfResponse> WhatIf(const v1::WhatIfRequest& request) const;
  // Events with sequence > after_sequence (all kept ones when unset), waiting
  // until `deadline` for at least one. Returns an empty list at the deadline.
  // NotFound.
  absl::StatusOr<std::vector<v1::JobEvent>> WaitEvents(const std::string& job_id,
                                                       std::optional<uint64_t> after_sequence,
                                                       absl::Time deadline) const;
  // Calls `waker` after every event appended to `job_id`'s log until
  // RemoveEventWaker (WatchJob streams, server/rpc/watch_stream.h: woken,
  // not polling). It runs with the coordinator's lock held, like a
  // SessionWaker: quick, no blocking, no calls into the Coordinator.
  // NotFound: no such job.
  absl::StatusOr<uint64_t> AddEventWaker(const std::string& job_id, std::function<void()> waker);
  // Idempotent; an unknown job or id is ignored.
  void RemoveEventWaker(const std::string& job_id, uint64_t id);

  // SHA-256 (hex) of the job's worker token. NotFound.
  absl::StatusOr<std::string> WorkerTokenHash(const std::string& job_id) const;

  // --- WorkerService -----------------------------------------------------

  // Joins (or re-joins) the job's current generation.
  // InvalidArgument: empty worker_id, incarnation 0, bad device.
  // NotFound: no job. FailedPrecondition: job COMPLETED, FAILED or
  //   CANCELLED, or a backend different from the job's other workers.
  // A new incarnation of a worker_id replaces the old one, which is fenced
  // off (its calls fail with Aborted); if the old one held a rank, the
  // generation ends (returned by the next Tick()). A repeated join of the
  // current generation by the same incarnation changes nothing. A worker
  // joining a RUNNING job becomes a SPARE of the current generation (the job
  // grows at the next committed checkpoint, see NoteCheckpointCommitted),
  // except in an external job whose world_size is below max_workers: the
  // generation ends at once (FORMATION_REASON_GROW, "grow: '<worker>'
  // joined; world N -> N+1", returned by the next Tick()) and the worker is
  // JOINING in the next one.
  // Unavailable: the join could not be recorded in the state store.
  // Credentials (`by`, see UseCredentials): a new incarnation joining with
  // the job token gets a fresh member_token in the response (only its hash
  // is kept, persisted with the member; one joining with the admin token
  // gets none); a re-join of the same incarnation keeps it and the
  // response's member_token is empty (unless the incarnation has none and
  // `by` is kJobToken: an earlier join by the admin, or one not recorded).
  // PermissionDenied: `by` is kJobToken and this incarnation already joined
  // and holds a member token (re-join with it).
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& request,
                                              JoinedBy by = JoinedBy::kTrusted);

  // Opens the worker's Session stream; returns a session id for
  // NextSessionMessage and CloseSession. The first message queued is
  // SessionOpened, then the current assignment if one exists. A new session
  // replaces an older one of the same incarnation (the old one ends).
  // NotFound: unknown job or worker. Aborted: the incarnation was replaced or
  //   is LOST/LEFT (re-join with JoinJob first).
  //
  // `waker`, if set, is called whenever NextSessionMessage would return
  // something new for this session: a message was queued, or the session
  // was replaced or closed. It lets an asynchronous stream (no thread per
  // session) pull with a past deadline instead of waiting. It runs with the
  // coordinator's lock held, on whatever thread changed the session: it must
  // be quick, must not block and must not call the Coordinator (hand the
  // work to another thread). It is dropped when the session ends.
  using SessionWaker = std::function<void()>;
  absl::StatusOr<uint64_t> OpenSession(const v1::WorkerIdentity& worker,
                                       SessionWaker waker = nullptr);
  // The next message for the session, waiting until `deadline` (a past
  // deadline does not wait); nullopt at the deadline. Aborted: the session
  // was replaced or closed, or the member is gone; the stream should end.
  absl::StatusOr<std::optional<v1::SessionMessage>> NextSessionMessage(
      const v1::WorkerIdentity& worker, uint64_t session_id, absl::Time deadline);
  // The stream broke (client gone): if `session_id` is the member's current
  // session and it is live, it is LOST (STREAM_BROKEN) at once. Ended
  // generations are returned for the adapter to pass on.
  std::vector<GenerationEnded> CloseSession(const v1::WorkerIdentity& worker,
                                            uint64_t session_id);

  // Validates a fence (see coordinator.proto "Fencing"). Counts as a sign of
  // life for the member.
  // InvalidArgument: fence incomplete. NotFound: no job / worker never
  // joined. FailedPrecondition: job finished. Aborted: stale generation,
  // replaced incarnation, or member LOST/LEFT/FENCED (re-join).
  absl::StatusOr<FencedWorker> CheckFence(const v1::Fence& fence);
  // CheckFence, but only when the coordinator's lock is free at once:
  // nullopt (nothing checked) when another thread holds it. For callers on
  // threads that must not wait (gRPC's own: server/rpc/call.h RunFenced).
  std::optional<absl::StatusOr<FencedWorker>> TryCheckFence(const v1::Fence& fence);

  // The assignment for fence.generation, waiting up to `deadline` when
  // `wait`. Errors: CheckFence's; FailedPrecondition when not formed and not
  // waiting; DeadlineExceeded when the wait ends first; Aborted when the
  // generation ends while waiting.
  absl::StatusOr<v1::Assignment> GetAssignment(const v1::Fence& fence, bool wait,
                                               absl::Time deadline);

  // GetAssignment(fence, wait=true) without blocking, for callers that wait
  // asynchronously (the gRPC adapter: no thread per waiting worker).
  // Returns the answer GetAssignment would give when its wait ends (the
  // assignment, Aborted when the generation ended, CheckFence's errors),
  // and then removes the waker `*waker_id` if one is registered (setting
  // *waker_id to 0); or nullopt
  // when the caller must wait: then, if *waker_id is 0, `waker` is
  // registered and its id (never 0) stored in *waker_id. The waker is
  // called with the Coordinator's lock held (it may only queue work, as a
  // SessionWaker) whenever the answer may have changed: another join of the
  // job does not call it. The caller then polls again; it does its own
  // deadline (DeadlineExceeded is never returned here) and removes the
  // waker with RemoveAssignmentWaker when it gives up.
  absl::StatusOr<std::optional<v1::Assignment>> PollAssignment(const v1::Fence& fence,
                                                               std::function<void()> waker,
                                                               uint64_t* waker_id);
  // Drops the waker `waker_id` of `worker` (PollAssignment). Idempotent;
  // a no-op when the job or worker is gone.
  void RemoveAssignmentWaker(const v1::WorkerIdentity& worker, uint64_t waker_id);

  // Records a heartbeat and answers with a directive (CONTINUE, CHECKPOINT
  // or STOP). Errors: CheckFence's (a stale generation is Aborted).
  // An excluded incarnation (LOST: REPEATED_ERRORS or HUNG) gets STOP with
  // its detail. A progress report (request.progress, progress.proto) is
  // checked (InvalidArgument naming the field, progress_monitor.h
  // ValidateProgress: activity UNSPECIFIED, a peer_rank >= world_size, ...)
  // and, while the member is ACTIVE, kept as Member.progress (not durable)
  // for hang and straggler detection (Tick).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // Heartbeat, but only when the coordinator's lock is free at once (as
  // TryCheckFence): nullopt (nothing done) when another thread holds it.
  std::optional<absl::StatusOr<v1::HeartbeatResponse>> TryHeartbeat(
      const v1::HeartbeatRequest& request);

  // A worker reports a failure. The generation ends (the caller's
  // communicators are broken); the named peer is declared LOST if it is also
  // late or disconnected. Answers RESTART_AT_GENERATION (or STOP; STOP with
  // its detail to an excluded incarnation).
  // Before the generation ends, the ranks' latest progress reports are
  // searched for the ranks the others waited for (progress_monitor.h
  // LocaliseHang); when some are found the reason (the directive's,
  // phase_reason, a lost peer's detail) ends with "; held up by rank 2 (w2
  // on host1): in compute at step 15, last heartbeat 6.1 s ago", a
  // HangDetected event (action REPORT) is emitted, and each culprit's
  // Member.detail says so (it stays when the member is FENCED).
  //
  // Restore fallback (a checksum mismatch is DataLoss, and restore falls
  // back to the previous committed checkpoint):
  // when the report ends the current generation and says that the restore
  // of the generation's restore point (the job's last_checkpoint id) found
  // it unusable (RestoreFailureMarksUnusable, server/unusable_marks.h: a
  // DATA_LOSS naming it, or NOT_FOUND etc. from "restoring <id>"), that
  // checkpoint is marked unusable in `marks` (their owner, the
  // CheckpointRegistry: durably, before the job record with the new restore
  // point is written, with the report as the reason; it stays COMMITTED and
  // listed) and the next generation restores the newest entry of
  // `committed` that is older (by step) and not marked, or starts from
  // scratch when there is none; the job's phase_reason and a
  // CheckpointAborted event say which. Such a report does not count towards
  // kMaxConsecutiveErrorGenerations (the checkpoint is at fault, not the
  // worker); every further DataLoss moves one checkpoint further back, so
  // it cannot loop. `committed`: the job's COMMITTED checkpoints (any
  // order; server/checkpoint_flow.h passes CheckpointRegistry::List's when
  // the code is an UnusableCheckpointCode). `marks` null: nothing is marked and every entry
  // of `committed` counts as usable. `marks` is called with this
  // coordinator's lock held (server/unusable_marks.h).
  // Errors: CheckFence's.
  absl::StatusOr<v1::ReportErrorResponse> ReportError(
      const v1::ReportErrorRequest& request, std::vector<GenerationEnded>* ended,
      const std::vector<v1::CheckpointRef>& committed = {},
      UnusableCheckpointMarks* marks = nullptr);

  // Drains `worker_id` (coordinator.proto DrainWorker): a rank of a RUNNING
  // GPT job with a checkpoint directory is marked draining and every rank is
  // pushed CheckpointAtStep(job step + 1); the next checkpoint that commits
  // (NoteCheckpointCommitted) then takes it out. Anything else is taken out
  // at once: LEFT with detail "drained: <reason>", STOP pushed to it, and,
  // when it held a rank of a RUNNING job, the generation ends
  // (FORMATION_REASON_WORKER_LEFT). The drain is durable (Member
  // drain_reason / drain_after_step). Errors: InvalidArgument (reason over
  // 1024 bytes or with control characters); NotFound (no job / worker);
  // FailedPrecondition (job terminal, worker not live, or, unless `force`,
  // the live workers left would be fewer than min_workers: the job would
  // stop until others join and fail after join_timeout).
  absl::StatusOr<v1::Member> DrainWorker(const std::string& job_id, const std::string& worker_id,
                                         const std::string& reason, bool force,
                                         std::vector<GenerationEnded>* ended);

  // Graceful leave; an ACTIVE member's leave ends the generation. The fence's
  // generation is not checked. NotFound: no job or worker; Aborted: a
  // replaced incarnation.
  // An external job (job.proto ExternalWorkload) is different: an ACTIVE
  // member's leave does not end the generation; once no member of the
  // RUNNING generation is ACTIVE any more (every rank left) the job is
  // COMPLETED ("all N ranks of generation G left"), every live member (the
  // spares) gets STOP and the generation goes to `ended` (its rendezvous
  // calls end). A LOST rank still ends the generation.
  absl::Status LeaveJob(const v1::LeaveJobRequest& request, std::vector<GenerationEnded>* ended);

  // Completes an external job on a member's word (coordinator.proto
  // CompleteJob, torchrun's set_closed): COMPLETED with phase_reason
  // "completed by '<worker_id>'[: <reason>]", STOP to every live member,
  // PhaseChanged emitted, the current generation to `ended` (the adapter
  // ends its rendezvous calls: ABORTED). The fence's generation is not
  // checked; the caller may be JOINING, ACTIVE, SPARE or FENCED. A
  // COMPLETED job is returned unchanged. Errors:
  //   InvalidArgument: fence.worker incomplete; reason over kMaxReasonBytes
  //     or with control characters.
  //   NotFound: no job, or the worker never joined it.
  //   FailedPrecondition: a GPT job (it completes at train_steps), or the
  //     job is FAILED or CANCELLED.
  //   Aborted: the caller's incarnation was replaced, or it is LOST or LEFT.
  absl::StatusOr<v1::Job> CompleteJob(const v1::CompleteJobRequest& request,
                                      std::vector<GenerationEnded>* ended);

  // Periodic work at clock->Now(): heartbeat timeouts, last-call windows,
  // join timeouts, hangs and stragglers.
  //
  // Hangs (ElasticPolicy.progress_timeout, progress.proto HangReport): a
  // RUNNING GPT job none of whose ranks made progress (a step done, a
  // group's completed sequence up; formation, and a rank in a checkpoint,
  // count) for the progress timeout (unset: max(30 s, 10 x the median of
  // the ranks' latest step_time); 0 s: never), while a rank waits in a
  // collective: the culprits (progress_monitor.h LocaliseHang) go into a
  // HangDetected event, Job.last_hang and a log line. HANG_POLICY_EVICT
  // (with culprits): each is LOST (LOSS_REASON_HUNG, detail = the
  // summary; excluded like REPEATED_ERRORS), the generation ends
  // (FORMATION_REASON_HANG), and the job FAILS at once when the others
  // cannot form one. HANG_POLICY_REPORT: reported once per stall (again
  // only after progress). An external job is never judged.
  // Stragglers (ElasticPolicy.straggler_*): the ranks' compute_time per
  // step (progress_monitor.h StragglerTracker); a flagged rank gets
  // Member.straggler, is listed in Job.stragglers (slowest first, at most
  // kMaxStragglersListed; num_stragglers counts all), and a
  // StragglerChanged event is emitted (cleared at a generation's end too).
  // STRAGGLER_POLICY_REPLACE: a flagged rank of a job with a checkpoint
  // directory and a healthy spare (SPARE with an open session) is drained
  // as DrainWorker does (reason "straggler: ..."; Straggler.replacing). Call every ~100 ms (the server does; tests call it after
  // advancing a FakeClock). Returns the generations that ended.
  std::vector<GenerationEnded> Tick();

  // Records a committed checkpoint as the job's latest (the restore point of
  // the next generation) and its step as the job's progress. NotFound.
  //
  // Growing (docs/ARCHITECTURE.md "Coordinator state machine": RUNNING --grow--> RECOVERING): a worker
  // that joins a RUNNING job waits as a SPARE; the job grows only here, at a
  // checkpoint boundary, so that nothing trained since the restore point is
  // thrown away. When the job is RUNNING, `ref` is not older (by step) than
  // the previous restore point, ref.step < train_steps (a job about to
  // complete does not restart), and ChooseDp over the generation's ranks
  // plus its healthy spares (SPARE in this generation with an open session)
  // gives a larger dp than the current one, the generation ends
  // (FORMATION_REASON_GROW, reason "grow: N spares joined; world A -> B at
  // checkpoint step S") and every rank and spare re-joins; the next
  // generation restores `ref`. Policy on spares: the job grows whenever a
  // larger world fits (up to max_workers); no spare is held back for
  // failover: a lost rank of the larger world re-forms the job at the
  // largest world that still fits, from the same kind of restore point a
  // spare would use. Workers a larger world cannot use (max_workers, or dp
  // not dividing global_batch / micro_batch) stay spares. A job with no
  // checkpoints never grows. Ended generations go to `ended`; when it is
  // null, the next Tick() returns them. A checkpoint `marks` holds unusable
  // (see ReportError) never becomes the restore point; `marks` null: none is.
  absl::Status NoteCheckpointCommitted(const std::string& job_id, const v1::CheckpointRef& ref,
                                       uint64_t total_bytes,
                                       std::vector<GenerationEnded>* ended = nullptr,
                                       const UnusableCheckpointMarks* marks = nullptr);
  void NoteCheckpointAborted(const std::string& job_id, const std::string& checkpoint_id,
                             uint64_t step, const std::string& reason);

  // --- Finished-job retention (CoordinatorOptions) -----------------------
  // The finished jobs (COMPLETED, FAILED, CANCELLED) due to be forgotten at
  // clock->Now(): those whose update_time is more than
  // finished_job_retention ago, then the oldest (by update_time, then id)
  // beyond max_finished_jobs; oldest first. The server calls it from its
  // tick loop and, for each id, drops the job's checkpoint records
  // (CheckpointRegistry::ForgetJob) and then calls PruneJob.
  std::vector<std::string> FinishedJobsToPrune() const;
  // Forgets a finished job: its job, worker-token, member and event records,
  // in memory and in the store (one batch). Checkpoint records are the
  // CheckpointRegistry's (dropped before this, so that a crash in between
  // leaves a job that is pruned again, never checkpoint rows of a forgotten
  // job); checkpoint files on disk are never touched. Afterwards every call
  // naming the job answers NotFound.
  // NotFound: no such job. FailedPrecondition: not finished, or a call is
  // blocked waiting on the job (WatchJob, GetAssignment, a session): pruned
  // at a later call. Unavailable: the store write failed (nothing is
  // forgotten).
  absl::Status PruneJob(const std::string& job_id);

 private:
  // coordinator_records.h.
  struct MemberRecord;
  struct JobRecord;
  class WaitGuard;

  // coordinator.cc: the core.
  JobRecord* FindJobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const JobRecord* FindJobLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetPhaseLocked(JobRecord& job, v1::JobPhase phase, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // STOP to every live member.
  void StopAllLocked(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends to the job's EventLog at clock_->Now() in its current generation.
  void EmitLocked(JobRecord& job, v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The restore point of `job`'s current generation failed its checksums
  // (`what`: the report): marks it unusable in `marks` (if any) and ends the
  // generation with the previous usable committed checkpoint as the
  // restore point.
  void FallBackFromRestorePointLocked(JobRecord& job, const std::string& what,
                                      const std::vector<v1::CheckpointRef>& committed,
                                      UnusableCheckpointMarks* marks,
                                      std::vector<GenerationEnded>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_formation.cc: generations.
  // Forms the next generation of a PENDING or RECOVERING job once enough
  // members joined (max_workers, every survivor back, or the last call), or
  // FAILS it past join_timeout without enough.
  void MaybeFormLocked(JobRecord& job, std::vector<GenerationEnded>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forms a generation of `candidates` (its JOINING members, by worker_id)
  // as FormWorld (formation.h) says.
  void FormGenerationLocked(JobRecord& job, std::vector<MemberRecord*> candidates)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndGenerationLocked(JobRecord& job, v1::FormationReason reason, const std::string& why,
                           std::vector<GenerationEnded>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NoteCheckpointCommitted's grow rule, after `ref` became the restore
  // point: ends the generation when the spares make a larger world fit.
  void MaybeGrowLocked(JobRecord& job, const v1::CheckpointRef& ref,
                       std::vector<GenerationEnded>* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::Assignment> GetAssignmentLocked(const JobRecord& job,
                                                     const MemberRecord& member) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetAssignment's parts: whether a wait for `member`'s assignment of
  // `generation` (incarnation `incarnation`) is over, and its answer then.
  bool AssignmentSettledLocked(const JobRecord& job, const MemberRecord& member,
                               uint64_t generation, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers a waker for `member` (MemberRecord::assignment_wakers); returns its id.
  uint64_t AddAssignmentWakerLocked(JobRecord& job, MemberRecord& member,
                                    std::function<void()> waker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveAssignmentWakerLocked(JobRecord& job, MemberRecord& member, uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the assignment wakers of `member`, or (null) of every waiting
  // member of `job`.
  void WakeAssignmentWaitersLocked(JobRecord& job, MemberRecord* member)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_failure.cc: failure policy.
  void LoseMemberLocked(JobRecord& job, MemberRecord& member, v1::LossReason reason,
                        const std::string& detail, std::vector<GenerationEnded>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `member`'s error reports ended kMaxConsecutiveErrorGenerations
  // generations: LOST (REPEATED_ERRORS), which ends the generation; FAILED
  // when the others cannot form one.
  void ExcludeMemberLocked(JobRecord& job, MemberRecord& member,
                           std::vector<GenerationEnded>* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_membership.cc: drain and leave.
  // Takes a drained member out: LEFT, STOP pushed, WorkerLeft emitted; the
  // generation ends when it held a rank of a RUNNING job.
  void RemoveDrainedLocked(JobRecord& job, MemberRecord& member,
                           std::vector<GenerationEnded>* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_progress.cc: hangs and stragglers (server/progress_monitor.h).
  // A heartbeat's progress report (validated by the caller): kept in the
  // member while it is ACTIVE, the job's last progress time, the straggler
  // windows.
  void NoteProgressLocked(JobRecord& job, MemberRecord& member, const v1::HeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's part: a RUNNING GPT job that made no progress for its progress
  // timeout while a rank waits in a collective: HangDetected, and by
  // hang_policy the culprits LOST (LOSS_REASON_HUNG); then the straggler
  // flags.
  void DetectHangLocked(JobRecord& job, absl::Time now, std::vector<GenerationEnded>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateStragglersLocked(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportError's: the ranks that hold up the others by their latest
  // reports, for the reason of the generation's end: "; held up by ..."
  // (empty when none is found); emits HangDetected (REPORT) and marks the
  // culprits' details when it finds some. `frozen` gets the culprits whose
  // last heartbeat is older than 2 heartbeat intervals (a process stopped
  // whole: it will not re-join soon, so ReportError declares it lost);
  // `stuck` the others (heartbeats go on, the training thread is behind:
  // hung, evicted by ReportError) unless hang_policy is REPORT, which only
  // names them.
  std::string NameHoldersUpLocked(JobRecord& job, absl::Time now,
                                  std::vector<MemberRecord*>* frozen,
                                  std::vector<MemberRecord*>* stuck)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Both of those: LocaliseHang (server/progress_monitor.h) over the ACTIVE
  // ranks' latest reports at `now`; and recording a report (Job.last_hang,
  // the HangDetected event, the hangs-detected count).
  std::optional<HangFinding> LocateHangLocked(const JobRecord& job, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishHangLocked(JobRecord& job, const v1::HangReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A generation formed / ends: progress clock, straggler windows and flags
  // (StragglerChanged cleared for each flagged rank).
  void ProgressGenerationFormedLocked(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProgressGenerationEndedLocked(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_membership.cc: a graceful drain of an ACTIVE rank of a
  // RUNNING GPT job with a checkpoint directory (DrainWorker's, and the
  // straggler REPLACE policy's): it leaves after the next checkpoint.
  void StartGracefulDrainLocked(JobRecord& job, MemberRecord& member, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_worker.cc: fences.
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatLocked(const v1::HeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckFence's answer (mu_ held).
  absl::StatusOr<FencedWorker> FenceLocked(const v1::Fence& fence)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<MemberRecord*> CheckFenceLocked(const v1::Fence& fence, JobRecord** job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The STOP (with its detail) that every call of an excluded incarnation
  // (LOST with LOSS_REASON_REPEATED_ERRORS or LOSS_REASON_HUNG) of the
  // fence's worker gets, so that its process exits; nullopt otherwise.
  std::optional<v1::Directive> ExcludedStopLocked(const v1::Fence& fence) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_persistence.cc.
  // Writes the job record and the given members; logs and keeps serving on
  // failure (the state in memory stays authoritative until the next write).
  // `extra`: more records written in the same batch.
  absl::Status PersistLocked(const JobRecord& job, const std::vector<const MemberRecord*>& members,
                             std::vector<Mutation> extra = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers every credential with creds_ (when set).
  void RegisterCredentialsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistAllMembersLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  StateStore* const store_;
  const CoordinatorOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_assignment_waker_ ABSL_GUARDED_BY(mu_) = 1;
  // Generations ended inside calls that do not return them (JoinJob replacing
  // a live incarnation); the next Tick() returns them.
  std::vector<GenerationEnded> pending_ended_ ABSL_GUARDED_BY(mu_);
  Authenticator* creds_ ABSL_GUARDED_BY(mu_) = nullptr;  // see UseCredentials
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_H_

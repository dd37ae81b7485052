// WorkerClient: the calls a worker makes about its membership in a job
// (WorkerService in proto/shardline/v1/coordinator.proto), as an interface
// (fakes in testing/fake_worker_client.h) and its gRPC implementation.
//
//   GrpcWorkerClient workers(channel, options);
//   absl::StatusOr<v1::JoinJobResponse> joined = workers.JoinJob(request);
//   std::unique_ptr<SessionStream> session = workers.Session(session_request);
//   while (session->Read(&message)) { ... }
//   absl::Status ended = session->Finish();
//
// Errors: every method returns the coordinator's status code; the gRPC
// implementation's messages are client::FromGrpcStatus's (connection.h).
// The codes below are those particular to each call; any call may also
// return UNAVAILABLE (not reachable, starting, stopping: retry with
// backoff), DEADLINE_EXCEEDED (no answer within the call's deadline),
// UNAUTHENTICATED / PERMISSION_DENIED (token), INVALID_ARGUMENT (a field
// missing or malformed: names it) and NOT_FOUND (no such job). Fenced calls
// (every one but JoinJob) may also return ABORTED (stale fence: the
// generation is over, re-join) and FAILED_PRECONDITION (the job is
// COMPLETED, FAILED or CANCELLED: stop).
//
// Retries: JoinJob, Heartbeat, GetAssignment, LeaveJob and CompleteJob are safe to
// repeat; ReportError is not (a repeat after the generation changed is
// ABORTED, which asks for the same action). The gRPC implementation retries
// only between coordinator replicas, within the call's deadline
// (client/grpc_call.h: a follower's leader hint for every call, an ambiguous
// failure only for the safe ones); with one address it makes one attempt.
// Beyond that callers decide (common/backoff.h). A Session stream opens on
// the replica believed to lead; how it ends (a hint, or UNAVAILABLE) moves
// the guess, so the caller's next stream goes to the new leader.
//
// Thread-safety: implementations are thread-safe; a SessionStream is read
// by one thread, and Cancel may be called from any thread.
#ifndef SHARDLINE_CLIENT_WORKER_CLIENT_H_
#define SHARDLINE_CLIENT_WORKER_CLIENT_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "client/coordinator_channels.h"
#include "grpcpp/grpcpp.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::client {

namespace v1 = ::shardline::v1;

namespace internal {
template <typename Service>
class ReplicaStubs;
}  // namespace internal

// One Session stream (WorkerService.Session).
class SessionStream {
 public:
  virtual ~SessionStream() = default;

  // The next message, blocking until one arrives: SessionOpened first, then
  // every Assignment and urgent Directive. False once the stream has ended
  // (then call Finish). Nothing is sent before the first Read.
  virtual bool Read(v1::SessionMessage* message) = 0;
  // How the stream ended, after Read returned false: OK after a STOP
  // directive or LeaveJob; NOT_FOUND (this incarnation never joined);
  // ABORTED (this incarnation is LOST, LEFT or replaced, or another stream
  // of it opened: JoinJob first); ALREADY_EXISTS (the previous stream is
  // still closing on the coordinator); FAILED_PRECONDITION (the job is
  // finished); CANCELLED after Cancel; UNAVAILABLE (connection lost).
  virtual absl::Status Finish() = 0;
  // Ends the stream from any thread, also before the first Read or while a
  // Read blocks: Read returns false and Finish CANCELLED. The coordinator
  // sees the stream break (this worker LOST) unless it left first.
  virtual void Cancel() = 0;
};

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;

  // Sends JoinJob (worker id and incarnation, host, device, backend);
  // returns the generation to put in fences, the job's spec and phase.
  // Deadline: --timeout. Errors: INVALID_ARGUMENT (worker_id, incarnation
  // 0, device or backend refused); FAILED_PRECONDITION (the job is
  // finished, or the backend differs from the job's other workers);
  // RESOURCE_EXHAUSTED (too many workers); UNAVAILABLE (the join could not
  // be recorded durably: retry).
  virtual absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& request) = 0;

  // Opens the Session stream of request.worker (no deadline; nothing is
  // sent before the stream's first Read). See SessionStream for how it ends.
  virtual std::unique_ptr<SessionStream> Session(const v1::SessionRequest& request) = 0;

  // Sends Heartbeat (fence, step, state, metrics); returns what to do next
  // (CONTINUE, CHECKPOINT, RESTART_AT_GENERATION or STOP). Deadline:
  // `timeout`. Errors: ABORTED also from a FENCED incarnation (a survivor
  // that has not re-joined yet); INVALID_ARGUMENT (state UNSPECIFIED, a
  // step beyond train_steps).
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                          absl::Duration timeout) = 0;

  // Sends GetAssignment (fence; with `wait`, how long the coordinator may
  // wait for the generation to form). Deadline: request.timeout +
  // kWaitDeadlineSlack when waiting, else --timeout. Errors:
  // DEADLINE_EXCEEDED (it did not form within request.timeout);
  // FAILED_PRECONDITION also when not formed and not waiting;
  // INVALID_ARGUMENT (timeout negative or over 1 h).
  virtual absl::StatusOr<v1::Assignment> GetAssignment(
      const v1::GetAssignmentRequest& request) = 0;

  // Sends ReportError (fence of the generation the failure happened in,
  // code, message, operation, optional peer_rank); returns the directive
  // (RESTART_AT_GENERATION, or STOP). Deadline: --timeout. Errors:
  // INVALID_ARGUMENT (code OK or not canonical, peer_rank >= world_size);
  // FAILED_PRECONDITION also when the caller is a spare or not assigned;
  // ABORTED when that generation has already ended.
  virtual absl::StatusOr<v1::ReportErrorResponse> ReportError(
      const v1::ReportErrorRequest& request) = 0;

  // Sends LeaveJob (fence, reason): this incarnation leaves for good; the
  // coordinator then ends its stream with OK. Deadline: --timeout. Leaving
  // twice is harmless; a finished job answers OK; ABORTED only for a
  // replaced incarnation.
  virtual absl::StatusOr<v1::LeaveJobResponse> LeaveJob(const v1::LeaveJobRequest& request) = 0;

  // Sends CompleteJob (fence, reason): marks an external job COMPLETED
  // (torchrun's set_closed); returns the job. Deadline: --timeout. Safe to
  // repeat (a COMPLETED job is returned unchanged). Errors:
  // INVALID_ARGUMENT (reason over 1024 bytes); FAILED_PRECONDITION (a GPT
  // job, or FAILED / CANCELLED); ABORTED (this incarnation is LOST, LEFT or
  // replaced).
  virtual absl::StatusOr<v1::Job> CompleteJob(const v1::CompleteJobRequest& request) = 0;

  // After a call failed UNAVAILABLE: waits up to `timeout` for the
  // connection to the coordinator (the leader guess's, with replicas) to be
  // ready, making it connect and watching the attempts meanwhile. gRPC
  // notices a finished connect only while something polls the channel, and
  // calls on a failed channel fail at once without polling
  // (common/grpc_backup_poll.h); this wait polls, so a restarted
  // coordinator is reached as soon as it serves whatever the backup poller
  // does. Returns whether it reconnected (the connection was not ready and
  // now is; a connection that was ready returns {false, 0} at once: the
  // call failed for another reason) and how long it waited. Default
  // (fakes): {false, 0}, at once.
  struct Reconnect {
    bool reconnected = false;
    absl::Duration waited;
  };
  virtual Reconnect AwaitConnection(absl::Duration timeout) { return {}; }
};

// WorkerClient over gRPC: every call carries its token and deadline
// (client::Prepare); errors are client::FromGrpcStatus's. A JoinJob that
// returns a member_token stores it in options.member_credential (made here
// when null), so this client's later calls, and those of every client
// sharing that credential, carry it instead of options.token.
class GrpcWorkerClient final : public WorkerClient {
 public:
  // One channel (one coordinator, or the first replica of options.address).
  GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options);
  // Every call to the leader of `channels` (client/coordinator_channels.h).
  GrpcWorkerClient(std::shared_ptr<CoordinatorChannels> channels, ConnectionOptions options);
  ~GrpcWorkerClient() override;

  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& request) override;
  std::unique_ptr<SessionStream> Session(const v1::SessionRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                  absl::Duration timeout) override;
  absl::StatusOr<v1::Assignment> GetAssignment(const v1::GetAssignmentRequest& request) override;
  absl::StatusOr<v1::ReportErrorResponse> ReportError(
      const v1::ReportErrorRequest& request) override;
  absl::StatusOr<v1::LeaveJobResponse> LeaveJob(const v1::LeaveJobRequest& request) override;
  absl::StatusOr<v1::Job> CompleteJob(const v1::CompleteJobRequest& request) override;
  Reconnect AwaitConnection(absl::Duration timeout) override;

 private:
  static ConnectionOptions WithMemberCredential(ConnectionOptions options);

  const ConnectionOptions options_;
  const std::unique_ptr<internal::ReplicaStubs<v1::WorkerService>> stubs_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_WORKER_CLIENT_H_

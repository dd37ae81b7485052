// FakeWorkerClient: an in-memory client::WorkerClient for unit tests of the
// worker agent, on a FakeClock. It plays one job's coordinator as one worker
// sees it, and a test scripts it: form a generation, end it, make the next
// Heartbeat return ABORTED, refuse a token, send a directive on the Session
// stream, end the stream.
//
//   FakeClock clock;
//   auto workers = std::make_shared<FakeWorkerClient>(&clock);
//   workers->FailNext("Heartbeat", absl::AbortedError("generation 1 is over"));
//   ... agent.Connect() ...
//   ASSERT_TRUE(workers->AwaitCalls("Heartbeat", 2));
//   EXPECT_THAT(workers->CallTimes("Heartbeat"), ElementsAre(t0, t0 + absl::Seconds(5)));
//
// Behaviour without a script: JoinJob answers the current generation (1 at
// the start), the spec and the phase; Session streams start with
// SessionOpened (then the assignment, when the generation is formed) and
// carry what Send queues; a fenced call whose fence names another
// generation answers ABORTED ("generation G is over (current C): <reason of
// its end>; re-join"); Heartbeat answers the queued directives, then
// CONTINUE; GetAssignment answers the formed assignment, or waits on the
// clock for it up to the request's timeout (DEADLINE_EXCEEDED), ABORTED
// when the generation ends meanwhile; ReportError ends the generation and
// answers RESTART_AT_GENERATION of the next; LeaveJob ends the open stream
// with OK.
//
// The blocking waits (AwaitCalls, AwaitSessions) wait in real time, bounded
// by their timeout: a test's guard against hanging, never its pace.
//
// Thread-safety: thread-safe. The fake must outlive the streams it opened.
#ifndef SHARDLINE_TESTING_FAKE_WORKER_CLIENT_H_
#define SHARDLINE_TESTING_FAKE_WORKER_CLIENT_H_

#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/worker_client.h"
#include "common/clock.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::client::testing {

// FailNext's `times` for "every call from now on".
inline constexpr int kForever = INT_MAX;

class FakeWorkerClient final : public WorkerClient {
 public:
  // `clock` (not owned) stamps the calls and paces GetAssignment's waits.
  explicit FakeWorkerClient(const Clock* clock);
  ~FakeWorkerClient() override;

  // --- The job ---------------------------------------------------------
  void SetSpec(const v1::JobSpec& spec);
  void SetPhase(v1::JobPhase phase);
  uint64_t generation() const;
  // Forms the current generation: `assignment` (its generation set to the
  // current one) is what GetAssignment answers, and it is sent on the open
  // Session stream.
  void Form(v1::Assignment assignment);
  // Ends the current generation: the next one begins (not formed); fenced
  // calls of the old one, blocked or not, get ABORTED naming `reason`. With
  // `tell_session`, the open stream gets RESTART_AT_GENERATION of the new
  // generation with `reason`.
  void EndGeneration(const std::string& reason, bool tell_session = true);

  // --- Script ----------------------------------------------------------
  // The next `times` calls of `rpc` ("JoinJob", "Session", "Heartbeat",
  // "GetAssignment", "ReportError", "LeaveJob") fail with `status`, before
  // anything else happens (a Session stream then ends with it before any
  // message).
  void FailNext(const std::string& rpc, absl::Status status, int times = 1);
  // The next Heartbeats answer these directives, in order.
  void QueueHeartbeatDirective(v1::Directive directive);
  // Queues `message` on the open Session stream; false when none is open.
  bool Send(const v1::SessionMessage& message);
  bool SendDirective(const v1::Directive& directive);
  // Ends the open Session stream with `status`; false when none is open.
  bool EndSession(absl::Status status);

  // --- What was called -------------------------------------------------
  struct Call {
    std::string rpc;
    absl::Time time;
    uint64_t generation = 0;  // the fence's; 0 for JoinJob and Session
    absl::Duration timeout;   // Heartbeat's deadline, GetAssignment's wait
  };
  std::vector<Call> calls() const;
  // The rpc names in call order.
  std::vector<std::string> CallNames() const;
  std::vector<absl::Time> CallTimes(const std::string& rpc) const;
  int CallCount(const std::string& rpc) const;
  std::vector<v1::JoinJobRequest> joins() const;
  std::vector<v1::HeartbeatRequest> heartbeats() const;
  std::vector<v1::GetAssignmentRequest> assignment_requests() const;
  std::vector<v1::ReportErrorRequest> error_reports() const;
  std::vector<v1::LeaveJobRequest> leaves() const;
  // Whether a Session stream is open now (opened and not ended).
  bool session_open() const;

  // Blocks until `rpc` was called at least `n` times; false after
  // `real_timeout`.
  bool AwaitCalls(const std::string& rpc, int n,
                  absl::Duration real_timeout = absl::Seconds(60)) const;
  // Blocks until `n` Session streams have been opened and the latest one is
  // still open; false after `real_timeout`.
  bool AwaitSessions(int n, absl::Duration real_timeout = absl::Seconds(60)) const;

  // --- WorkerClient ----------------------------------------------------
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& request) override;
  std::unique_ptr<SessionStream> Session(const v1::SessionRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                  absl::Duration timeout) override;
  absl::StatusOr<v1::Assignment> GetAssignment(const v1::GetAssignmentRequest& request) override;
  absl::StatusOr<v1::ReportErrorResponse> ReportError(
      const v1::ReportErrorRequest& request) override;
  absl::StatusOr<v1::LeaveJobResponse> LeaveJob(const v1::LeaveJobRequest& request) override;
  // Answers a Job COMPLETED with the reason (the fake keeps no job record).
  absl::StatusOr<v1::Job> CompleteJob(const v1::CompleteJobRequest& request) override;

 private:
  class Stream;
  struct StreamState {
    std::deque<v1::SessionMessage> messages;
    std::optional<absl::Status> end;  // set: no more messages after the queue
    bool cancelled = false;
  };

  // Records the call; returns the scripted failure, if any.
  std::optional<absl::Status> Begin(const std::string& rpc, uint64_t generation,
                                    absl::Duration timeout = absl::ZeroDuration())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StaleLocked(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndGenerationLocked(const std::string& reason, bool tell_session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The open stream, or null.
  StreamState* OpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  v1::JobSpec spec_ ABSL_GUARDED_BY(mu_);
  v1::JobPhase phase_ ABSL_GUARDED_BY(mu_) = v1::JOB_PHASE_PENDING;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  // Why each generation ended, by generation.
  std::map<uint64_t, std::string> end_reasons_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  // Per rpc: (status, calls left) in order.
  std::map<std::string, std::deque<std::pair<absl::Status, int>>> failures_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::Directive> heartbeat_directives_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<StreamState>> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JoinJobRequest> joins_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GetAssignmentRequest> assignment_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportErrorRequest> error_reports_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::LeaveJobRequest> leaves_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTING_FAKE_WORKER_CLIENT_H_

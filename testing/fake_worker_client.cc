#include "testing/fake_worker_client.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::client::testing {

// Reads what the fake queued for it; ends as the fake or Cancel says.
class FakeWorkerClient::Stream final : public SessionStream {
 public:
  Stream(FakeWorkerClient* fake, std::shared_ptr<StreamState> state)
      : fake_(fake), state_(std::move(state)) {}

  bool Read(v1::SessionMessage* message) override {
    absl::MutexLock lock(&fake_->mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake_->mu_) {
      return state_->cancelled || !state_->messages.empty() || state_->end.has_value();
    };
    fake_->mu_.Await(absl::Condition(&ready));
    if (state_->cancelled || state_->messages.empty()) return false;
    *message = std::move(state_->messages.front());
    state_->messages.pop_front();
    return true;
  }

  absl::Status Finish() override {
    absl::MutexLock lock(&fake_->mu_);
    if (state_->cancelled) return absl::CancelledError("Session was cancelled");
    return state_->end.value_or(absl::OkStatus());
  }

  void Cancel() override {
    absl::MutexLock lock(&fake_->mu_);
    state_->cancelled = true;
  }

 private:
  FakeWorkerClient* const fake_;
  const std::shared_ptr<StreamState> state_;
};

FakeWorkerClient::FakeWorkerClient(const Clock* clock) : clock_(clock) {}

FakeWorkerClient::~FakeWorkerClient() = default;

void FakeWorkerClient::SetSpec(const v1::JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  spec_ = spec;
}

void FakeWorkerClient::SetPhase(v1::JobPhase phase) {
  absl::MutexLock lock(&mu_);
  phase_ = phase;
}

uint64_t FakeWorkerClient::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void FakeWorkerClient::Form(v1::Assignment assignment) {
  absl::MutexLock lock(&mu_);
  assignment.set_generation(generation_);
  assignment_ = assignment;
  if (StreamState* open = OpenLocked()) {
    v1::SessionMessage m;
    *m.mutable_assignment() = assignment;
    open->messages.push_back(std::move(m));
  }
}

void FakeWorkerClient::EndGeneration(const std::string& reason, bool tell_session) {
  absl::MutexLock lock(&mu_);
  EndGenerationLocked(reason, tell_session);
}

void FakeWorkerClient::EndGenerationLocked(const std::string& reason, bool tell_session) {
  end_reasons_[generation_] = reason;
  ++generation_;
  assignment_.reset();
  if (!tell_session) return;
  if (StreamState* open = OpenLocked()) {
    v1::SessionMessage m;
    m.mutable_directive()->mutable_restart_at_generation()->set_generation(generation_);
    m.mutable_directive()->mutable_restart_at_generation()->set_reason(reason);
    open->messages.push_back(std::move(m));
  }
}

void FakeWorkerClient::FailNext(const std::string& rpc, absl::Status status, int times) {
  absl::MutexLock lock(&mu_);
  failures_[rpc].emplace_back(std::move(status), times);
}

void FakeWorkerClient::QueueHeartbeatDirective(v1::Directive directive) {
  absl::MutexLock lock(&mu_);
  heartbeat_directives_.push_back(std::move(directive));
}

bool FakeWorkerClient::Send(const v1::SessionMessage& message) {
  absl::MutexLock lock(&mu_);
  StreamState* open = OpenLocked();
  if (open == nullptr) return false;
  open->messages.push_back(message);
  return true;
}

bool FakeWorkerClient::SendDirective(const v1::Directive& directive) {
  v1::SessionMessage m;
  *m.mutable_directive() = directive;
  return Send(m);
}

bool FakeWorkerClient::EndSession(absl::Status status) {
  absl::MutexLock lock(&mu_);
  StreamState* open = OpenLocked();
  if (open == nullptr) return false;
  open->end = std::move(status);
  return true;
}

FakeWorkerClient::StreamState* FakeWorkerClient::OpenLocked() const {
  if (streams_.empty()) return nullptr;
  StreamState* last = streams_.back().get();
  if (last->cancelled || last->end.has_value()) return nullptr;
  return last;
}

std::optional<absl::Status> FakeWorkerClient::Begin(const std::string& rpc, uint64_t generation,
                                                    absl::Duration timeout) {
  calls_.push_back(Call{rpc, clock_->Now(), generation, timeout});
  auto it = failures_.find(rpc);
  if (it == failures_.end() || it->second.empty()) return std::nullopt;
  auto& [status, left] = it->second.front();
  absl::Status out = status;
  if (left != kForever && --left <= 0) it->second.pop_front();
  return out;
}

absl::Status FakeWorkerClient::StaleLocked(uint64_t generation) const {
  auto reason = end_reasons_.find(generation);
  return absl::AbortedError(absl::StrCat(
      "generation ", generation, " is over (current ", generation_,
      "): ", reason == end_reasons_.end() ? "not this worker's generation" : reason->second,
      "; re-join"));
}

std::vector<FakeWorkerClient::Call> FakeWorkerClient::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

std::vector<std::string> FakeWorkerClient::CallNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const Call& c : calls_) out.push_back(c.rpc);
  return out;
}

std::vector<absl::Time> FakeWorkerClient::CallTimes(const std::string& rpc) const {
  absl::MutexLock lock(&mu_);
  std::vector<absl::Time> out;
  for (const Call& c : calls_) {
    if (c.rpc == rpc) out.push_back(c.time);
  }
  return out;
}

int FakeWorkerClient::CallCount(const std::string& rpc) const {
  return static_cast<int>(CallTimes(rpc).size());
}

std::vector<v1::JoinJobRequest> FakeWorkerClient::joins() const {
  absl::MutexLock lock(&mu_);
  return joins_;
}

std::vector<v1::HeartbeatRequest> FakeWorkerClient::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

std::vector<v1::GetAssignmentRequest> FakeWorkerClient::assignment_requests() const {
  absl::MutexLock lock(&mu_);
  return assignment_requests_;
}

std::vector<v1::ReportErrorRequest> FakeWorkerClient::error_reports() const {
  absl::MutexLock lock(&mu_);
  return error_reports_;
}

std::vector<v1::LeaveJobRequest> FakeWorkerClient::leaves() const {
  absl::MutexLock lock(&mu_);
  return leaves_;
}

bool FakeWorkerClient::session_open() const {
  absl::MutexLock lock(&mu_);
  return OpenLocked() != nullptr;
}

bool FakeWorkerClient::AwaitCalls(const std::string& rpc, int n,
                                  absl::Duration real_timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int count = 0;
    for (const Call& c : calls_) count += c.rpc == rpc ? 1 : 0;
    return count >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), real_timeout);
}

bool FakeWorkerClient::AwaitSessions(int n, absl::Duration real_timeout) const {
  absl::MutexLock lock(&mu_);
  auto open = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(streams_.size()) >= n && OpenLocked() != nullptr;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&open), real_timeout);
}

absl::StatusOr<v1::JoinJobResponse> FakeWorkerClient::JoinJob(const v1::JoinJobRequest& request) {
  absl::MutexLock lock(&mu_);
  joins_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("JoinJob", 0)) return *failure;
  v1::JoinJobResponse response;
  response.set_generation(generation_);
  *response.mutable_spec() = spec_;
  response.set_phase(phase_);
  return response;
}

std::unique_ptr<SessionStream> FakeWorkerClient::Session(const v1::SessionRequest& request) {
  absl::MutexLock lock(&mu_);
  auto state = std::make_shared<StreamState>();
  if (std::optional<absl::Status> failure = Begin("Session", 0)) {
    state->end = *failure;
  } else {
    // A new stream of the same worker replaces the open one (ABORTED).
    if (StreamState* open = OpenLocked()) {
      open->end = absl::AbortedError("replaced by a new Session stream");
    }
    v1::SessionMessage opened;
    opened.mutable_opened()->set_generation(generation_);
    state->messages.push_back(std::move(opened));
    if (assignment_.has_value()) {
      v1::SessionMessage m;
      *m.mutable_assignment() = *assignment_;
      state->messages.push_back(std::move(m));
    }
  }
  streams_.push_back(state);
  return std::make_unique<Stream>(this, std::move(state));
}

absl::StatusOr<v1::HeartbeatResponse> FakeWorkerClient::Heartbeat(
    const v1::HeartbeatRequest& request, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  heartbeats_.push_back(request);
  if (std::optional<absl::Status> failure =
          Begin("Heartbeat", request.fence().generation(), timeout)) {
    return *failure;
  }
  if (request.fence().generation() != generation_) return StaleLocked(request.fence().generation());
  v1::HeartbeatResponse response;
  if (!heartbeat_directives_.empty()) {
    *response.mutable_directive() = std::move(heartbeat_directives_.front());
    heartbeat_directives_.pop_front();
  } else {
    response.mutable_directive()->mutable_continue_training();
  }
  return response;
}

absl::StatusOr<v1::Assignment> FakeWorkerClient::GetAssignment(
    const v1::GetAssignmentRequest& request) {
  absl::MutexLock lock(&mu_);
  const uint64_t generation = request.fence().generation();
  const absl::Duration timeout =
      absl::Seconds(request.timeout().seconds()) + absl::Nanoseconds(request.timeout().nanos());
  assignment_requests_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("GetAssignment", generation, timeout)) {
    return *failure;
  }
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation != generation_ || assignment_.has_value();
  };
  if (!settled() && request.wait()) {
    clock_->AwaitWithTimeout(mu_, absl::Condition(&settled), timeout);
  }
  if (generation != generation_) return StaleLocked(generation);
  if (assignment_.has_value()) return *assignment_;
  if (!request.wait()) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", generation, " has not formed yet"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("generation ", generation, " did not form in time"));
}

absl::StatusOr<v1::ReportErrorResponse> FakeWorkerClient::ReportError(
    const v1::ReportErrorRequest& request) {
  absl::MutexLock lock(&mu_);
  const uint64_t generation = request.fence().generation();
  error_reports_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("ReportError", generation)) return *failure;
  if (generation != generation_) return StaleLocked(generation);
  EndGenerationLocked(absl::StrCat(request.fence().worker().worker_id(), " reported ",
                                   request.operation(), ": ", request.message()),
                      /*tell_session=*/false);
  v1::ReportErrorResponse response;
  response.mutable_directive()->mutable_restart_at_generation()->set_generation(generation_);
  response.mutable_directive()->mutable_restart_at_generation()->set_reason(
      end_reasons_[generation]);
  return response;
}

absl::StatusOr<v1::LeaveJobResponse> FakeWorkerClient::LeaveJob(
    const v1::LeaveJobRequest& request) {
  absl::MutexLock lock(&mu_);
  leaves_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("LeaveJob", request.fence().generation())) {
    return *failure;
  }
  if (StreamState* open = OpenLocked()) open->end = absl::OkStatus();
  return v1::LeaveJobResponse();
}

absl::StatusOr<v1::Job> FakeWorkerClient::CompleteJob(const v1::CompleteJobRequest& request) {
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> failure = Begin("CompleteJob", request.fence().generation())) {
    return *failure;
  }
  v1::Job job;
  job.set_job_id(request.fence().worker().job_id());
  job.set_phase(v1::JOB_PHASE_COMPLETED);
  job.set_phase_reason(request.reason());
  job.set_generation(generation_);
  return job;
}

}  // namespace shardline::client::testing

#include "worker/agent.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardline::worker {
namespace {

// Longest single GetAssignment wait (the proto allows 1 h).
constexpr absl::Duration kAssignmentSlice = absl::Seconds(30);
// ElasticPolicy.heartbeat_interval when unset.
constexpr absl::Duration kDefaultHeartbeatInterval = absl::Seconds(5);
// After an UNAVAILABLE heartbeat, how long at most the heartbeat thread
// watches the connection before it waits for the rest of the interval (it
// does not see Stop meanwhile).
constexpr absl::Duration kReconnectWatch = absl::Seconds(1);

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

v1::Directive RestartDirective(uint64_t generation, const std::string& reason) {
  v1::Directive d;
  d.mutable_restart_at_generation()->set_generation(generation);
  d.mutable_restart_at_generation()->set_reason(reason);
  return d;
}

}  // namespace

uint64_t RandomIncarnation() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      (static_cast<uint64_t>(::getpid()) << 16));
  uint64_t v = 0;
  while (v == 0) v = gen();
  return v;
}

absl::StatusOr<std::unique_ptr<WorkerAgent>> WorkerAgent::Create(WorkerAgentOptions options,
                                                                client::CoordinatorClients clients,
                                                                const Clock* clock) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("--job is required");
  if (options.worker_id.empty()) return absl::InvalidArgumentError("--worker-id is required");
  if (clients.workers == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("a WorkerAgent needs a workers client and a clock");
  }
  return std::make_unique<WorkerAgent>(std::move(options), std::move(clients), clock);
}

WorkerAgent::WorkerAgent(WorkerAgentOptions options, client::CoordinatorClients clients,
                         const Clock* clock)
    : options_(std::move(options)),
      incarnation_(options_.incarnation != 0 ? options_.incarnation : RandomIncarnation()),
      clients_(std::move(clients)),
      workers_(clients_.workers.get()),
      clock_(clock) {}

WorkerAgent::~WorkerAgent() { StopThreads(); }

void WorkerAgent::StopThreads() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (session_ != nullptr) session_->Cancel();
  }
  CancelGenerationToken("the worker agent is shutting down");
  if (session_thread_.joinable()) session_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

absl::Status WorkerAgent::WithJobHint(absl::Status status) const {
  if (status.code() == absl::StatusCode::kNotFound &&
      absl::StrContains(status.message(), "no job")) {
    return absl::NotFoundError(
        absl::StrCat(status.message(), " on the coordinator at ", options_.connection.address,
                     "; check --job (create the job first with shardctl job create)"));
  }
  return status;
}

v1::Fence WorkerAgent::FenceLocked() const {
  v1::Fence f;
  f.mutable_worker()->set_job_id(options_.job_id);
  f.mutable_worker()->set_worker_id(options_.worker_id);
  f.mutable_worker()->set_incarnation(incarnation_);
  f.set_generation(generation_);
  return f;
}

v1::Fence WorkerAgent::fence() const {
  absl::MutexLock lock(&mu_);
  return FenceLocked();
}

uint64_t WorkerAgent::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool WorkerAgent::generation_over() const {
  absl::MutexLock lock(&mu_);
  return generation_over_;
}

bool WorkerAgent::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

std::shared_ptr<client::CancelToken> WorkerAgent::GenerationToken(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation == generation_ && !generation_over_ && !stopped_ && !stopping_ && !left_) {
    if (generation_token_ == nullptr) generation_token_ = std::make_shared<client::CancelToken>();
    return generation_token_;
  }
  auto over = std::make_shared<client::CancelToken>();
  over->Cancel(absl::StrCat("generation ", generation, " is not this worker's live generation (",
                            generation_, generation_over_ ? ", over" : "", ")"));
  return over;
}

void WorkerAgent::CancelGenerationToken(const std::string& reason) {
  std::shared_ptr<client::CancelToken> token;
  {
    absl::MutexLock lock(&mu_);
    token = generation_token_;
  }
  if (token != nullptr) token->Cancel(reason);
}

v1::JobSpec WorkerAgent::spec() const {
  absl::MutexLock lock(&mu_);
  return spec_;
}

void WorkerAgent::SetDirectiveCallback(DirectiveCallback callback) {
  absl::MutexLock lock(&mu_);
  callback_ = std::move(callback);
}

void WorkerAgent::SetProgress(uint64_t step, v1::WorkerState state) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  if (state != state_) heartbeat_now_ = true;
  state_ = state;
}

void WorkerAgent::SetMetrics(const v1::StepMetrics& metrics) {
  absl::MutexLock lock(&mu_);
  metrics_ = metrics;
}

bool WorkerAgent::SleepUnlessStopping(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  return clock_->AwaitWithTimeout(mu_, absl::Condition(&stopping), d);
}

absl::StatusOr<v1::JoinJobResponse> WorkerAgent::JoinWithRetry(absl::Time deadline) {
  v1::JoinJobRequest req;
  {
    absl::MutexLock lock(&mu_);
    *req.mutable_worker() = FenceLocked().worker();
  }
  req.set_host(options_.host.empty() ? HostName() : options_.host);
  req.set_device(options_.device);
  req.set_backend(options_.backend);
  // Communicators::Build reads both forms (spec::GroupRanks); compact keeps every
  // assignment O(1) in size at any dp.
  req.set_compact_groups(true);
  Backoff backoff(options_.backoff);
  absl::StatusOr<v1::JoinJobResponse> resp;
  bool shutting_down = false;
  const absl::Status s = Retry(
      *clock_, backoff, deadline,
      [](const absl::Status& s) { return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s); },
      [&] {
        resp = workers_->JoinJob(req);
        return resp.status();
      },
      [&](absl::Duration d) {
        shutting_down = SleepUnlessStopping(d);
        return shutting_down ? absl::CancelledError("the agent is shutting down")
                             : absl::OkStatus();
      });
  if (shutting_down) return s;
  if (!s.ok()) return WithJobHint(s);
  std::shared_ptr<client::CancelToken> old_token;
  {
    absl::MutexLock lock(&mu_);
    if (resp->generation() != generation_ ||
        (generation_token_ != nullptr && generation_token_->cancelled())) {
      // The next GenerationToken makes a fresh one.
      old_token = std::move(generation_token_);
      generation_token_.reset();
    }
    generation_ = resp->generation();
    generation_over_ = false;
    spec_ = resp->spec();
    assignment_.reset();
  }
  if (old_token != nullptr) old_token->Cancel("this worker joined a newer generation");
  return resp;
}

absl::Status WorkerAgent::Connect() {
  {
    absl::MutexLock lock(&mu_);
    if (connected_ || stopping_) {
      return absl::FailedPreconditionError("WorkerAgent::Connect called twice");
    }
  }
  absl::StatusOr<v1::JoinJobResponse> joined =
      JoinWithRetry(clock_->Now() + options_.connect_timeout);
  if (!joined.ok()) return joined.status();
  if (joined->phase() == v1::JOB_PHASE_COMPLETED || joined->phase() == v1::JOB_PHASE_FAILED ||
      joined->phase() == v1::JOB_PHASE_CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", options_.job_id, "' is ", v1::JobPhase_Name(joined->phase())));
  }
  if (joined->spec().has_external()) {
    // Not ours to train (job.proto ExternalWorkload): take the join back at
    // once so this process never counts as one of the workload's nodes.
    v1::LeaveJobRequest leave;
    {
      absl::MutexLock lock(&mu_);
      *leave.mutable_fence() = FenceLocked();
    }
    leave.set_reason("shardline-worker trains GPT jobs only; this job is an external workload");
    workers_->LeaveJob(leave).IgnoreError();
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", options_.job_id, "' is an external workload (spec.external, framework '",
        joined->spec().external().framework(),
        "'): shardline-worker trains GPT jobs only; run the workload's own launcher (for "
        "torchrun: python3 -m shardline.torchrun, README 'PyTorch under torchrun')"));
  }
  {
    absl::MutexLock lock(&mu_);
    connected_ = true;
  }
  session_thread_ = std::thread([this] { SessionLoop(); });
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return session_opened_ || session_first_error_.has_value();
    };
    if (!clock_->AwaitWithTimeout(mu_, absl::Condition(&ready), options_.connect_timeout)) {
      session_first_error_ = absl::UnavailableError(
          absl::StrCat("the Session stream to the coordinator at ", options_.connection.address,
                       " did not open within ", absl::FormatDuration(options_.connect_timeout)));
    }
    if (!session_opened_) {
      error = *session_first_error_;
      connected_ = false;
    }
  }
  if (!error.ok()) {
    StopThreads();
    return error;
  }
  if (options_.send_heartbeats) heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void WorkerAgent::SessionLoop() {
  Backoff backoff(options_.backoff);
  while (true) {
    v1::SessionRequest req;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      *req.mutable_worker() = FenceLocked().worker();
    }
    // Nothing is sent before the first Read, so StopThreads can cancel the
    // stream from the moment it is registered.
    std::unique_ptr<client::SessionStream> stream = workers_->Session(req);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      session_ = stream.get();
    }
    v1::SessionMessage msg;
    while (stream->Read(&msg)) {
      backoff.Reset();
      if (msg.has_opened()) {
        absl::MutexLock lock(&mu_);
        session_opened_ = true;
      } else if (msg.has_assignment()) {
        absl::MutexLock lock(&mu_);
        if (msg.assignment().generation() == generation_ && !generation_over_) {
          assignment_ = msg.assignment();
        }
      } else if (msg.has_directive()) {
        HandleDirective(msg.directive());
      }
    }
    const absl::Status s = stream->Finish();
    bool first_failure = false;
    {
      absl::MutexLock lock(&mu_);
      session_ = nullptr;
      if (stopping_ || left_) return;
      if (!session_opened_ && !s.ok() && !absl::IsUnavailable(s)) {
        first_failure = true;
        session_first_error_ = WithJobHint(s);
      }
    }
    stream.reset();
    if (first_failure) return;
    switch (s.code()) {
      case absl::StatusCode::kOk:
        // Ends OK after STOP or LeaveJob.
        if (stopped()) return;
        break;
      case absl::StatusCode::kFailedPrecondition:
        DeliverStop(std::string(s.message()), v1::JOB_PHASE_UNSPECIFIED);
        return;
      case absl::StatusCode::kAborted:
      case absl::StatusCode::kNotFound: {
        // LOST or replaced (or the coordinator forgot us): this generation is
        // over for us; re-join before reopening.
        if (stopped()) return;
        uint64_t g = generation();
        EndGeneration(g, RestartDirective(g + 1, std::string(s.message())));
        if (generation_over()) {
          // The re-join failed (e.g. a newer incarnation replaced us).
          JoinWithRetry(clock_->Now() + options_.connect_timeout).IgnoreError();
        }
        // Never spin: a stream refused again right away waits a little.
        if (SleepUnlessStopping(backoff.Next())) return;
        break;
      }
      default:
        // UNAVAILABLE (coordinator restarting), ALREADY_EXISTS (our previous
        // stream is still closing there), CANCELLED...: reopen after a pause.
        if (SleepUnlessStopping(backoff.Next())) return;
        break;
    }
  }
}

void WorkerAgent::HandleDirective(const v1::Directive& d) {
  switch (d.action_case()) {
    case v1::Directive::kRestartAtGeneration: {
      uint64_t g;
      {
        absl::MutexLock lock(&mu_);
        g = generation_;
        // Already re-joined this (or a later) generation: stale repeat.
        if (d.restart_at_generation().generation() <= g) return;
      }
      EndGeneration(g, d);
      return;
    }
    case v1::Directive::kStop:
      DeliverStop(d.stop().reason(), d.stop().phase());
      return;
    case v1::Directive::kCheckpoint: {
      {
        absl::MutexLock lock(&mu_);
        if (d.checkpoint().step() <= last_checkpoint_step_) return;
        last_checkpoint_step_ = d.checkpoint().step();
      }
      Deliver(d);
      return;
    }
    default:
      return;  // CONTINUE: nothing to do.
  }
}

void WorkerAgent::Deliver(const v1::Directive& d) {
  DirectiveCallback callback;
  {
    absl::MutexLock lock(&mu_);
    directives_.push_back(d);
    callback = callback_;
  }
  if (callback) {
    absl::MutexLock serial(&callback_mu_);
    callback(d);
  }
}

void WorkerAgent::DeliverStop(const std::string& reason, v1::JobPhase phase) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  CancelGenerationToken(absl::StrCat("the job stopped: ", reason));
  v1::Directive d;
  d.mutable_stop()->set_phase(phase);
  d.mutable_stop()->set_reason(reason);
  Deliver(d);
}

void WorkerAgent::EndGeneration(uint64_t old_generation, const v1::Directive& directive) {
  {
    absl::MutexLock lock(&mu_);
    if (old_generation != generation_ || generation_over_ || stopping_ || left_ || stopped_) {
      return;
    }
    generation_over_ = true;
    assignment_.reset();
  }
  CancelGenerationToken(directive.has_restart_at_generation()
                            ? directive.restart_at_generation().reason()
                            : std::string("the generation ended"));
  Deliver(directive);
  // Re-join in place (same incarnation): marks this worker ready for the
  // next generation. A terminal job answers FAILED_PRECONDITION: stop.
  absl::StatusOr<v1::JoinJobResponse> joined = JoinWithRetry(absl::InfiniteFuture());
  if (!joined.ok() && joined.status().code() == absl::StatusCode::kFailedPrecondition) {
    DeliverStop(std::string(joined.status().message()), v1::JOB_PHASE_UNSPECIFIED);
  } else if (!joined.ok()) {
    // JoinJob's NOT_FOUND: the job this worker trained in is gone.
    StopIfJobForgotten(joined.status(), /*not_found_means_unknown_job=*/true);
  }
}

bool WorkerAgent::StopIfJobForgotten(const absl::Status& status,
                                     bool not_found_means_unknown_job) {
  const char* prefix = nullptr;
  if (absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status)) {
    prefix = kTokenRefusedPrefix;
  } else if (not_found_means_unknown_job && absl::IsNotFound(status)) {
    prefix = kJobUnknownPrefix;
  }
  if (prefix == nullptr) return false;
  DeliverStop(absl::StrCat(prefix, status.message()), v1::JOB_PHASE_UNSPECIFIED);
  return true;
}

void WorkerAgent::HeartbeatLoop() {
  // The current run of failed heartbeats: how many, since when.
  int failures = 0;
  absl::Time first_failure;
  absl::Status last_failure;
  while (true) {
    v1::HeartbeatRequest req;
    absl::Duration interval, deadline;
    ProgressSource source;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || left_) return;
      *req.mutable_fence() = FenceLocked();
      req.set_step(step_);
      req.set_state(state_);
      if (metrics_.has_value()) *req.mutable_metrics() = *metrics_;
      heartbeat_now_ = false;
      interval = spec_.elastic().has_heartbeat_interval()
                     ? FromProto(spec_.elastic().heartbeat_interval())
                     : kDefaultHeartbeatInterval;
      // At least the interval; at most --timeout and half the heartbeat
      // timeout: a heartbeat held longer than that (on a connection that
      // went dead, to a coordinator that restarted) can no longer keep this
      // worker alive, while a fresh one, perhaps on a new connection, can.
      deadline = options_.connection.timeout;
      if (spec_.elastic().has_heartbeat_timeout()) {
        deadline = std::min(deadline, FromProto(spec_.elastic().heartbeat_timeout()) / 2);
      }
      deadline = std::max(interval, deadline);
      // Only a rank reports progress: the current generation's assignment,
      // not a spare's.
      if (progress_source_ && !generation_over_ && assignment_.has_value() &&
          assignment_->generation() == generation_ && !assignment_->spare()) {
        source = progress_source_;
      }
    }
    if (source) *req.mutable_progress() = source(req.fence().generation());
    const absl::StatusOr<v1::HeartbeatResponse> resp = workers_->Heartbeat(req, deadline);
    const absl::Status& s = resp.status();
    if (options_.log) {
      if (!resp.ok()) last_failure = s;
      if (!resp.ok() && failures++ == 0) {
        first_failure = clock_->Now();
        options_.log(absl::StrCat("heartbeat of generation ", req.fence().generation(),
                                  " failed (trying again every ", absl::FormatDuration(interval),
                                  "): ", s.ToString()));
      } else if (resp.ok() && failures > 0) {
        options_.log(absl::StrCat("heartbeats accepted again after ", failures, " failed over ",
                                  absl::FormatDuration(absl::Trunc(clock_->Now() - first_failure,
                                                                   absl::Milliseconds(1))),
                                  " (the last: ", last_failure.ToString(), ")"));
        failures = 0;
      }
    }
    if (resp.ok()) {
      HandleDirective(resp->directive());
    } else if (absl::IsAborted(s)) {
      EndGeneration(req.fence().generation(),
                    RestartDirective(req.fence().generation() + 1, std::string(s.message())));
    } else if (absl::IsFailedPrecondition(s)) {
      DeliverStop(std::string(s.message()), v1::JOB_PHASE_UNSPECIFIED);
    } else {
      // A refused token: the coordinator no longer knows this job (e.g.
      // restarted on another --state file); training on would only fail at
      // the next coordinator call and start over. UNAVAILABLE and the rest:
      // try again next interval (or at once when SetProgress changes the
      // state).
      StopIfJobForgotten(s, /*not_found_means_unknown_job=*/false);
    }
    absl::Duration wait = interval;
    if (absl::IsUnavailable(s)) {
      // Watch the connection for part of the interval: the next heartbeat
      // goes as soon as a restarted coordinator can be reached
      // (WorkerClient::AwaitConnection), at most one interval after this
      // one otherwise.
      const client::WorkerClient::Reconnect r =
          workers_->AwaitConnection(std::min(interval, kReconnectWatch));
      wait = r.reconnected ? absl::ZeroDuration()
                           : std::max(absl::ZeroDuration(), interval - r.waited);
    }
    absl::MutexLock lock(&mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || heartbeat_now_; };
    clock_->AwaitWithTimeout(mu_, absl::Condition(&wake), wait);
    if (stopping_) return;
  }
}

void WorkerAgent::SetProgressSource(ProgressSource source) {
  absl::MutexLock lock(&mu_);
  progress_source_ = std::move(source);
}

std::optional<v1::Directive> WorkerAgent::NextDirective(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !directives_.empty(); };
  if (!clock_->AwaitWithTimeout(mu_, absl::Condition(&any), timeout)) return std::nullopt;
  v1::Directive d = std::move(directives_.front());
  directives_.pop_front();
  return d;
}

absl::StatusOr<v1::Assignment> WorkerAgent::WaitForAssignment(absl::Duration timeout) {
  const absl::Time deadline = clock_->Now() + timeout;
  Backoff backoff(options_.backoff);
  while (true) {
    v1::GetAssignmentRequest req;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !generation_over_ || stopped_ || stopping_ || left_ || !connected_;
      };
      clock_->AwaitWithDeadline(mu_, absl::Condition(&ready), deadline);
      if (!connected_ || stopping_ || left_) {
        return absl::FailedPreconditionError("the agent is not connected (Connect first)");
      }
      if (stopped_) {
        return absl::FailedPreconditionError(absl::StrCat("job '", options_.job_id, "' stopped"));
      }
      if (generation_over_) {
        return absl::DeadlineExceededError(
            absl::StrCat("generation ", generation_, " ended and re-joining did not finish within ",
                         absl::FormatDuration(timeout)));
      }
      if (assignment_.has_value() && assignment_->generation() == generation_) {
        return *assignment_;
      }
      *req.mutable_fence() = FenceLocked();
    }
    const absl::Duration left = deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no assignment for generation ",
                                                      req.fence().generation(), " within ",
                                                      absl::FormatDuration(timeout)));
    }
    const absl::Duration slice = std::min(left, kAssignmentSlice);
    req.set_wait(true);
    ToProto(slice, req.mutable_timeout());
    absl::StatusOr<v1::Assignment> a = workers_->GetAssignment(req);
    if (a.ok()) {
      absl::MutexLock lock(&mu_);
      if (a->generation() == generation_ && !generation_over_) assignment_ = *a;
      return a;
    }
    const absl::Status& s = a.status();
    switch (s.code()) {
      case absl::StatusCode::kAborted:
        EndGeneration(req.fence().generation(),
                      RestartDirective(req.fence().generation() + 1, std::string(s.message())));
        break;
      case absl::StatusCode::kDeadlineExceeded:
        break;  // the loop checks the overall deadline
      case absl::StatusCode::kUnavailable: {
        const absl::Duration delay = backoff.Next();
        if (clock_->Now() + delay > deadline) return s;
        SleepUnlessStopping(delay);
        break;
      }
      case absl::StatusCode::kFailedPrecondition:
        // The job finished (or a not-formed race without wait): stop.
        DeliverStop(std::string(s.message()), v1::JOB_PHASE_UNSPECIFIED);
        return s;
      default:
        return WithJobHint(s);
    }
  }
}

absl::StatusOr<v1::Directive> WorkerAgent::ReportError(absl::StatusCode code,
                                                       const std::string& message,
                                                       const std::string& operation,
                                                       std::optional<uint32_t> peer_rank,
                                                       std::optional<uint64_t> generation) {
  if (code == absl::StatusCode::kOk) {
    return absl::InvalidArgumentError("ReportError needs a non-OK code");
  }
  v1::ReportErrorRequest req;
  *req.mutable_fence() = fence();
  if (generation.has_value()) req.mutable_fence()->set_generation(*generation);
  req.set_code(static_cast<int32_t>(code));
  req.set_message(message);
  req.set_operation(operation);
  if (peer_rank.has_value()) req.set_peer_rank(*peer_rank);
  const absl::StatusOr<v1::ReportErrorResponse> resp = workers_->ReportError(req);
  const uint64_t g = req.fence().generation();
  if (absl::IsAborted(resp.status())) {
    EndGeneration(g, RestartDirective(g + 1, std::string(resp.status().message())));
  }
  if (!resp.ok()) return WithJobHint(resp.status());
  if (resp->directive().has_restart_at_generation()) {
    EndGeneration(g, resp->directive());
  } else {
    HandleDirective(resp->directive());
  }
  return resp->directive();
}

absl::Status WorkerAgent::Leave(const std::string& reason) {
  v1::LeaveJobRequest req;
  {
    absl::MutexLock lock(&mu_);
    if (left_) return absl::OkStatus();
    if (!connected_) {
      stopping_ = true;
      return absl::OkStatus();
    }
    *req.mutable_fence() = FenceLocked();
  }
  req.set_reason(reason);
  const absl::StatusOr<v1::LeaveJobResponse> resp = workers_->LeaveJob(req);
  {
    absl::MutexLock lock(&mu_);
    left_ = true;
  }
  StopThreads();
  if (!resp.ok() && !absl::IsFailedPrecondition(resp.status())) {
    return WithJobHint(resp.status());
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker

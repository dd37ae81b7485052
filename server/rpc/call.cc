#include "server/rpc/call.h"

#include <chrono>
#include <utility>

#include "common/grpc_status.h"
#include "common/log.h"

namespace shardline::server::rpc {

// ---------------------------------------------------------------------------
// HandlerPool.

HandlerPool::HandlerPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

HandlerPool::~HandlerPool() { Stop(); }

void HandlerPool::Post(Item item) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  queue_.push_back(std::move(item));
}

void HandlerPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void HandlerPool::Loop() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopped
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    item();
  }
}

// ---------------------------------------------------------------------------
// CallRunner.

CallRunner::CallRunner(Coordinator* coordinator, const std::string& admin_token,
                       metrics::Metrics* metrics, std::function<absl::Status()> gate)
    : coordinator_(coordinator),
      metrics_(metrics),
      auth_(std::make_unique<Authenticator>(admin_token, &clock_)),
      gate_(std::move(gate)),
      pool_(std::make_shared<HandlerPool>(kHandlerPoolThreads)) {
  coordinator_->UseCredentials(auth_.get());
}

CallRunner::~CallRunner() { coordinator_->UseCredentials(nullptr); }

absl::Status CallRunner::Admit() const {
  if (shutting_down()) {
    return absl::UnavailableError("the coordinator is shutting down; retry with backoff");
  }
  return gate_ ? gate_() : absl::OkStatus();
}

grpc::Status CallRunner::Run(absl::string_view method, absl::FunctionRef<absl::Status()> body) {
  const absl::Time start = absl::Now();
  absl::Status status = Admit();
  if (status.ok()) status = body();
  return Conclude(method, start, std::move(status));
}

grpc::Status CallRunner::Conclude(absl::string_view method, absl::Time start,
                                  absl::Status status) {
  // A call that failed because the server is going away (its waits were
  // ended) should be retried, not acted upon.
  if (!status.ok() && shutting_down()) {
    status = absl::UnavailableError("the coordinator is shutting down; retry with backoff");
  }
  if (metrics_ != nullptr) metrics_->ObserveRpc(method, absl::Now() - start, status.code());
  if (status.code() == absl::StatusCode::kInternal) {
    LogLine(absl::StrCat("internal error method=", method, " status=\"", status.ToString(), "\""));
  }
  return ToGrpcStatus(status);
}

grpc::ServerUnaryReactor* CallRunner::RunPooled(grpc::CallbackServerContext* ctx,
                                                const char* method,
                                                std::function<absl::Status()> body) {
  // Not on the gRPC thread that received the call, and not on a sync-server
  // thread (whose hand-off put 70 ms on the p99 of heartbeats at 256/s).
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  pool_->Post([this, reactor, method, body = std::move(body)] {
    reactor->Finish(Run(method, body));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CallRunner::RunInlineOrPooled(
    grpc::CallbackServerContext* ctx, const char* method,
    std::function<std::optional<absl::Status>()> attempt, std::function<absl::Status()> rest) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  // A refused admission is the answer: `rest` must never run without the
  // checks of `attempt`.
  absl::Status admitted = Admit();
  std::optional<absl::Status> answer = admitted.ok() ? attempt() : admitted;
  if (answer.has_value()) {
    reactor->Finish(Conclude(method, start, *std::move(answer)));
    return reactor;
  }
  pool_->Post([this, reactor, method, rest = std::move(rest)] {
    reactor->Finish(Run(method, rest));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CallRunner::RunFenced(grpc::CallbackServerContext* ctx,
                                                const char* method, absl::Status checked,
                                                const v1::Fence* fence, FencedBody body) {
  return RunInlineOrPooled(
      ctx, method,
      [this, ctx, checked, fence, body]() -> std::optional<absl::Status> {
        if (!checked.ok()) return checked;
        std::optional<absl::StatusOr<FencedWorker>> fw = TryAuthorizeFence(*ctx, *fence);
        if (!fw.has_value()) return std::nullopt;  // the coordinator's lock is held
        if (!fw->ok()) return fw->status();
        return body(**fw);
      },
      [this, fence, body]() -> absl::Status {  // limits and token checked above
        absl::StatusOr<FencedWorker> fw = CheckFence(*fence);
        if (!fw.ok()) return fw.status();
        return body(*fw);
      });
}

absl::StatusOr<Principal> CallRunner::Authorize(const grpc::ServerContextBase& ctx,
                                                Access access, absl::string_view job_id,
                                                const v1::WorkerIdentity* worker) const {
  if (!auth_->enabled()) return Principal{};
  std::vector<absl::string_view> values;
  auto range = ctx.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    values.emplace_back(it->second.data(), it->second.size());
  }
  std::optional<WorkerRef> who;
  if (worker != nullptr) {
    who = WorkerRef{worker->job_id(), worker->worker_id(), worker->incarnation()};
  }
  return auth_->Authorize(values, access, job_id, PeerHost(ctx.peer()),
                          who.has_value() ? &*who : nullptr);
}

absl::Status CallRunner::AuthorizeRead(const grpc::ServerContextBase& ctx,
                                       const std::string& job_id, const char* field) const {
  if (auto p = Authorize(ctx, Access::kJobRead, job_id); !p.ok()) return p.status();
  return RequireJobId(job_id, field);
}

absl::Status CallRunner::AuthorizeMember(const grpc::ServerContextBase& ctx,
                                         const v1::WorkerIdentity& worker,
                                         const char* field) const {
  if (auto p = Authorize(ctx, Access::kMember, worker.job_id(), &worker); !p.ok()) {
    return p.status();
  }
  return RequireJobId(worker.job_id(), field);
}

absl::StatusOr<JoinedBy> CallRunner::AuthorizeJoin(const grpc::ServerContextBase& ctx,
                                                   const v1::WorkerIdentity& worker) const {
  absl::StatusOr<Principal> p = Authorize(ctx, Access::kJoin, worker.job_id(), &worker);
  if (!p.ok()) return p.status();
  if (absl::Status st = RequireJobId(worker.job_id(), "worker.job_id"); !st.ok()) return st;
  switch (p->kind) {
    case Principal::Kind::kJob:
      return JoinedBy::kJobToken;
    case Principal::Kind::kMember:
      return JoinedBy::kMemberToken;
    default:
      return JoinedBy::kTrusted;
  }
}

absl::StatusOr<FencedWorker> CallRunner::AuthorizeFence(const grpc::ServerContextBase& ctx,
                                                        const v1::Fence& fence) const {
  if (absl::Status st = AuthorizeMember(ctx, fence.worker(), "fence.worker.job_id"); !st.ok()) {
    return st;
  }
  return coordinator_->CheckFence(fence);
}

std::optional<absl::StatusOr<FencedWorker>> CallRunner::TryAuthorizeFence(
    const grpc::ServerContextBase& ctx, const v1::Fence& fence) const {
  if (absl::Status st = AuthorizeMember(ctx, fence.worker(), "fence.worker.job_id"); !st.ok()) {
    return absl::StatusOr<FencedWorker>(st);
  }
  return coordinator_->TryCheckFence(fence);
}

absl::StatusOr<FencedWorker> CallRunner::CheckFence(const v1::Fence& fence) const {
  return coordinator_->CheckFence(fence);
}

// ---------------------------------------------------------------------------
// Request helpers.

absl::Status RequireJobId(absl::string_view job_id, absl::string_view field) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be non-empty"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<absl::Duration>> ParseTimeout(bool has,
                                                           const google::protobuf::Duration& d,
                                                           absl::Duration max,
                                                           absl::string_view field) {
  if (!has) return std::nullopt;
  if (d.nanos() <= -1000000000 || d.nanos() >= 1000000000 ||
      (d.seconds() > 0 && d.nanos() < 0) || (d.seconds() < 0 && d.nanos() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is not a valid google.protobuf.Duration (nanos=", d.nanos(), ")"));
  }
  absl::Duration t = absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
  if (t < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "=", absl::FormatDuration(t), " is negative; give 0 or more"));
  }
  if (t > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, "=", absl::FormatDuration(t),
                                                   " is over the maximum of ",
                                                   absl::FormatDuration(max)));
  }
  return t;
}

absl::Time RpcDeadline(const grpc::ServerContextBase& ctx) {
  const auto d = ctx.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

absl::Time WaitDeadline(const grpc::ServerContextBase& ctx, std::optional<absl::Duration> timeout,
                        absl::Duration default_timeout) {
  return std::min(absl::Now() + timeout.value_or(default_timeout), RpcDeadline(ctx));
}

std::string Who(const v1::WorkerIdentity& w) {
  return absl::StrCat("job=", w.job_id(), " worker=", w.worker_id(),
                      " incarnation=", w.incarnation());
}

bool IsTerminal(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_COMPLETED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

}  // namespace shardline::server::rpc

// What every RPC adapter of server/rpc/ shares: the call runner (shutdown
// mapping, metrics, the absl -> gRPC status mapping of common/grpc_status.h),
// the handler pool of the callback-API methods, authentication helpers
// and the request's timeout and deadline.
//
//   grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
//                                       v1::Job* resp) {
//     return calls_->Run("JobService/GetJob", [&]() -> absl::Status {
//       if (absl::Status st = calls_->AuthorizeRead(*ctx, req->job_id(), "job_id"); !st.ok()) {
//         return st;
//       }
//       ... call the component, fill *resp ...
//     });
//   }
//
// Two kinds of handlers (the adapters' headers say which method is which):
//   * Sync API (grpc::Service methods): the body runs on a thread of gRPC's
//     sync server, one per in-flight call (bounded by
//     ServerOptions::max_threads), blocking waits included: Run().
//   * Callback API (WithCallbackMethod_*): gRPC calls the handler on one of
//     its own threads, which also move the bytes of every connection; the
//     body is posted to the HandlerPool (4 threads) and the handler returns
//     at once: RunPooled(). Only for bodies that never wait long. A body
//     that can first be tried without waiting for the coordinator's lock
//     runs on gRPC's thread when that works, else on the pool:
//     RunInlineOrPooled(), RunFenced(). A call
//     that waits holds no thread while it waits: the Session and WatchJob
//     streams (session_stream.h, watch_stream.h), GetAssignment with wait
//     (worker_service.h, OwningReactor below), and KvGet with wait, KvWait
//     and Barrier (rendezvous_service.h).
//
// Every handler answers UNAVAILABLE ("the coordinator is shutting down;
// retry with backoff") once BeginShutdown() was called, and also when its
// body failed while the server was shutting down (its waits were ended):
// such a call should be retried, not acted upon. INTERNAL answers are
// logged. Every call is counted in metrics::Metrics::ObserveRpc (when
// metrics are configured) under "<Service>/<Method>".
//
// Thread-safety: CallRunner and HandlerPool are thread-safe.
#ifndef SHARDLINE_SERVER_RPC_CALL_H_
#define SHARDLINE_SERVER_RPC_CALL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "metrics/metrics.h"
#include "common/clock.h"
#include "server/auth.h"
#include "server/coordinator.h"
#include "shardline/v1/common.pb.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

// coordinator.proto kMaxMessageBytes: largest request or response (bytes).
inline constexpr int kMaxMessageBytes = 64 * 1024 * 1024;
// GetAssignmentRequest.timeout: default and maximum.
inline constexpr absl::Duration kDefaultAssignmentTimeout = absl::Minutes(5);
inline constexpr absl::Duration kMaxAssignmentTimeout = absl::Hours(1);

namespace rpc {

// A few threads that run the callback-API handlers' work, so that gRPC's own
// threads (which also move the bytes of every connection) never wait on the
// coordinator's lock: a reaction that blocks stalls I/O for other calls,
// and at 4096 workers that meant unanswered keepalive pings. Open Session
// streams hold no thread at all (a sync server held one per worker:
// thousands of threads waking every poll_interval on 2 cores). Post() may be
// called with the coordinator's lock held (session wakers): it only queues.
// Thread-safe. Runs each posted item once, FIFO; items posted after Stop()
// are dropped; Stop() runs the items already queued, then joins.
class HandlerPool {
 public:
  using Item = std::function<void()>;
  explicit HandlerPool(int threads);
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  void Post(Item item) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Threads of the HandlerPool.
inline constexpr int kHandlerPoolThreads = 4;

// The reactor of a unary call whose work (a `Call`) waits without a thread:
// it owns the work until gRPC is done with the call, and passes a cancel
// on (Call::Cancel(), any thread; it must still lead to the reactor's
// Finish). Usage:
//   auto* reactor = new OwningReactor<MyWait>();
//   auto wait = std::make_shared<MyWait>(..., reactor);  // Finish()es it once
//   reactor->Own(wait);
template <typename Call>
class OwningReactor final : public grpc::ServerUnaryReactor {
 public:
  void Own(std::shared_ptr<Call> call) { call_ = std::move(call); }
  void OnCancel() override { call_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<Call> call_;
};

// Runs the handlers of every adapter (see the file comment) and checks who
// calls. Owned by CoordinatorServer; outlives every adapter.
class CallRunner {
 public:
  // `coordinator` (required) answers fences, and keeps the credential index
  // of the Authenticator this runner owns (Coordinator::UseCredentials: it
  // is attached here and detached in the destructor, so the coordinator
  // must outlive the runner); `admin_token` empty turns authentication off;
  // `metrics` may be null.
  // `gate` (may be null) is asked before every handler body and every
  // stream opened: a non-OK answer (a coordinator replica whose lease is
  // not confirmed, server/replica.h) is the call's answer and the body does
  // not run.
  CallRunner(Coordinator* coordinator, const std::string& admin_token,
             metrics::Metrics* metrics, std::function<absl::Status()> gate = nullptr);
  ~CallRunner();
  CallRunner(const CallRunner&) = delete;
  CallRunner& operator=(const CallRunner&) = delete;

  // Runs one sync-API handler body: UNAVAILABLE while shutting down (the
  // body does not run), metrics, the INTERNAL log, the status mapping.
  grpc::Status Run(absl::string_view method, absl::FunctionRef<absl::Status()> body);
  // Run()'s ending for a call whose body ended elsewhere (an asynchronous
  // wait begun at `start`): the shutdown mapping, metrics, the INTERNAL log
  // and the status mapping of `status`.
  grpc::Status Conclude(absl::string_view method, absl::Time start, absl::Status status);

  // Run() for a handler on the callback API: `body` runs on the pool, not
  // on the gRPC thread that received the call. `body` must capture by value
  // (the handler has returned when it runs); the request, response and
  // context stay valid until the reactor's Finish. Only for bodies that
  // never wait long: a few such bodies fill the pool. `method` must be a
  // string literal.
  grpc::ServerUnaryReactor* RunPooled(grpc::CallbackServerContext* ctx, const char* method,
                                      std::function<absl::Status()> body);

  // RunPooled() for a call that can be tried first without waiting:
  // `attempt` runs on the gRPC thread that received the call (after the
  // admission check; a refusal is answered at once and nothing runs) and
  // answers, or returns nullopt when it would have to wait for a lock; then
  // `rest` finishes the call on the pool. `rest` runs only after `attempt`
  // returned nullopt, so it relies on the checks `attempt` made (the
  // request's limits, the token) and does not repeat them. Saves the
  // hand-off to the pool when
  // the coordinator's lock is free (bench cp_load A/B against the pool
  // alone, medians of 3 each, two runs on the same machine: heartbeats
  // closed loop 1.47x at 256 workers, 1.16x at 1024; KV set+get ops/s
  // 1.14x at 1 client, 1.22-1.37x at 4, 1.02x at 16; barrier rounds
  // 1.06-1.43x at 2 members, 0.91-1.12x at 16, the run-to-run noise of
  // this 2-core machine). `attempt` must never wait for the
  // coordinator's lock (Coordinator::TryCheckFence, TryHeartbeat) nor do
  // slow work; both capture by value.
  grpc::ServerUnaryReactor* RunInlineOrPooled(grpc::CallbackServerContext* ctx,
                                              const char* method,
                                              std::function<std::optional<absl::Status>()> attempt,
                                              std::function<absl::Status()> rest);

  // RunInlineOrPooled() for a fenced call whose work after the fence check
  // never waits long (the Rendezvous's, under its short lock): `checked`
  // (the request's limits, already checked), then AuthorizeFence(fence),
  // then `body(fenced)`; on the gRPC thread when the fence could be checked
  // without waiting (TryAuthorizeFence), else the fence (CheckFence) and
  // `body` on the pool. `fence` must stay valid until the reactor's Finish
  // (it is the request's).
  using FencedBody = std::function<absl::Status(const FencedWorker&)>;
  grpc::ServerUnaryReactor* RunFenced(grpc::CallbackServerContext* ctx, const char* method,
                                      absl::Status checked, const v1::Fence* fence,
                                      FencedBody body);

  // Authentication (server/auth.h) of the call's "authorization" metadata,
  // rate-limited by the peer's host. `worker`: the identity a kJoin or
  // kMember call acts as. Never calls the coordinator.
  // Errors: UNAUTHENTICATED, RESOURCE_EXHAUSTED, PERMISSION_DENIED
  // (coordinator.proto Errors).
  absl::StatusOr<Principal> Authorize(const grpc::ServerContextBase& ctx, Access access,
                                      absl::string_view job_id,
                                      const v1::WorkerIdentity* worker = nullptr) const;
  // A read of `job_id` (named `field` in errors): the admin token, the
  // job's worker token or one of its member tokens, and the id is present.
  // Errors: Authorize's; INVALID_ARGUMENT "<field> must be non-empty".
  absl::Status AuthorizeRead(const grpc::ServerContextBase& ctx, const std::string& job_id,
                             const char* field) const;
  // A call that acts as `worker` (its job_id named `field` in errors): the
  // admin token, or the member token of exactly that incarnation.
  // Errors: Authorize's; INVALID_ARGUMENT "<field> must be non-empty".
  absl::Status AuthorizeMember(const grpc::ServerContextBase& ctx,
                               const v1::WorkerIdentity& worker, const char* field) const;
  // JoinJob as `worker`: who joins (for Coordinator::JoinJob).
  // Errors: Authorize's; INVALID_ARGUMENT "worker.job_id must be non-empty".
  absl::StatusOr<JoinedBy> AuthorizeJoin(const grpc::ServerContextBase& ctx,
                                         const v1::WorkerIdentity& worker) const;
  // AuthorizeMember on fence.worker, then Coordinator::CheckFence.
  // Errors: AuthorizeMember's; CheckFence's (INVALID_ARGUMENT, NOT_FOUND,
  // FAILED_PRECONDITION, ABORTED).
  absl::StatusOr<FencedWorker> AuthorizeFence(const grpc::ServerContextBase& ctx,
                                              const v1::Fence& fence) const;
  // AuthorizeFence without waiting for the coordinator's lock
  // (Coordinator::TryCheckFence): nullopt when another thread holds it;
  // the token was checked then, and CheckFence finishes the check.
  std::optional<absl::StatusOr<FencedWorker>> TryAuthorizeFence(const grpc::ServerContextBase& ctx,
                                                                const v1::Fence& fence) const;
  // Coordinator::CheckFence alone, for a call whose token TryAuthorizeFence
  // has checked. Errors: CheckFence's.
  absl::StatusOr<FencedWorker> CheckFence(const v1::Fence& fence) const;
  bool auth_enabled() const { return auth_->enabled(); }

  // From now on every handler answers UNAVAILABLE. Idempotent.
  void BeginShutdown() { shutting_down_.store(true); }
  bool shutting_down() const { return shutting_down_.load(); }
  // OK when calls may be served: not shutting down and the gate (if any)
  // says OK; else the UNAVAILABLE (or the gate's) status to answer.
  absl::Status Admit() const;

  // Shared with the session wakers the coordinator holds.
  const std::shared_ptr<HandlerPool>& pool() const { return pool_; }
  metrics::Metrics* metrics() const { return metrics_; }

 private:
  Coordinator* const coordinator_;
  metrics::Metrics* const metrics_;
  RealClock clock_;  // paces the Authenticator's FailureLimiter
  const std::unique_ptr<Authenticator> auth_;
  std::atomic<bool> shutting_down_{false};
  const std::function<absl::Status()> gate_;
  const std::shared_ptr<HandlerPool> pool_;
};

// INVALID_ARGUMENT "<field> must be non-empty" for an empty job id.
absl::Status RequireJobId(absl::string_view job_id, absl::string_view field);

// The request's timeout: nullopt when unset. INVALID_ARGUMENT (naming
// `field`) when malformed, negative or over `max`.
absl::StatusOr<std::optional<absl::Duration>> ParseTimeout(bool has,
                                                           const google::protobuf::Duration& d,
                                                           absl::Duration max,
                                                           absl::string_view field);

// The call's gRPC deadline (InfiniteFuture when it has none).
absl::Time RpcDeadline(const grpc::ServerContextBase& ctx);

// The earlier of now + the request's timeout (or `default_timeout`) and the
// gRPC deadline.
absl::Time WaitDeadline(const grpc::ServerContextBase& ctx, std::optional<absl::Duration> timeout,
                        absl::Duration default_timeout);

// "job=<id> worker=<id> incarnation=<n>" for log lines.
std::string Who(const v1::WorkerIdentity& w);

// COMPLETED, FAILED or CANCELLED.
bool IsTerminal(v1::JobPhase phase);

}  // namespace rpc
}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_RPC_CALL_H_

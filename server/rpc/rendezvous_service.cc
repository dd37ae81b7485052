#include "server/rpc/rendezvous_service.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "server/limits.h"

namespace shardline::server::rpc {

namespace {

// The request's timeout (ParseTimeout), named "timeout" in errors.
template <typename Request>
absl::StatusOr<std::optional<absl::Duration>> RequestTimeout(const Request& req) {
  return ParseTimeout(req.has_timeout(), req.timeout(), kMaxWaitTimeout, "timeout");
}

// One call that may wait in the Rendezvous, without holding a thread: a
// KvGet with wait, a KvWait or a Barrier arrival. Its checks (the request's
// limits, the token, the fence, the timeout, in that order) and its start
// run on the gRPC thread that received it when the coordinator's lock is
// free at once (as CallRunner::RunFenced); else the limits and the token
// there, the rest on the pool. Shared by its reactor
// (which owns it until OnDone), the Rendezvous's answer callback and the
// deadline alarm (both hold weak references). Exactly one answer finishes
// the call: the one known at once, or (once it waits) either the
// Rendezvous's `done` (with the Rendezvous's lock held: it only fills the
// response and finishes the RPC) or a withdrawal at the deadline or on
// cancel, whichever the Rendezvous lets happen (it serializes them). So no
// lock of this class is held around a Rendezvous call, and none is taken in
// `done`. Shutdown ends a waiting call through Rendezvous::DropJob
// (ABORTED, answered as UNAVAILABLE while shutting down).
template <typename T>
class WaitingCall : public std::enable_shared_from_this<WaitingCall<T>> {
 public:
  using Timeout = absl::StatusOr<std::optional<absl::Duration>>;
  // Starts the wait (or answers) for the checked caller.
  using Begin = std::function<Rendezvous::Arrival<T>(
      const FencedWorker&, std::optional<absl::Duration> timeout, Rendezvous::Done<T>)>;
  // Fills the response with an OK answer.
  using Respond = std::function<void(T)>;

  // The reactor of a new call. `checked`: the request's limits; `fence`
  // (the request's) must stay valid until the reactor's Finish. `method`
  // must be a string literal.
  static grpc::ServerUnaryReactor* Launch(CallRunner* calls, Rendezvous* rendezvous,
                                          const char* method, grpc::CallbackServerContext* ctx,
                                          absl::Status checked, const v1::Fence* fence,
                                          Timeout timeout, Begin begin, Respond respond) {
    auto* reactor = new OwningReactor<WaitingCall>();
    auto call = std::make_shared<WaitingCall>(calls, rendezvous, method, reactor, fence,
                                              std::move(timeout), std::move(begin),
                                              std::move(respond));
    reactor->Own(call);
    if (absl::Status st = calls->Admit(); !st.ok()) {
      call->Finish(st);
    } else if (!checked.ok()) {
      call->Finish(checked);
    } else if (std::optional<absl::StatusOr<FencedWorker>> fw =
                   calls->TryAuthorizeFence(*ctx, *fence)) {
      call->Start(*std::move(fw));  // checked without waiting: start here
    } else {
      calls->pool()->Post([call] { call->StartPooled(); });
    }
    return reactor;
  }

  WaitingCall(CallRunner* calls, Rendezvous* rendezvous, const char* method,
              grpc::ServerUnaryReactor* reactor, const v1::Fence* fence, Timeout timeout,
              Begin begin, Respond respond)
      : calls_(calls),
        rendezvous_(rendezvous),
        method_(method),
        reactor_(reactor),
        fence_(fence),
        timeout_(std::move(timeout)),
        begin_(std::move(begin)),
        respond_(std::move(respond)) {}

  // The caller cancelled (any thread).
  void Cancel() {
    cancelled_.store(true);
    PostWithdraw(*calls_->pool(), this->weak_from_this(), /*cancelled=*/true);
  }

 private:
  // On the pool, when the coordinator's lock was held at Launch (the limits
  // and the token were checked there): the fence, waiting for the lock.
  void StartPooled() {
    if (absl::Status st = calls_->Admit(); !st.ok()) return Finish(st);
    Start(calls_->CheckFence(*fence_));
  }

  // Starts the wait (or answers) with the fence's answer.
  void Start(absl::StatusOr<FencedWorker> fw) {
    if (!fw.ok()) return Finish(fw.status());
    if (!timeout_.ok()) return Finish(timeout_.status());
    std::weak_ptr<WaitingCall> weak = this->weak_from_this();
    Rendezvous::Arrival<T> a = begin_(*fw, *timeout_, [weak](absl::StatusOr<T> answer) {
      if (auto self = weak.lock()) self->Finish(std::move(answer));
    });
    if (a.answer.has_value()) return Finish(*std::move(a.answer));
    wait_id_.store(a.wait_id);
    std::shared_ptr<HandlerPool> pool = calls_->pool();
    alarm_.Set(absl::ToChronoTime(a.deadline), [weak, pool](bool fired) {
      if (fired) PostWithdraw(*pool, weak, /*cancelled=*/false);  // else: finished
    });
    // A cancel that came before the wait was registered withdraws now.
    if (cancelled_.load()) PostWithdraw(*pool, weak, /*cancelled=*/true);
  }

  // On the pool: withdraws the waiting call and finishes with the answer,
  // unless the Rendezvous already answered it.
  static void PostWithdraw(HandlerPool& pool, std::weak_ptr<WaitingCall> weak, bool cancelled) {
    pool.Post([weak = std::move(weak), cancelled] {
      auto self = weak.lock();
      if (self == nullptr) return;
      const uint64_t id = self->wait_id_.load();
      if (id == 0) return;  // not waiting (yet): Start handles a cancel
      if (std::optional<absl::Status> st = self->rendezvous_->Withdraw(id, cancelled)) {
        self->Finish(*std::move(st));
      }
    });
  }

  void Finish(absl::StatusOr<T> r) {
    if (finished_.exchange(true)) return;  // never twice (the Rendezvous ensures it)
    if (r.ok()) respond_(*std::move(r));
    grpc::Status out = calls_->Conclude(method_, start_, r.ok() ? absl::OkStatus() : r.status());
    // Last touch of the call: the reactor may be gone right after.
    reactor_->Finish(out);
  }

  CallRunner* const calls_;
  Rendezvous* const rendezvous_;
  const char* const method_;
  grpc::ServerUnaryReactor* const reactor_;
  const v1::Fence* const fence_;
  const Timeout timeout_;
  const Begin begin_;
  const Respond respond_;
  const absl::Time start_ = absl::Now();
  grpc::Alarm alarm_;
  std::atomic<uint64_t> wait_id_{0};  // non-zero once it waits
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

}  // namespace

RendezvousServiceImpl::RendezvousServiceImpl(CallRunner* calls, Coordinator* coordinator,
                                             Rendezvous* rendezvous)
    : calls_(calls), coordinator_(coordinator), rendezvous_(rendezvous) {}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvSet(grpc::CallbackServerContext* ctx,
                                                       const v1::KvSetRequest* req,
                                                       v1::KvSetResponse*) {
  return calls_->RunFenced(ctx, "RendezvousService/KvSet", CheckRequestLimits(*req),
                           &req->fence(), [this, req](const FencedWorker& fw) {
                             return rendezvous_->Set(fw.job_id, fw.generation, req->scope(),
                                                     req->key(), req->value());
                           });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvGet(grpc::CallbackServerContext* ctx,
                                                       const v1::KvGetRequest* req,
                                                       v1::KvGetResponse* resp) {
  if (!req->has_fence()) {  // an operator's read: never waits (it refuses wait)
    return calls_->RunPooled(ctx, "RendezvousService/KvGet", [=]() -> absl::Status {
      if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
      return OperatorRead(*ctx, *req, resp);
    });
  }
  if (!req->wait()) {
    return calls_->RunFenced(
        ctx, "RendezvousService/KvGet", CheckRequestLimits(*req), &req->fence(),
        [this, req, resp](const FencedWorker& fw) -> absl::Status {
          absl::StatusOr<std::optional<absl::Duration>> timeout = RequestTimeout(*req);
          if (!timeout.ok()) return timeout.status();
          absl::StatusOr<std::optional<std::string>> r = rendezvous_->Get(
              fw.job_id, fw.generation, req->scope(), req->key(), /*wait=*/false, *timeout);
          if (!r.ok()) return r.status();
          resp->set_found(r->has_value());
          if (r->has_value()) resp->set_value(**std::move(r));
          return absl::OkStatus();
        });
  }
  return WaitingCall<Rendezvous::KeyAnswer>::Launch(
      calls_, rendezvous_, "RendezvousService/KvGet", ctx, CheckRequestLimits(*req),
      &req->fence(), RequestTimeout(*req),
      [this, ctx, req](const FencedWorker& fw, std::optional<absl::Duration> timeout,
                       Rendezvous::Done<Rendezvous::KeyAnswer> done) {
        return rendezvous_->AwaitKey(fw.job_id, fw.generation, req->scope(), req->key(), timeout,
                                     RpcDeadline(*ctx), std::move(done));
      },
      [resp](Rendezvous::KeyAnswer value) {
        resp->set_found(value.has_value());
        if (value.has_value()) resp->set_value(*std::move(value));
      });
}

absl::Status RendezvousServiceImpl::OperatorRead(const grpc::ServerContextBase& ctx,
                                                 const v1::KvGetRequest& req,
                                                 v1::KvGetResponse* resp) {
  if (req.job_id().empty()) {
    return absl::InvalidArgumentError(
        "KvGet needs a fence, or job_id and generation for an operator read");
  }
  if (auto p = calls_->Authorize(ctx, Access::kAdminOnly, req.job_id()); !p.ok()) {
    return p.status();
  }
  if (req.wait()) {
    return absl::InvalidArgumentError("an operator read (no fence) cannot wait; set wait=false");
  }
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(req.job_id());
  if (!job.ok()) return job.status();
  if (req.generation() < job->generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", req.generation(), " of job ", req.job_id(), " is over (current ",
        job->generation(), "); its rendezvous keys were dropped when it ended"));
  }
  if (req.generation() > job->generation()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation=", req.generation(), " does not exist yet; job ", req.job_id(),
        " is at generation ", job->generation()));
  }
  absl::StatusOr<std::optional<std::string>> r = rendezvous_->Get(
      req.job_id(), req.generation(), req.scope(), req.key(), false, std::nullopt);
  if (!r.ok()) return r.status();
  resp->set_found(r->has_value());
  if (r->has_value()) resp->set_value(**std::move(r));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvAdd(grpc::CallbackServerContext* ctx,
                                                       const v1::KvAddRequest* req,
                                                       v1::KvAddResponse* resp) {
  return calls_->RunFenced(ctx, "RendezvousService/KvAdd", CheckRequestLimits(*req),
                           &req->fence(),
                           [this, req, resp](const FencedWorker& fw) -> absl::Status {
                             absl::StatusOr<int64_t> r = rendezvous_->Add(
                                 fw.job_id, fw.generation, req->scope(), req->key(), req->delta());
                             if (!r.ok()) return r.status();
                             resp->set_value(*r);
                             return absl::OkStatus();
                           });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvCompareAndSet(
    grpc::CallbackServerContext* ctx, const v1::KvCompareAndSetRequest* req,
    v1::KvCompareAndSetResponse* resp) {
  return calls_->RunFenced(
      ctx, "RendezvousService/KvCompareAndSet", CheckRequestLimits(*req), &req->fence(),
      [this, req, resp](const FencedWorker& fw) -> absl::Status {
        std::optional<absl::string_view> expected;
        if (req->has_expected()) expected = req->expected();
        absl::StatusOr<Rendezvous::CasResult> r = rendezvous_->CompareAndSet(
            fw.job_id, fw.generation, req->scope(), req->key(), expected, req->desired());
        if (!r.ok()) return r.status();
        resp->set_swapped(r->swapped);
        if (r->current.has_value()) resp->set_current(*r->current);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvWait(grpc::CallbackServerContext* ctx,
                                                        const v1::KvWaitRequest* req,
                                                        v1::KvWaitResponse*) {
  return WaitingCall<Rendezvous::KeyAnswer>::Launch(
      calls_, rendezvous_, "RendezvousService/KvWait", ctx, CheckRequestLimits(*req),
      &req->fence(), RequestTimeout(*req),
      [this, ctx, req](const FencedWorker& fw, std::optional<absl::Duration> timeout,
                       Rendezvous::Done<Rendezvous::KeyAnswer> done) {
        return rendezvous_->AwaitKeys(fw.job_id, fw.generation, req->scope(),
                                      {req->keys().begin(), req->keys().end()}, timeout,
                                      RpcDeadline(*ctx), std::move(done));
      },
      [](Rendezvous::KeyAnswer) {});
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvDelete(grpc::CallbackServerContext* ctx,
                                                          const v1::KvDeleteRequest* req,
                                                          v1::KvDeleteResponse* resp) {
  return calls_->RunFenced(ctx, "RendezvousService/KvDelete", CheckRequestLimits(*req),
                           &req->fence(),
                           [this, req, resp](const FencedWorker& fw) -> absl::Status {
                             absl::StatusOr<bool> r = rendezvous_->Delete(
                                 fw.job_id, fw.generation, req->scope(), req->key());
                             if (!r.ok()) return r.status();
                             resp->set_deleted(*r);
                             return absl::OkStatus();
                           });
}

grpc::Status RendezvousServiceImpl::KvNumKeys(grpc::ServerContext* ctx,
                                              const v1::KvNumKeysRequest* req,
                                              v1::KvNumKeysResponse* resp) {
  return calls_->Run("RendezvousService/KvNumKeys", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    absl::StatusOr<uint64_t> r = rendezvous_->NumKeys(fw->job_id, fw->generation, req->scope());
    if (!r.ok()) return r.status();
    resp->set_num_keys(*r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Barrier(grpc::CallbackServerContext* ctx,
                                                         const v1::BarrierRequest* req,
                                                         v1::BarrierResponse* resp) {
  return WaitingCall<uint32_t>::Launch(
      calls_, rendezvous_, "RendezvousService/Barrier", ctx, CheckRequestLimits(*req),
      &req->fence(), RequestTimeout(*req),
      [this, ctx, req](const FencedWorker& fw, std::optional<absl::Duration> timeout,
                       Rendezvous::Done<uint32_t> done) {
        return rendezvous_->BarrierArrive(fw.job_id, fw.generation, req->scope(), req->name(),
                                          fw.worker_id, req->participants(), timeout,
                                          RpcDeadline(*ctx), std::move(done));
      },
      [resp](uint32_t position) { resp->set_arrival(position); });
}

}  // namespace shardline::server::rpc

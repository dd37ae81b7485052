#include "server/rpc/rendezvous_service.h"

#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "server/limits.h"

namespace shardline::server::rpc {

RendezvousServiceImpl::RendezvousServiceImpl(CallRunner* calls, Coordinator* coordinator,
                                             Rendezvous* rendezvous, int max_waiting_gets)
    : calls_(calls),
      coordinator_(coordinator),
      rendezvous_(rendezvous),
      max_waiting_gets_(max_waiting_gets) {}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvSet(grpc::CallbackServerContext* ctx,
                                                       const v1::KvSetRequest* req,
                                                       v1::KvSetResponse*) {
  return calls_->RunPooled(ctx, "RendezvousService/KvSet", [=]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    return rendezvous_->Set(fw->job_id, fw->generation, req->scope(), req->key(), req->value());
  });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvGet(grpc::CallbackServerContext* ctx,
                                                       const v1::KvGetRequest* req,
                                                       v1::KvGetResponse* resp) {
  if (!req->wait()) {
    return calls_->RunPooled(ctx, "RendezvousService/KvGet",
                             [=] { return Get(ctx, req, resp); });
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (waiting_gets_.fetch_add(1) >= max_waiting_gets_) {
    waiting_gets_.fetch_sub(1);
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("the coordinator already holds ", max_waiting_gets_,
                     " waiting KvGet calls; retry later (or wait with KvWait)"))));
    return reactor;
  }
  try {
    std::thread([this, ctx, req, resp, reactor] {
      grpc::Status status =
          calls_->Run("RendezvousService/KvGet", [&] { return Get(ctx, req, resp); });
      waiting_gets_.fetch_sub(1);
      // Finish is the last touch: the call (and maybe the server) may be
      // gone right after it.
      reactor->Finish(status);
    }).detach();
  } catch (const std::system_error& e) {  // the process is out of threads
    waiting_gets_.fetch_sub(1);
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("cannot start a thread for a waiting KvGet (", e.what(), "); retry"))));
  }
  return reactor;
}

absl::Status RendezvousServiceImpl::Get(grpc::CallbackServerContext* ctx,
                                        const v1::KvGetRequest* req, v1::KvGetResponse* resp) {
  if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
  if (!req->has_fence()) return OperatorRead(*ctx, *req, resp);
  absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
  if (!fw.ok()) return fw.status();
  absl::StatusOr<std::optional<absl::Duration>> timeout =
      ParseTimeout(req->has_timeout(), req->timeout(), kMaxWaitTimeout, "timeout");
  if (!timeout.ok()) return timeout.status();
  absl::StatusOr<std::optional<std::string>> r;
  if (!req->wait()) {
    r = rendezvous_->Get(fw->job_id, fw->generation, req->scope(), req->key(), false, *timeout);
  } else {
    const absl::Time deadline = WaitDeadline(*ctx, *timeout, kDefaultWaitTimeout);
    r = calls_->SlicedWait<std::optional<std::string>>(
        ctx, deadline, [&](absl::Duration remaining, absl::Time slice_end) {
          return rendezvous_->Get(fw->job_id, fw->generation, req->scope(), req->key(), true,
                                  remaining, slice_end);
        });
  }
  if (!r.ok()) return r.status();
  resp->set_found(r->has_value());
  if (r->has_value()) resp->set_value(**std::move(r));
  return absl::OkStatus();
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
  return calls_->RunPooled(ctx, "RendezvousService/KvAdd", [=]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    absl::StatusOr<int64_t> r =
        rendezvous_->Add(fw->job_id, fw->generation, req->scope(), req->key(), req->delta());
    if (!r.ok()) return r.status();
    resp->set_value(*r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvCompareAndSet(
    grpc::CallbackServerContext* ctx, const v1::KvCompareAndSetRequest* req,
    v1::KvCompareAndSetResponse* resp) {
  return calls_->RunPooled(ctx, "RendezvousService/KvCompareAndSet", [=]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    std::optional<absl::string_view> expected;
    if (req->has_expected()) expected = req->expected();
    absl::StatusOr<Rendezvous::CasResult> r = rendezvous_->CompareAndSet(
        fw->job_id, fw->generation, req->scope(), req->key(), expected, req->desired());
    if (!r.ok()) return r.status();
    resp->set_swapped(r->swapped);
    if (r->current.has_value()) resp->set_current(*r->current);
    return absl::OkStatus();
  });
}

grpc::Status RendezvousServiceImpl::KvWait(grpc::ServerContext* ctx, const v1::KvWaitRequest* req,
                                           v1::KvWaitResponse*) {
  return calls_->Run("RendezvousService/KvWait", [&]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    absl::StatusOr<std::optional<absl::Duration>> timeout =
        ParseTimeout(req->has_timeout(), req->timeout(), kMaxWaitTimeout, "timeout");
    if (!timeout.ok()) return timeout.status();
    const std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    const absl::Time deadline = WaitDeadline(*ctx, *timeout, kDefaultWaitTimeout);
    return calls_
        ->SlicedWait<bool>(ctx, deadline,
                           [&](absl::Duration remaining,
                               absl::Time slice_end) -> absl::StatusOr<bool> {
                             absl::Status st = rendezvous_->Wait(fw->job_id, fw->generation,
                                                                 req->scope(), keys, remaining,
                                                                 slice_end);
                             if (!st.ok()) return st;
                             return true;
                           })
        .status();
  });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::KvDelete(grpc::CallbackServerContext* ctx,
                                                          const v1::KvDeleteRequest* req,
                                                          v1::KvDeleteResponse* resp) {
  return calls_->RunPooled(ctx, "RendezvousService/KvDelete", [=]() -> absl::Status {
    if (absl::Status st = CheckRequestLimits(*req); !st.ok()) return st;
    absl::StatusOr<FencedWorker> fw = calls_->AuthorizeFence(*ctx, req->fence());
    if (!fw.ok()) return fw.status();
    absl::StatusOr<bool> r =
        rendezvous_->Delete(fw->job_id, fw->generation, req->scope(), req->key());
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

// One Barrier arrival, which holds no thread while it waits. Shared by its
// reactor (which owns it until OnDone), the Rendezvous's answer callback and
// the deadline alarm (both hold weak references). Exactly one answer
// finishes the call: the one at arrival, or (once it waits) either the
// Rendezvous's `done` (with the Rendezvous's lock held: it only finishes the
// RPC) or a withdrawal at the deadline or on cancel, whichever the
// Rendezvous lets happen (it serializes them). So no lock of this class is
// held around a Rendezvous call, and no lock is taken in `done`.
class RendezvousServiceImpl::BarrierCall
    : public std::enable_shared_from_this<RendezvousServiceImpl::BarrierCall> {
 public:
  BarrierCall(RendezvousServiceImpl* service, grpc::CallbackServerContext* ctx,
              const v1::BarrierRequest* req, v1::BarrierResponse* resp,
              grpc::ServerUnaryReactor* reactor)
      : service_(service), ctx_(ctx), req_(req), resp_(resp), reactor_(reactor) {}

  // On the pool: checks the request and arrives.
  void Start() {
    CallRunner* calls = service_->calls_;
    if (absl::Status st = calls->Admit(); !st.ok()) return Finish(st);
    if (absl::Status st = CheckRequestLimits(*req_); !st.ok()) return Finish(st);
    absl::StatusOr<FencedWorker> fw = calls->AuthorizeFence(*ctx_, req_->fence());
    if (!fw.ok()) return Finish(fw.status());
    absl::StatusOr<std::optional<absl::Duration>> timeout =
        ParseTimeout(req_->has_timeout(), req_->timeout(), kMaxWaitTimeout, "timeout");
    if (!timeout.ok()) return Finish(timeout.status());
    // Not sliced: a barrier arrival that times out is withdrawn. The gRPC
    // deadline bounds it; shutdown ends it with DropJob (ABORTED, answered
    // as UNAVAILABLE while shutting down).
    std::weak_ptr<BarrierCall> weak = weak_from_this();
    Rendezvous::BarrierArrival a = service_->rendezvous_->BarrierArrive(
        fw->job_id, fw->generation, req_->scope(), req_->name(), fw->worker_id,
        req_->participants(), *timeout, RpcDeadline(*ctx_),
        [weak](absl::StatusOr<uint32_t> answer) {
          if (auto self = weak.lock()) self->Finish(std::move(answer));
        });
    if (a.answer.has_value()) return Finish(*std::move(a.answer));
    wait_id_.store(a.wait_id);
    std::shared_ptr<HandlerPool> pool = calls->pool();
    alarm_.Set(absl::ToChronoTime(a.deadline), [weak, pool](bool fired) {
      if (fired) PostWithdraw(*pool, weak, /*cancelled=*/false);  // else: finished
    });
    // A cancel that came before the arrival was registered withdraws now.
    if (cancelled_.load()) PostWithdraw(*pool, weak, /*cancelled=*/true);
  }

  // The caller cancelled (any thread).
  void Cancel() {
    cancelled_.store(true);
    PostWithdraw(*service_->calls_->pool(), weak_from_this(), /*cancelled=*/true);
  }

 private:
  // On the pool: withdraws the waiting arrival and finishes with the
  // answer, unless the Rendezvous already answered it.
  static void PostWithdraw(HandlerPool& pool, std::weak_ptr<BarrierCall> weak, bool cancelled) {
    pool.Post([weak = std::move(weak), cancelled] {
      auto self = weak.lock();
      if (self == nullptr) return;
      const uint64_t id = self->wait_id_.load();
      if (id == 0) return;  // not waiting (yet): Start handles a cancel
      if (std::optional<absl::Status> st =
              self->service_->rendezvous_->WithdrawBarrierWait(id, cancelled)) {
        self->Finish(*std::move(st));
      }
    });
  }

  void Finish(absl::StatusOr<uint32_t> r) {
    if (finished_.exchange(true)) return;  // never twice (the Rendezvous ensures it)
    if (r.ok()) resp_->set_arrival(*r);
    grpc::Status out = service_->calls_->Conclude("RendezvousService/Barrier", start_,
                                                   r.ok() ? absl::OkStatus() : r.status());
    // Last touch of the call: the reactor may be gone right after.
    reactor_->Finish(out);
  }

  RendezvousServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  const v1::BarrierRequest* const req_;
  v1::BarrierResponse* const resp_;
  grpc::ServerUnaryReactor* const reactor_;
  const absl::Time start_ = absl::Now();
  grpc::Alarm alarm_;
  std::atomic<uint64_t> wait_id_{0};  // non-zero once it waits
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

grpc::ServerUnaryReactor* RendezvousServiceImpl::Barrier(grpc::CallbackServerContext* ctx,
                                                         const v1::BarrierRequest* req,
                                                         v1::BarrierResponse* resp) {
  auto* reactor = new OwningReactor<BarrierCall>();
  auto call = std::make_shared<BarrierCall>(this, ctx, req, resp, reactor);
  reactor->Own(call);
  calls_->pool()->Post([call] { call->Start(); });
  return reactor;
}

}  // namespace shardline::server::rpc

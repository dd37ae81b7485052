#include "worker/coordinator_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);
// rendezvous.proto kMaxWaitTimeout: the longest wait of one call.
constexpr absl::Duration kMaxWaitTimeout = absl::Seconds(3600);
// Extra gRPC deadline beyond a blocking call's own timeout.
constexpr absl::Duration kDeadlineSlack = absl::Seconds(5);

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t ns = absl::ToInt64Nanoseconds(std::max(d, absl::ZeroDuration()));
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

// Runs `attempt(slice)` until it returns something other than UNAVAILABLE or
// `deadline` passes; `slice` is the time left (capped at kMaxWaitTimeout).
// A DEADLINE_EXCEEDED answer before `deadline` (a capped slice) is retried.
// Stops early (CANCELLED) once `cancel` (may be null) is cancelled.
template <typename Attempt>
grpc::Status RetryUntil(absl::Time deadline, const CancelToken* cancel, Attempt attempt) {
  const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "the generation is over");
  absl::Duration backoff = kMinBackoff;
  while (true) {
    if (cancel != nullptr && cancel->cancelled()) return cancelled;
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    const absl::Duration slice = std::min(left, kMaxWaitTimeout);
    grpc::Status s = attempt(slice);
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && slice < left) continue;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return s;
    if (absl::Now() + backoff >= deadline) return s;
    if (cancel != nullptr) {
      if (cancel->WaitForCancel(backoff)) return cancelled;
    } else {
      absl::SleepFor(backoff);
    }
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace

CoordinatorStore::CoordinatorStore(std::shared_ptr<grpc::Channel> channel,
                                   client::ConnectionOptions connection, v1::Fence fence,
                                   std::string scope, std::shared_ptr<CancelToken> cancel)
    : connection_(std::move(connection)),
      fence_(std::move(fence)),
      scope_(std::move(scope)),
      stub_(v1::RendezvousService::NewStub(channel)),
      cancel_(std::move(cancel)) {}

template <typename Call>
grpc::Status CoordinatorStore::Guarded(grpc::ClientContext* ctx, Call call) const {
  if (cancel_ != nullptr && !cancel_->Register(ctx)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the generation is over");
  }
  grpc::Status s = call();
  if (cancel_ != nullptr) cancel_->Unregister(ctx);
  return s;
}

absl::Status CoordinatorStore::CancelledStatus() const {
  return absl::AbortedError(absl::StrCat("generation ", fence_.generation(),
                                         " is over (scope '", scope_, "'): ", cancel_->reason(),
                                         "; abort the group and re-join"));
}

void CoordinatorStore::Prepare(grpc::ClientContext* ctx, absl::Duration deadline) const {
  if (!connection_.token.empty()) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", connection_.token));
  }
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
}

absl::Status CoordinatorStore::ToStatus(const grpc::Status& s, absl::string_view rpc) const {
  if (s.ok()) return absl::OkStatus();
  if (cancel_ != nullptr && cancel_->cancelled()) return CancelledStatus();
  if (s.error_code() == grpc::StatusCode::ABORTED) {
    return absl::AbortedError(s.error_message());
  }
  return client::FromGrpcStatus(s, connection_, rpc);
}

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  v1::KvSetRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_value(value);
  grpc::Status s = RetryUntil(absl::Now() + kRetryWindow, cancel_.get(), [&](absl::Duration) {
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, connection_.timeout);
    return Guarded(&ctx, [&] { return stub_->KvSet(&ctx, req, &resp); });
  });
  return ToStatus(s, "KvSet");
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key, absl::Duration timeout) {
  v1::KvGetRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_wait(true);
  v1::KvGetResponse resp;
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status s = RetryUntil(deadline, cancel_.get(), [&](absl::Duration slice) {
    ToProto(slice, req.mutable_timeout());
    grpc::ClientContext ctx;
    Prepare(&ctx, slice + kDeadlineSlack);
    return Guarded(&ctx, [&] { return stub_->KvGet(&ctx, req, &resp); });
  });
  if (!s.ok() && cancel_ != nullptr && cancel_->cancelled()) return CancelledStatus();
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(
        absl::StrCat("key '", key, "' of scope '", scope_, "' (generation ", fence_.generation(),
                     ") was not set within ", absl::FormatDuration(timeout)));
  }
  if (!s.ok()) return ToStatus(s, "KvGet");
  return std::string(resp.value());
}

absl::StatusOr<int64_t> CoordinatorStore::Add(const std::string& key, int64_t delta) {
  v1::KvAddRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_delta(delta);
  v1::KvAddResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, connection_.timeout);
  grpc::Status s = Guarded(&ctx, [&] { return stub_->KvAdd(&ctx, req, &resp); });
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    return absl::InvalidArgumentError(s.error_message());
  }
  if (!s.ok()) return ToStatus(s, "KvAdd");
  return resp.value();
}

absl::Status CoordinatorStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (keys.empty()) return absl::OkStatus();
  v1::KvWaitRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  for (const std::string& k : keys) req.add_keys(k);
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status s = RetryUntil(deadline, cancel_.get(), [&](absl::Duration slice) {
    ToProto(slice, req.mutable_timeout());
    v1::KvWaitResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, slice + kDeadlineSlack);
    return Guarded(&ctx, [&] { return stub_->KvWait(&ctx, req, &resp); });
  });
  if (!s.ok() && cancel_ != nullptr && cancel_->cancelled()) return CancelledStatus();
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(absl::StrCat(
        "scope '", scope_, "' (generation ", fence_.generation(),
        "): ", s.error_message().empty() ? "keys not set in time" : s.error_message()));
  }
  return ToStatus(s, "KvWait");
}

absl::StatusOr<bool> CoordinatorStore::Check(const std::string& key) {
  v1::KvGetRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_wait(false);
  v1::KvGetResponse resp;
  grpc::Status s = RetryUntil(absl::Now() + kRetryWindow, cancel_.get(), [&](absl::Duration) {
    grpc::ClientContext ctx;
    Prepare(&ctx, connection_.timeout);
    return Guarded(&ctx, [&] { return stub_->KvGet(&ctx, req, &resp); });
  });
  if (!s.ok()) return ToStatus(s, "KvGet");
  return resp.found();
}

}  // namespace shardline::worker

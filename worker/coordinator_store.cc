#include "worker/coordinator_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

// rendezvous.proto kMaxWaitTimeout: the longest wait of one call.
constexpr absl::Duration kMaxWaitTimeout = absl::Seconds(3600);

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t ns = absl::ToInt64Nanoseconds(std::max(d, absl::ZeroDuration()));
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

}  // namespace

CoordinatorStore::CoordinatorStore(std::shared_ptr<client::RendezvousClient> rendezvous,
                                   const Clock* clock, v1::Fence fence, std::string scope,
                                   std::shared_ptr<client::CancelToken> cancel,
                                   BackoffOptions backoff)
    : rendezvous_(std::move(rendezvous)),
      clock_(clock),
      fence_(std::move(fence)),
      scope_(std::move(scope)),
      cancel_(std::move(cancel)),
      backoff_(backoff) {}

absl::Status CoordinatorStore::RetryUntil(
    absl::Time deadline, absl::FunctionRef<absl::Status(absl::Duration slice)> attempt) const {
  const absl::Status cancelled = absl::CancelledError("the generation is over");
  Backoff backoff(backoff_);
  return Retry(
      *clock_, backoff, deadline, [](const absl::Status& s) { return absl::IsUnavailable(s); },
      [&]() -> absl::Status {
        while (true) {
          if (cancel_ != nullptr && cancel_->cancelled()) return cancelled;
          const absl::Duration left = std::max(deadline - clock_->Now(), absl::ZeroDuration());
          const absl::Duration slice = std::min(left, kMaxWaitTimeout);
          absl::Status s = attempt(slice);
          // The end of a capped slice, not of the caller's timeout: ask again.
          if (absl::IsDeadlineExceeded(s) && slice < left) continue;
          return s;
        }
      },
      [&](absl::Duration delay) {
        if (cancel_ == nullptr) {
          clock_->SleepFor(delay);
          return absl::OkStatus();
        }
        return cancel_->WaitForCancel(*clock_, delay) ? cancelled : absl::OkStatus();
      });
}

absl::Status CoordinatorStore::CancelledStatus() const {
  return absl::AbortedError(absl::StrCat("generation ", fence_.generation(),
                                         " is over (scope '", scope_, "'): ", cancel_->reason(),
                                         "; abort the group and re-join"));
}

absl::Status CoordinatorStore::ToStatus(const absl::Status& s) const {
  if (s.ok()) return s;
  if (cancel_ != nullptr && cancel_->cancelled()) return CancelledStatus();
  return s;
}

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  v1::KvSetRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_value(value);
  return ToStatus(RetryUntil(clock_->Now() + kRetryWindow, [&](absl::Duration) {
    return rendezvous_->KvSet(req, cancel_.get()).status();
  }));
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key, absl::Duration timeout) {
  v1::KvGetRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_wait(true);
  std::string value;
  const absl::Status s = RetryUntil(clock_->Now() + timeout, [&](absl::Duration slice) {
    ToProto(slice, req.mutable_timeout());
    absl::StatusOr<v1::KvGetResponse> got = rendezvous_->KvGet(req, cancel_.get());
    if (got.ok()) value = got->value();
    return got.status();
  });
  if (!s.ok() && cancel_ != nullptr && cancel_->cancelled()) return CancelledStatus();
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(
        absl::StrCat("key '", key, "' of scope '", scope_, "' (generation ", fence_.generation(),
                     ") was not set within ", absl::FormatDuration(timeout)));
  }
  if (!s.ok()) return ToStatus(s);
  return value;
}

absl::StatusOr<int64_t> CoordinatorStore::Add(const std::string& key, int64_t delta) {
  v1::KvAddRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_delta(delta);
  absl::StatusOr<v1::KvAddResponse> added = rendezvous_->KvAdd(req, cancel_.get());
  if (absl::IsFailedPrecondition(added.status())) {
    return absl::InvalidArgumentError(added.status().message());
  }
  if (!added.ok()) return ToStatus(added.status());
  return added->value();
}

absl::Status CoordinatorStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (keys.empty()) return absl::OkStatus();
  v1::KvWaitRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  for (const std::string& k : keys) req.add_keys(k);
  const absl::Status s = RetryUntil(clock_->Now() + timeout, [&](absl::Duration slice) {
    ToProto(slice, req.mutable_timeout());
    return rendezvous_->KvWait(req, cancel_.get()).status();
  });
  if (!s.ok() && cancel_ != nullptr && cancel_->cancelled()) return CancelledStatus();
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "scope '", scope_, "' (generation ", fence_.generation(),
        "): ", s.message().empty() ? "keys not set in time" : s.message()));
  }
  return ToStatus(s);
}

absl::StatusOr<bool> CoordinatorStore::Check(const std::string& key) {
  v1::KvGetRequest req;
  *req.mutable_fence() = fence_;
  req.set_scope(scope_);
  req.set_key(key);
  req.set_wait(false);
  bool found = false;
  const absl::Status s = RetryUntil(clock_->Now() + kRetryWindow, [&](absl::Duration) {
    absl::StatusOr<v1::KvGetResponse> got = rendezvous_->KvGet(req, cancel_.get());
    if (got.ok()) found = got->found();
    return got.status();
  });
  if (!s.ok()) return ToStatus(s);
  return found;
}

}  // namespace shardline::worker

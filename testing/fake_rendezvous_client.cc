#include "testing/fake_rendezvous_client.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline::client::testing {
namespace {

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace

FakeRendezvousClient::FakeRendezvousClient(const Clock* clock, uint64_t generation)
    : clock_(clock), generation_(generation) {}

uint64_t FakeRendezvousClient::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void FakeRendezvousClient::EndGeneration(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  end_reasons_[generation_] = reason;
  ++generation_;
  values_.clear();
  arrivals_.clear();
  participants_.clear();
}

void FakeRendezvousClient::FailNext(const std::string& rpc, absl::Status status, int times) {
  absl::MutexLock lock(&mu_);
  failures_[rpc].emplace_back(std::move(status), times);
}

std::vector<FakeRendezvousClient::Call> FakeRendezvousClient::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

std::vector<absl::Time> FakeRendezvousClient::CallTimes(const std::string& rpc) const {
  absl::MutexLock lock(&mu_);
  std::vector<absl::Time> out;
  for (const Call& c : calls_) {
    if (c.rpc == rpc) out.push_back(c.time);
  }
  return out;
}

int FakeRendezvousClient::CallCount(const std::string& rpc) const {
  return static_cast<int>(CallTimes(rpc).size());
}

bool FakeRendezvousClient::AwaitBlocked(int n, absl::Duration real_timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return blocked_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), real_timeout);
}

absl::Status FakeRendezvousClient::StaleLocked(uint64_t generation) const {
  auto reason = end_reasons_.find(generation);
  return absl::AbortedError(absl::StrCat(
      "generation ", generation, " is over (current ", generation_,
      "): ", reason == end_reasons_.end() ? "not the job's generation" : reason->second,
      "; re-join"));
}

absl::Status FakeRendezvousClient::Run(const std::string& rpc, uint64_t generation,
                                       const Call& call, CancelToken* cancel,
                                       absl::FunctionRef<absl::Status(const bool&)> body) {
  // Set by the token's callback, which runs under the token's mutex and
  // takes mu_: mu_ is never held while calling into the token.
  bool cancelled = false;
  uint64_t registration = 0;
  if (cancel != nullptr) {
    registration = cancel->Register([this, &cancelled] {
      absl::MutexLock lock(&mu_);
      cancelled = true;
    });
    if (registration == 0) {
      return absl::CancelledError(absl::StrCat(rpc, " was cancelled: ", cancel->reason()));
    }
  }
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    Call recorded = call;
    recorded.rpc = rpc;
    recorded.time = clock_->Now();
    calls_.push_back(std::move(recorded));
    auto it = failures_.find(rpc);
    if (it != failures_.end() && !it->second.empty()) {
      auto& [failure, left] = it->second.front();
      status = failure;
      if (left != INT_MAX && --left <= 0) it->second.pop_front();
    } else if (generation != generation_) {
      status = StaleLocked(generation);
    } else {
      status = body(cancelled);
    }
  }
  if (cancel != nullptr) {
    cancel->Unregister(registration);
    if (absl::IsCancelled(status)) {
      status = absl::CancelledError(absl::StrCat(rpc, " was cancelled: ", cancel->reason()));
    }
  }
  return status;
}

absl::Status FakeRendezvousClient::WaitLocked(uint64_t generation, const bool& cancelled,
                                              absl::Duration timeout,
                                              absl::FunctionRef<bool()> done,
                                              const std::string& deadline_message) {
  ++blocked_;
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled || generation != generation_ || done();
  };
  clock_->AwaitWithTimeout(mu_, absl::Condition(&settled), timeout);
  --blocked_;
  if (cancelled) return absl::CancelledError("cancelled");
  if (generation != generation_) return StaleLocked(generation);
  if (done()) return absl::OkStatus();
  return absl::DeadlineExceededError(deadline_message);
}

absl::StatusOr<v1::KvSetResponse> FakeRendezvousClient::KvSet(const v1::KvSetRequest& request,
                                                              CancelToken* cancel) {
  absl::Status s = Run("KvSet", request.fence().generation(),
                       Call{"", {}, request.scope(), request.key(), absl::ZeroDuration()}, cancel,
                       [&](const bool&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                         values_[{request.scope(), request.key()}] = request.value();
                         return absl::OkStatus();
                       });
  if (!s.ok()) return s;
  return v1::KvSetResponse();
}

absl::StatusOr<v1::KvGetResponse> FakeRendezvousClient::KvGet(const v1::KvGetRequest& request,
                                                              CancelToken* cancel) {
  const uint64_t generation =
      request.has_fence() ? request.fence().generation() : request.generation();
  const absl::Duration timeout =
      request.wait() ? FromProto(request.timeout()) : absl::ZeroDuration();
  const Key key{request.scope(), request.key()};
  v1::KvGetResponse response;
  absl::Status s = Run(
      "KvGet", generation, Call{"", {}, request.scope(), request.key(), timeout}, cancel,
      [&](const bool& cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (request.wait()) {
          absl::Status waited = WaitLocked(
              generation, cancelled, timeout,
              [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; },
              absl::StrCat("key '", request.key(), "' of scope '", request.scope(),
                           "' was not set within ", absl::FormatDuration(timeout)));
          if (!waited.ok()) return waited;
        }
        auto it = values_.find(key);
        response.set_found(it != values_.end());
        if (it != values_.end()) response.set_value(it->second);
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::KvAddResponse> FakeRendezvousClient::KvAdd(const v1::KvAddRequest& request,
                                                              CancelToken* cancel) {
  v1::KvAddResponse response;
  absl::Status s = Run(
      "KvAdd", request.fence().generation(),
      Call{"", {}, request.scope(), request.key(), absl::ZeroDuration()}, cancel,
      [&](const bool&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        std::string& value = values_[{request.scope(), request.key()}];
        int64_t current = 0;
        if (!value.empty() && !absl::SimpleAtoi(value, &current)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "key '", request.key(), "' holds '", value, "', not a decimal int64"));
        }
        const int64_t delta = request.delta();
        if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
            (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
          return absl::OutOfRangeError("the sum would overflow int64");
        }
        value = absl::StrCat(current + delta);
        response.set_value(current + delta);
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::KvCompareAndSetResponse> FakeRendezvousClient::KvCompareAndSet(
    const v1::KvCompareAndSetRequest& request, CancelToken* cancel) {
  v1::KvCompareAndSetResponse response;
  absl::Status s = Run(
      "KvCompareAndSet", request.fence().generation(),
      Call{"", {}, request.scope(), request.key(), absl::ZeroDuration()}, cancel,
      [&](const bool&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Key key{request.scope(), request.key()};
        auto it = values_.find(key);
        const bool matches = request.has_expected()
                                 ? it != values_.end() && it->second == request.expected()
                                 : it == values_.end();
        if (matches) values_[key] = request.desired();
        response.set_swapped(matches);
        it = values_.find(key);
        if (it != values_.end()) response.set_current(it->second);
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::KvWaitResponse> FakeRendezvousClient::KvWait(const v1::KvWaitRequest& request,
                                                                CancelToken* cancel) {
  const absl::Duration timeout = FromProto(request.timeout());
  absl::Status s = Run(
      "KvWait", request.fence().generation(),
      Call{"", {}, request.scope(), request.keys().empty() ? "" : request.keys(0), timeout},
      cancel, [&](const bool& cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto missing = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          std::vector<std::string> out;
          for (const std::string& k : request.keys()) {
            if (values_.count({request.scope(), k}) == 0) out.push_back(k);
          }
          return out;
        };
        absl::Status waited =
            WaitLocked(request.fence().generation(), cancelled, timeout,
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return missing().empty(); }, "");
        if (absl::IsDeadlineExceeded(waited)) {
          return absl::DeadlineExceededError(
              absl::StrCat("keys not set within ", absl::FormatDuration(timeout), ": ",
                           absl::StrJoin(missing(), ", ")));
        }
        return waited;
      });
  if (!s.ok()) return s;
  return v1::KvWaitResponse();
}

absl::StatusOr<v1::KvDeleteResponse> FakeRendezvousClient::KvDelete(
    const v1::KvDeleteRequest& request, CancelToken* cancel) {
  v1::KvDeleteResponse response;
  absl::Status s = Run("KvDelete", request.fence().generation(),
                       Call{"", {}, request.scope(), request.key(), absl::ZeroDuration()}, cancel,
                       [&](const bool&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                         response.set_deleted(values_.erase({request.scope(), request.key()}) > 0);
                         return absl::OkStatus();
                       });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::KvNumKeysResponse> FakeRendezvousClient::KvNumKeys(
    const v1::KvNumKeysRequest& request, CancelToken* cancel) {
  v1::KvNumKeysResponse response;
  absl::Status s = Run("KvNumKeys", request.fence().generation(),
                       Call{"", {}, request.scope(), "", absl::ZeroDuration()}, cancel,
                       [&](const bool&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                         uint64_t n = 0;
                         for (const auto& [key, value] : values_) n += key.first == request.scope();
                         response.set_num_keys(n);
                         return absl::OkStatus();
                       });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::BarrierResponse> FakeRendezvousClient::Barrier(
    const v1::BarrierRequest& request, CancelToken* cancel) {
  const absl::Duration timeout = FromProto(request.timeout());
  v1::BarrierResponse response;
  absl::Status s = Run(
      "Barrier", request.fence().generation(),
      Call{"", {}, request.scope(), request.name(), timeout}, cancel,
      [&](const bool& cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Key key{request.scope(), request.name()};
        auto [expected, first] = participants_.emplace(key, request.participants());
        if (!first && expected->second != request.participants()) {
          return absl::FailedPreconditionError(
              absl::StrCat("barrier '", request.name(), "' has participants=", expected->second,
                           ", not ", request.participants()));
        }
        std::set<std::string>& arrived = arrivals_[key];
        arrived.insert(request.fence().worker().worker_id());
        response.set_arrival(static_cast<uint32_t>(arrived.size()));
        const uint32_t participants = request.participants();
        absl::Status waited = WaitLocked(
            request.fence().generation(), cancelled, timeout,
            [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return arrivals_[key].size() >= participants; },
            "");
        if (absl::IsDeadlineExceeded(waited)) {
          return absl::DeadlineExceededError(absl::StrCat(
              "barrier '", request.name(), "': ", arrivals_[key].size(), " of ", participants,
              " arrived within ", absl::FormatDuration(timeout)));
        }
        return waited;
      });
  if (!s.ok()) return s;
  return response;
}

}  // namespace shardline::client::testing

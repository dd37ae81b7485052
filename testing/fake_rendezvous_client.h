// FakeRendezvousClient: an in-memory client::RendezvousClient for unit tests
// of the worker's stores, on a FakeClock. One fake is one job's rendezvous:
// every store given it shares its keys, as workers share the coordinator's.
//
//   FakeClock clock;
//   auto rendezvous = std::make_shared<FakeRendezvousClient>(&clock);
//   CoordinatorStore store(rendezvous, &clock, fence, "dp/0");
//   rendezvous->FailNext("KvSet", absl::UnavailableError("restarting"), 2);
//
// Behaviour: keys live per (generation, scope); a call fenced with another
// generation than the current one answers ABORTED ("generation G is over
// (current C): <reason>"), and ending the generation (EndGeneration) drops
// its keys and ends every call blocked in it with that ABORTED. The calls
// that wait (KvGet with `wait`, KvWait, Barrier) wait on the clock up to
// their request's timeout and then answer DEADLINE_EXCEEDED naming what was
// missing. A call whose CancelToken is cancelled ends with CANCELLED at once
// (blocked or not; one started on a cancelled token is not recorded as
// reaching the fake). KvAdd of a value that is not an integer answers
// FAILED_PRECONDITION.
//
// Thread-safety: thread-safe.
#ifndef SHARDLINE_TESTING_FAKE_RENDEZVOUS_CLIENT_H_
#define SHARDLINE_TESTING_FAKE_RENDEZVOUS_CLIENT_H_

#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cancel_token.h"
#include "client/rendezvous_client.h"
#include "common/clock.h"

namespace shardline::client::testing {

class FakeRendezvousClient final : public RendezvousClient {
 public:
  // `clock` (not owned) stamps the calls and paces the waits.
  explicit FakeRendezvousClient(const Clock* clock, uint64_t generation = 1);

  uint64_t generation() const;
  // The next generation begins; see the file comment.
  void EndGeneration(const std::string& reason);
  // The next `times` calls of `rpc` ("KvSet", "KvGet", ...) fail with
  // `status` instead of doing anything (INT_MAX: every call from now on).
  void FailNext(const std::string& rpc, absl::Status status, int times = 1);

  struct Call {
    std::string rpc;
    absl::Time time;
    std::string scope;
    std::string key;          // the first key of a KvWait, the name of a Barrier
    absl::Duration timeout;   // the wait asked for (zero when none)
  };
  std::vector<Call> calls() const;
  std::vector<absl::Time> CallTimes(const std::string& rpc) const;
  int CallCount(const std::string& rpc) const;
  // Blocks until `n` calls are waiting in the fake; false after
  // `real_timeout` (a test's guard against hanging).
  bool AwaitBlocked(int n, absl::Duration real_timeout = absl::Seconds(60)) const;

  // RendezvousClient.
  absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request,
                                          CancelToken* cancel) override;
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request,
                                          CancelToken* cancel) override;
  absl::StatusOr<v1::KvAddResponse> KvAdd(const v1::KvAddRequest& request,
                                          CancelToken* cancel) override;
  absl::StatusOr<v1::KvCompareAndSetResponse> KvCompareAndSet(
      const v1::KvCompareAndSetRequest& request, CancelToken* cancel) override;
  absl::StatusOr<v1::KvWaitResponse> KvWait(const v1::KvWaitRequest& request,
                                            CancelToken* cancel) override;
  absl::StatusOr<v1::KvNumKeysResponse> KvNumKeys(const v1::KvNumKeysRequest& request,
                                                  CancelToken* cancel) override;
  absl::StatusOr<v1::KvDeleteResponse> KvDelete(const v1::KvDeleteRequest& request,
                                                CancelToken* cancel) override;
  absl::StatusOr<v1::BarrierResponse> Barrier(const v1::BarrierRequest& request,
                                              CancelToken* cancel) override;

 private:
  using Key = std::pair<std::string, std::string>;  // scope, key

  // Runs `body` (with mu_ held) as one call of `rpc` in `generation`:
  // CANCELLED when `cancel` is; the scripted failure; ABORTED for a stale
  // generation. `body` gets whether the call was cancelled meanwhile (a
  // flag to wait on) and returns the call's status.
  absl::Status Run(const std::string& rpc, uint64_t generation, const Call& call,
                   CancelToken* cancel, absl::FunctionRef<absl::Status(const bool& cancelled)> body)
      ABSL_LOCKS_EXCLUDED(mu_);
  // With mu_ held: waits on the clock until `done`, the generation ends,
  // `cancelled`, or `timeout`; then the status of the first that happened
  // (OK for `done`, DEADLINE_EXCEEDED `deadline_message`).
  absl::Status WaitLocked(uint64_t generation, const bool& cancelled, absl::Duration timeout,
                          absl::FunctionRef<bool()> done, const std::string& deadline_message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StaleLocked(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> end_reasons_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::string> values_ ABSL_GUARDED_BY(mu_);  // the current generation's
  std::map<Key, std::set<std::string>> arrivals_ ABSL_GUARDED_BY(mu_);
  std::map<Key, uint32_t> participants_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<std::pair<absl::Status, int>>> failures_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTING_FAKE_RENDEZVOUS_CLIENT_H_

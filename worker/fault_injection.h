// Fault injection: a TEST FACILITY, off unless shardline-worker is started
// with --inject-fault. It makes one worker misbehave the ways a real rank
// does, so that hang, straggler and mismatch detection (issue 17) can be
// tested with real processes: never use it in production.
//
//   shardline-worker ... --inject-fault stall_at_step=15
//   shardline-worker ... --inject-fault slow_compute=2 --inject-fault collective_count_mismatch_at_step=5
//   shardline-worker ... --inject-fault slow_compute=2,stall_at_step=40
//
// The forms (the flag repeats, and each value may hold several,
// comma-separated; each kind at most once). Steps are optimizer steps,
// counted from 1 over the whole job (the trainer's step() + 1 is the step
// about to run):
//   stall_at_step=N   (N >= 1) the training thread blocks before running
//       step N, i.e. once N-1 steps are done, and never returns on its own
//       (a hung training thread: a stuck kernel or data loader), while the
//       agent's heartbeats go on. Its reports say COMPUTE at step N-1. Once
//       per process.
//   slow_compute=F    (1 <= F <= kMaxSlowCompute = 100, decimal) after each step the training thread
//       sleeps (F-1) x that step's compute time (its time minus its
//       communication waits), counted as compute in its reports: its
//       compute is F times slower (a straggler).
//   collective_count_mismatch_at_step=N   (N >= 1) during step N the rank
//       issues its next all_reduce or reduce_scatter on its dp group with
//       one element more than the other ranks (the extra element is zero,
//       in a scratch buffer: no memory outside the caller's buffers is
//       touched). Once per process.
//
// Thread-safety: FaultInjector and CountMismatchBackend are thread-safe.
#ifndef SHARDLINE_WORKER_FAULT_INJECTION_H_
#define SHARDLINE_WORKER_FAULT_INJECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/comm/backend.h"

namespace shardline::worker {

struct FaultSpec {
  std::optional<uint64_t> stall_at_step;
  double slow_compute = 1.0;  // 1: off
  std::optional<uint64_t> collective_count_mismatch_at_step;

  bool any() const {
    return stall_at_step.has_value() || slow_compute != 1.0 ||
           collective_count_mismatch_at_step.has_value();
  }
  // "stall_at_step=15,slow_compute=2" (the set ones, in this order); "" for none.
  std::string ToString() const;
};

// Parses the values of every --inject-fault flag (see the file comment).
// InvalidArgument naming --inject-fault, the offending item and the valid
// forms: an empty item, a kind not listed, a missing '=' or value, N not a
// decimal whole number in 1..spec::kMaxTrainSteps, F not a decimal number
// in 1..kMaxSlowCompute, a kind given twice.
absl::StatusOr<FaultSpec> ParseFaultSpecs(const std::vector<std::string>& values);

// The largest slow_compute factor: 100x slower is a straggler; more is a
// hang, which stall_at_step makes.
inline constexpr double kMaxSlowCompute = 100;

// The valid forms, for --help and the errors.
inline constexpr char kFaultForms[] =
    "stall_at_step=N, slow_compute=F (1 <= F <= 100), collective_count_mismatch_at_step=N "
    "(N >= 1)";

class FaultInjector {
 public:
  // How the slow_compute fault waits; default absl::SleepFor.
  using SleepFn = std::function<void(absl::Duration)>;
  // Where it says what it does when a fault fires (one line per call: the
  // stall begins, a collective is issued with another count); may be null.
  using LogFn = std::function<void(const std::string&)>;

  explicit FaultInjector(FaultSpec spec, SleepFn sleep = nullptr, LogFn log = nullptr);
  ~FaultInjector();
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  const FaultSpec& spec() const { return spec_; }

  // The training thread is about to run step `step` (1-based, see the file
  // comment). Blocks for good at the stall step (once per process; see
  // ReleaseStallForTest); arms the count mismatch at its step.
  void BeforeStep(uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // True once a thread is blocked in (or was released from) the stall.
  bool stalled() const { return stalled_.HasBeenNotified(); }
  // Ends the stall (tests only: a real stalled thread never returns).
  void ReleaseStallForTest() { release_.Notify(); }

  // A step finished whose compute part took `compute_time`: sleeps
  // (slow_compute - 1) x compute_time and returns how long it slept (zero
  // without slow_compute).
  absl::Duration AfterStep(absl::Duration compute_time);

  // Wraps the dp group's backend when the count-mismatch fault is set
  // (else returns null: use `dp` itself). The wrapper forwards everything
  // to `dp` (not owned; must outlive it) and fires once armed. It may be
  // destroyed before the operations it issued complete: the scratch
  // buffers live in this injector.
  std::unique_ptr<Backend> WrapDataParallel(Backend* dp);

  // CountMismatchBackend's side: true exactly once, for the first call
  // after BeforeStep armed the mismatch. Then `*scratch` is a buffer of
  // `bytes` zero bytes owned by this injector for its lifetime. `what`
  // ("all_reduce of 10 elements as 11") is logged.
  bool TakeMismatch(size_t bytes, char** scratch, const std::string& what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // How many collectives were issued with a different count (0 or 1).
  int mismatches_issued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const FaultSpec spec_;
  const SleepFn sleep_;
  const LogFn log_;
  absl::Notification stalled_;
  absl::Notification release_;
  mutable absl::Mutex mu_;
  bool stall_done_ ABSL_GUARDED_BY(mu_) = false;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t armed_step_ ABSL_GUARDED_BY(mu_) = 0;
  int fired_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<char[]>> scratch_ ABSL_GUARDED_BY(mu_);
};

// The Backend decorator of the count-mismatch fault: forwards every call to
// the wrapped backend, except that the first all_reduce or reduce_scatter
// after the injector armed it is issued with one more element (all_reduce:
// count + 1; reduce_scatter: the last piece one longer) on copies of the
// caller's buffers in the injector's scratch memory; when that operation
// completes OK, the caller's output receives the first elements of the
// copy, so nothing beyond the caller's buffers is read or written.
class CountMismatchBackend : public Backend {
 public:
  CountMismatchBackend(Backend* inner, FaultInjector* injector)
      : inner_(inner), injector_(injector) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  BackendProgress Progress() const override { return inner_->Progress(); }
  std::shared_ptr<Work> AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  std::shared_ptr<Work> AllGather(const void* in, size_t count, void* out, DType dtype) override {
    return inner_->AllGather(in, count, out, dtype);
  }
  std::shared_ptr<Work> ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                      DType dtype, ReduceOp op) override;
  std::shared_ptr<Work> AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                                 const std::vector<size_t>& recv_counts, DType dtype) override {
    return inner_->AllToAll(in, send_counts, out, recv_counts, dtype);
  }
  std::shared_ptr<Work> Broadcast(void* data, size_t count, DType dtype, int root) override {
    return inner_->Broadcast(data, count, dtype, root);
  }
  std::shared_ptr<Work> Send(const void* data, size_t count, DType dtype, int peer,
                             uint32_t tag) override {
    return inner_->Send(data, count, dtype, peer, tag);
  }
  std::shared_ptr<Work> Recv(void* data, size_t count, DType dtype, int peer,
                             uint32_t tag) override {
    return inner_->Recv(data, count, dtype, peer, tag);
  }
  std::shared_ptr<Work> Barrier() override { return inner_->Barrier(); }
  void Abort() override { inner_->Abort(); }

 private:
  Backend* const inner_;
  FaultInjector* const injector_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_FAULT_INJECTION_H_

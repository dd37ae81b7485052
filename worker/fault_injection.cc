#include "worker/fault_injection.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "spec/job_spec.h"

namespace shardline::worker {
namespace {

absl::Status FaultError(absl::string_view item, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--inject-fault: '", item, "' ", why,
                                                 "; valid forms (a test facility): ", kFaultForms,
                                                 ", several comma-separated or the flag repeated"));
}

// Decimal digits only (no sign, no 0x): what a person writes.
bool AllDigits(absl::string_view v) {
  return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
}

absl::StatusOr<uint64_t> ParseStep(absl::string_view item, absl::string_view value) {
  uint64_t n = 0;
  if (!AllDigits(value) || !absl::SimpleAtoi(value, &n) || n < 1 || n > spec::kMaxTrainSteps) {
    return FaultError(item, absl::StrCat("needs a whole step number N in 1..",
                                         spec::kMaxTrainSteps, " (training.train_steps' range)"));
  }
  return n;
}

// Completes like `inner`; once it has completed OK, copies `bytes` from
// `from` (the scratch copy) to `to` (the caller's buffer), once.
class CopyBackWork : public Work {
 public:
  CopyBackWork(std::shared_ptr<Work> inner, const char* from, void* to, size_t bytes)
      : inner_(std::move(inner)), from_(from), to_(to), bytes_(bytes) {}

  bool IsCompleted() override { return inner_->IsCompleted(); }

  absl::Status Wait(absl::Duration timeout) override {
    absl::Status s = inner_->Wait(timeout);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      if (!copied_) {
        if (bytes_ > 0) std::memcpy(to_, from_, bytes_);
        copied_ = true;
      }
    }
    return s;
  }

 private:
  const std::shared_ptr<Work> inner_;
  const char* const from_;
  void* const to_;
  const size_t bytes_;
  absl::Mutex mu_;
  bool copied_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::string FaultSpec::ToString() const {
  std::vector<std::string> parts;
  if (stall_at_step.has_value()) parts.push_back(absl::StrCat("stall_at_step=", *stall_at_step));
  if (slow_compute != 1.0) parts.push_back(absl::StrCat("slow_compute=", slow_compute));
  if (collective_count_mismatch_at_step.has_value()) {
    parts.push_back(
        absl::StrCat("collective_count_mismatch_at_step=", *collective_count_mismatch_at_step));
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<FaultSpec> ParseFaultSpecs(const std::vector<std::string>& values) {
  FaultSpec spec;
  bool slow_set = false;
  for (const std::string& value : values) {
    for (absl::string_view raw : absl::StrSplit(value, ',')) {
      const absl::string_view item = absl::StripAsciiWhitespace(raw);
      if (item.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--inject-fault: '", value, "' has an empty item; valid forms (a test "
                         "facility): ", kFaultForms, ", several comma-separated or the flag "
                         "repeated"));
      }
      const size_t eq = item.find('=');
      if (eq == absl::string_view::npos) return FaultError(item, "has no '=VALUE'");
      const absl::string_view kind = item.substr(0, eq);
      const absl::string_view v = item.substr(eq + 1);
      if (kind == "stall_at_step") {
        if (spec.stall_at_step.has_value()) return FaultError(item, "is given twice");
        absl::StatusOr<uint64_t> n = ParseStep(item, v);
        if (!n.ok()) return n.status();
        spec.stall_at_step = *n;
      } else if (kind == "collective_count_mismatch_at_step") {
        if (spec.collective_count_mismatch_at_step.has_value()) {
          return FaultError(item, "is given twice");
        }
        absl::StatusOr<uint64_t> n = ParseStep(item, v);
        if (!n.ok()) return n.status();
        spec.collective_count_mismatch_at_step = *n;
      } else if (kind == "slow_compute") {
        if (slow_set) return FaultError(item, "is given twice");
        double f = 0;
        const bool decimal = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
          return (c >= '0' && c <= '9') || c == '.';
        });
        if (!decimal || !absl::SimpleAtod(v, &f) || !std::isfinite(f) || f < 1.0 ||
            f > kMaxSlowCompute) {
          return FaultError(item, absl::StrCat("needs a decimal factor F in 1..", kMaxSlowCompute,
                                               " (e.g. slow_compute=2)"));
        }
        spec.slow_compute = f;
        slow_set = true;
      } else {
        return FaultError(item, absl::StrCat("names no fault kind ('", kind, "')"));
      }
    }
  }
  return spec;
}

FaultInjector::FaultInjector(FaultSpec spec, SleepFn sleep, LogFn log)
    : spec_(std::move(spec)),
      sleep_(sleep ? std::move(sleep) : SleepFn([](absl::Duration d) { absl::SleepFor(d); })),
      log_(std::move(log)) {}

FaultInjector::~FaultInjector() = default;

void FaultInjector::BeforeStep(uint64_t step) {
  bool stall = false;
  {
    absl::MutexLock lock(&mu_);
    if (spec_.collective_count_mismatch_at_step == step && fired_ == 0) {
      armed_ = true;
      armed_step_ = step;
    }
    if (spec_.stall_at_step == step && !stall_done_) {
      stall_done_ = true;
      stall = true;
    }
  }
  if (!stall) return;
  // A hung training thread: nothing in production releases it; the worker
  // exits around it once the coordinator evicts it (worker/main.cc).
  if (log_) {
    log_(absl::StrCat("TEST FACILITY: the training thread stalls before step ", step,
                      " for good (--inject-fault stall_at_step=", step, ")"));
  }
  stalled_.Notify();
  release_.WaitForNotification();
}

absl::Duration FaultInjector::AfterStep(absl::Duration compute_time) {
  if (spec_.slow_compute == 1.0 || compute_time <= absl::ZeroDuration()) {
    return absl::ZeroDuration();
  }
  const absl::Duration extra = compute_time * (spec_.slow_compute - 1.0);
  sleep_(extra);
  return extra;
}

std::unique_ptr<Backend> FaultInjector::WrapDataParallel(Backend* dp) {
  if (!spec_.collective_count_mismatch_at_step.has_value() || dp == nullptr) return nullptr;
  return std::make_unique<CountMismatchBackend>(dp, this);
}

bool FaultInjector::TakeMismatch(size_t bytes, char** scratch, const std::string& what) {
  uint64_t step;
  {
    absl::MutexLock lock(&mu_);
    if (!armed_ || fired_ > 0) return false;
    armed_ = false;
    ++fired_;
    step = armed_step_;
    scratch_.push_back(std::make_unique<char[]>(bytes > 0 ? bytes : 1));  // zeroed
    *scratch = scratch_.back().get();
  }
  if (log_) {
    log_(absl::StrCat("TEST FACILITY: step ", step, " issues its dp ", what,
                      " (--inject-fault collective_count_mismatch_at_step=", step, ")"));
  }
  return true;
}

int FaultInjector::mismatches_issued() const {
  absl::MutexLock lock(&mu_);
  return fired_;
}

std::shared_ptr<Work> CountMismatchBackend::AllReduce(void* data, size_t count, DType dtype,
                                                      ReduceOp op) {
  const size_t es = ElementSize(dtype);
  char* scratch = nullptr;
  if (data == nullptr ||
      !injector_->TakeMismatch((count + 1) * es, &scratch,
                               absl::StrCat("all_reduce of ", count, " elements as ", count + 1))) {
    return inner_->AllReduce(data, count, dtype, op);
  }
  if (count > 0) std::memcpy(scratch, data, count * es);
  return std::make_shared<CopyBackWork>(inner_->AllReduce(scratch, count + 1, dtype, op), scratch,
                                        data, count * es);
}

std::shared_ptr<Work> CountMismatchBackend::ReduceScatter(const void* in, void* out,
                                                          const std::vector<size_t>& counts,
                                                          DType dtype, ReduceOp op) {
  const int me = inner_->rank();
  if (counts.empty() || counts.size() != static_cast<size_t>(inner_->size()) || in == nullptr ||
      me < 0 || static_cast<size_t>(me) >= counts.size()) {
    return inner_->ReduceScatter(in, out, counts, dtype, op);
  }
  const size_t es = ElementSize(dtype);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<size_t> longer = counts;
  ++longer.back();
  const size_t in_bytes = (total + 1) * es;
  const size_t out_bytes = longer[static_cast<size_t>(me)] * es;
  char* scratch = nullptr;
  if (!injector_->TakeMismatch(in_bytes + out_bytes, &scratch,
                               absl::StrCat("reduce_scatter of ", total, " elements as ",
                                            total + 1))) {
    return inner_->ReduceScatter(in, out, counts, dtype, op);
  }
  // The pieces are consecutive and the longer one is the last: the copy is
  // the caller's input with one zero element after it.
  if (total > 0) std::memcpy(scratch, in, total * es);
  char* scratch_out = scratch + in_bytes;
  return std::make_shared<CopyBackWork>(
      inner_->ReduceScatter(scratch, scratch_out, longer, dtype, op), scratch_out, out,
      counts[static_cast<size_t>(me)] * es);
}

}  // namespace shardline::worker

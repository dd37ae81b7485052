#include "worker/rank_progress.h"

namespace shardline::worker {

namespace v1 = ::shardline::v1;

void DurationToProto(absl::Duration d, google::protobuf::Duration* out) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

void RankProgressTracker::BeginGeneration(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  generation_ = generation;
  step_ = 0;
  step_time_ = compute_time_ = absl::ZeroDuration();
}

void RankProgressTracker::SetActivity(v1::Activity activity) {
  if (activity == v1::ACTIVITY_UNSPECIFIED || activity == v1::ACTIVITY_COLLECTIVE) {
    activity = v1::ACTIVITY_IDLE;
  }
  activity_.store(activity, std::memory_order_relaxed);
}

v1::Activity RankProgressTracker::activity() const {
  if (in_wait_.load(std::memory_order_relaxed)) return v1::ACTIVITY_COLLECTIVE;
  return static_cast<v1::Activity>(activity_.load(std::memory_order_relaxed));
}

void RankProgressTracker::StepDone(uint64_t step, absl::Duration step_time,
                                   absl::Duration compute_time) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  step_time_ = step_time;
  compute_time_ = compute_time;
}

void RankProgressTracker::Fill(uint64_t generation, v1::RankProgress* out) const {
  out->set_activity(activity());
  absl::MutexLock lock(&mu_);
  if (generation != generation_ || step_ == 0) {
    out->set_step(0);
    out->clear_step_time();
    out->clear_compute_time();
    return;
  }
  out->set_step(step_);
  DurationToProto(step_time_, out->mutable_step_time());
  DurationToProto(compute_time_, out->mutable_compute_time());
}

}  // namespace shardline::worker

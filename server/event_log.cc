#include "server/event_log.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/log.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"

namespace shardline::server {

std::string EventLog::Key(const std::string& job_id, uint64_t sequence) {
  return absl::StrCat(job_id, "/", absl::Dec(sequence, absl::kZeroPad20));
}

EventLog::EventLog(StateStore* store, int max_events) : store_(store), max_events_(max_events) {}

uint64_t EventLog::Append(const std::string& job_id, uint64_t generation, absl::Time time,
                          v1::JobEvent event) {
  changed_->SignalAll();
  event.set_sequence(next_sequence_++);
  *event.mutable_time() =
      google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(time));
  event.set_job_id(job_id);
  event.set_generation(generation);
  // The log is durable so that sequence numbers survive a restart without
  // gaps or repeats (events.proto); an event whose write fails is logged and
  // kept in memory only.
  std::vector<Mutation> batch = {
      Mutation::Put(kStoreKind, Key(job_id, event.sequence()), event.SerializeAsString())};
  if (event.sequence() > static_cast<uint64_t>(max_events_)) {
    batch.push_back(Mutation::Delete(kStoreKind, Key(job_id, event.sequence() - max_events_)));
  }
  if (absl::Status s = store_->Write(batch); !s.ok()) {
    LogLine(absl::StrFormat("job %s: event %d not saved: %s", job_id,
                 event.sequence(),
                 s.message()));
  }
  const uint64_t sequence = event.sequence();
  events_.push_back(std::move(event));
  while (events_.size() > static_cast<size_t>(max_events_)) events_.pop_front();
  for (const auto& [id, waker] : wakers_) waker();
  return sequence;
}

uint64_t EventLog::AddWaker(std::function<void()> waker) {
  const uint64_t id = next_waker_++;
  wakers_.emplace(id, std::move(waker));
  return id;
}

void EventLog::RemoveWaker(uint64_t id) { wakers_.erase(id); }

void EventLog::Restore(v1::JobEvent event) {
  next_sequence_ = std::max(next_sequence_, event.sequence() + 1);
  events_.push_back(std::move(event));
  if (events_.size() > static_cast<size_t>(max_events_)) events_.pop_front();
}

std::vector<v1::JobEvent> EventLog::After(uint64_t after) const {
  std::vector<v1::JobEvent> out;
  for (const v1::JobEvent& e : events_) {
    if (e.sequence() > after) out.push_back(e);
  }
  return out;
}

std::vector<v1::JobEvent> EventLog::WaitAfter(absl::Mutex* mu, uint64_t after,
                                              absl::Time deadline) const {
  // Our own reference: the CondVar must outlive this wait.
  const std::shared_ptr<absl::CondVar> changed = changed_;
  while (next_sequence_ <= after + 1 && !changed->WaitWithDeadline(mu, deadline)) {
  }
  return After(after);
}

}  // namespace shardline::server

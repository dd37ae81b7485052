// One job's event log (events.proto JobEvent): sequence numbers, retention
// of the newest events, durability in the StateStore, replay after a
// sequence for WatchJob, the CondVar that wakes whoever waits for the job
// to change, and the wakers of asynchronous watchers (WatchJob streams).
//
//   EventLog log(store, /*max_events=*/10000);   // one per job (JobRecord)
//   log.Append("job-1", /*generation=*/1, clock->Now(), std::move(event));
//   std::vector<v1::JobEvent> replay = log.After(/*after=*/0);
//
// Sequence numbers start at 1 and have no gaps or repeats, across restarts
// too: every event is written to the store (kind kStoreKind, key Key()) and
// Restore() reads the log back. Only the newest `max_events` are kept, in
// memory and in the store (the write of event s deletes event
// s - max_events).
//
// Thread-safety: not thread-safe; the Coordinator's lock (Coordinator::mu_)
// guards it. Every method is called with that lock held; WaitAfter releases
// it while it waits.
#ifndef SHARDLINE_SERVER_EVENT_LOG_H_
#define SHARDLINE_SERVER_EVENT_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/state_store.h"
#include "shardline/v1/events.pb.h"

namespace shardline::server {

class EventLog {
 public:
  // StateStore kind of the events.
  static constexpr char kStoreKind[] = "event";
  // "<job>/<sequence, 20 digits>": keys sort by job, then sequence.
  static std::string Key(const std::string& job_id, uint64_t sequence);

  // `store` is not owned and must outlive the log. Keeps the newest
  // `max_events` events (CoordinatorOptions::max_events_per_job).
  EventLog(StateStore* store, int max_events);

  // Stamps `event` with the next sequence number, `time`, `job_id` and
  // `generation`, writes it to the store (with the deletion of the event
  // that falls out of retention), keeps it, and wakes every waiter on
  // changed(). A failed write is logged to stderr and the event is kept in
  // memory only. Returns the event's sequence number.
  uint64_t Append(const std::string& job_id, uint64_t generation, absl::Time time,
                  v1::JobEvent event);

  // Calls `waker` after every later Append (with the Coordinator's lock
  // held: it must be quick and only hand work elsewhere, like
  // Coordinator::SessionWaker) until RemoveWaker(id). Returns the id.
  uint64_t AddWaker(std::function<void()> waker);
  // Idempotent; unknown ids are ignored.
  void RemoveWaker(uint64_t id);
  size_t wakers() const { return wakers_.size(); }

  // Recovery: an event read back from the store; call in sequence order.
  // Not written again, wakes no one.
  void Restore(v1::JobEvent event);

  // The kept events with sequence > `after`, oldest first.
  std::vector<v1::JobEvent> After(uint64_t after) const;

  // Waits, with `mu` (the Coordinator's lock) released, until an event with
  // sequence > `after` has been appended or until `deadline` (a past
  // deadline does not wait); then After(after), which is empty at the
  // deadline.
  std::vector<v1::JobEvent> WaitAfter(absl::Mutex* mu, uint64_t after, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The sequence number the next event gets.
  uint64_t next_sequence() const { return next_sequence_; }
  // Events kept, at most max_events.
  size_t size() const { return events_.size(); }

  // Signalled at every Append. Every change that the Coordinator's
  // waits (GetAssignment, WaitEvents) wait for emits an event, so they all
  // wait on this one. A CondVar rather than an absl::Condition on the
  // Coordinator's lock: with thousands of workers waiting in GetAssignment,
  // every unlock re-evaluated every waiter, so each join cost O(waiters).
  // Shared so a waiter keeps it alive (copy it before waiting).
  const std::shared_ptr<absl::CondVar>& changed() const { return changed_; }

 private:
  StateStore* store_;
  int max_events_;
  std::deque<v1::JobEvent> events_;
  uint64_t next_sequence_ = 1;
  std::shared_ptr<absl::CondVar> changed_ = std::make_shared<absl::CondVar>();
  std::map<uint64_t, std::function<void()>> wakers_;
  uint64_t next_waker_ = 1;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_EVENT_LOG_H_

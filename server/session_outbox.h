// A member's Session stream, seen from the coordinator: the open session
// (its id, the SessionMessages queued for it, the stream's waker) and the
// CondVar that the thread streaming it waits on. One per member
// (MemberRecord); at most one session open at a time.
//
//   SessionOutbox outbox;
//   outbox.Open(/*id=*/1, waker);          // waker may be empty
//   outbox.Push(message);                  // queued, stream woken
//   outbox.Wait(&mu, 1, deadline);         // the streaming thread
//   std::optional<v1::SessionMessage> next = outbox.Pop();
//   outbox.End();                          // the stream is woken and ends
//
// Thread-safety: not thread-safe; the Coordinator's lock (Coordinator::mu_)
// guards it. Every method is called with that lock held; Wait releases it
// while it waits. The waker runs inside Push, Open and End, so with that
// lock held (see Coordinator::OpenSession for what a waker may do).
#ifndef SHARDLINE_SERVER_SESSION_OUTBOX_H_
#define SHARDLINE_SERVER_SESSION_OUTBOX_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/session.pb.h"

namespace shardline::server {

// Called whenever the session has something new for its stream: a message
// was queued, or the session was replaced or ended (Coordinator::SessionWaker).
using SessionWaker = std::function<void()>;

// An open session.
struct Session {
  uint64_t id = 0;
  std::deque<v1::SessionMessage> outbox;
  SessionWaker waker;  // may be empty (a stream that waits on the CondVar)
};

class SessionOutbox {
 public:
  // Messages kept for a slow stream; a stuck stream loses the oldest.
  static constexpr size_t kMaxQueued = 256;

  // Ends the open session, if any (End), then opens session `id` with no
  // messages queued and `waker` (may be empty).
  void Open(uint64_t id, SessionWaker waker);

  // Ends the open session, if any: its queued messages are dropped, its
  // stream woken (CondVar and waker); the waker is dropped.
  void End();

  // Queues `message` for the open session and wakes its stream; when
  // kMaxQueued are already queued, the oldest is dropped first. No session
  // open: `message` is dropped and no one is woken.
  void Push(v1::SessionMessage message);

  // Wakes the stream: every Wait on the CondVar, and the open session's waker.
  void Wake();

  // Whether a session is open / whether it is session `id`.
  bool is_open() const { return session_.has_value(); }
  bool IsCurrent(uint64_t id) const { return session_.has_value() && session_->id == id; }
  // Messages queued for the open session (0 when none is open).
  size_t queued() const { return session_.has_value() ? session_->outbox.size() : 0; }

  // Waits, with `mu` (the Coordinator's lock) released, until session `id`
  // is no longer the open one or has a message queued, or until `deadline`
  // (a past deadline does not wait).
  void Wait(absl::Mutex* mu, uint64_t id, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The oldest message queued for the open session, taken off the queue;
  // nullopt when none is queued or no session is open.
  std::optional<v1::SessionMessage> Pop();

 private:
  std::optional<Session> session_;
  // Wakes the thread streaming this member's session when the outbox gets
  // a message or the session changes. One per member rather than an
  // absl::Condition on the Coordinator's lock, whose waiters would all be
  // re-evaluated at every unlock: with thousands of open sessions that made
  // every heartbeat cost O(members). Shared so the outbox (and its member
  // record) stays movable and a waiter keeps it alive.
  std::shared_ptr<absl::CondVar> cv_ = std::make_shared<absl::CondVar>();
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_SESSION_OUTBOX_H_

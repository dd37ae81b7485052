#include "server/session_outbox.h"

#include <utility>

namespace shardline::server {

void SessionOutbox::Open(uint64_t id, SessionWaker waker) {
  End();  // an older stream ends
  session_ = Session{id, {}, std::move(waker)};
}

void SessionOutbox::End() {
  if (!session_.has_value()) return;
  SessionWaker waker = std::move(session_->waker);
  session_.reset();
  cv_->SignalAll();
  if (waker) waker();
}

void SessionOutbox::Push(v1::SessionMessage message) {
  if (!session_.has_value()) return;
  auto& outbox = session_->outbox;
  if (outbox.size() >= kMaxQueued) outbox.pop_front();  // a stuck stream loses the oldest
  outbox.push_back(std::move(message));
  Wake();
}

void SessionOutbox::Wake() {
  cv_->SignalAll();
  if (session_.has_value() && session_->waker) session_->waker();
}

void SessionOutbox::Wait(absl::Mutex* mu, uint64_t id, absl::Time deadline) {
  auto ready = [this, id]() {
    return !session_.has_value() || session_->id != id || !session_->outbox.empty();
  };
  // Keep our own reference: the CondVar must outlive this wait.
  const std::shared_ptr<absl::CondVar> cv = cv_;
  while (!ready() && !cv->WaitWithDeadline(mu, deadline)) {
  }
}

std::optional<v1::SessionMessage> SessionOutbox::Pop() {
  if (!session_.has_value() || session_->outbox.empty()) return std::nullopt;
  v1::SessionMessage msg = std::move(session_->outbox.front());
  session_->outbox.pop_front();
  return msg;
}

}  // namespace shardline::server

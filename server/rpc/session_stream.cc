#include "server/rpc/session_stream.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "server/limits.h"

namespace shardline::server::rpc {
namespace {

}  // namespace

// One Session stream (see the header): the coordinator's waker posts it to
// the pool, which pulls the next message (NextSessionMessage with a past
// deadline) and starts its write; at most one write is in flight. A
// cancelled stream (the client went away) or a failed write calls
// CloseSession (the worker is LOST at once) unless the server is shutting
// down. Lock order: mu_, then the coordinator's lock (Advance); the
// coordinator's lock is never held while taking mu_ (the waker only posts).
class SessionStream : public std::enable_shared_from_this<SessionStream> {
 public:
  SessionStream(SessionStreams* owner, v1::WorkerIdentity w,
                grpc::ServerWriteReactor<v1::SessionMessage>* reactor)
      : owner_(owner), w_(std::move(w)), start_(absl::Now()), reactor_(reactor) {}

  SessionStreams* owner() const { return owner_; }

  // Any thread, even with the coordinator's lock held: schedule Advance.
  void Wake() {
    if (queued_.exchange(true)) return;
    std::weak_ptr<SessionStream> weak = weak_from_this();
    owner_->calls_->pool()->Post([weak] {
      if (auto st = weak.lock()) st->Advance();
    });
  }

  // The waker handed to Coordinator::OpenSession.
  Coordinator::SessionWaker Waker() {
    std::weak_ptr<SessionStream> weak = weak_from_this();
    return [weak] {
      if (auto st = weak.lock()) st->Wake();
    };
  }

  // The handler, once OpenSession returned.
  void Opened(uint64_t session_id) {
    {
      absl::MutexLock lock(&mu_);
      session_id_ = session_id;
      if (cancelled_ && finished_ && !shutting_down()) {
        // The client went away before the session was recorded.
        owner_->pass_on_(owner_->coordinator_->CloseSession(w_, session_id_));
        return;
      }
    }
    Wake();
  }

  // Ends a stream that never opened (bad request, unknown worker ...).
  void FinishEarly(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }

  // Pool thread: writes the next queued message, or ends the stream.
  void Advance() {
    queued_.store(false);
    absl::MutexLock lock(&mu_);
    if (finished_ || writing_ || session_id_ == 0) return;
    if (shutting_down()) {
      FinishLocked(absl::UnavailableError("the coordinator is shutting down; reconnect"));
      return;
    }
    absl::StatusOr<std::optional<v1::SessionMessage>> msg =
        owner_->coordinator_->NextSessionMessage(w_, session_id_, absl::InfinitePast());
    if (!msg.ok()) {
      // Replaced by a newer stream, closed, or the member is gone.
      if (owner_->HasLeft(w_)) {
        LogLine(absl::StrCat("session ended ", Who(w_), " session=", session_id_, " (left)"));
        FinishLocked(absl::OkStatus());
        return;
      }
      LogLine(absl::StrCat("session ended ", Who(w_), " session=", session_id_, " status=\"",
                       msg.status().ToString(), "\""));
      FinishLocked(msg.status());
      return;
    }
    if (!msg->has_value()) return;
    current_ = **std::move(msg);
    writing_ = true;
    reactor_->StartWrite(&current_);
  }

  // gRPC: a write finished (ok = false: the stream is broken).
  void WriteDone(bool ok) {
    bool more = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (finished_) return;
      if (shutting_down()) {
        FinishLocked(absl::UnavailableError("the coordinator is shutting down; reconnect"));
        return;
      }
      if (!ok || cancelled_) {
        BrokenLocked(cancelled_ ? "cancelled by the client or the connection broke"
                                : "write failed");
        return;
      }
      if (current_.has_directive() && current_.directive().has_stop()) {
        LogLine(absl::StrCat("session ended ", Who(w_), " session=", session_id_, " (stop)"));
        FinishLocked(absl::OkStatus());
        return;
      }
      more = true;
    }
    if (more) Wake();  // more messages may be queued
  }

  // gRPC: the client cancelled or the connection broke.
  void Cancelled() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (finished_ || writing_) return;  // WriteDone finishes a pending write
    if (shutting_down()) {
      FinishLocked(absl::UnavailableError("the coordinator is shutting down; reconnect"));
      return;
    }
    BrokenLocked("cancelled by the client or the connection broke");
  }

  // gRPC: the stream is over; the reactor is deleted after this.
  void Done() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    if (metrics::Metrics* m = owner_->calls_->metrics(); m != nullptr) {
      m->ObserveRpc("WorkerService/Session", absl::Now() - start_, final_code_);
    }
    absl::MutexLock streams(&owner_->mu_);
    owner_->streams_.erase(this);
  }

 private:
  bool shutting_down() const { return owner_->calls_->shutting_down(); }

  void BrokenLocked(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (session_id_ != 0) {
      std::vector<GenerationEnded> ended = owner_->coordinator_->CloseSession(w_, session_id_);
      LogLine(absl::StrCat("session broken ", Who(w_), " session=", session_id_, " why=\"", why,
                       "\""));
      owner_->pass_on_(ended);
    }
    FinishLocked(absl::UnavailableError("the session stream broke"));
  }

  void FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || reactor_ == nullptr) return;
    finished_ = true;
    if (!status.ok() && shutting_down()) {
      status = absl::UnavailableError("the coordinator is shutting down; reconnect");
    }
    final_code_ = status.code();
    if (status.code() == absl::StatusCode::kInternal) {
      LogLine(absl::StrCat("internal error method=WorkerService/Session status=\"",
                       status.ToString(), "\""));
    }
    reactor_->Finish(ToGrpcStatus(status));
  }

  SessionStreams* const owner_;
  const v1::WorkerIdentity w_;
  const absl::Time start_;
  std::atomic<bool> queued_{false};
  absl::Mutex mu_;
  grpc::ServerWriteReactor<v1::SessionMessage>* reactor_ ABSL_GUARDED_BY(mu_);
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  v1::SessionMessage current_ ABSL_GUARDED_BY(mu_);  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusCode final_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
};

// gRPC's side of one stream; owns the SessionStream (the coordinator's waker
// holds only a weak reference).
class SessionReactor final : public grpc::ServerWriteReactor<v1::SessionMessage> {
 public:
  SessionReactor(SessionStreams* owner, const v1::WorkerIdentity& w)
      : stream_(std::make_shared<SessionStream>(owner, w, this)) {
    absl::MutexLock lock(&owner->mu_);
    owner->streams_[stream_.get()] = stream_;
  }
  SessionStream& stream() { return *stream_; }
  // Both may take the coordinator's lock: on the pool, off gRPC's thread.
  void OnWriteDone(bool ok) override {
    stream_->owner()->calls_->pool()->Post([st = stream_, ok] { st->WriteDone(ok); });
  }
  void OnCancel() override {
    stream_->owner()->calls_->pool()->Post([st = stream_] { st->Cancelled(); });
  }
  void OnDone() override {
    stream_->Done();
    delete this;
  }

 private:
  const std::shared_ptr<SessionStream> stream_;
};

SessionStreams::SessionStreams(CallRunner* calls, Coordinator* coordinator,
                               CheckpointFlow::PassOnFn pass_on)
    : calls_(calls), coordinator_(coordinator), pass_on_(std::move(pass_on)) {}

grpc::ServerWriteReactor<v1::SessionMessage>* SessionStreams::Start(
    grpc::CallbackServerContext* ctx, const v1::SessionRequest& request) {
  auto* reactor = new SessionReactor(this, request.worker());
  SessionStream& stream = reactor->stream();
  const v1::WorkerIdentity& w = request.worker();
  if (absl::Status admit = calls_->Admit(); !admit.ok()) {
    stream.FinishEarly(admit);
    return reactor;
  }
  if (absl::Status st = CheckRequestLimits(request); !st.ok()) {
    stream.FinishEarly(st);
    return reactor;
  }
  if (absl::Status st = calls_->AuthorizeMember(*ctx, w, "worker.job_id"); !st.ok()) {
    stream.FinishEarly(st);
    return reactor;
  }
  // A new stream of the same incarnation replaces an open one
  // (coordinator.proto): the coordinator ends the old session, which then
  // finishes with ABORTED without declaring the worker lost.
  absl::StatusOr<uint64_t> session = coordinator_->OpenSession(w, stream.Waker());
  if (!session.ok()) {
    stream.FinishEarly(session.status());
    return reactor;
  }
  LogLine(absl::StrCat("session opened ", Who(w), " session=", *session));
  stream.Opened(*session);
  return reactor;
}

void SessionStreams::EndAll() {
  std::vector<std::shared_ptr<SessionStream>> open;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [raw, weak] : streams_) {
      if (auto st = weak.lock()) open.push_back(std::move(st));
    }
  }
  for (auto& st : open) st->Wake();
}

bool SessionStreams::HasLeft(const v1::WorkerIdentity& w) const {
  absl::StatusOr<v1::ListMembersResponse> members = coordinator_->ListMembers(w.job_id());
  if (!members.ok()) return false;
  for (const v1::Member& m : members->members()) {
    if (m.worker_id() == w.worker_id()) {
      return m.incarnation() == w.incarnation() && m.state() == v1::MEMBER_STATE_LEFT;
    }
  }
  return false;
}

}  // namespace shardline::server::rpc

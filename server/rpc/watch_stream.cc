#include "server/rpc/watch_stream.h"

#include <atomic>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "server/limits.h"

namespace shardline::server::rpc {

// One WatchJob stream (see the header). The event log's waker posts Wake
// to the pool; Advance pulls the events after the last one sent (no wait)
// and starts the next write. Lock order: mu_, then the coordinator's lock.
class WatchStream : public std::enable_shared_from_this<WatchStream> {
 public:
  WatchStream(WatchStreams* owner, std::string job_id,
              grpc::ServerWriteReactor<v1::JobEvent>* reactor)
      : owner_(owner), job_id_(std::move(job_id)), start_(absl::Now()), reactor_(reactor) {}

  WatchStreams* owner() const { return owner_; }
  const std::string& job_id() const { return job_id_; }

  // Any thread, even with the coordinator's lock held: schedule Advance.
  void Wake() {
    if (queued_.exchange(true)) return;
    std::weak_ptr<WatchStream> weak = weak_from_this();
    owner_->calls_->pool()->Post([weak] {
      if (auto st = weak.lock()) st->Advance();
    });
  }

  // The handler: sets where the stream starts and registers the waker,
  // then pulls (an event appended in between wakes it, so none is missed).
  absl::Status Open(const v1::WatchJobRequest& req) {
    Coordinator& c = *owner_->coordinator_;
    absl::StatusOr<v1::Job> job = c.GetJob(job_id_);
    if (!job.ok()) return job.status();
    absl::StatusOr<std::vector<v1::JobEvent>> retained =
        c.WaitEvents(job_id_, std::nullopt, absl::InfinitePast());
    if (!retained.ok()) return retained.status();
    const uint64_t oldest = retained->empty() ? 0 : retained->front().sequence();
    const uint64_t newest = retained->empty() ? 0 : retained->back().sequence();
    const uint64_t lowest_resume = oldest == 0 ? 0 : oldest - 1;
    uint64_t last = newest;
    if (req.has_after_sequence()) {
      last = req.after_sequence();
      if (last < lowest_resume || last > newest) {
        return absl::OutOfRangeError(absl::StrCat(
            "after_sequence=", last, " is outside the retained range [", lowest_resume, ", ",
            newest, "]; resume from within it, or leave after_sequence unset for live events"));
      }
    }
    // Already over: only the replay (events up to `newest`) is sent. The
    // phase was read before the events, so a job that ended in between
    // shows as a terminal PhaseChanged among them.
    bool terminal = IsTerminal(job->phase());
    for (const v1::JobEvent& e : *retained) {
      if (e.has_phase_changed() && IsTerminal(e.phase_changed().new_phase())) terminal = true;
    }
    {
      absl::MutexLock lock(&mu_);
      last_ = last;
      if (terminal) end_after_ = newest;
    }
    if (absl::Status admitted = owner_->Admit(job_id_, this); !admitted.ok()) return admitted;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr) {  // already done (cancelled meanwhile)
        owner_->Release(job_id_, this);
        return absl::OkStatus();
      }
      admitted_ = true;
    }
    std::weak_ptr<WatchStream> weak = weak_from_this();
    absl::StatusOr<uint64_t> waker = c.AddEventWaker(job_id_, [weak] {
      if (auto st = weak.lock()) st->Wake();
    });
    if (!waker.ok()) return waker.status();
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr) {
        c.RemoveEventWaker(job_id_, *waker);
        return absl::OkStatus();
      }
      waker_id_ = *waker;
    }
    Wake();
    return absl::OkStatus();
  }

  // Ends a stream that never opened.
  void FinishEarly(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }

  // Pool thread: writes the next event, or ends the stream.
  void Advance() {
    queued_.store(false);
    absl::MutexLock lock(&mu_);
    if (finished_ || writing_) return;
    if (owner_->calls_->shutting_down()) {
      FinishLocked(absl::UnavailableError("the coordinator is shutting down"));
      return;
    }
    if (cancelled_) {
      FinishLocked(absl::CancelledError("the watcher went away"));
      return;
    }
    if (pending_.empty()) {
      owner_->CountPull();
      absl::StatusOr<std::vector<v1::JobEvent>> events =
          owner_->coordinator_->WaitEvents(job_id_, last_, absl::InfinitePast());
      if (!events.ok()) {
        FinishLocked(events.status());
        return;
      }
      uint64_t expected = last_ + 1;
      for (v1::JobEvent& e : *events) {
        if (e.sequence() < expected) continue;
        if (e.sequence() > expected) {
          FinishLocked(absl::ResourceExhaustedError(absl::StrCat(
              "the watcher fell behind: events ", expected, "..", e.sequence() - 1,
              " are no longer retained; reconnect with after_sequence=", expected - 1)));
          return;
        }
        if (end_after_.has_value() && e.sequence() > *end_after_) break;
        pending_.push_back(std::move(e));
        ++expected;
      }
    }
    if (pending_.empty()) {
      if (end_after_.has_value() && last_ >= *end_after_) FinishLocked(absl::OkStatus());
      return;  // nothing new: the next event wakes it
    }
    current_ = std::move(pending_.front());
    pending_.pop_front();
    writing_ = true;
    reactor_->StartWrite(&current_);
  }

  // gRPC (via the pool): a write finished.
  void WriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (finished_) return;
      if (!ok) {
        FinishLocked(absl::CancelledError("the watcher went away"));
        return;
      }
      last_ = current_.sequence();
      if (current_.has_phase_changed() && IsTerminal(current_.phase_changed().new_phase())) {
        FinishLocked(absl::OkStatus());
        return;
      }
    }
    Wake();
  }

  // gRPC (via the pool): the client cancelled or the connection broke.
  void Cancelled() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(absl::CancelledError("the watcher went away"));
  }

  // gRPC: the stream is over; the reactor is deleted after this.
  void Done() {
    bool admitted = false;
    uint64_t waker = 0;
    {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
      std::swap(admitted, admitted_);
      std::swap(waker, waker_id_);
      if (metrics::Metrics* m = owner_->calls_->metrics(); m != nullptr) {
        m->ObserveRpc("JobService/WatchJob", absl::Now() - start_, final_code_);
      }
    }
    if (waker != 0) owner_->coordinator_->RemoveEventWaker(job_id_, waker);
    if (admitted) owner_->Release(job_id_, this);
  }

 private:
  void FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || reactor_ == nullptr) return;
    finished_ = true;
    if (!status.ok() && owner_->calls_->shutting_down()) {
      status = absl::UnavailableError("the coordinator is shutting down");
    }
    final_code_ = status.code();
    reactor_->Finish(ToGrpcStatus(status));
  }

  WatchStreams* const owner_;
  const std::string job_id_;
  const absl::Time start_;
  std::atomic<bool> queued_{false};
  absl::Mutex mu_;
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;  // holds a WatchStreams slot
  uint64_t waker_id_ ABSL_GUARDED_BY(mu_) = 0;  // Coordinator::AddEventWaker's id
  grpc::ServerWriteReactor<v1::JobEvent>* reactor_ ABSL_GUARDED_BY(mu_);
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;                  // sequence last sent
  std::optional<uint64_t> end_after_ ABSL_GUARDED_BY(mu_);  // job terminal at start
  std::deque<v1::JobEvent> pending_ ABSL_GUARDED_BY(mu_);
  v1::JobEvent current_ ABSL_GUARDED_BY(mu_);  // the event being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusCode final_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
};

// gRPC's side of one stream; owns the WatchStream (the waker holds only a
// weak reference).
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(WatchStreams* owner, const std::string& job_id)
      : stream_(std::make_shared<WatchStream>(owner, job_id, this)) {}
  const std::shared_ptr<WatchStream>& stream() { return stream_; }
  // Both take the stream's mutex: on the pool, off gRPC's thread.
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
  const std::shared_ptr<WatchStream> stream_;
};

WatchStreams::WatchStreams(CallRunner* calls, Coordinator* coordinator, WatchLimits limits)
    : calls_(calls), coordinator_(coordinator), limits_(limits) {}

grpc::ServerWriteReactor<v1::JobEvent>* WatchStreams::Start(grpc::CallbackServerContext* ctx,
                                                            const v1::WatchJobRequest& request) {
  auto* reactor = new WatchReactor(this, request.job_id());
  // Kept alive here: the reactor may be done (and deleted) before this returns.
  std::shared_ptr<WatchStream> keep = reactor->stream();
  WatchStream& stream = *keep;
  absl::Status st = CheckRequestLimits(request);
  if (st.ok()) st = calls_->Admit();
  if (st.ok()) st = calls_->AuthorizeRead(*ctx, request.job_id(), "job_id");
  if (st.ok()) st = stream.Open(request);
  if (!st.ok()) stream.FinishEarly(st);
  return reactor;
}

absl::Status WatchStreams::Admit(const std::string& job_id, WatchStream* stream) {
  absl::MutexLock lock(&mu_);
  int& of_job = per_job_[job_id];
  if (of_job >= limits_.per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", job_id, "' already has ", of_job, " open watchers, the most kMaxWatchersPerJob = ",
        limits_.per_job, " allows; close one (shardctl watch) and retry"));
  }
  if (static_cast<int>(streams_.size()) >= limits_.total) {
    if (of_job == 0) per_job_.erase(job_id);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator already has ", streams_.size(),
        " open watchers, the most kMaxWatchers = ", limits_.total,
        " allows; close one and retry"));
  }
  ++of_job;
  streams_[stream] = stream->weak_from_this();
  return absl::OkStatus();
}

void WatchStreams::Release(const std::string& job_id, WatchStream* stream) {
  absl::MutexLock lock(&mu_);
  if (streams_.erase(stream) == 0) return;
  auto it = per_job_.find(job_id);
  if (it != per_job_.end() && --it->second <= 0) per_job_.erase(it);
}

void WatchStreams::CountPull() {
  absl::MutexLock lock(&mu_);
  ++pulls_;
}

void WatchStreams::EndAll() {
  std::vector<std::shared_ptr<WatchStream>> open;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [raw, weak] : streams_) {
      if (auto st = weak.lock()) open.push_back(std::move(st));
    }
  }
  for (auto& st : open) st->Wake();
}

int WatchStreams::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

int WatchStreams::open(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = per_job_.find(job_id);
  return it == per_job_.end() ? 0 : it->second;
}

uint64_t WatchStreams::pulls() const {
  absl::MutexLock lock(&mu_);
  return pulls_;
}

}  // namespace shardline::server::rpc

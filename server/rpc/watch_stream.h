// JobService.WatchJob (proto/shardline/v1/coordinator.proto) on gRPC's
// callback API: an open watcher holds no thread and never polls. It is
// woken by the job's event log (Coordinator::AddEventWaker), pulls the new
// events (Coordinator::WaitEvents with a past deadline) on a HandlerPool
// thread (server/rpc/call.h) and writes them, one write in flight.
//
//   WatchStreams watches(&calls, &coordinator, WatchLimits{});
//   // JobServiceImpl::WatchJob:
//   return watches.Start(ctx, *req);
//   // CoordinatorServer::Shutdown:
//   watches.EndAll();
//
// Limits: at most WatchLimits::per_job open watchers of one job and
// WatchLimits::total of all jobs (defaults kMaxWatchersPerJob,
// kMaxWatchers; issue 14: a thread each, polling every 100 ms, up to
// 16384 of them, 2000 cost 72 % of a core). One more is RESOURCE_EXHAUSTED
// naming the limit.
//
// How a stream ends:
//   OK                 after the PhaseChanged to a terminal phase (at once,
//                      after its replay, for a job already terminal).
//   RESOURCE_EXHAUSTED events it had not received were dropped from the
//                      coordinator's retention (reconnect with
//                      after_sequence = the last received); or, before it
//                      opens, a watcher limit.
//   CANCELLED          the watcher went away.
//   UNAVAILABLE        the server is shutting down (EndAll).
//   Before it opens: coordinator.proto's common codes, server/limits.h's
//   INVALID_ARGUMENT, INVALID_ARGUMENT for an empty job_id, NOT_FOUND,
//   OUT_OF_RANGE for an after_sequence outside [oldest retained - 1,
//   newest].
// Every stream is counted as "JobService/WatchJob" in metrics when done.
//
// Lock order: a stream's mutex, then the coordinator's lock; the waker only
// posts to the pool (it runs under the coordinator's lock).
//
// Thread-safety: WatchStreams is thread-safe; it must outlive every stream
// it started (the gRPC server's Wait() returns after the last one is done).
#ifndef SHARDLINE_SERVER_RPC_WATCH_STREAM_H_
#define SHARDLINE_SERVER_RPC_WATCH_STREAM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator.h"
#include "server/rpc/call.h"
#include "shardline/v1/events.pb.h"

namespace shardline::server::rpc {

// Open WatchJob streams of one job, and of all jobs.
inline constexpr int kMaxWatchersPerJob = 64;
inline constexpr int kMaxWatchers = 1024;

struct WatchLimits {
  int per_job = kMaxWatchersPerJob;
  int total = kMaxWatchers;
};

class WatchStream;   // watch_stream.cc
class WatchReactor;  // watch_stream.cc

class WatchStreams {
 public:
  // Not owned; both must outlive this.
  WatchStreams(CallRunner* calls, Coordinator* coordinator, WatchLimits limits);
  WatchStreams(const WatchStreams&) = delete;
  WatchStreams& operator=(const WatchStreams&) = delete;

  // The WatchJob handler (gRPC's callback thread): the reactor that
  // streams `request`'s job; see the file comment.
  grpc::ServerWriteReactor<v1::JobEvent>* Start(grpc::CallbackServerContext* ctx,
                                                const v1::WatchJobRequest& request);

  // Shutdown: every open stream ends with UNAVAILABLE. Call after
  // CallRunner::BeginShutdown.
  void EndAll() ABSL_LOCKS_EXCLUDED(mu_);

  // Open streams (all jobs / one job), and how many times any stream
  // pulled events from the coordinator: for tests (a watcher that nothing
  // happens to pulls nothing).
  int open() const ABSL_LOCKS_EXCLUDED(mu_);
  int open(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t pulls() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class WatchStream;
  friend class WatchReactor;

  // Takes a slot for a watcher of `job_id`, or says which limit is full.
  absl::Status Admit(const std::string& job_id, WatchStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& job_id, WatchStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void CountPull() ABSL_LOCKS_EXCLUDED(mu_);

  CallRunner* const calls_;
  Coordinator* const coordinator_;
  const WatchLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> per_job_ ABSL_GUARDED_BY(mu_);
  std::map<WatchStream*, std::weak_ptr<WatchStream>> streams_ ABSL_GUARDED_BY(mu_);
  uint64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::server::rpc

#endif  // SHARDLINE_SERVER_RPC_WATCH_STREAM_H_

// NcclBackend: Backend over the GPU plugin's C ABI. No CUDA or NCCL header or
// library here: everything goes through the function table that
// GpuPlugin::api() returns (worker/gpu/plugin_abi.h).
//
// Failure handling, shared by the backend and its Works through `Comm`:
//   healthy --async error / op timeout / CUDA error--> failed (comm aborted)
//   healthy or failed --Abort()--> aborted (comm aborted)
// The first failure is kept and returned by every later operation; the
// plugin's comm_abort (ncclCommAbort) is called at most once per state change
// and never while holding Comm::mu.
#include "worker/comm/nccl_backend.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/gpu/gpu_plugin.h"
#include "worker/gpu/plugin_abi.h"

namespace shardline::worker {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";
constexpr size_t kErrorLen = 1024;

// A plugin code and its error text -> absl::Status (the codes are absl's).
absl::Status FromPlugin(int code, const char* error, const std::string& context) {
  if (code == SHARDLINE_GPU_OK) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat(context, ": ", error));
}

int32_t ToPlugin(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return SHARDLINE_GPU_FLOAT32;
    case DType::kFloat16:
      return SHARDLINE_GPU_FLOAT16;
    case DType::kBFloat16:
      return SHARDLINE_GPU_BFLOAT16;
  }
  return -1;
}

int32_t ToPlugin(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return SHARDLINE_GPU_SUM;
    case ReduceOp::kAvg:
      return SHARDLINE_GPU_AVG;
    case ReduceOp::kMax:
      return SHARDLINE_GPU_MAX;
    case ReduceOp::kMin:
      return SHARDLINE_GPU_MIN;
  }
  return -1;
}

int64_t ToMs(absl::Duration d) { return std::max<int64_t>(1, absl::ToInt64Milliseconds(d)); }

// Loads the plugin; Unavailable with a message that says to use Gloo.
absl::StatusOr<GpuPlugin> LoadPlugin(const std::string& path_option) {
#ifdef SHARDLINE_CUDA_COMPILED_OUT
  if (path_option.empty()) {
    return absl::UnavailableError(
        "NCCL backend unavailable: this build has CUDA compiled out (--config=nocuda); use Gloo");
  }
#endif
  const std::string path = path_option.empty() ? GpuPlugin::DefaultPath() : path_option;
  absl::StatusOr<GpuPlugin> plugin = GpuPlugin::Load(path);
  if (!plugin.ok()) {
    return absl::Status(plugin.status().code(),
                        absl::StrCat("NCCL backend unavailable: ", plugin.status().message()));
  }
  return plugin;
}

// One communicator, shared by the backend and its outstanding Works (a Work
// may outlive the backend). Thread-safe.
class Comm {
 public:
  Comm(const ShardlineGpuApi* api, ShardlineNcclComm* comm, int rank, int size, int device,
       NcclOptions options)
      : api_(*api), comm_(comm), rank_(rank), size_(size), device_(device), options_(options) {}
  ~Comm() {
    for (const auto& [ends, channel] : channels_) api_.comm_destroy(channel);
    api_.comm_destroy(comm_);
  }

  // Adds the 2-rank communicator of the directed channel src -> dst (group
  // ranks; NcclOptions::p2p_channels). Only while bootstrapping, before the
  // Comm is shared.
  void AddChannel(int src, int dst, ShardlineNcclComm* channel) { channels_[{src, dst}] = channel; }
  // The channel src -> dst, or null (then the main communicator carries it).
  ShardlineNcclComm* Channel(int src, int dst) const {
    auto it = channels_.find({src, dst});
    return it == channels_.end() ? nullptr : it->second;
  }

  // Every communicator of the group: the main one, then the p2p channels.
  std::vector<ShardlineNcclComm*> All() const {
    std::vector<ShardlineNcclComm*> all = {comm_};
    for (const auto& [ends, channel] : channels_) all.push_back(channel);
    return all;
  }

  const ShardlineGpuApi& api() const { return api_; }
  ShardlineNcclComm* handle() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  const NcclOptions& options() const { return options_; }

  // OK while healthy; else the error every operation now returns.
  absl::Status GroupError() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return GroupErrorLocked();
  }

  // Records `s` as the group's failure unless one is recorded already, aborts
  // the communicator, and returns the group's error.
  absl::Status Fail(absl::Status s) ABSL_LOCKS_EXCLUDED(mu_) {
    bool abort = false;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) {
        failure_ = std::move(s);
        abort = !aborted_;
      }
      result = GroupErrorLocked();
    }
    if (abort) AbortAll();  // bounded; never under mu_
    return result;
  }

  void Abort() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return;
      aborted_ = true;
    }
    AbortAll();
  }

 private:
  absl::Status GroupErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (aborted_) {
      return absl::AbortedError(
          failure_.ok()
              ? std::string("backend was aborted")
              : absl::StrCat("backend was aborted (earlier failure: ", failure_.message(), ")"));
    }
    return failure_;
  }

  // ncclCommAbort on every communicator of the group (idempotent each).
  void AbortAll() {
    api_.comm_abort(comm_);
    for (const auto& [ends, channel] : channels_) api_.comm_abort(channel);
  }

  const ShardlineGpuApi& api_;
  ShardlineNcclComm* const comm_;
  std::map<std::pair<int, int>, ShardlineNcclComm*> channels_;  // fixed once shared
  const int rank_, size_, device_;
  const NcclOptions options_;
  absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

class NcclWork;

// Polls the operations that a device stream waits for (Work::OrderBefore)
// until each has a status, so that one which passes its deadline or whose
// communicator reports an asynchronous error is aborted even when no host
// thread waits for it: the abort stops its kernels, and the stream that
// waits for it goes on (as torch's ProcessGroupNCCL watchdog does). One
// thread per backend, started at the first Watch. Thread-safe.
class Watchdog {
 public:
  // How often the watched operations are polled: an operation is aborted at
  // most this long after its deadline or its communicator's error.
  static constexpr absl::Duration kPeriod = absl::Milliseconds(10);

  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  void Watch(std::weak_ptr<NcclWork> work) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    watched_.push_back(std::move(work));
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }

 private:
  void Run();

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<NcclWork>> watched_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// One enqueued operation: its CUDA event, and the deadline from
// NcclOptions::timeout. Completed by polling (IsCompleted / Wait, and the
// watchdog once a stream waits for it).
class NcclWork : public Work, public std::enable_shared_from_this<NcclWork> {
 public:
  // An operation already finished with `status` (argument errors, failures to
  // enqueue, operations on a failed group).
  static std::shared_ptr<NcclWork> Done(absl::Status status) {
    auto w =
        std::make_shared<NcclWork>(nullptr, nullptr, nullptr, "", absl::InfiniteFuture());
    {
      absl::MutexLock lock(&w->mu_);  // not shared yet: taken for the analysis only
      w->done_ = true;
      w->status_ = std::move(status);
    }
    return w;
  }

  // `on`: the communicator the operation runs on (the group's main one, or
  // a p2p channel), whose asynchronous error is polled.
  NcclWork(std::shared_ptr<Comm> comm, ShardlineNcclComm* on, ShardlineGpuEvent* event,
           std::string what, absl::Time deadline, std::weak_ptr<Watchdog> watchdog = {})
      : comm_(std::move(comm)),
        on_(on),
        event_(event),
        what_(std::move(what)),
        deadline_(deadline),
        watchdog_(std::move(watchdog)) {}

  ~NcclWork() override {
    if (event_ != nullptr) comm_->api().event_destroy(event_);
  }

  bool IsCompleted() override { return Poll(); }

  // The communicator it runs on (null for Done()).
  const ShardlineNcclComm* on() const { return on_; }

  absl::Status OrderBefore(DeviceStream stream) override {
    if (stream.handle == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(what_, ": OrderBefore: null stream"));
    if (event_ == nullptr) {  // finished at issue (Done): nothing to wait for
      absl::MutexLock lock(&mu_);
      return status_;
    }
    // Watched first: the fake plugin's stream_wait_event blocks until the
    // event fires, which for a stuck operation takes the watchdog's abort.
    if (std::shared_ptr<Watchdog> w = watchdog_.lock()) w->Watch(weak_from_this());
    char error[kErrorLen] = {0};
    const int code = comm_->api().stream_wait_event(stream.handle, event_, error, sizeof(error));
    if (code != SHARDLINE_GPU_OK) {
      absl::Status s = comm_->Fail(FromPlugin(code, error, absl::StrCat("rank ", comm_->rank())));
      return absl::Status(s.code(), absl::StrCat(what_, ": ordering a stream after it: ", s.message()));
    }
    return absl::OkStatus();
  }

  // When the operation was seen to finish (successfully or not), or nullopt
  // while it runs. Polls like IsCompleted.
  std::optional<absl::Time> FinishedAt() ABSL_LOCKS_EXCLUDED(mu_) {
    if (!Poll()) return std::nullopt;
    absl::MutexLock lock(&mu_);
    return finished_at_;
  }

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time until =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    // Spin briefly (small operations finish in microseconds), then back off
    // to 1 ms so a long wait costs little CPU.
    absl::Duration sleep = absl::Microseconds(2);
    while (!Poll()) {
      if (absl::Now() >= until) {
        return absl::DeadlineExceededError(
            absl::StrCat(what_, " still running after waiting ", absl::FormatDuration(timeout),
                         " (not cancelled; NcclOptions::timeout still applies)"));
      }
      absl::SleepFor(sleep);
      sleep = std::min(sleep * 2, absl::Milliseconds(1));
    }
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  // Checks the group, the event, the communicator's async error and the
  // deadline, in that order. Returns true once the operation has a status.
  bool Poll() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (done_) return true;
    absl::Status s = comm_->GroupError();
    if (s.ok()) s = CheckLocked();
    if (!s.ok() || finished_) {
      done_ = true;
      finished_at_ = absl::Now();
      status_ = s.ok() ? s : absl::Status(s.code(), absl::StrCat(what_, ": ", s.message()));
    }
    return done_;
  }

  // OK with finished_ set: the event fired. OK without: still running.
  absl::Status CheckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const ShardlineGpuApi& api = comm_->api();
    char error[kErrorLen] = {0};
    // The event first: a kernel that finished did so with all its data (NCCL
    // stops kernels early only when we abort, and then GroupError() is set),
    // so a peer that has already torn its communicator down cannot turn a
    // finished operation into an error.
    int32_t fired = 0;
    int code = api.event_query(event_, &fired, error, sizeof(error));
    if (code != SHARDLINE_GPU_OK)
      return comm_->Fail(FromPlugin(code, error, absl::StrCat("rank ", comm_->rank())));
    if (fired) {
      finished_ = true;
      return absl::OkStatus();
    }
    code = api.comm_status(on_, error, sizeof(error));
    if (code != SHARDLINE_GPU_OK)
      return comm_->Fail(FromPlugin(code, error, absl::StrCat("rank ", comm_->rank())));
    if (absl::Now() >= deadline_) {
      return comm_->Fail(absl::DeadlineExceededError(absl::StrCat(
          "rank ", comm_->rank(), ": did not finish within NcclOptions::timeout=",
          absl::FormatDuration(comm_->options().timeout), "; the communicator was aborted")));
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<Comm> comm_;  // null only for Done()
  ShardlineNcclComm* const on_;       // owned by comm_; null only for Done()
  ShardlineGpuEvent* const event_;    // owned; null only for Done()
  const std::string what_;            // e.g. "all_reduce of 1024 elements on rank 1"
  const absl::Time deadline_;
  const std::weak_ptr<Watchdog> watchdog_;  // the issuing backend's
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time finished_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

void Watchdog::Run() {
  for (;;) {
    std::vector<std::weak_ptr<NcclWork>> watched;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), kPeriod)) return;
      watched = watched_;
    }
    // Polling sets each operation's status, and aborts the communicator on
    // a deadline or an asynchronous error (NcclWork::Poll). A communicator's
    // operations finish in issue order and their deadlines come in that
    // order too, so past the first one still running on a communicator
    // (which also polls its asynchronous error) the rest need no poll: a
    // step's worth queued on the device costs one poll per communicator.
    // Finished ones are held until they leave the list, so that no new
    // operation can take a finished one's address meanwhile.
    std::vector<std::shared_ptr<NcclWork>> finished;
    bool expired = false;
    std::set<const ShardlineNcclComm*> running;
    for (const std::weak_ptr<NcclWork>& weak : watched) {
      std::shared_ptr<NcclWork> w = weak.lock();
      if (w == nullptr) {
        expired = true;
      } else if (running.count(w->on()) > 0) {
        continue;
      } else if (w->IsCompleted()) {
        finished.push_back(std::move(w));
      } else {
        running.insert(w->on());
      }
    }
    if (finished.empty() && !expired) continue;
    absl::MutexLock lock(&mu_);
    watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                  [&](const std::weak_ptr<NcclWork>& weak) {
                                    std::shared_ptr<NcclWork> w = weak.lock();
                                    return w == nullptr ||
                                           std::find(finished.begin(), finished.end(), w) !=
                                               finished.end();
                                  }),
                   watched_.end());
  }
}

// The bookkeeping behind NcclBackend::Progress (backend.h OpProgress).
// Operations are recorded when enqueued; they are seen to finish by polling
// their events, oldest first, when Progress is called (or earlier through
// Work::Wait / IsCompleted, whose time of completion is kept). NCCL runs a
// communicator's operations in stream order, so one starts when it was
// enqueued or when the one before it finished, whichever is later.
// Thread-safe.
class ProgressBook {
 public:
  void Issued(OpProgress p, bool p2p, const std::shared_ptr<NcclWork>& work)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    p.in_flight = true;
    p.sequence = p2p ? ++p2p_issued_ : ++issued_;
    Tracked t{std::move(p), absl::Now(), work};
    if (p2p) {
      p2p_[t.progress.sequence] = std::move(t);
    } else {
      collectives_.push_back(std::move(t));
    }
  }

  BackendProgress Progress() ABSL_LOCKS_EXCLUDED(poll_mu_, mu_) {
    absl::MutexLock poll(&poll_mu_);  // one poller at a time; only it removes entries
    // Finished collectives leave from the front; a Work dropped unwaited
    // counts as finished when noticed.
    for (;;) {
      std::shared_ptr<NcclWork> w;
      {
        absl::MutexLock lock(&mu_);
        if (collectives_.empty()) break;
        w = collectives_.front().work.lock();
      }
      const std::optional<absl::Time> end = w ? w->FinishedAt() : absl::Now();
      if (!end) break;
      absl::MutexLock lock(&mu_);
      Tracked& t = collectives_.front();
      last_ = std::move(t.progress);
      last_.in_flight = false;
      last_.elapsed = std::max(absl::ZeroDuration(), *end - std::max(t.issued, last_end_));
      last_end_ = *end;
      collectives_.pop_front();
    }
    std::vector<std::pair<uint64_t, std::weak_ptr<NcclWork>>> p2p;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [n, t] : p2p_) p2p.emplace_back(n, t.work);
    }
    std::vector<uint64_t> finished;
    for (auto& [n, weak] : p2p) {
      std::shared_ptr<NcclWork> w = weak.lock();
      if (w == nullptr || w->FinishedAt().has_value()) finished.push_back(n);
    }
    BackendProgress out;
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    for (uint64_t n : finished) p2p_.erase(n);
    if (collectives_.empty()) {
      out.collective = last_;
    } else {
      const Tracked& t = collectives_.front();
      out.collective = t.progress;
      out.collective.elapsed = now - std::max(t.issued, last_end_);
    }
    if (!p2p_.empty()) {
      const Tracked& t = p2p_.begin()->second;
      out.p2p = t.progress;
      out.p2p->elapsed = now - t.issued;
    }
    return out;
  }

 private:
  struct Tracked {
    OpProgress progress;
    absl::Time issued;
    std::weak_ptr<NcclWork> work;
  };
  absl::Mutex poll_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t p2p_issued_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Tracked> collectives_ ABSL_GUARDED_BY(mu_);  // in flight, in issue order
  OpProgress last_ ABSL_GUARDED_BY(mu_);                  // the latest finished
  absl::Time last_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<uint64_t, Tracked> p2p_ ABSL_GUARDED_BY(mu_);  // in flight, by number
};

class NcclBackend : public Backend {
 public:
  explicit NcclBackend(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}
  ~NcclBackend() override { Abort(); }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  bool device_memory() const override { return true; }
  bool stream_ordered() const override { return true; }

  absl::Status OrderAfter(DeviceStream stream) override {
    if (stream.handle == nullptr) return absl::InvalidArgumentError("OrderAfter: null stream");
    if (absl::Status s = comm_->GroupError(); !s.ok()) return s;
    for (ShardlineNcclComm* c : comm_->All()) {
      char error[kErrorLen] = {0};
      const int code = api().comm_order_after_stream(c, stream.handle, error, sizeof(error));
      if (code != SHARDLINE_GPU_OK) {
        return comm_->Fail(FromPlugin(
            code, error, absl::StrCat("rank ", rank(), ": ordering the group after a stream")));
      }
    }
    return absl::OkStatus();
  }

  BackendProgress Progress() const override { return progress_->Progress(); }

  std::shared_ptr<Work> AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return Issue("all_reduce", count, dtype, [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
      return api().all_reduce(handle(), data, count, ToPlugin(dtype), ToPlugin(op), ms, ev, e, n);
    });
  }

  std::shared_ptr<Work> AllGather(const void* in, size_t count, void* out, DType dtype) override {
    return Issue("all_gather", count, dtype, [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
      return api().all_gather(handle(), in, count, out, ToPlugin(dtype), ms, ev, e, n);
    });
  }

  std::shared_ptr<Work> ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                      DType dtype, ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(size())) {
      return Invalid("reduce_scatter",
                     absl::StrCat("counts.size()=", counts.size(), " != size=", size()));
    }
    size_t total = 0;
    for (size_t c : counts) total += c;
    return Issue("reduce_scatter", total, dtype,
                 [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
                   return api().reduce_scatter(handle(), in, out, counts.data(), ToPlugin(dtype),
                                               ToPlugin(op), ms, ev, e, n);
                 });
  }

  std::shared_ptr<Work> AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                                 const std::vector<size_t>& recv_counts, DType dtype) override {
    if (send_counts.size() != static_cast<size_t>(size())) {
      return Invalid("all_to_all",
                     absl::StrCat("send_counts.size()=", send_counts.size(), " != size=", size()));
    }
    if (recv_counts.size() != static_cast<size_t>(size())) {
      return Invalid("all_to_all",
                     absl::StrCat("recv_counts.size()=", recv_counts.size(), " != size=", size()));
    }
    size_t total = 0;
    for (size_t c : send_counts) total += c;
    return Issue("all_to_all", total, dtype, [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
      return api().all_to_all(handle(), in, send_counts.data(), out, recv_counts.data(),
                              ToPlugin(dtype), ms, ev, e, n);
    });
  }

  std::shared_ptr<Work> Broadcast(void* data, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size()) {
      return Invalid("broadcast", absl::StrCat("root=", root, " out of range [0,", size(), ")"));
    }
    return Issue("broadcast", count, dtype, [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
      return api().broadcast(handle(), data, count, ToPlugin(dtype), root, ms, ev, e, n);
    });
  }

  std::shared_ptr<Work> Send(const void* data, size_t count, DType dtype, int peer,
                             uint32_t /*tag: NCCL matches in issue order*/) override {
    if (auto bad = CheckPeer("send", peer)) return bad;
    // On the channel rank -> peer this rank is rank 0, the peer rank 1.
    ShardlineNcclComm* channel = comm_->Channel(rank(), peer);
    ShardlineNcclComm* on = channel != nullptr ? channel : handle();
    const int to = channel != nullptr ? 1 : peer;
    return Issue(
        "send", count, dtype,
        [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
          return api().send(on, data, count, ToPlugin(dtype), to, ms, ev, e, n);
        },
        peer, on);
  }

  std::shared_ptr<Work> Recv(void* data, size_t count, DType dtype, int peer,
                             uint32_t /*tag*/) override {
    if (auto bad = CheckPeer("recv", peer)) return bad;
    // On the channel peer -> rank the peer is rank 0.
    ShardlineNcclComm* channel = comm_->Channel(peer, rank());
    ShardlineNcclComm* on = channel != nullptr ? channel : handle();
    const int from = channel != nullptr ? 0 : peer;
    return Issue(
        "recv", count, dtype,
        [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
          return api().recv(on, data, count, ToPlugin(dtype), from, ms, ev, e, n);
        },
        peer, on);
  }

  std::shared_ptr<Work> Barrier() override {
    return Issue("barrier", 0, DType::kFloat32, [&](int64_t ms, ShardlineGpuEvent** ev, char* e, size_t n) {
      return api().barrier(handle(), ms, ev, e, n);
    });
  }

  void Abort() override { comm_->Abort(); }

 private:
  const ShardlineGpuApi& api() const { return comm_->api(); }
  ShardlineNcclComm* handle() const { return comm_->handle(); }

  std::shared_ptr<Work> Invalid(const char* op, const std::string& what) {
    return NcclWork::Done(
        absl::InvalidArgumentError(absl::StrCat(op, " on rank ", rank(), ": ", what)));
  }

  std::shared_ptr<Work> CheckPeer(const char* op, int peer) {
    if (peer < 0 || peer >= size())
      return Invalid(op, absl::StrCat("peer=", peer, " out of range [0,", size(), ")"));
    if (peer == rank()) return Invalid(op, absl::StrCat("peer=", peer, " == rank"));
    return nullptr;
  }

  // Enqueues through `call(timeout_ms, &event, error, error_len)`.
  // `count` and `dtype` are recorded for Progress (`peer` for send / recv);
  // `on` is the communicator it runs on (null: the group's main one).
  template <typename F>
  std::shared_ptr<Work> Issue(const char* op, size_t count, DType dtype, F call, int peer = -1,
                              ShardlineNcclComm* on = nullptr) {
    if (on == nullptr) on = handle();
    const std::string what = absl::StrCat(op, " of ", count, " elements on rank ", rank());
    absl::Status s = comm_->GroupError();
    if (!s.ok())
      return NcclWork::Done(absl::Status(s.code(), absl::StrCat(what, ": ", s.message())));
    const absl::Time deadline = absl::Now() + comm_->options().timeout;
    ShardlineGpuEvent* event = nullptr;
    char error[kErrorLen] = {0};
    const int code = call(ToMs(comm_->options().timeout), &event, error, sizeof(error));
    if (code == SHARDLINE_GPU_INVALID_ARGUMENT)
      return NcclWork::Done(FromPlugin(code, error, what));
    if (code != SHARDLINE_GPU_OK) {
      s = comm_->Fail(FromPlugin(code, error, absl::StrCat("rank ", rank())));
      return NcclWork::Done(absl::Status(s.code(), absl::StrCat(what, ": ", s.message())));
    }
    auto work = std::make_shared<NcclWork>(comm_, on, event, what, deadline, watchdog_);
    OpProgress p;
    p.operation = op;
    p.count = count;
    p.dtype = dtype;
    p.peer = peer;
    progress_->Issued(std::move(p), peer >= 0, work);
    return work;
  }

  const std::shared_ptr<Comm> comm_;
  const std::shared_ptr<ProgressBook> progress_ = std::make_shared<ProgressBook>();
  // Destroyed (its thread joined) before comm_'s last reference here.
  const std::shared_ptr<Watchdog> watchdog_ = std::make_shared<Watchdog>();
};

// Makes rank `rank` of an `nranks`-rank communicator on `device`: rank 0
// creates the NCCL unique id and sets it in `store` under `key`, the others
// wait for it there; then every rank joins (ncclCommInitRankConfig) until
// `deadline`. Errors: as CreateNcclBackend's, prefixed by `where`.
absl::StatusOr<ShardlineNcclComm*> InitComm(const ShardlineGpuApi& api, Store& store,
                                            const std::string& key, int nranks, int rank,
                                            int device, absl::Time deadline,
                                            const std::string& where) {
  char error[kErrorLen] = {0};
  std::string id;
  if (rank == 0) {
    id.resize(SHARDLINE_NCCL_UNIQUE_ID_BYTES);
    const int code = api.get_unique_id(reinterpret_cast<uint8_t*>(id.data()), error, sizeof(error));
    if (code != SHARDLINE_GPU_OK) return FromPlugin(code, error, where);
    absl::Status s = store.Set(key, id);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
  } else {
    absl::StatusOr<std::string> got =
        store.Get(key, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (!got.ok()) {
      return absl::Status(
          got.status().code(),
          absl::StrCat(where, ": waiting for rank 0's NCCL unique id: ", got.status().message()));
    }
    id = *std::move(got);
    if (id.size() != SHARDLINE_NCCL_UNIQUE_ID_BYTES) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": key '", key, "' holds ", id.size(), " bytes, not ",
          SHARDLINE_NCCL_UNIQUE_ID_BYTES, "; is another group using this store prefix?"));
    }
  }
  ShardlineNcclComm* comm = nullptr;
  const int code = api.comm_init(reinterpret_cast<const uint8_t*>(id.data()), nranks, rank,
                                 device,
                                 ToMs(std::max(deadline - absl::Now(), absl::Milliseconds(1))),
                                 &comm, error, sizeof(error));
  if (code != SHARDLINE_GPU_OK) {
    return FromPlugin(code, error, absl::StrCat(where, " on device ", device));
  }
  return comm;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(std::shared_ptr<Store> store, int rank,
                                                           int size, NcclOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("store is null");
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("size=", size, " must be >= 1"));
  if (rank < 0 || rank >= size)
    return absl::InvalidArgumentError(absl::StrCat("rank=", rank, " out of range [0,", size, ")"));
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("options.timeout must be positive");
  if (options.connect_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("options.connect_timeout must be positive");
  const absl::Time deadline = absl::Now() + options.connect_timeout;

  absl::StatusOr<GpuPlugin> plugin = LoadPlugin(options.plugin_path);
  if (!plugin.ok()) return plugin.status();
  const ShardlineGpuApi& api = plugin->api();
  char error[kErrorLen] = {0};
  int32_t devices = 0;
  if (api.device_count(&devices, error, sizeof(error)) != SHARDLINE_GPU_OK || devices < 1) {
    return absl::UnavailableError(
        absl::StrCat("NCCL backend unavailable: no usable GPU: ", error, "; use Gloo"));
  }
  const int device = options.device < 0 ? rank % devices : options.device;
  if (device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.device=", options.device, " out of range [0,", devices, ")"));
  }

  const std::string where = absl::StrCat("bootstrapping NCCL rank ", rank, " of ", size);
  absl::StatusOr<ShardlineNcclComm*> main_comm =
      InitComm(api, *store, kUniqueIdKey, size, rank, device, deadline, where);
  if (!main_comm.ok()) return main_comm.status();
  auto comm = std::make_shared<Comm>(&api, *main_comm, rank, size, device, options);

  // p2p channels between ring neighbours (NcclOptions::p2p_channels), pair
  // by pair in one global order, lowest pair first: every rank's blocking
  // inits then follow that order, so the lowest pair not yet made always has
  // both its ranks at it and none waits forever. On error, `comm` frees what
  // was made.
  if (options.p2p_channels && size > 1) {
    std::set<std::pair<int, int>> pairs;
    for (int r = 0; r < size; ++r) {
      const int next = (r + 1) % size;
      pairs.insert({std::min(r, next), std::max(r, next)});
    }
    for (const auto& [a, b] : pairs) {
      if (rank != a && rank != b) continue;
      for (const auto& [src, dst] : {std::pair<int, int>{a, b}, std::pair<int, int>{b, a}}) {
        absl::StatusOr<ShardlineNcclComm*> channel = InitComm(
            api, *store, absl::StrCat(kUniqueIdKey, "_p2p_", src, "_to_", dst), 2,
            rank == src ? 0 : 1, device, deadline,
            absl::StrCat(where, ": the p2p channel from rank ", src, " to rank ", dst));
        if (!channel.ok()) return channel.status();
        comm->AddChannel(src, dst, *channel);
      }
    }
  }
  return std::unique_ptr<Backend>(new NcclBackend(std::move(comm)));
}

// --- DeviceMemory ---

namespace {
const ShardlineGpuApi& Api(const void* p) { return *static_cast<const ShardlineGpuApi*>(p); }
}  // namespace

absl::StatusOr<DeviceMemory> DeviceMemory::Load(const std::string& plugin_path) {
  absl::StatusOr<GpuPlugin> plugin = LoadPlugin(plugin_path);
  if (!plugin.ok()) return plugin.status();
  return DeviceMemory(&plugin->api());
}

absl::StatusOr<int> DeviceMemory::DeviceCount() const {
  char error[kErrorLen] = {0};
  int32_t n = 0;
  const int code = Api(api_).device_count(&n, error, sizeof(error));
  if (code != SHARDLINE_GPU_OK) return FromPlugin(code, error, "no usable GPU");
  return static_cast<int>(n);
}

absl::StatusOr<void*> DeviceMemory::Alloc(int device, size_t bytes) const {
  char error[kErrorLen] = {0};
  void* ptr = nullptr;
  const int code = Api(api_).device_alloc(device, bytes, &ptr, error, sizeof(error));
  if (code != SHARDLINE_GPU_OK) return FromPlugin(code, error, "allocating device memory");
  return ptr;
}

void DeviceMemory::Free(int device, void* ptr) const { Api(api_).device_free(device, ptr); }

absl::Status DeviceMemory::CopyToDevice(int device, void* dst, const void* src,
                                        size_t bytes) const {
  char error[kErrorLen] = {0};
  return FromPlugin(Api(api_).copy_to_device(device, dst, src, bytes, error, sizeof(error)), error,
                    "copying to the device");
}

absl::Status DeviceMemory::CopyToHost(int device, void* dst, const void* src, size_t bytes) const {
  char error[kErrorLen] = {0};
  return FromPlugin(Api(api_).copy_to_host(device, dst, src, bytes, error, sizeof(error)), error,
                    "copying to the host");
}

}  // namespace shardline::worker

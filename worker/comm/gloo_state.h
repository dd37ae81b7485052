// The Gloo backend's shared state (gloo_backend.cc: collectives and the op
// thread; gloo_p2p.cc: send / recv): the Work handle, the state shared by a
// backend and its threads, and the slots its own messages use. Only those
// two files include this.
//
// Thread-safety: WorkImpl is thread-safe; State's fields say what guards them.
#ifndef SHARDLINE_WORKER_COMM_GLOO_STATE_H_
#define SHARDLINE_WORKER_COMM_GLOO_STATE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/context.h"
#include "worker/comm/backend.h"
#include "gloo/transport/device.h"
#include "worker/comm/gloo_checks.h"
#include "worker/comm/shm_group.h"
#include "worker/comm/store.h"

namespace shardline::worker::gloo_internal {

struct State;

// Completed-once handle. The first Complete() wins (Abort may complete the
// running op before its thread notices). Lock order: State::mu before mu_.
class WorkImpl : public Work {
 public:
  WorkImpl() = default;
  // `owner`: the backend whose queue may run this operation on a thread
  // that waits for it (State::Help).
  explicit WorkImpl(std::weak_ptr<State> owner) : owner_(std::move(owner)) {}

  bool IsCompleted() override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  // With an infinite timeout, first lets the owner run this operation on the
  // calling thread (State::Help); then waits.
  absl::Status Wait(absl::Duration timeout) override;
  void Complete(absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    status_ = std::move(s);
    done_ = true;
  }

 private:
  std::weak_ptr<State> owner_;  // set at construction
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

inline std::shared_ptr<Work> Done(absl::Status s) {
  auto w = std::make_shared<WorkImpl>();
  w->Complete(std::move(s));
  return w;
}

// Slot prefix for point-to-point operations; Gloo's collectives use small
// prefixes in the top byte, so this does not collide with them.
constexpr uint64_t kP2PSlotPrefix = uint64_t{0x5a} << 56;
// The descriptors of a send / recv pair (gloo_checks::CallDesc), one slot
// per direction: sender -> receiver and receiver -> sender.
constexpr uint64_t kP2PSendDescSlotPrefix = uint64_t{0x5c} << 56;
constexpr uint64_t kP2PRecvDescSlotPrefix = uint64_t{0x5d} << 56;
// How a group moves its collectives' data (decided at bootstrap, the same
// on every rank; gloo_shm.cc):
//   kTcp: Gloo over TCP between every pair (no two ranks share a host, or
//     shared memory is off or failed).
//   kShm: every rank is on this host: the collectives run on `shm`
//     (all_to_all, send and recv stay on TCP).
//   kHierarchical: ranks on several hosts, some sharing one: each host's
//     ranks combine through their shared memory and its leader (its lowest
//     rank) exchanges with the other hosts' leaders over `leaders`.
enum class Mode { kTcp, kShm, kHierarchical };

// Shared between the backend object and its op thread, so the thread may
// outlive the object (destruction detaches a thread stuck in Gloo).
struct State {
  int rank = 0;
  int size = 1;
  GlooOptions options;
  std::shared_ptr<gloo::rendezvous::Context> context;  // null when size == 1
  std::shared_ptr<Store> store;                        // the group's store
  // By rank: the names Gloo's errors may give that peer (see GlooName); a
  // host leader's include its names on the `leaders` context.
  std::vector<std::vector<std::string>> peer_names;

  // The transport (fixed after bootstrap). hosts: the group ranks on each
  // host, each list ascending, hosts ordered by their lowest rank (a host
  // whose shared memory failed counts as one host per rank); host / local:
  // this rank's host and its index there.
  Mode mode = Mode::kTcp;
  std::vector<std::vector<int>> hosts;
  int host = 0;
  int local = 0;
  std::unique_ptr<shm::ShmGroup> shm;  // when this host has >= 2 ranks (kShm, kHierarchical)
  // kHierarchical, on host leaders only: one rank per host, leader i of
  // hosts[i].
  std::shared_ptr<gloo::rendezvous::Context> leaders;
  TransportInfo transport;

  // Waiters use Mutex::Await: a change to the fields below wakes them when
  // its writer releases `mu`, with no separate notify.
  gloo_checks::GroupNames names;  // for messages (GlooOptions::group_name, global_ranks)

  absl::Mutex mu;
  struct Queued {
    std::function<absl::Status(const gloo_checks::CallDesc&)> fn;  // called with `desc`
    std::shared_ptr<WorkImpl> work;
    OpProgress progress;  // operation, sequence, count, dtype
    gloo_checks::CallDesc desc;
    // It runs in shared memory only, so Abort interrupts it at once: a
    // waiting thread may run it (Help).
    bool interruptible = false;
  };
  std::deque<Queued> queue ABSL_GUARDED_BY(mu);
  // The operation running now, on the op thread or a helping waiter (one at
  // a time, in queue order).
  std::shared_ptr<WorkImpl> running ABSL_GUARDED_BY(mu);
  bool loop_busy ABSL_GUARDED_BY(mu) = false;  // the op thread runs `running`
  bool aborted ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool exited ABSL_GUARDED_BY(mu) = false;    // op thread left Loop
  bool detached ABSL_GUARDED_BY(mu) = false;  // counted in g_stalled_op_threads
  absl::Status sticky ABSL_GUARDED_BY(mu);    // first fatal error
  // Posted point-to-point operations not yet known complete (Abort
  // completes them with Aborted at once).
  std::vector<std::weak_ptr<WorkImpl>> p2p_pending ABSL_GUARDED_BY(mu);
  // Progress (backend.h OpProgress): ordered collectives issued so far; the
  // running one, else the latest completed, and when it started running;
  // send / recv issued so far and those in flight by their number, with
  // when they were posted.
  uint64_t issued ABSL_GUARDED_BY(mu) = 0;
  OpProgress current ABSL_GUARDED_BY(mu);
  absl::Time current_start ABSL_GUARDED_BY(mu);
  uint64_t p2p_issued ABSL_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::pair<OpProgress, absl::Time>> p2p_in_flight ABSL_GUARDED_BY(mu);
  // Send / recv between one pair with one tag post their payloads in call
  // order (Gloo matches a slot's messages in posting order, and each
  // operation posts its payload from its own thread once the descriptors
  // matched): by (peer, tag, is_send), the tickets handed out and the
  // number of payloads posted.
  absl::flat_hash_map<std::tuple<int, uint32_t, bool>, std::pair<uint64_t, uint64_t>> p2p_order
      ABSL_GUARDED_BY(mu);
  // Fields below marked "op thread" are touched only by the thread running
  // an operation (the op thread, or a waiter in Help): one at a time, handed
  // over under mu.
  uint32_t next_tag = 1;    // only touched on the op thread
  uint32_t leader_tag = 1;  // the same, for `leaders` (its own tags: only leaders use it)
  // CheckCollective's results (op thread only): every collective up to
  // checked_through matched on every rank, except failed_sequence (0:
  // none), which fails with failed_check.
  uint64_t checked_through = 0;
  uint64_t failed_sequence = 0;
  absl::Status failed_check;
  // Scratch reused across calls (a fresh buffer of tens of MiB is a fresh
  // mmap with its page faults each call); only touched on the op thread.
  std::vector<float> fp32_scratch;  // 16-bit all_reduce in fp32
  std::vector<float> reduce_scatter_acc;
  std::vector<float> reduce_scatter_incoming;
  std::vector<char> host_scratch;  // kHierarchical leaders: packed pieces

  // The time limit of a collective starting now.
  shm::OpContext Ctx(const char* op) const { return {op, absl::Now() + options.timeout}; }

  // Turns the exception in flight into a status naming the op and, where it
  // can be identified, the peer rank.
  absl::Status MapException(const std::string& op);

  // A lost peer poisons the group. Gloo does not tell the other ranks, and
  // ranks not talking to the lost peer directly would block until their op
  // timeout; so record the first loss in the group's store and close our
  // sockets, which makes our peers fail at once. They then see *this* rank as
  // lost, and the recorded first report names the root cause. Returns
  // "; first failure in this group: rank A lost peer rank B" when someone
  // else reported first, else "". Runs on the op thread.
  std::string PropagateLoss(const std::string& what);

  // Bootstrap of the transport, after `context` connected: which ranks share
  // a host (through the store), their shared memory segment, the leaders'
  // context (gloo_shm.cc). Errors as CreateGlooBackend's; Gloo exceptions
  // from connecting the leaders propagate to its handlers.
  absl::Status SetUpTransport(std::shared_ptr<gloo::transport::Device> device);

  // The kHierarchical collectives (gloo_shm.cc), after CheckCollective:
  // shapes as in backend.h.
  absl::Status HierAllReduce(void* data, size_t count, DType dtype, ReduceOp op);
  absl::Status HierAllGather(const void* in, size_t count, void* out, DType dtype);
  absl::Status HierReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                 DType dtype, ReduceOp op);
  absl::Status HierBroadcast(void* data, size_t count, DType dtype, int root);

  // Makes `s` the group's sticky error (first one wins) unless it is an
  // argument error.
  void RecordFailure(const absl::Status& s);

  // Before an ordered collective moves data: every rank sends every rank
  // its descriptor of the call and of up to CheckBatch(size) - 1 calls
  // queued behind it (a Gloo allgather of a fixed size, so it cannot
  // mismatch itself); each sequence number issued on every rank is compared,
  // and a difference fails that operation on every rank, with the same
  // message, before it moves data. Operations already compared this way
  // (issued back to back) skip the exchange. Either way every rank has
  // issued the operation before it runs, so barriers and empty operations
  // need nothing else. Op thread only.
  absl::Status CheckCollective(const gloo_checks::CallDesc& mine, const char* op);

  std::string DebugNames();

  // The op thread's wait in Loop: stopping, or an operation to run and
  // nobody running one.
  bool StoppingOrRunnable() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  bool IdleOrDrained() const ABSL_SHARED_LOCKS_REQUIRED(mu);
  bool NothingRunning() const ABSL_SHARED_LOCKS_REQUIRED(mu);

  // Pops the queue's front and runs it on the calling thread (requires a
  // non-empty queue and no running operation; releases mu while it runs).
  void RunFrontLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A thread about to wait for `work` without a timeout runs the queued
  // operations itself, in order, up to and including `work`, while they are
  // interruptible and no other thread runs one: an operation issued and
  // waited for at once then costs no hand-over to the op thread and back
  // (two thread wake-ups). Returns when `work` is done or it cannot help.
  void Help(WorkImpl* work);

  void Loop();
};

// Send (send=true) or recv on `st`'s group, arguments already checked
// (peer in range and != rank, data non-null when count > 0); see
// gloo_p2p.cc.
std::shared_ptr<Work> PostPointToPoint(const std::shared_ptr<State>& st, void* data, size_t count,
                                       DType dtype, int peer, uint32_t tag, bool send);

}  // namespace shardline::worker::gloo_internal

#endif  // SHARDLINE_WORKER_COMM_GLOO_STATE_H_

// ShmGroup: the collectives of one communicator group's ranks that share a
// host, through the group's shared memory segment (shm_segment.h), as NCCL's
// SHM transport does between GPUs of one node. The Gloo backend
// (gloo_backend.cc) runs a group whose ranks are all on one host entirely on
// it, and a group spread over hosts hierarchically (gloo_shm.cc: the ranks
// of each host combine here, one leader per host talks TCP to the others).
//
//   ShmGroup g(std::move(segment), options, names, on_loss);
//   g.Join();                                  // every local rank, once all mapped
//   absl::Status s = g.AllReduce(data, count, DType::kFloat32, ReduceOp::kSum, desc, ctx);
//
// Protocol. Every local rank passes the same sequence of sync points: at
// sync k a rank stores k in its RankControl::arrived (and wakes the peers
// sleeping on it), then waits until every other local rank's arrived is at
// least k. Data moves in steps; step s uses buffer s % 3 of every rank, and
// only its owner writes a buffer: write your own buffer, sync, read the
// others'. A step's reads are done before the rank arrives at the second
// sync after the step's first, and a rank writes buffer s % 3 again only at
// step s + 3, after passing at least two more syncs: so no write ever meets
// a peer still reading, with no wait beyond the syncs themselves, and the
// writes of a step overlap the reads of the one before. (Two buffers would
// do for algorithms that finish a step's reads before its next sync; the
// pipelined all_reduce reads a step's results one sync later.) The first
// sync of each collective also carries the rank's descriptor of the call
// (gloo_checks::CallDesc in RankControl::desc[k % 2]); every rank compares
// them before any data moves, so a mismatch fails every rank with the same
// FailedPrecondition message.
//
// Algorithms (B = the buffer size in bytes, n the local ranks, es the
// element size; counts in elements):
//   all_reduce up to kDirectBytes (two ranks: up to B): write the whole
//     input; sync; every rank reduces all n buffers itself (one sync).
//   all_reduce above: in chunks of B bytes, pipelined: write chunk s except
//     your own slice (1/n of it); sync; copy the other n - 1 reduced slices
//     of chunk s - 1 and reduce your slice of chunk s over the n buffers
//     into your output and your buffer (reduce-scatter + all-gather: each
//     rank reduces 1/n of the data; one sync per chunk, plus one).
//   reduce_scatter: per step, B/n bytes of every piece but your own; sync;
//     reduce your piece's chunk (one sync per step).
//   all_gather, broadcast: per step, B bytes of your piece (the root's
//     data); sync; copy.
// Reductions accumulate in fp32 (reduce_kernels.h), in rank order.
//
// Waiting: spin for a few microseconds when every local rank can have its
// own CPU, yield, then sleep on the peer's futex word in slices of at most
// 10 ms, checking each time whether the operation was aborted, its deadline
// passed, or the peer left the group (RankControl::state kGone: it aborted
// or failed) or its process exited (ProcessWatch: a SIGKILLed peer).
//
// Errors (every public method):
//   Aborted: Abort() was called (before or during the call).
//   DeadlineExceeded: a local rank did not arrive by the deadline ("<op> on
//     rank R did not finish within T: waiting for rank J (shared memory)").
//   Unavailable: a local rank left the group or its process exited ("<op>
//     on rank R: lost peer rank J<suffix>: <why>"); `on_loss` was called
//     with "lost peer rank J" first and gave <suffix> (the Gloo backend
//     records the loss in the group's store and closes its TCP connections,
//     as for a TCP peer), and this rank is marked gone so that its own
//     peers stop waiting for it.
//   FailedPrecondition: the descriptors differ (gloo_checks::CompareCollective).
// After an error the group is unusable.
//
// Thread-safety: one thread at a time runs the collectives (the backend's op
// thread, or a thread waiting for one; handed over under the backend's mutex);
// Abort() and MarkGone() may be called from any thread at any time.
#ifndef SHARDLINE_WORKER_COMM_SHM_GROUP_H_
#define SHARDLINE_WORKER_COMM_SHM_GROUP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/backend.h"
#include "worker/comm/gloo_checks.h"
#include "worker/comm/shm_segment.h"

namespace shardline::worker::shm {

// One collective as the group runs it: its name for messages and when it
// must be done by.
struct OpContext {
  const char* op = "";
  absl::Time deadline = absl::InfiniteFuture();
};

class ShmGroup {
 public:
  // Up to this many bytes an all_reduce of more than two ranks reads every
  // buffer directly (one sync); two ranks do so up to the buffer size.
  static constexpr size_t kDirectBytes = size_t{64} << 10;

  struct Options {
    int local_rank = 0;             // this rank's index among the local ranks
    std::vector<int> group_ranks;   // the group rank of each local rank, ascending
    int group_size = 1;             // ranks in the whole group (kAvg divides by it)
    absl::Duration timeout;         // for messages ("did not finish within")
    bool spin = true;               // spin briefly before sleeping
  };

  // `names` names group ranks in mismatch messages; `on_loss(what)` is
  // called once when this rank first finds a peer lost (see the file
  // comment) and returns the suffix for the message.
  ShmGroup(std::unique_ptr<Segment> segment, Options options, gloo_checks::GroupNames names,
           std::function<std::string(const std::string&)> on_loss);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Records this process in its RankControl and marks it alive. Before any
  // collective, on every local rank.
  void Join();
  // Starts watching the other local ranks' processes (their RankControls
  // must be filled in: call once every local rank has joined).
  void WatchPeers();

  int local_rank() const { return options_.local_rank; }
  int local_size() const { return static_cast<int>(options_.group_ranks.size()); }

  // --- Every rank of the group is local (local rank == group rank) ---
  // Shapes and buffers as in backend.h; `desc` is this rank's descriptor.
  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                         const gloo_checks::CallDesc& desc, const OpContext& ctx);
  absl::Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                             DType dtype, ReduceOp op, const gloo_checks::CallDesc& desc,
                             const OpContext& ctx);
  absl::Status AllGather(const void* in, size_t count, void* out, DType dtype,
                         const gloo_checks::CallDesc& desc, const OpContext& ctx);
  absl::Status Broadcast(void* data, size_t bytes, int root, const gloo_checks::CallDesc& desc,
                         const OpContext& ctx);
  // One sync with the descriptor check: a barrier, or the check before an
  // operation that moves its data another way.
  absl::Status Check(const gloo_checks::CallDesc& desc, const OpContext& ctx);

  // --- The local part of a group spread over hosts (no descriptor check:
  // the caller checked over TCP). Local rank 0 is the host's leader. ---
  // The leader gets acc[i] = op over the local ranks' in[i] in fp32 (kAvg
  // sums); `acc` is ignored elsewhere and may be `in` for fp32.
  absl::Status ReduceToLeader(const void* in, size_t count, DType dtype, ReduceOp op, float* acc,
                              const OpContext& ctx);
  // data[0..bytes) of local rank `root` to every local rank.
  absl::Status BroadcastLocal(void* data, size_t bytes, int root, const OpContext& ctx);
  // The leader copies local rank j's in[0..bytes) to dst[j] (j >= 1).
  absl::Status GatherToLeader(const void* in, size_t bytes, const std::vector<char*>& dst,
                              const OpContext& ctx);
  // Local rank j (j >= 1) gets the leader's src[j][0..bytes[j]) in `out`
  // (bytes known to every local rank; src only on the leader). The leader's
  // own piece is left to the caller.
  absl::Status ScatterFromLeader(const std::vector<const char*>& src,
                                 const std::vector<size_t>& bytes, void* out,
                                 const OpContext& ctx);

  // Fails the running and every later call with Aborted, marks this rank
  // gone (peers get Unavailable naming it) and wakes every waiter; returns
  // once the op thread no longer touches the caller's buffers (bounded: a
  // step's copy). Idempotent; any thread.
  void Abort();
  // Marks this rank gone and wakes its peers (after a loss found elsewhere,
  // e.g. over TCP). Any thread.
  void MarkGone();

 private:
  // Arrives at the next sync point (with `desc` when non-null, checked
  // against every local rank's) and waits for every local rank.
  absl::Status Sync(const gloo_checks::CallDesc* desc, const OpContext& ctx);
  absl::Status WaitFor(int local, uint32_t target, const OpContext& ctx);
  absl::Status Lost(int local, const std::string& why, const OpContext& ctx);
  absl::Status Aborted(const OpContext& ctx) const;

  // This step's buffers (`ahead` steps on).
  char* Mine(uint64_t ahead = 0) const {
    return segment_->buffer(options_.local_rank, static_cast<int>((step_ + ahead) % kBuffers));
  }
  char* Theirs(int local, uint64_t ahead = 0) const {
    return segment_->buffer(local, static_cast<int>((step_ + ahead) % kBuffers));
  }
  RankControl* Me() const { return segment_->control(options_.local_rank); }
  int GroupRank(int local) const { return options_.group_ranks[local]; }

  absl::Status AllReduceDirect(void* data, size_t count, DType dtype, ReduceOp op,
                               const gloo_checks::CallDesc& desc, const OpContext& ctx);
  absl::Status AllReduceChunked(void* data, size_t count, DType dtype, ReduceOp op,
                                const gloo_checks::CallDesc& desc, const OpContext& ctx);

  // Set by the op thread while it may touch caller buffers or the segment
  // (RAII below); Abort waits for it to clear.
  class Active;

  const std::unique_ptr<Segment> segment_;
  const Options options_;
  const gloo_checks::GroupNames names_;
  const std::function<std::string(const std::string&)> on_loss_;
  std::vector<ProcessWatch> watches_;  // by local rank; op thread only after WatchPeers
  uint32_t syncs_ = 0;                 // sync points passed (op thread only)
  uint64_t step_ = 0;                  // data steps done (op thread only)
  std::atomic<bool> aborted_{false};
  std::atomic<bool> active_{false};
  std::atomic<bool> lost_{false};  // on_loss_ was called
};

}  // namespace shardline::worker::shm

#endif  // SHARDLINE_WORKER_COMM_SHM_GROUP_H_

// Backend: one communicator group's collectives (c10d-style seam), and Work,
// the handle of one enqueued operation.
//
//   auto backend = CreateGlooBackend(PrefixStore(store, "gen3/dp0/"), rank, size, {});
//   std::shared_ptr<Work> w = (*backend)->AllReduce(grads, n, DType::kFloat32, ReduceOp::kAvg);
//   absl::Status s = w->Wait(absl::Minutes(1));
//
// Conventions for every collective:
//   * Every count is in ELEMENTS of the given DType, never bytes.
//   * Calls return when the operation is enqueued. Collectives run one at a
//     time in issue order on a thread owned by the backend (or on a thread
//     that waits for them: see Work::Wait); every rank must
//     issue the same collectives in the same order. Send and Recv are posted
//     at once instead, outside that order (like torch's isend/irecv), so a
//     rank may post a send and a receive to the same peer and wait for them
//     in either order without deadlock. Buffers must stay valid and
//     untouched until the Work completes.
//   * 16-bit types (fp16, bf16) are reduced by accumulating in fp32 and rounding
//     back to the 16-bit type with round-to-nearest-even.
//   * A count of 0 is valid everywhere (the op still synchronises the group).
//
// Errors, reported through Work::Wait (never by exceptions):
//   InvalidArgument: arguments wrong in themselves; the message names the field
//     (e.g. "counts.size()=3 != size=4", "root=5 out of range [0,4)",
//     "peer=2 == rank"). Detected locally, before any communication.
//   DeadlineExceeded: the operation did not finish within GlooOptions::timeout.
//   Unavailable: a peer was lost (connection closed/reset, process died; in
//     shared memory: its process exited, or it aborted, was destroyed or
//     failed); the message names it ("lost peer rank 3"). The rank that
//     notices a loss records it in the group's store, closes its own
//     connections and marks itself gone in shared memory, so ranks not
//     talking to the lost peer also fail at once instead of at their op
//     timeout; they name the rank they lost and add the group's first
//     failure ("(first failure in this group: rank 2 lost peer rank 3)").
//     Rebuild the group (under a new store prefix).
//   Aborted: Abort() was called before or during the operation.
//   FailedPrecondition: the ranks disagree on the call, detected before any
//     data moves, on every rank involved, with the same message there:
//     * Collectives (Gloo): before each one the ranks exchange a fixed-size
//       descriptor of it (operation, sequence number, count, dtype, reduce
//       op, root, a hash of reduce_scatter's counts) and compare; a
//       different operation, count, dtype, reduce op, root or counts vector
//       at the same sequence number fails every rank of the group: e.g.
//       "collective #12 of group dp/0 differs between ranks: rank 3 (dp/0
//       rank 0) issued all_reduce count=10 float32 sum, rank 5 (dp/0 rank 1)
//       issued all_reduce count=20 float32 sum" (rank 0 and the first rank
//       that differs from it; "rank 1" alone without GlooOptions::
//       global_ranks). Cost: one small allgather before a collective, which
//       also carries the descriptors of up to 7 collectives queued behind it
//       (those then skip it): about one more small-message latency for a
//       collective issued alone, little for ones issued back to back; none
//       in shared memory, where the descriptor travels with the first sync
//       of the call. all_to_all also compares its splits ("split mismatch
//       between rank 0 and rank 2").
//     * Send / recv (Gloo): the sender and the receiver exchange
//       descriptors (count, dtype, tag) before the payload; a different
//       count or dtype fails both: "send/recv with tag 7 of group dp/0
//       differs between ranks: rank 3 (dp/0 rank 0) issued send count=10
//       float32 to rank 5 (dp/0 rank 1), rank 5 (dp/0 rank 1) issued recv
//       count=20 float32 from rank 3 (dp/0 rank 0)"; the receiver's buffer is
//       untouched. Cost: about one more round trip per message.
//     A rank that never issues the matching call is not a mismatch: its
//     peers fail with DeadlineExceeded at the op timeout (Progress() shows
//     them waiting). The NCCL backend does not check.
//   After any error other than InvalidArgument the group is unusable: later
//   operations fail with the same error class; build a new backend.
//
// Thread-safety: all methods may be called from any thread; operations are
// serialised in call order.
#ifndef SHARDLINE_WORKER_COMM_BACKEND_H_
#define SHARDLINE_WORKER_COMM_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/store.h"
#include "worker/comm/types.h"

namespace shardline::worker {

// DType, ElementSize and ReduceOp are in worker/comm/types.h.
const char* DTypeName(DType dtype);
const char* ReduceOpName(ReduceOp op);

// Where one group's operations are, for the rank's progress reports
// (progress.proto CollectiveProgress; worker/communicators.h turns it into
// one).
struct OpProgress {
  // "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
  // "broadcast", "barrier", "send", "recv"; empty when none was issued yet.
  std::string operation;
  // Ordered collectives are numbered from 1 in issue order, the same on
  // every rank of the group (the conventions below); send / recv have their
  // own count. The running one when in_flight, else the latest completed.
  uint64_t sequence = 0;
  // Elements (of dtype): per rank for all_gather and broadcast, the whole
  // input for reduce_scatter and all_to_all, the buffer otherwise.
  size_t count = 0;
  DType dtype = DType::kFloat32;
  // Issued and not completed yet. One that failed and broke the
  // communicator (a timeout, a lost peer, a mismatch) never completes: it
  // stays in flight, elapsed growing, until the backend is destroyed; one
  // refused for bad arguments (InvalidArgument) is done.
  bool in_flight = false;
  // in_flight: running for this long so far (from when it started to run,
  // not when it was queued). Else: how long it took.
  absl::Duration elapsed;
  // send / recv: the peer's rank in the group; -1 otherwise.
  int peer = -1;
};

struct BackendProgress {
  // The ordered collective running now, else the latest completed one.
  OpProgress collective;
  // The oldest send / recv still in flight, when there is one.
  std::optional<OpProgress> p2p;
};

// How one rank of a group reaches the others (Backend::Transport).
struct TransportInfo {
  // Distinct hosts among the group's ranks (GlooOptions::host); 0: unknown.
  int hosts = 0;
  // Ranks of the group on this rank's host, this one included.
  int local_ranks = 0;
  // True when those local ranks (at least 2) exchange through a POSIX
  // shared memory segment; the other hosts are reached over TCP.
  bool shared_memory = false;
  // Why local ranks do not use shared memory although they share a host
  // (GlooOptions::shared_memory off, or the segment could not be made or
  // mapped: names the cause); empty otherwise.
  std::string note;
};

// The handle of one enqueued operation. Thread-safe.
// A CUDA stream of this process (a cudaStream_t), opaque here: the trainer's
// compute stream (worker/gpu/gpu_compute_device.h) handed to a backend whose
// operations run on streams of their own (NCCL), so the two are ordered on
// the device with events and neither host thread waits. Never null.
struct DeviceStream {
  void* handle = nullptr;
};

class Work {
 public:
  virtual ~Work() = default;

  // Stream ordering (backends with stream_ordered(); the others return
  // Unimplemented): work enqueued on `stream` from now on starts on the
  // device only after this operation has finished; returns at once. The
  // operation's errors still come from IsCompleted / Wait, which the caller
  // must call before trusting anything `stream` computed from its result:
  // an operation that fails or passes its deadline is aborted (by the
  // backend itself even when nobody polls it), and `stream` then goes on
  // with whatever the buffer holds. Errors: Unimplemented; Unavailable (a
  // CUDA error, named); the operation's own error where it already has one.
  virtual absl::Status OrderBefore(DeviceStream /*stream*/) {
    return absl::UnimplementedError(
        "this backend does not order its operations on device streams; check "
        "stream_ordered() and order on the host instead");
  }

  // True once the operation has finished (successfully or not). Never blocks.
  virtual bool IsCompleted() = 0;

  // Blocks until the operation finishes or `timeout` passes, and returns the
  // operation's status. If `timeout` passes first, returns DeadlineExceeded
  // without cancelling the operation (it is still bounded by
  // GlooOptions::timeout). Errors: see the file comment.
  // Gloo, every rank on one host (shared memory): with no timeout, the
  // calling thread may run the operation itself, with those queued before
  // it, when the backend's thread has not started them (same order, same
  // results; it saves handing each call to that thread and back, most of a
  // small collective's latency); Abort still ends it at once.
  virtual absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) = 0;
};

// One communicator group: `size()` ranks, this one being `rank()`.
// Lifecycle: created connected (by a factory such as CreateGlooBackend) ->
// runs operations -> Abort() or destruction. Destruction aborts pending work.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Whether this backend's buffers are device memory (NCCL: pointers on its
  // rank's GPU, nccl_backend.h) rather than host memory (Gloo). The trainer
  // keeps its state where its backends can read it (worker/train/trainer.h).
  virtual bool device_memory() const { return false; }

  // Whether OrderAfter and Work::OrderBefore order this backend's operations
  // against a DeviceStream (NCCL: yes; Gloo: no).
  virtual bool stream_ordered() const { return false; }
  // Operations issued from now on start on the device only after everything
  // already enqueued on `stream` (every stream of the group, p2p channels
  // included); the host does not wait. Not thread-safe against this
  // backend's other calls from another thread: issue from one thread.
  // Errors: Unimplemented (not stream_ordered()); the group's error once it
  // has failed or was aborted; Unavailable (a CUDA error, named).
  virtual absl::Status OrderAfter(DeviceStream /*stream*/) {
    return absl::UnimplementedError(
        "this backend does not order its operations on device streams; check "
        "stream_ordered() and order on the host instead");
  }

  // Where this group's operations are now (see OpProgress). Cheap (a lock
  // and a copy; NCCL also polls the events of the operations it has not
  // seen finish, oldest first, up to the first one still running): the
  // heartbeat thread calls it. Thread-safe. Operations rejected with
  // InvalidArgument are not issued and not counted. NCCL: an operation is
  // taken to start running when it was enqueued or when the one before it
  // finished, whichever is later (they run in stream order). The default
  // knows nothing (operation empty).
  virtual BackendProgress Progress() const { return {}; }

  // In place: data[0..count) on every rank becomes op over all ranks.
  virtual std::shared_ptr<Work> AllReduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;

  // out[r*count .. (r+1)*count) receives rank r's in[0..count); out holds
  // size()*count elements. `in` may alias out + rank()*count (in-place).
  virtual std::shared_ptr<Work> AllGather(const void* in, size_t count, void* out, DType dtype) = 0;

  // `in` holds sum(counts) elements laid out as size() consecutive pieces,
  // piece r of counts[r] elements; out[0..counts[rank()]) receives op over all
  // ranks of piece rank(). counts.size() must equal size() and be the same on
  // every rank (counts may be uneven and may be 0). InvalidArgument names
  // "counts" when its size is wrong.
  virtual std::shared_ptr<Work> ReduceScatter(const void* in, void* out,
                                              const std::vector<size_t>& counts, DType dtype,
                                              ReduceOp op) = 0;

  // `in` holds size() consecutive pieces; piece p of send_counts[p] elements
  // goes to rank p. `out` receives size() consecutive pieces; piece p of
  // recv_counts[p] elements comes from rank p. Pieces may be 0. Must hold:
  // my send_counts[p] == rank p's recv_counts[rank()]; a mismatch fails
  // (FailedPrecondition naming the pair, or at worst within the op timeout)
  // and never hangs. `in` and `out` must not overlap.
  virtual std::shared_ptr<Work> AllToAll(const void* in, const std::vector<size_t>& send_counts,
                                         void* out, const std::vector<size_t>& recv_counts,
                                         DType dtype) = 0;

  // data[0..count) on every rank becomes root's. InvalidArgument names "root".
  virtual std::shared_ptr<Work> Broadcast(void* data, size_t count, DType dtype, int root) = 0;

  // Point-to-point, posted when called (see the file comment). Matched by
  // (peer, tag) in posting order; count must equal on both sides. Use a
  // distinct tag for each message in flight between one pair, or post them
  // in the same order on both sides.
  // InvalidArgument names "peer" when it is out of range or equals rank().
  virtual std::shared_ptr<Work> Send(const void* data, size_t count, DType dtype, int peer,
                                     uint32_t tag) = 0;
  virtual std::shared_ptr<Work> Recv(void* data, size_t count, DType dtype, int peer,
                                     uint32_t tag) = 0;

  // Completes once every rank has entered the barrier.
  virtual std::shared_ptr<Work> Barrier() = 0;

  // How this rank reaches the others (fixed when the backend is created).
  // The default knows nothing (hosts 0).
  virtual TransportInfo Transport() const { return {}; }

  // Tears the group down: closes connections and marks this rank gone in
  // shared memory so peers see it as lost (they get Unavailable naming this
  // rank), completes the running and queued operations with Aborted, and
  // returns in bounded time (milliseconds; it never waits for a peer) even
  // if a peer is dead or silent. Later operations fail with Aborted.
  // Idempotent. Once it returns no more data lands in the aborted
  // operation's buffers: an operation in shared memory has left them (Abort
  // waits for that, one chunk's copy at most); over TCP the sockets are
  // closed, though its thread may stay blocked inside Gloo until
  // GlooOptions::timeout, holding only its own scratch memory.
  virtual void Abort() = 0;
};

struct GlooOptions {
  // IP address of the local interface to bind and advertise (IPv4 dotted quad).
  std::string interface_address = "127.0.0.1";
  // Deadline for each collective, from when it starts running.
  absl::Duration timeout = absl::Minutes(5);
  // Deadline for bootstrapping: exchanging addresses through the store and
  // connecting every pair.
  absl::Duration connect_timeout = absl::Minutes(5);
  // For error messages only: the group's name (e.g. "dp/0") and, by group
  // rank, each member's global rank, so a mismatch names "rank 3 (dp/0 rank
  // 1)" rather than "rank 1". Either may be left empty; global_ranks, when
  // given, has one entry per rank (else InvalidArgument naming it).
  std::string group_name;
  std::vector<int> global_ranks;

  // Ranks on one host (equal `host`) exchange through POSIX shared memory
  // (see "Shared memory" below) unless this is kOff. The same on every rank.
  enum class SharedMemory { kAuto, kOff };
  SharedMemory shared_memory = SharedMemory::kAuto;
  // Which ranks share a host. Empty (the default): this machine as the
  // kernel sees it (its boot, its /dev/shm, this process's pid namespace:
  // processes that can share a segment and see each other's pids; and its
  // network namespace, since one of its own simulates another host, as
  // deploy/netns does). Non-empty: ranks with the same name count as one
  // host (tests simulate hosts with it; ranks named alike on different
  // machines fall back to TCP). At most 255 bytes.
  std::string host;
  // Bytes of each of a rank's three staging buffers in the segment (a
  // segment holds 3 x local ranks x this, plus 4 KiB per 16 ranks and a
  // 4 KiB header; all of it reserved in /dev/shm up front). Large buffers
  // move through them in chunks of this size. 0 (the default): 1 MiB / the
  // local ranks, between 64 KiB and 1 MiB (what the ranks' chunks leave of
  // the CPU caches, measured on 2 cores; a segment of about 3 MiB), else a
  // multiple of 4096 in [4096, 268435456]. The host's lowest rank decides
  // for its host.
  size_t shm_buffer_bytes = 0;
};

// Creates a connected Gloo (CPU) backend. Blocks until every one of
// `size` ranks has called it with the same `store` namespace, or
// connect_timeout passes. Keys are written under `store` as given; scope
// groups with PrefixStore.
//
// Shared memory. Ranks on the same host (GlooOptions::host) exchange their
// collectives through one POSIX shared memory segment per host per group,
// ranks on different hosts over TCP, as NCCL's SHM and socket transports
// do:
//   * every rank on this host: all_reduce, all_gather, reduce_scatter,
//     broadcast and barrier run in the segment (worker/comm/shm_group.h:
//     staging buffers of shm_buffer_bytes, sequence-numbered flags with
//     futex waits, fp32 accumulation in vectorised loops, large buffers in
//     chunks); all_to_all, send and recv stay on TCP.
//   * ranks on several hosts, some sharing one: each host's ranks combine in
//     their segment and its lowest rank (the host's leader) runs the TCP
//     part with the other hosts' leaders (e.g. all_reduce: reduce to the
//     leader, all_reduce among leaders, broadcast from the leader).
// Bootstrap through the store: every rank publishes its host; one segment
// per host is created by its lowest rank under a fresh random name
// ("/shardline-<pid namespace>-<pid>-<start time>-<group>-<nonce>") and
// unlinked as soon as every rank of that host has mapped it, so no name
// outlives the bootstrap; a segment left by a creator that died during it
// (SIGKILL) is removed by the next one created on that host. When a host's
// segment cannot be made or mapped (e.g. /dev/shm full: the space is
// reserved up front, never a SIGBUS later), that host's ranks use TCP
// (Transport().note says why).
// Failure semantics are the TCP path's (see "Errors" above): a peer whose
// process exits (even SIGKILLed: a pidfd reports it at once), or that
// aborts or is destroyed, fails its local peers' waits within ~10 ms with
// Unavailable "lost peer rank N", and the loss propagates to the other
// hosts as a closed connection does; mismatched calls fail every rank with
// the same FailedPrecondition before any data moves (the descriptors travel
// in the segment); a waiting op notices Abort at once; a rank that does not
// arrive is DeadlineExceeded at the op timeout, naming whom it waits for.
//
// Possible errors:
//   InvalidArgument: size < 1, rank outside [0,size), bad interface_address,
//     non-positive timeouts, host over 255 bytes, shm_buffer_bytes out of
//     range (message names the field).
//   DeadlineExceeded: some rank did not arrive within connect_timeout.
//   Unavailable: connecting to a peer failed (names the peer rank).
//   Aborted: the store's generation ended.
absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(std::shared_ptr<Store> store, int rank,
                                                           int size, GlooOptions options);

// How many op threads of destroyed Gloo backends are still inside a Gloo
// operation. Abort closes the sockets, so no more data reaches the
// operation's buffers, but Gloo does not wake an operation waiting for data:
// it fails at its GlooOptions::timeout. Destroying the backend does not wait
// for it (that held up every re-formation after a node loss); the thread
// keeps the group's Gloo context until then. Process-wide; thread-safe.
int64_t GlooStalledOpThreads();

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_COMM_BACKEND_H_

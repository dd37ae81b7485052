// libshardline_gpu_fake.so: a stand-in for the GPU plugin with no CUDA, so
// the worker side of the NCCL backend (bootstrap through the store, Work
// polling, op timeout, asynchronous errors, abort) and, in loopback mode,
// everything that communicates through it (the trainer's NCCL path) are
// tested on machines without a GPU. "Device" memory is host memory.
//
// Two modes:
//   * Steered (the default): communicators of any size exist only locally,
//     and every collective leaves the buffers as they are and finishes, hangs
//     or fails as shardline_fake_set_mode says.
//   * Loopback (shardline_fake_set_loopback(devices), or the environment
//     variable SHARDLINE_FAKE_LOOPBACK_DEVICES=devices read at the first
//     call): `devices` fake devices, and the communicators of the ranks of
//     one process that share a unique id really form a group, as NCCL's do
//     across processes: comm_init waits for every rank (bounded by its
//     timeout) and refuses two ranks on one device; each communicator has a
//     stream, a thread that runs its operations one at a time in issue
//     order, so a call returns at once and its event fires when the
//     operation is done. Collectives match by their place in each rank's
//     stream (the k-th collective of every rank together) and really reduce,
//     gather, scatter and broadcast through host memory; send and recv match
//     per (sender, receiver) pair in issue order and tags play no part (NCCL
//     has none). A send of at most rendezvous_bytes (default 4 MiB, NCCL's
//     default NCCL_BUFFSIZE; shardline_fake_set_rendezvous_bytes) finishes
//     once copied, as a send that fits NCCL's buffers can; a larger one
//     blocks its stream until the receive has taken the data, so two ranks
//     that each queue a large send before the recv of the other's message
//     deadlock here as they can on GPUs. This is a model of NCCL's
//     behaviour, not its exact rule. Reductions accumulate in
//     fp32 in rank order and round once to the element type (NCCL's 16-bit
//     reductions round at every step of its ring; our tests use values that
//     are exact either way). Each operation's start is logged
//     (shardline_fake_stream_log) so tests can check the order of a rank's
//     stream. shardline_fake_set_op_delay (or SHARDLINE_FAKE_OP_DELAY_US)
//     makes every operation wait that long on its stream before it runs, as
//     a slow network would, so that a caller that uses a result before it
//     is ordered after the operation reads stale data.
//     Stream ordering (comm_order_after_stream, stream_wait_event): the
//     other stream is taken to be an emulated CUDA stream that has run its
//     work by the time it was enqueued (worker/gpu/testing/cuda_emu), so
//     comm_order_after_stream has nothing to wait for, and stream_wait_event
//     blocks the calling thread until the event fires (or its communicator
//     is aborted). Both are counted (shardline_fake_stream_calls).
//     Failures: when a communicator is aborted or destroyed (what a dead
//     process's peers see) or fails, a peer waiting for it in a collective
//     or a send/recv fails with an asynchronous error naming that rank
//     (comm_status: UNAVAILABLE). Unlike NCCL, which hangs or corrupts
//     memory, ranks that issue different collectives at the same place, a
//     recv whose size differs from its send, or all_to_all counts that do
//     not pair up fail the same way with a message naming both sides.
//
// A test dlopen()s the same path the backend loads (so both see one copy of
// the state below) and steers it through the shardline_fake_* functions.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/float16.h"
#include "worker/gpu/plugin_abi.h"

// What the next operations do (shardline_fake_set_mode; steered mode only).
#define SHARDLINE_FAKE_COMPLETE 0     // finish at once
#define SHARDLINE_FAKE_HANG 1         // never finish (a silent peer) until aborted
#define SHARDLINE_FAKE_ASYNC_ERROR 2  // never finish; the communicator reports an error
#define SHARDLINE_FAKE_INIT_HANG 3    // comm_init waits out its deadline

namespace {

constexpr int kMaxLoopbackDevices = SHARDLINE_GPU_MAX_DEVICES;

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSend, kRecv, kBarrier };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kAllGather: return "all_gather";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kSend: return "send";
    case Kind::kRecv: return "recv";
    case Kind::kBarrier: return "barrier";
  }
  return "?";
}

const char* DTypeName(int32_t dtype) {
  switch (dtype) {
    case SHARDLINE_GPU_FLOAT32: return "float32";
    case SHARDLINE_GPU_FLOAT16: return "float16";
    case SHARDLINE_GPU_BFLOAT16: return "bfloat16";
  }
  return "?";
}

size_t ElementBytes(int32_t dtype) { return dtype == SHARDLINE_GPU_FLOAT32 ? 4 : 2; }

// One enqueued operation (loopback). Pointers are the caller's "device"
// (host) memory; `fired` is shared with the event handed back.
struct Op {
  Kind kind = Kind::kBarrier;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;                  // elements (per rank for all_gather)
  std::vector<size_t> counts;        // reduce_scatter pieces / all_to_all send counts
  std::vector<size_t> recv_counts;   // all_to_all
  int32_t dtype = SHARDLINE_GPU_FLOAT32;
  int32_t reduce = SHARDLINE_GPU_SUM;
  int peer = -1;                     // send/recv peer, broadcast root
  std::shared_ptr<std::atomic<bool>> fired;
};

std::string Describe(const Op& op) {
  std::string s = absl::StrCat(KindName(op.kind));
  switch (op.kind) {
    case Kind::kBarrier: return s;
    case Kind::kReduceScatter:
    case Kind::kAllToAll: absl::StrAppend(&s, " counts=[", absl::StrJoin(op.counts, ","), "]"); break;
    default: absl::StrAppend(&s, " count=", op.count); break;
  }
  absl::StrAppend(&s, " ", DTypeName(op.dtype));
  if (op.kind == Kind::kSend || op.kind == Kind::kRecv) absl::StrAppend(&s, " peer=", op.peer);
  if (op.kind == Kind::kBroadcast) absl::StrAppend(&s, " root=", op.peer);
  return s;
}

// A collective in flight: the operation of each rank that has reached it.
struct Slot {
  std::vector<const Op*> ops;
  int arrived = 0, departed = 0;
  bool done = false;
};

// A send not yet received: the sender's buffer while the sender waits
// (rendezvous), or a copy of its data (eager).
struct Message {
  size_t count = 0;
  int32_t dtype = SHARDLINE_GPU_FLOAT32;
  const void* data = nullptr;  // the sender's buffer, or copy.data()
  std::vector<char> copy;
  bool eager = false;  // data is the copy; the sender does not wait
  bool taken = false;
  std::string error;  // set by the receiver when the sizes differ
};

// The ranks of one unique id (loopback).
struct Group {
  Group(int n, int label_) : nranks(n), label(label_), devices(n, -1), lost(n, false), lost_reason(n) {}
  const int nranks;
  const int label;  // creation order, for the stream log
  absl::Mutex mu;
  absl::CondVar cv;
  std::vector<int> devices ABSL_GUARDED_BY(mu);  // -1 until that rank joined
  int joined ABSL_GUARDED_BY(mu) = 0;
  std::vector<bool> lost ABSL_GUARDED_BY(mu);     // aborted, destroyed or failed
  std::vector<std::string> lost_reason ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Slot> slots ABSL_GUARDED_BY(mu);  // by place in the ranks' streams
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> channels ABSL_GUARDED_BY(mu);  // (from, to)
  std::string mismatch ABSL_GUARDED_BY(mu);       // first inconsistent collective
};

}  // namespace

struct ShardlineNcclComm {
  int nranks = 0;
  int rank = 0;
  std::atomic<bool> aborted{false};
  std::atomic<bool> failed{false};
  // Loopback only (null group in steered mode).
  std::shared_ptr<Group> group;
  absl::Mutex qmu;
  absl::CondVar qcv;
  std::deque<Op> queue ABSL_GUARDED_BY(qmu);
  bool stop ABSL_GUARDED_BY(qmu) = false;
  std::string failure ABSL_GUARDED_BY(qmu);
  uint64_t collectives = 0;  // the stream thread's count of collectives run
  std::thread stream;
};

struct ShardlineGpuEvent {
  ShardlineNcclComm* comm;  // outlives the event (the worker keeps it alive)
  bool done;                // steered mode: finished at issue
  std::shared_ptr<std::atomic<bool>> fired;  // loopback: set by the stream
};

namespace {

ABSL_CONST_INIT absl::Mutex mu(absl::kConstInit);
int mode ABSL_GUARDED_BY(mu) = SHARDLINE_FAKE_COMPLETE;
int aborts ABSL_GUARDED_BY(mu) = 0;
std::vector<std::string> init_ids ABSL_GUARDED_BY(mu);  // one per comm_init, in call order
int loopback_devices ABSL_GUARDED_BY(mu) = -1;          // -1: environment not read yet
std::map<std::string, std::weak_ptr<Group>> groups ABSL_GUARDED_BY(mu);  // by unique id
int next_group_label ABSL_GUARDED_BY(mu) = 0;
size_t rendezvous_bytes ABSL_GUARDED_BY(mu) = size_t{4} << 20;
std::vector<std::string> stream_log ABSL_GUARDED_BY(mu);
constexpr size_t kMaxStreamLog = 1 << 20;  // lines kept; older ones are dropped
int64_t op_delay_us ABSL_GUARDED_BY(mu) = -1;  // -1: environment not read yet
std::atomic<int64_t> stream_orders{0};  // comm_order_after_stream calls
std::atomic<int64_t> stream_waits{0};   // stream_wait_event calls

absl::Duration OpDelay() {
  absl::MutexLock lock(&mu);
  if (op_delay_us < 0) {
    const char* env = std::getenv("SHARDLINE_FAKE_OP_DELAY_US");
    op_delay_us = std::clamp<int64_t>(env != nullptr ? std::atoll(env) : 0, 0, 10'000'000);
  }
  return absl::Microseconds(op_delay_us);
}

int Mode() {
  absl::MutexLock lock(&mu);
  return mode;
}

int LoopbackDevicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  if (loopback_devices < 0) {
    const char* env = std::getenv("SHARDLINE_FAKE_LOOPBACK_DEVICES");
    const int n = env != nullptr ? std::atoi(env) : 0;
    loopback_devices = std::clamp(n, 0, kMaxLoopbackDevices);
  }
  return loopback_devices;
}

int LoopbackDevices() {
  absl::MutexLock lock(&mu);
  return LoopbackDevicesLocked();
}

int Fail(int code, char* error, size_t error_len, const std::string& text) {
  if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", text.c_str());
  return code;
}

int DeviceCount(int32_t* count, char*, size_t) {
  *count = std::max(1, LoopbackDevices());
  return SHARDLINE_GPU_OK;
}

int GetUniqueId(uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], char*, size_t) {
  static std::atomic<uint64_t> next{1};
  const uint64_t n = next++;  // unique for the life of the process
  std::memset(id, 0, SHARDLINE_NCCL_UNIQUE_ID_BYTES);
  std::memcpy(id, &n, sizeof(n));
  return SHARDLINE_GPU_OK;
}

// --- Loopback: failures --------------------------------------------------

// Marks `c`'s rank as gone from its group and wakes everyone waiting there.
void MarkLost(ShardlineNcclComm* c, const std::string& reason) {
  Group& g = *c->group;
  absl::MutexLock lock(&g.mu);
  if (!g.lost[c->rank]) {
    g.lost[c->rank] = true;
    g.lost_reason[c->rank] = reason;
  }
  g.cv.SignalAll();
}

// The asynchronous error of `c` (what comm_status reports from now on).
void FailComm(ShardlineNcclComm* c, const std::string& error) {
  {
    absl::MutexLock lock(&c->qmu);
    if (c->failure.empty()) c->failure = error;
  }
  c->failed = true;
  MarkLost(c, absl::StrCat("it failed: ", error));
}

std::string LostText(const Group& g, int rank, const Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu) {
  return absl::StrCat("NCCL asynchronous error: rank ", rank, " of this ", g.nranks,
                      "-rank communicator is gone (", g.lost_reason[rank], ") while ",
                      Describe(op), " waited for it (fake loopback)");
}

// --- Loopback: the math ----------------------------------------------------

float Load(const void* p, int32_t dtype, size_t i) {
  switch (dtype) {
    case SHARDLINE_GPU_FLOAT16: return shardline::worker::HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case SHARDLINE_GPU_BFLOAT16: return shardline::worker::BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void Store(void* p, int32_t dtype, size_t i, float v) {
  switch (dtype) {
    case SHARDLINE_GPU_FLOAT16: static_cast<uint16_t*>(p)[i] = shardline::worker::FloatToHalf(v); break;
    case SHARDLINE_GPU_BFLOAT16: static_cast<uint16_t*>(p)[i] = shardline::worker::FloatToBFloat16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// The reduction over every rank's `in + offset` of `count` elements, in fp32
// and rank order, into `out` (fp32).
void Reduce(const std::vector<const Op*>& ops, const std::vector<const void*>& ins, size_t offset,
            size_t count, std::vector<float>* out) {
  const Op& op = *ops[0];
  const int n = static_cast<int>(ops.size());
  out->assign(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    float acc = Load(ins[0], op.dtype, offset + i);
    for (int q = 1; q < n; ++q) {
      const float v = Load(ins[q], op.dtype, offset + i);
      switch (op.reduce) {
        case SHARDLINE_GPU_MAX: acc = std::max(acc, v); break;
        case SHARDLINE_GPU_MIN: acc = std::min(acc, v); break;
        default: acc += v; break;
      }
    }
    if (op.reduce == SHARDLINE_GPU_AVG) acc /= static_cast<float>(n);
    (*out)[i] = acc;
  }
}

// Every rank's operation is in `ops` and they agree: do it.
void Compute(const std::vector<const Op*>& ops) {
  const Op& op0 = *ops[0];
  const int n = static_cast<int>(ops.size());
  const size_t e = ElementBytes(op0.dtype);
  std::vector<float> tmp;
  switch (op0.kind) {
    case Kind::kAllReduce: {
      std::vector<const void*> ins(n);
      for (int q = 0; q < n; ++q) ins[q] = ops[q]->out;  // in place
      Reduce(ops, ins, 0, op0.count, &tmp);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < op0.count; ++i) Store(ops[q]->out, op0.dtype, i, tmp[i]);
      break;
    }
    case Kind::kAllGather:
      // Rank p's input may be its own out + p * count; no other rank's piece
      // p is anyone's input, so the copies never overwrite a source.
      for (int q = 0; q < n; ++q) {
        for (int p = 0; p < n; ++p) {
          char* dst = static_cast<char*>(ops[q]->out) + p * op0.count * e;
          if (dst != ops[p]->in && op0.count > 0) std::memmove(dst, ops[p]->in, op0.count * e);
        }
      }
      break;
    case Kind::kReduceScatter: {
      std::vector<const void*> ins(n);
      for (int q = 0; q < n; ++q) ins[q] = ops[q]->in;
      std::vector<std::vector<float>> results(n);  // all first: out may alias in
      size_t offset = 0;
      for (int p = 0; p < n; ++p) {
        Reduce(ops, ins, offset, op0.counts[p], &results[p]);
        offset += op0.counts[p];
      }
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < op0.counts[p]; ++i) Store(ops[p]->out, op0.dtype, i, results[p][i]);
      break;
    }
    case Kind::kAllToAll:
      for (int d = 0; d < n; ++d) {
        size_t recv_offset = 0;
        for (int s = 0; s < n; ++s) {
          size_t send_offset = 0;
          for (int k = 0; k < d; ++k) send_offset += ops[s]->counts[k];
          const size_t c = ops[d]->recv_counts[s];
          if (c > 0) {
            std::memcpy(static_cast<char*>(ops[d]->out) + recv_offset * e,
                        static_cast<const char*>(ops[s]->in) + send_offset * e, c * e);
          }
          recv_offset += c;
        }
      }
      break;
    case Kind::kBroadcast: {
      const int root = op0.peer;
      const std::vector<char> data(static_cast<const char*>(ops[root]->out),
                                   static_cast<const char*>(ops[root]->out) + op0.count * e);
      for (int q = 0; q < n; ++q)
        if (q != root && op0.count > 0) std::memcpy(ops[q]->out, data.data(), data.size());
      break;
    }
    default:
      break;  // barrier
  }
}

// Why two ranks' operations at the same place of their streams do not form
// one collective ("" when they do).
std::string Disagreement(const Op& a, int rank_a, const Op& b, int rank_b) {
  bool same = a.kind == b.kind && a.dtype == b.dtype;
  if (same) {
    switch (a.kind) {
      case Kind::kAllReduce: same = a.count == b.count && a.reduce == b.reduce; break;
      case Kind::kAllGather: same = a.count == b.count; break;
      case Kind::kBroadcast: same = a.count == b.count && a.peer == b.peer; break;
      case Kind::kReduceScatter: same = a.counts == b.counts && a.reduce == b.reduce; break;
      case Kind::kAllToAll:
        same = a.counts[rank_b] == b.recv_counts[rank_a] && b.counts[rank_a] == a.recv_counts[rank_b];
        break;
      default: break;
    }
  }
  if (same) return "";
  return absl::StrCat("collective mismatch: rank ", rank_a, " issued ", Describe(a), " where rank ",
                      rank_b, " issued ", Describe(b),
                      " (NCCL would hang or corrupt memory) (fake loopback)");
}

// Runs a collective on `c`'s stream. False (with *error, unless `c` was
// aborted) when it cannot finish.
bool Collective(ShardlineNcclComm* c, const Op& op, std::string* error) {
  Group& g = *c->group;
  const uint64_t place = c->collectives++;
  absl::MutexLock lock(&g.mu);
  Slot& slot = g.slots[place];
  if (slot.ops.empty()) slot.ops.assign(g.nranks, nullptr);
  slot.ops[c->rank] = &op;
  ++slot.arrived;
  if (g.mismatch.empty()) {
    for (int q = 0; q < g.nranks; ++q) {
      if (q == c->rank || slot.ops[q] == nullptr) continue;
      g.mismatch = Disagreement(*slot.ops[q], q, op, c->rank);
      if (!g.mismatch.empty() || op.kind != Kind::kAllToAll) break;  // all_to_all: check every pair
    }
  }
  if (g.mismatch.empty() && slot.arrived == g.nranks) {
    Compute(slot.ops);
    slot.done = true;
    g.cv.SignalAll();
  }
  bool ok = true;
  while (ok && !slot.done) {
    if (c->aborted) {
      ok = false;
    } else if (!g.mismatch.empty()) {
      *error = g.mismatch;
      g.cv.SignalAll();
      ok = false;
    } else {
      for (int q = 0; q < g.nranks && ok; ++q) {
        if (slot.ops[q] == nullptr && g.lost[q]) {
          *error = LostText(g, q, op);
          ok = false;
        }
      }
      if (ok) g.cv.Wait(&g.mu);
    }
  }
  if (!ok) {
    // Leave the slot: `op` dies with this call and no later arrival may read
    // it. This rank is marked lost next (abort or FailComm), which is what
    // later arrivals then see.
    slot.ops[c->rank] = nullptr;
    --slot.arrived;
    g.cv.SignalAll();  // peers that saw it registered look again
    return false;
  }
  if (++slot.departed == g.nranks) g.slots.erase(place);
  return true;
}

size_t RendezvousBytes() {
  absl::MutexLock lock(&mu);
  return rendezvous_bytes;
}

// Posts a send of `count` elements at `data` to `peer` on its channel: a
// copy when it is small enough to go eagerly, else the buffer itself (the
// caller then waits with WaitTaken). Null, with *error, when the peer is gone.
std::shared_ptr<Message> PostSend(ShardlineNcclComm* c, const void* data, size_t count,
                                  int32_t dtype, int peer, const Op& op, std::string* error) {
  Group& g = *c->group;
  const size_t bytes = count * ElementBytes(dtype);
  auto m = std::make_shared<Message>();
  m->count = count;
  m->dtype = dtype;
  if (bytes <= RendezvousBytes()) {
    m->copy.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    m->data = m->copy.data();
    m->eager = true;
  } else {
    m->data = data;
  }
  absl::MutexLock lock(&g.mu);
  if (g.lost[peer]) {
    *error = LostText(g, peer, op);
    return nullptr;
  }
  g.channels[{c->rank, peer}].push_back(m);
  g.cv.SignalAll();
  return m;
}

// Waits until the receiver has taken a posted send (at once for an eager one).
bool WaitTaken(ShardlineNcclComm* c, const std::shared_ptr<Message>& m, int peer, const Op& op,
               std::string* error) {
  if (m->eager) return true;  // its error, if any, is the receiver's
  Group& g = *c->group;
  absl::MutexLock lock(&g.mu);
  while (!m->taken) {
    const bool gone = g.lost[peer];
    if (c->aborted || gone) {
      std::deque<std::shared_ptr<Message>>& channel = g.channels[{c->rank, peer}];
      auto it = std::find(channel.begin(), channel.end(), m);
      if (it != channel.end()) channel.erase(it);
      if (gone) *error = LostText(g, peer, op);
      return false;
    }
    g.cv.Wait(&g.mu);
  }
  if (!m->error.empty()) *error = m->error;
  return m->error.empty();
}

// Receives `count` elements from `peer` into `out`: the oldest send on the
// channel (peer, this rank), whatever its tag.
bool Receive(ShardlineNcclComm* c, void* out, size_t count, int32_t dtype, int peer, const Op& op,
             std::string* error) {
  Group& g = *c->group;
  absl::MutexLock lock(&g.mu);
  std::deque<std::shared_ptr<Message>>& channel = g.channels[{peer, c->rank}];
  while (channel.empty()) {
    if (c->aborted) return false;
    if (g.lost[peer]) {
      *error = LostText(g, peer, op);
      return false;
    }
    g.cv.Wait(&g.mu);
  }
  std::shared_ptr<Message> m = channel.front();
  channel.pop_front();
  bool ok = true;
  if (m->count != count || m->dtype != dtype) {
    m->error = absl::StrCat("send/recv mismatch: rank ", peer, " sent ", m->count, " ",
                            DTypeName(m->dtype), " elements where rank ", c->rank, " receives ",
                            count, " ", DTypeName(dtype),
                            " (sends and receives of a pair match in issue order; NCCL has no "
                            "tags) (fake loopback)");
    *error = m->error;
    ok = false;
  } else if (count > 0) {
    std::memcpy(out, m->data, count * ElementBytes(dtype));
  }
  m->taken = true;
  g.cv.SignalAll();
  return ok;
}

bool Send(ShardlineNcclComm* c, const Op& op, std::string* error) {
  std::shared_ptr<Message> m = PostSend(c, op.in, op.count, op.dtype, op.peer, op, error);
  return m != nullptr && WaitTaken(c, m, op.peer, op, error);
}

bool Recv(ShardlineNcclComm* c, const Op& op, std::string* error) {
  return Receive(c, op.out, op.count, op.dtype, op.peer, op, error);
}

void Log(const ShardlineNcclComm* c, const Op& op) {
  std::string line = absl::StrCat("group ", c->group->label, " rank ", c->rank, ": ", Describe(op));
  absl::MutexLock lock(&mu);
  if (stream_log.size() >= kMaxStreamLog) stream_log.erase(stream_log.begin(), stream_log.begin() + kMaxStreamLog / 2);
  stream_log.push_back(std::move(line));
}

// The stream: runs `c`'s operations one at a time in issue order until
// comm_destroy. After an abort or a failure nothing more runs (events of
// operations left behind fire on abort, as NCCL's kernels stop; after a
// failure they never fire and comm_status reports the error).
void RunStream(ShardlineNcclComm* c) {
  for (;;) {
    Op op;
    {
      absl::MutexLock lock(&c->qmu);
      while (c->queue.empty() && !c->stop) c->qcv.Wait(&c->qmu);
      if (c->stop) return;
      op = std::move(c->queue.front());
      c->queue.pop_front();
    }
    if (c->aborted || c->failed) continue;
    if (const absl::Duration delay = OpDelay(); delay > absl::ZeroDuration()) absl::SleepFor(delay);
    if (c->aborted || c->failed) continue;
    Log(c, op);
    std::string error;
    bool ok = false;
    switch (op.kind) {
      case Kind::kSend: ok = Send(c, op, &error); break;
      case Kind::kRecv: ok = Recv(c, op, &error); break;
      default: ok = Collective(c, op, &error); break;
    }
    if (ok) {
      op.fired->store(true);
    } else if (!c->aborted) {
      FailComm(c, error);
    }
  }
}

// --- The NCCL table --------------------------------------------------------

int CommInitLoopback(const uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], int32_t nranks, int32_t rank,
                     int32_t device, int64_t timeout_ms, int devices, ShardlineNcclComm** comm,
                     char* error, size_t error_len) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                absl::StrCat("ncclCommInitRankConfig: rank ", rank, " of ", nranks, " (fake loopback)"));
  }
  if (device < 0 || device >= devices) {
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                absl::StrCat("cudaSetDevice: device ", device, " is not one of the ", devices,
                             " fake devices (fake loopback)"));
  }
  std::shared_ptr<Group> g;
  {
    absl::MutexLock lock(&mu);
    for (auto it = groups.begin(); it != groups.end();) it = it->second.expired() ? groups.erase(it) : std::next(it);
    std::weak_ptr<Group>& slot =
        groups[std::string(reinterpret_cast<const char*>(id), SHARDLINE_NCCL_UNIQUE_ID_BYTES)];
    g = slot.lock();
    if (g == nullptr) {
      g = std::make_shared<Group>(nranks, next_group_label++);
      slot = g;
    }
  }
  {
    const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
    absl::MutexLock lock(&g->mu);
    if (g->nranks != nranks) {
      return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                  absl::StrCat("ncclCommInitRankConfig: nranks ", nranks, " where rank 0's id was used with ",
                               g->nranks, " (fake loopback)"));
    }
    if (g->devices[rank] != -1) {
      return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                  absl::StrCat("ncclCommInitRankConfig: rank ", rank, " joined twice (fake loopback)"));
    }
    for (int q = 0; q < nranks; ++q) {
      if (g->devices[q] == device) {
        return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                    absl::StrCat("ncclCommInitRankConfig: ranks ", q, " and ", rank,
                                 " both on device ", device,
                                 " (NCCL allows one rank per device per communicator) (fake loopback)"));
      }
    }
    g->devices[rank] = device;
    ++g->joined;
    g->cv.SignalAll();
    while (g->joined < nranks) {
      if (g->cv.WaitWithDeadline(&g->mu, deadline) && g->joined < nranks) {
        g->devices[rank] = -1;
        --g->joined;
        return Fail(SHARDLINE_GPU_DEADLINE_EXCEEDED, error, error_len,
                    absl::StrCat("ncclCommInitRankConfig: ", g->joined, " of ", nranks,
                                 " ranks joined within ", timeout_ms, " ms (fake loopback)"));
      }
    }
  }
  auto* c = new ShardlineNcclComm;
  c->nranks = nranks;
  c->rank = rank;
  c->group = std::move(g);
  c->stream = std::thread(RunStream, c);
  *comm = c;
  return SHARDLINE_GPU_OK;
}

int CommInit(const uint8_t id[SHARDLINE_NCCL_UNIQUE_ID_BYTES], int32_t nranks, int32_t rank,
             int32_t device, int64_t timeout_ms, ShardlineNcclComm** comm, char* error,
             size_t error_len) {
  int devices = 0;
  {
    absl::MutexLock lock(&mu);
    init_ids.emplace_back(reinterpret_cast<const char*>(id), SHARDLINE_NCCL_UNIQUE_ID_BYTES);
    devices = LoopbackDevicesLocked();
  }
  if (devices > 0)
    return CommInitLoopback(id, nranks, rank, device, timeout_ms, devices, comm, error, error_len);
  if (Mode() == SHARDLINE_FAKE_INIT_HANG) {
    return Fail(SHARDLINE_GPU_DEADLINE_EXCEEDED, error, error_len,
                "ncclCommInitRankConfig: not every rank joined (fake)");
  }
  *comm = new ShardlineNcclComm;
  (*comm)->nranks = nranks;
  (*comm)->rank = rank;
  return SHARDLINE_GPU_OK;
}

int CommStatus(ShardlineNcclComm* c, char* error, size_t error_len) {
  if (c->aborted) return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  if (c->failed) {
    if (c->group != nullptr) {
      absl::MutexLock lock(&c->qmu);
      return Fail(SHARDLINE_GPU_UNAVAILABLE, error, error_len, c->failure);
    }
    return Fail(SHARDLINE_GPU_UNAVAILABLE, error, error_len,
                "NCCL asynchronous error: remote process exited or there was a network error "
                "(fake)");
  }
  return SHARDLINE_GPU_OK;
}

void CommAbort(ShardlineNcclComm* c) {
  if (c->aborted.exchange(true)) return;
  {
    absl::MutexLock lock(&mu);
    ++aborts;
  }
  if (c->group != nullptr)
    MarkLost(c, "its communicator was aborted or destroyed, as when its process dies");
}

void CommDestroy(ShardlineNcclComm* c) {
  CommAbort(c);
  if (c->stream.joinable()) {
    {
      absl::MutexLock lock(&c->qmu);
      c->stop = true;
      c->qcv.SignalAll();
    }
    c->stream.join();
  }
  delete c;
}

int Issue(ShardlineNcclComm* c, Op op, ShardlineGpuEvent** event, char* error, size_t error_len) {
  if (c->aborted) return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  if (c->group != nullptr) {
    op.fired = std::make_shared<std::atomic<bool>>(false);
    *event = new ShardlineGpuEvent{c, false, op.fired};
    absl::MutexLock lock(&c->qmu);
    c->queue.push_back(std::move(op));
    c->qcv.Signal();
    return SHARDLINE_GPU_OK;
  }
  const int m = Mode();
  if (m == SHARDLINE_FAKE_ASYNC_ERROR) c->failed = true;
  *event = new ShardlineGpuEvent{c, m == SHARDLINE_FAKE_COMPLETE, nullptr};
  return SHARDLINE_GPU_OK;
}

// One operation of `kind`; the fields an operation does not use stay unset.
Op MakeOp(Kind kind, const void* in, void* out, size_t count, int32_t dtype, int peer = -1,
          int32_t reduce = SHARDLINE_GPU_SUM) {
  Op o;
  o.kind = kind;
  o.in = in;
  o.out = out;
  o.count = count;
  o.dtype = dtype;
  o.peer = peer;
  o.reduce = reduce;
  return o;
}

int AllReduce(ShardlineNcclComm* c, void* data, size_t count, int32_t dtype, int32_t op, int64_t,
              ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, MakeOp(Kind::kAllReduce, nullptr, data, count, dtype, -1, op), event, error,
               error_len);
}
int AllGather(ShardlineNcclComm* c, const void* in, size_t count, void* out, int32_t dtype, int64_t,
              ShardlineGpuEvent** event, char* error, size_t error_len) {
  if (c->group == nullptr && c->nranks == 1 && in != out && count > 0)
    std::memmove(out, in, count * ElementBytes(dtype));
  return Issue(c, MakeOp(Kind::kAllGather, in, out, count, dtype), event, error, error_len);
}
int ReduceScatter(ShardlineNcclComm* c, const void* in, void* out, const size_t* counts,
                  int32_t dtype, int32_t op, int64_t, ShardlineGpuEvent** event, char* error,
                  size_t error_len) {
  Op o = MakeOp(Kind::kReduceScatter, in, out, 0, dtype, -1, op);
  o.counts.assign(counts, counts + c->nranks);
  return Issue(c, std::move(o), event, error, error_len);
}
int AllToAll(ShardlineNcclComm* c, const void* in, const size_t* send_counts, void* out,
             const size_t* recv_counts, int32_t dtype, int64_t, ShardlineGpuEvent** event,
             char* error, size_t error_len) {
  Op o = MakeOp(Kind::kAllToAll, in, out, 0, dtype);
  o.counts.assign(send_counts, send_counts + c->nranks);
  o.recv_counts.assign(recv_counts, recv_counts + c->nranks);
  return Issue(c, std::move(o), event, error, error_len);
}
int Broadcast(ShardlineNcclComm* c, void* data, size_t count, int32_t dtype, int32_t root, int64_t,
              ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, MakeOp(Kind::kBroadcast, nullptr, data, count, dtype, root), event, error,
               error_len);
}
int SendFn(ShardlineNcclComm* c, const void* data, size_t count, int32_t dtype, int32_t peer,
           int64_t, ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, MakeOp(Kind::kSend, data, nullptr, count, dtype, peer), event, error, error_len);
}
int RecvFn(ShardlineNcclComm* c, void* data, size_t count, int32_t dtype, int32_t peer, int64_t,
           ShardlineGpuEvent** event, char* error, size_t error_len) {
  return Issue(c, MakeOp(Kind::kRecv, nullptr, data, count, dtype, peer), event, error, error_len);
}
int Barrier(ShardlineNcclComm* c, int64_t, ShardlineGpuEvent** event, char* error,
            size_t error_len) {
  return Issue(c, Op{}, event, error, error_len);
}

int EventQuery(ShardlineGpuEvent* ev, int32_t* done, char*, size_t) {
  // Aborted kernels stop, so their events fire (the worker reports Aborted).
  const bool fired = ev->fired != nullptr && ev->fired->load();
  *done = ev->done || fired || ev->comm->aborted ? 1 : 0;
  return SHARDLINE_GPU_OK;
}
void EventDestroy(ShardlineGpuEvent* ev) { delete ev; }

int CommOrderAfterStream(ShardlineNcclComm* c, void* stream, char* error, size_t error_len) {
  if (c == nullptr || stream == nullptr)
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                "comm_order_after_stream: null comm or stream (fake)");
  if (c->aborted) return Fail(SHARDLINE_GPU_ABORTED, error, error_len, "communicator was aborted");
  ++stream_orders;  // the emulated stream's work is done already (see the top)
  return SHARDLINE_GPU_OK;
}

int StreamWaitEvent(void* stream, ShardlineGpuEvent* ev, char* error, size_t error_len) {
  if (stream == nullptr || ev == nullptr)
    return Fail(SHARDLINE_GPU_INVALID_ARGUMENT, error, error_len,
                "stream_wait_event: null stream or event (fake)");
  ++stream_waits;
  // The emulated stream would run its next work now: it waits here.
  int32_t done = 0;
  for (absl::Duration sleep = absl::Microseconds(1);; sleep = std::min(sleep * 2, absl::Microseconds(200))) {
    EventQuery(ev, &done, nullptr, 0);
    if (done) return SHARDLINE_GPU_OK;
    absl::SleepFor(sleep);
  }
}

int DeviceAlloc(int32_t, size_t bytes, void** ptr, char*, size_t) {
  *ptr = std::malloc(bytes == 0 ? 1 : bytes);
  return SHARDLINE_GPU_OK;
}
void DeviceFree(int32_t, void* ptr) { std::free(ptr); }
int CopyBytes(int32_t, void* dst, const void* src, size_t bytes, char*, size_t) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return SHARDLINE_GPU_OK;
}

const ShardlineGpuApi kApi = {
    SHARDLINE_GPU_ABI_VERSION,
    DeviceCount,
    GetUniqueId,
    CommInit,
    CommStatus,
    CommAbort,
    CommDestroy,
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    SendFn,
    RecvFn,
    Barrier,
    EventQuery,
    EventDestroy,
    DeviceAlloc,
    DeviceFree,
    CopyBytes,
    CopyBytes,
    CommOrderAfterStream,
    StreamWaitEvent,
};

}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int shardline_gpu_probe(ShardlineGpuInfo* info, char*, size_t) {
  std::memset(info, 0, sizeof(*info));
  info->abi_version = SHARDLINE_GPU_ABI_VERSION;
  info->device_count = std::max(1, LoopbackDevices());
  for (int i = 0; i < info->device_count; ++i) {
    info->devices[i].index = i;
    std::snprintf(info->devices[i].name, sizeof(info->devices[i].name), "fake GPU");
  }
  return SHARDLINE_GPU_OK;
}

EXPORT const ShardlineGpuApi* shardline_gpu_api(void) { return &kApi; }

// --- Test controls ---

EXPORT void shardline_fake_set_mode(int m) {
  absl::MutexLock lock(&mu);
  mode = m;
}

// Loopback mode with `devices` fake devices (1..64); 0 turns it off for
// communicators created from now on.
EXPORT void shardline_fake_set_loopback(int devices) {
  absl::MutexLock lock(&mu);
  loopback_devices = std::clamp(devices, 0, kMaxLoopbackDevices);
}

// Loopback: sends of more than `bytes` wait for their receive (see the top).
EXPORT void shardline_fake_set_rendezvous_bytes(size_t bytes) {
  absl::MutexLock lock(&mu);
  rendezvous_bytes = bytes;
}

// comm_abort calls that aborted a live communicator, since the last reset.
EXPORT int shardline_fake_aborts(void) {
  absl::MutexLock lock(&mu);
  return aborts;
}

// How many comm_init calls since the last reset used the unique id `id`.
EXPORT int shardline_fake_inits_with_id(const uint8_t* id) {
  absl::MutexLock lock(&mu);
  int n = 0;
  for (const std::string& s : init_ids)
    n += std::memcmp(s.data(), id, SHARDLINE_NCCL_UNIQUE_ID_BYTES) == 0;
  return n;
}

// Loopback: the operations every stream has started since the last reset,
// one line each ("group G rank R: all_reduce count=N float32"), in the order
// they started (a rank's lines are its stream's order). Copies at most
// len - 1 bytes and a NUL into buf; returns the length of the whole text.
EXPORT size_t shardline_fake_stream_log(char* buf, size_t len) {
  absl::MutexLock lock(&mu);
  const std::string text = absl::StrJoin(stream_log, "\n");
  if (buf != nullptr && len > 0) std::snprintf(buf, len, "%s", text.c_str());
  return text.size();
}

// Loopback: every operation waits `us` microseconds on its stream before it
// runs (0: none; overrides SHARDLINE_FAKE_OP_DELAY_US).
EXPORT void shardline_fake_set_op_delay(int64_t us) {
  absl::MutexLock lock(&mu);
  op_delay_us = std::clamp<int64_t>(us, 0, 10'000'000);
}

// comm_order_after_stream and stream_wait_event calls since the last reset.
EXPORT void shardline_fake_stream_calls(int64_t* orders, int64_t* waits) {
  *orders = stream_orders.load();
  *waits = stream_waits.load();
}

EXPORT void shardline_fake_reset(void) {
  stream_orders = 0;
  stream_waits = 0;
  absl::MutexLock lock(&mu);
  mode = SHARDLINE_FAKE_COMPLETE;
  aborts = 0;
  init_ids.clear();
  stream_log.clear();
  rendezvous_bytes = size_t{4} << 20;
  op_delay_us = -1;
}

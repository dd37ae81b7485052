// Gloo (CPU, TCP) implementation of Backend.
//
// Layout: error mapping (Gloo exceptions -> absl::Status), then the
// backend: one op thread per backend runs queued operations in order. The
// store adapter, peer naming and fp32/16-bit helpers are in
// worker/comm/gloo_internal.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/backend.h"
#include "worker/comm/float16.h"
#include "worker/comm/gloo_checks.h"
#include "worker/comm/gloo_internal.h"
#include "worker/comm/gloo_state.h"
#include "worker/comm/shm_segment.h"

namespace shardline::worker {

// DTypeName and ReduceOpName are in gloo_checks.cc.

namespace gloo_internal {

using gloo_checks::CallDesc;
using gloo_checks::CheckBatch;

namespace {

constexpr uint64_t kReduceScatterSlotPrefix = uint64_t{0x5b} << 56;
// Elements per message of the reduce-scatter ring (1 MiB of fp32).
constexpr size_t kChunkElements = size_t{1} << 18;

// Store key (under the group's prefix) holding the group's first lost-peer
// report, e.g. "rank 2 lost peer rank 1". Gloo's own keys are "<rank>" and
// "rank_<n>", so this cannot collide.
constexpr char kLostPeerKey[] = "shardline/first_lost_peer";

std::atomic<int64_t> g_stalled_op_threads{0};

}  // namespace

absl::Status State::MapException(const std::string& op) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    std::string msg = e.what();
    {
      absl::MutexLock lock(&mu);
      if (aborted) return absl::AbortedError(absl::StrCat(op, ": aborted"));
    }
    if (absl::StrContains(msg, "Timed out") || absl::StrContains(msg, "timed out") ||
        absl::StrContains(msg, "Timeout") || absl::StrContains(msg, "timeout")) {
      return absl::DeadlineExceededError(
          absl::StrCat(op, " on rank ", rank, " did not finish within ",
                       absl::FormatDuration(options.timeout), ": ", msg));
    }
    int lost = -1;
    for (int r = 0; r < size && lost < 0; ++r) {
      for (const std::string& name : peer_names[r]) {
        if (Mentions(msg, name)) {
          lost = r;
          break;
        }
      }
    }
    const std::string what =
        lost >= 0 ? absl::StrCat("lost peer rank ", lost)
                  : absl::StrCat(
                        "lost a peer (rank unknown; known peer addresses: ", DebugNames(), ")");
    return absl::UnavailableError(
        absl::StrCat(op, " on rank ", rank, ": ", what, PropagateLoss(what), ": ", msg));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " on rank ", rank, ": ranks disagree on the operation: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op, " on rank ", rank, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(op, " on rank ", rank, ": unknown exception"));
  }
}

std::string State::PropagateLoss(const std::string& what) {
  std::string suffix;
  absl::StatusOr<std::string> first = store->Get(kLostPeerKey, absl::ZeroDuration());
  if (first.ok()) {
    suffix = absl::StrCat(" (first failure in this group: ", *first, ")");
  } else {
    (void)store->Set(kLostPeerKey, absl::StrCat("rank ", rank, " ", what));
  }
  try {
    context->closeConnections();
    if (leaders) leaders->closeConnections();
  } catch (...) {
  }
  // Local peers waiting for this rank in shared memory stop too.
  if (shm) shm->MarkGone();
  return suffix;
}

void State::RecordFailure(const absl::Status& s) {
  absl::MutexLock lock(&mu);
  if (!s.ok() && !absl::IsInvalidArgument(s) && sticky.ok()) sticky = s;
}

absl::Status State::CheckCollective(const CallDesc& mine, const char* op) {
  if (size == 1) return absl::OkStatus();
  if (mine.sequence <= checked_through) {
    return mine.sequence == failed_sequence ? failed_check : absl::OkStatus();
  }
  // This op's descriptor and those of the ops queued behind it (slots
  // without one stay zero: "not issued yet" on that rank).
  const int batch = CheckBatch(size);
  std::vector<CallDesc> all(static_cast<size_t>(size) * batch);
  all[rank * batch] = mine;
  {
    absl::MutexLock lock(&mu);
    for (int i = 1; i < batch && static_cast<size_t>(i) <= queue.size(); ++i) {
      if (queue[i - 1].desc.sequence != mine.sequence + i) break;
      all[rank * batch + i] = queue[i - 1].desc;
    }
  }
  try {
    gloo::AllgatherOptions opts(context);
    opts.setOutput(reinterpret_cast<uint8_t*>(all.data()), all.size() * sizeof(all[0]));
    opts.setTag(next_tag++);
    opts.setTimeout(ToMs(options.timeout));
    gloo::allgather(opts);
  } catch (...) {
    return MapException(op);
  }
  // Slot i is checked where every rank issued it; every rank sees the same
  // table, so all agree on how far that goes and on the first difference.
  std::vector<CallDesc> at(size);
  for (int i = 0; i < batch; ++i) {
    bool everywhere = true;
    for (int r = 0; r < size; ++r) {
      at[r] = all[r * batch + i];
      everywhere = everywhere && at[r].magic == CallDesc::kMagic;
    }
    if (!everywhere) break;  // slot 0 always is: every rank is in this op
    checked_through = mine.sequence + i;
    absl::Status s = gloo_checks::CompareCollective(at, mine.sequence + i, names);
    if (!s.ok()) {
      failed_sequence = checked_through;
      failed_check = s;
      break;
    }
  }
  return mine.sequence == failed_sequence ? failed_check : absl::OkStatus();
}

std::string State::DebugNames() {
  std::string out;
  for (int r = 0; r < size; ++r)
    absl::StrAppend(&out, r, "={", absl::StrJoin(peer_names[r], ","), "} ");
  return out;
}

bool State::StoppingOrRunnable() const {
  return stopping || (!queue.empty() && running == nullptr);
}

void State::RunFrontLocked() {
  Queued item = std::move(queue.front());
  queue.pop_front();
  if (aborted) {
    item.work->Complete(absl::AbortedError("backend was aborted"));
    return;
  }
  if (!sticky.ok()) {
    item.work->Complete(sticky);
    return;
  }
  running = item.work;
  current = std::move(item.progress);
  current.in_flight = true;
  current_start = absl::Now();
  mu.Unlock();
  absl::Status s = item.fn(item.desc);
  mu.Lock();
  running.reset();
  // A collective that broke the communicator (timed out, lost a peer,
  // mismatched) never completed: it stays in flight, its elapsed growing,
  // so that the rank's progress reports keep saying what it is stuck on
  // until the generation ends (backend.h OpProgress). One refused for bad
  // arguments moved nothing and is done.
  const bool broken = !s.ok() && !absl::IsInvalidArgument(s);
  current.in_flight = broken;
  if (!broken) current.elapsed = absl::Now() - current_start;
  if (aborted && !s.ok()) s = absl::AbortedError(absl::StrCat("backend was aborted: ", s.message()));
  if (broken && sticky.ok()) sticky = s;
  item.work->Complete(std::move(s));
}

bool State::IdleOrDrained() const { return running == nullptr || queue.empty(); }

bool State::NothingRunning() const { return running == nullptr; }

void State::Loop() {
  absl::MutexLock lock(&mu);
  for (;;) {
    mu.Await(absl::Condition(this, &State::StoppingOrRunnable));
    if (!queue.empty() && running == nullptr) {
      loop_busy = true;
      RunFrontLocked();
      loop_busy = false;
      continue;
    }
    if (queue.empty()) {  // stopping
      exited = true;  // wakes ~GlooBackend's Await when `lock` releases mu
      if (detached) --g_stalled_op_threads;
      return;
    }
    // Stopping with operations queued while a waiter runs one: ours next.
    mu.Await(absl::Condition(this, &State::IdleOrDrained));
  }
}

void State::Help(WorkImpl* work) {
  absl::MutexLock lock(&mu);
  for (;;) {
    if (running != nullptr || queue.empty() || !queue.front().interruptible) return;
    bool queued = false;
    for (const Queued& q : queue) {
      if (q.work.get() == work) {
        queued = true;
        break;
      }
    }
    if (!queued) return;  // running elsewhere, or done
    RunFrontLocked();
  }
}

absl::Status WorkImpl::Wait(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    if (std::shared_ptr<State> owner = owner_.lock()) owner->Help(this);
  }
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("Work::Wait: operation not complete after ", absl::FormatDuration(timeout)));
  }
  return status_;
}

}  // namespace gloo_internal

namespace {

using gloo_checks::CallDesc;
using gloo_checks::CheckBatch;
using gloo_checks::Collective;
using gloo_checks::Op;
using gloo_internal::FromFloat32;
using gloo_internal::Fp32Reducer;
using gloo_internal::Mentions;
using gloo_internal::ReduceFn;
using gloo_internal::StoreAdapter;
using gloo_internal::StoreError;
using gloo_internal::ToFloat32;
using gloo_internal::ToMs;

using gloo_internal::Done;
using gloo_internal::Mode;
using gloo_internal::g_stalled_op_threads;
using gloo_internal::kChunkElements;
using gloo_internal::kReduceScatterSlotPrefix;
using gloo_internal::State;
using gloo_internal::WorkImpl;

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(std::shared_ptr<State> state) : state_(std::move(state)) {
    std::shared_ptr<State> st = state_;
    thread_ = std::thread([st] { st->Loop(); });
  }

  ~GlooBackend() override {
    {
      // Wakes an idle op thread, which then exits (whether or not Abort
      // below still has anything to do).
      absl::MutexLock lock(&state_->mu);
      state_->stopping = true;
    }
    Abort();
    // An idle op thread exits at once. One inside a Gloo operation stays
    // there: Gloo's closeConnections (Abort) does not wake an operation
    // waiting for data, it fails at its op timeout. It holds its own
    // reference to the state, and with the sockets closed no more data can
    // reach its buffers: let it go rather than hold up the caller (waiting
    // 0.5 s here held up re-forming after every node loss). Counted in
    // GlooStalledOpThreads until it ends.
    state_->mu.Lock();
    // An operation in shared memory notices Abort at once and leaves its
    // waits (ShmGroup::Abort returned once it stopped touching buffers):
    // give it the moment it needs to finish rather than count it as stalled.
    if (state_->mode == gloo_internal::Mode::kShm && state_->running != nullptr) {
      state_->mu.AwaitWithTimeout(absl::Condition(state_.get(), &State::NothingRunning),
                                  absl::Seconds(2));
    }
    if (state_->exited || !state_->loop_busy) {
      state_->mu.Await(absl::Condition(&state_->exited));
      state_->mu.Unlock();
      thread_.join();
    } else {
      state_->detached = true;
      ++g_stalled_op_threads;
      state_->mu.Unlock();
      thread_.detach();
    }
  }

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  TransportInfo Transport() const override { return state_->transport; }

  BackendProgress Progress() const override {
    BackendProgress out;
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&state_->mu);
    out.collective = state_->current;
    if (out.collective.in_flight) out.collective.elapsed = now - state_->current_start;
    if (!state_->p2p_in_flight.empty()) {
      const auto& oldest = state_->p2p_in_flight.begin()->second;
      out.p2p = oldest.first;
      out.p2p->elapsed = now - oldest.second;
    }
    return out;
  }

  std::shared_ptr<Work> AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    if (data == nullptr && count > 0) return Invalid("all_reduce", "data is null with count > 0");
    State* st = state_.get();
    const CallDesc desc = Collective(Op::kAllReduce, 0, count, dtype, static_cast<int>(op));
    return Enqueue("all_reduce", count, dtype, desc,
                   [st, data, count, dtype, op](const CallDesc& d) -> absl::Status {
      if (st->mode == Mode::kShm)
        return st->shm->AllReduce(data, count, dtype, op, d, st->Ctx("all_reduce"));
      absl::Status check = st->CheckCollective(d, "all_reduce");
      if (!check.ok() || st->size == 1 || count == 0) return check;
      if (st->mode == Mode::kHierarchical) return st->HierAllReduce(data, count, dtype, op);
      std::vector<float>& tmp = st->fp32_scratch;  // reused: see reduce_scatter_acc
      float* buf = static_cast<float*>(data);
      if (dtype != DType::kFloat32) {
        tmp.resize(count);
        ToFloat32(data, dtype, count, tmp.data());
        buf = tmp.data();
      }
      try {
        gloo::AllreduceOptions opts(st->context);
        opts.setOutput(buf, count);
        opts.setReduceFunction(Fp32Reducer(op));
        opts.setTag(st->next_tag++);
        opts.setTimeout(ToMs(st->options.timeout));
        gloo::allreduce(opts);
      } catch (...) {
        return st->MapException("all_reduce");
      }
      if (op == ReduceOp::kAvg) {
        const float n = static_cast<float>(st->size);
        for (size_t i = 0; i < count; ++i) buf[i] /= n;
      }
      if (dtype != DType::kFloat32) FromFloat32(tmp.data(), count, dtype, data);
      return absl::OkStatus();
    });
  }

  std::shared_ptr<Work> AllGather(const void* in, size_t count, void* out, DType dtype) override {
    if (count > 0 && (in == nullptr || out == nullptr))
      return Invalid("all_gather", "in/out is null with count > 0");
    State* st = state_.get();
    return Enqueue("all_gather", count, dtype, Collective(Op::kAllGather, 0, count, dtype),
                   [st, in, count, out, dtype](const CallDesc& d) -> absl::Status {
      if (st->mode == Mode::kShm)
        return st->shm->AllGather(in, count, out, dtype, d, st->Ctx("all_gather"));
      absl::Status check = st->CheckCollective(d, "all_gather");
      if (!check.ok() || count == 0) return check;
      if (st->mode == Mode::kHierarchical) return st->HierAllGather(in, count, out, dtype);
      const size_t bytes = count * ElementSize(dtype);
      char* mine = static_cast<char*>(out) + st->rank * bytes;
      if (in != mine) std::memmove(mine, in, bytes);
      if (st->size == 1) return absl::OkStatus();
      try {
        gloo::AllgatherOptions opts(st->context);
        // No input: Gloo takes this rank's contribution from its output slot.
        opts.setOutput(static_cast<char*>(out), bytes * st->size);
        opts.setTag(st->next_tag++);
        opts.setTimeout(ToMs(st->options.timeout));
        gloo::allgather(opts);
      } catch (...) {
        return st->MapException("all_gather");
      }
      return absl::OkStatus();
    });
  }

  std::shared_ptr<Work> ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                      DType dtype, ReduceOp op) override {
    if (counts.size() != static_cast<size_t>(size())) {
      return Invalid("reduce_scatter",
                     absl::StrCat("counts.size()=", counts.size(), " != size=", size()));
    }
    size_t total = 0;
    for (int r = 0; r < size(); ++r) total += counts[r];
    const size_t mine = counts[rank()];
    if ((total > 0 && in == nullptr) || (mine > 0 && out == nullptr))
      return Invalid("reduce_scatter", "in/out is null with nonzero counts");
    State* st = state_.get();
    return Enqueue("reduce_scatter", total, dtype,
                   Collective(Op::kReduceScatter, 0, total, dtype, static_cast<int>(op), -1,
                              gloo_checks::HashCounts(counts)),
                   [st, in, out, counts, total, mine, dtype, op](const CallDesc& d) -> absl::Status {
      if (st->mode == Mode::kShm) {
        return st->shm->ReduceScatter(in, out, counts, dtype, op, d,
                                      st->Ctx("reduce_scatter"));
      }
      absl::Status check = st->CheckCollective(d, "reduce_scatter");
      if (!check.ok() || total == 0) return check;
      if (st->mode == Mode::kHierarchical)
        return st->HierReduceScatter(in, out, counts, dtype, op);
      // Scratch kept across calls (ops run one at a time on this thread):
      // a fresh buffer of tens of MiB is a fresh mmap each time, and its page
      // faults cost more than the transfer.
      std::vector<float>& acc = st->reduce_scatter_acc;
      acc.resize(total);
      ToFloat32(in, dtype, total, acc.data());
      const size_t offset = [&] {
        size_t o = 0;
        for (int p = 0; p < st->rank; ++p) o += counts[p];
        return o;
      }();
      if (st->size > 1) {
        absl::Status s = RingReduceScatter(st, acc, counts, op);
        if (!s.ok()) return s;
      }
      if (op == ReduceOp::kAvg) {
        const float n = static_cast<float>(st->size);
        for (size_t i = 0; i < mine; ++i) acc[offset + i] /= n;
      }
      FromFloat32(acc.data() + offset, mine, dtype, out);
      return absl::OkStatus();
    });
  }

  std::shared_ptr<Work> AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                                 const std::vector<size_t>& recv_counts, DType dtype) override {
    const size_t n = size();
    if (send_counts.size() != n)
      return Invalid("all_to_all",
                     absl::StrCat("send_counts.size()=", send_counts.size(), " != size=", n));
    if (recv_counts.size() != n)
      return Invalid("all_to_all",
                     absl::StrCat("recv_counts.size()=", recv_counts.size(), " != size=", n));
    if (send_counts[rank()] != recv_counts[rank()])
      return Invalid(
          "all_to_all",
          absl::StrCat("send_counts[", rank(), "]=", send_counts[rank()], " != recv_counts[",
                       rank(), "]=", recv_counts[rank()], " (the piece this rank sends itself)"));
    State* st = state_.get();
    size_t total = 0;
    for (size_t c : send_counts) total += c;
    return Enqueue("all_to_all", total, dtype,
                   Collective(Op::kAllToAll, 0, 0, dtype),
                   [st, in, send_counts, out, recv_counts, dtype](const CallDesc& d) -> absl::Status {
      const int size = st->size, rank = st->rank;
      const size_t es = ElementSize(dtype);
      // Its data moves over TCP whatever the transport; in shared memory
      // only the descriptor check runs there.
      absl::Status check = st->mode == Mode::kShm ? st->shm->Check(d, st->Ctx("all_to_all"))
                                                   : st->CheckCollective(d, "all_to_all");
      if (!check.ok()) return check;
      if (size == 1) {
        if (send_counts[0] > 0) std::memmove(out, in, send_counts[0] * es);
        return absl::OkStatus();
      }
      // 1) Agree on the split matrix so a mismatch fails on every rank with
      //    the same message instead of hanging or corrupting memory.
      std::vector<int64_t> mine(2 * size), all(2 * size * size);
      for (int p = 0; p < size; ++p) {
        mine[p] = static_cast<int64_t>(send_counts[p]);
        mine[size + p] = static_cast<int64_t>(recv_counts[p]);
      }
      std::memcpy(all.data() + 2 * size * rank, mine.data(), mine.size() * 8);
      try {
        gloo::AllgatherOptions opts(st->context);
        opts.setOutput(all.data(), all.size());
        opts.setTag(st->next_tag++);
        opts.setTimeout(ToMs(st->options.timeout));
        gloo::allgather(opts);
      } catch (...) {
        return st->MapException("all_to_all (split exchange)");
      }
      bool any = false;
      for (int s = 0; s < size; ++s) {
        for (int d = 0; d < size; ++d) {
          const int64_t sends = all[2 * size * s + d];
          const int64_t expects = all[2 * size * d + size + s];
          if (sends != expects) {
            return absl::FailedPreconditionError(
                absl::StrCat("all_to_all: split mismatch between rank ", s, " and rank ", d,
                             ": rank ", s, " sends ", sends, " elements to rank ", d, " but rank ",
                             d, " expects ", expects, " from rank ", s));
          }
          any = any || sends > 0;
        }
      }
      if (!any) return absl::OkStatus();  // the split exchange synchronised us
      // 2) Move the data (bytes; Gloo skips nothing, so give it valid pointers).
      std::vector<int64_t> in_bytes(size), out_bytes(size);
      size_t in_total = 0, out_total = 0;
      for (int p = 0; p < size; ++p) {
        in_bytes[p] = send_counts[p] * es;
        out_bytes[p] = recv_counts[p] * es;
        in_total += in_bytes[p];
        out_total += out_bytes[p];
      }
      char dummy_in = 0, dummy_out = 0;
      char* inp = in_total ? const_cast<char*>(static_cast<const char*>(in)) : &dummy_in;
      char* outp = out_total ? static_cast<char*>(out) : &dummy_out;
      try {
        gloo::AlltoallvOptions opts(st->context);
        opts.setInput(inp, in_bytes);
        opts.setOutput(outp, out_bytes);
        opts.setTag(st->next_tag++);
        opts.setTimeout(ToMs(st->options.timeout));
        gloo::alltoallv(opts);
      } catch (...) {
        return st->MapException("all_to_all");
      }
      return absl::OkStatus();
    });
  }

  std::shared_ptr<Work> Broadcast(void* data, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size())
      return Invalid("broadcast", absl::StrCat("root=", root, " out of range [0,", size(), ")"));
    if (data == nullptr && count > 0) return Invalid("broadcast", "data is null with count > 0");
    State* st = state_.get();
    return Enqueue("broadcast", count, dtype, Collective(Op::kBroadcast, 0, count, dtype, -1, root),
                   [st, data, count, dtype, root](const CallDesc& d) -> absl::Status {
      if (st->mode == Mode::kShm) {
        return st->shm->Broadcast(data, count * ElementSize(dtype), root, d,
                                  st->Ctx("broadcast"));
      }
      absl::Status check = st->CheckCollective(d, "broadcast");
      if (!check.ok() || st->size == 1 || count == 0) return check;
      if (st->mode == Mode::kHierarchical) return st->HierBroadcast(data, count, dtype, root);
      try {
        gloo::BroadcastOptions opts(st->context);
        opts.setOutput(static_cast<char*>(data), count * ElementSize(dtype));
        opts.setRoot(root);
        opts.setTag(st->next_tag++);
        opts.setTimeout(ToMs(st->options.timeout));
        gloo::broadcast(opts);
      } catch (...) {
        return st->MapException("broadcast");
      }
      return absl::OkStatus();
    });
  }

  std::shared_ptr<Work> Send(const void* data, size_t count, DType dtype, int peer,
                             uint32_t tag) override {
    return PointToPoint(const_cast<void*>(data), count, dtype, peer, tag, /*send=*/true);
  }
  std::shared_ptr<Work> Recv(void* data, size_t count, DType dtype, int peer,
                             uint32_t tag) override {
    return PointToPoint(data, count, dtype, peer, tag, /*send=*/false);
  }

  std::shared_ptr<Work> Barrier() override {
    State* st = state_.get();
    return Enqueue("barrier", 0, DType::kFloat32, Collective(Op::kBarrier, 0, 0, DType::kFloat32),
                   [st](const CallDesc& d) -> absl::Status {
      if (st->mode == Mode::kShm) return st->shm->Check(d, st->Ctx("barrier"));
      return st->CheckCollective(d, "barrier");
    });
  }

  void Abort() override {
    std::deque<State::Queued> queued;
    std::shared_ptr<WorkImpl> running;
    std::vector<std::weak_ptr<WorkImpl>> p2p;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->aborted) return;
      state_->aborted = true;
      queued.swap(state_->queue);
      running = state_->running;
      p2p.swap(state_->p2p_pending);
    }
    // Shared memory: local peers see this rank as gone, and our own op (if
    // it waits there) returns Aborted at once; this returns once the op no
    // longer touches its buffers.
    if (state_->shm) state_->shm->Abort();
    // Close sockets: peers see this rank as lost, and our own blocked op
    // (if any) fails on its next socket event or at its op timeout.
    if (state_->context) {
      try {
        state_->context->closeConnections();
        if (state_->leaders) state_->leaders->closeConnections();
      } catch (...) {
      }
    }
    for (auto& q : queued) q.work->Complete(absl::AbortedError("backend was aborted"));
    if (running) running->Complete(absl::AbortedError("backend was aborted during the operation"));
    for (auto& w : p2p) {
      if (auto p = w.lock()) p->Complete(absl::AbortedError("backend was aborted during the operation"));
    }
  }

 private:
  // Ring reduce-scatter in place on `acc` (fp32, pieces laid out by `counts`):
  // at step s (0..n-2) rank r sends its partial sum of piece (r-s-1) mod n to
  // rank r+1 and adds the partial sum of piece (r-s-2) mod n received from
  // rank r-1. After n-1 steps piece r holds the reduction over all ranks.
  // Each rank moves (n-1)/n of the data, the optimum. Pieces of 0 elements
  // are skipped on both sides (every rank knows every count).
  static absl::Status RingReduceScatter(State* st, std::vector<float>& acc,
                                        const std::vector<size_t>& counts, ReduceOp op) {
    const int n = st->size, r = st->rank;
    std::vector<size_t> offsets(n);
    size_t max_count = 1;
    for (int p = 1; p < n; ++p) offsets[p] = offsets[p - 1] + counts[p - 1];
    for (int p = 0; p < n; ++p) max_count = std::max(max_count, counts[p]);
    std::vector<float>& incoming = st->reduce_scatter_incoming;
    incoming.resize(max_count);
    const ReduceFn reduce = Fp32Reducer(op);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const uint64_t slot = kReduceScatterSlotPrefix | st->next_tag++;
    const absl::Time deadline = absl::Now() + st->options.timeout;
    auto remaining = [&]() -> absl::StatusOr<std::chrono::milliseconds> {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat("reduce_scatter on rank ", r,
                                                        " did not finish within ",
                                                        absl::FormatDuration(st->options.timeout)));
      }
      return ToMs(left);
    };
    // Each piece moves in chunks of kChunkElements: all of a step's sends
    // and receives are posted at once, and each received chunk is reduced
    // while the later ones are still on the wire.
    auto chunks_of = [](size_t count) { return (count + kChunkElements - 1) / kChunkElements; };
    try {
      auto send_buf = st->context->createUnboundBuffer(acc.data(), acc.size() * sizeof(float));
      auto recv_buf =
          st->context->createUnboundBuffer(incoming.data(), incoming.size() * sizeof(float));
      for (int step = 0; step < n - 1; ++step) {
        const int send_piece = ((r - step - 1) % n + n) % n;
        const int recv_piece = ((r - step - 2) % n + n) % n;
        const size_t send_count = counts[send_piece], recv_count = counts[recv_piece];
        for (size_t c = 0; c < chunks_of(send_count); ++c) {
          const size_t begin = c * kChunkElements;
          const size_t len = std::min(kChunkElements, send_count - begin);
          send_buf->send(next, slot, (offsets[send_piece] + begin) * sizeof(float),
                         len * sizeof(float));
        }
        for (size_t c = 0; c < chunks_of(recv_count); ++c) {
          const size_t begin = c * kChunkElements;
          recv_buf->recv(prev, slot, begin * sizeof(float),
                         std::min(kChunkElements, recv_count - begin) * sizeof(float));
        }
        for (size_t c = 0; c < chunks_of(recv_count); ++c) {
          auto left = remaining();
          if (!left.ok()) return left.status();
          recv_buf->waitRecv(*left);  // chunks complete in posting order
          const size_t begin = c * kChunkElements;
          float* dst = acc.data() + offsets[recv_piece] + begin;
          reduce(dst, dst, incoming.data() + begin,
                 std::min(kChunkElements, recv_count - begin));
        }
        for (size_t c = 0; c < chunks_of(send_count); ++c) {
          auto left = remaining();
          if (!left.ok()) return left.status();
          send_buf->waitSend(*left);
        }
      }
    } catch (...) {
      return st->MapException("reduce_scatter");
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Work> PointToPoint(void* data, size_t count, DType dtype, int peer, uint32_t tag,
                                     bool send) {
    const char* op = send ? "send" : "recv";
    if (peer < 0 || peer >= size())
      return Invalid(op, absl::StrCat("peer=", peer, " out of range [0,", size(), ")"));
    if (peer == rank()) return Invalid(op, absl::StrCat("peer=", peer, " == rank"));
    if (data == nullptr && count > 0) return Invalid(op, "data is null with count > 0");
    return gloo_internal::PostPointToPoint(state_, data, count, dtype, peer, tag, send);
  }

  std::shared_ptr<Work> Invalid(const char* op, const std::string& what) {
    return Done(absl::InvalidArgumentError(absl::StrCat(op, " on rank ", rank(), ": ", what)));
  }

  // Queues `fn(desc)`, `desc` numbered here, at issue, so the sequence is
  // the same on every rank that issues the same collectives.
  std::shared_ptr<Work> Enqueue(const char* op, size_t count, DType dtype, CallDesc desc,
                                std::function<absl::Status(const CallDesc&)> fn) {
    auto work = std::make_shared<WorkImpl>(state_);
    {
      absl::MutexLock lock(&state_->mu);  // wakes the op thread
      if (state_->aborted) {
        work->Complete(absl::AbortedError("backend was aborted"));
        return work;
      }
      OpProgress p;
      p.operation = op;
      p.sequence = desc.sequence = ++state_->issued;
      p.count = count;
      p.dtype = dtype;
      // all_to_all moves its data over TCP, which Abort cannot interrupt.
      const bool interruptible =
          state_->mode == Mode::kShm && desc.op != static_cast<uint32_t>(Op::kAllToAll);
      state_->queue.push_back(State::Queued{std::move(fn), work, std::move(p), desc,
                                            interruptible});
    }
    return work;
  }

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace

int64_t GlooStalledOpThreads() { return g_stalled_op_threads.load(); }

absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(std::shared_ptr<Store> store, int rank,
                                                           int size, GlooOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("store is null");
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("size=", size, " must be >= 1"));
  if (rank < 0 || rank >= size)
    return absl::InvalidArgumentError(absl::StrCat("rank=", rank, " out of range [0,", size, ")"));
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("options.timeout must be positive");
  if (options.connect_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("options.connect_timeout must be positive");
  if (!options.global_ranks.empty() && options.global_ranks.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat("options.global_ranks has ",
                                                   options.global_ranks.size(),
                                                   " entries; give none or one per rank (", size,
                                                   ")"));
  }
  if (options.host.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("options.host is ", options.host.size(),
                                                   " bytes; at most 255"));
  }
  if (options.shm_buffer_bytes != 0 &&
      (options.shm_buffer_bytes < shm::kMinBufferBytes ||
       options.shm_buffer_bytes > shm::kMaxBufferBytes || options.shm_buffer_bytes % 4096 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.shm_buffer_bytes=", options.shm_buffer_bytes,
        " must be 0 (automatic) or a multiple of 4096 in [", shm::kMinBufferBytes, ",",
        shm::kMaxBufferBytes, "]"));
  }
  {
    // Gloo crashes (rather than throws) on some unresolvable hostnames, so
    // only IP literals reach it.
    in_addr v4;
    in6_addr v6;
    if (inet_pton(AF_INET, options.interface_address.c_str(), &v4) != 1 &&
        inet_pton(AF_INET6, options.interface_address.c_str(), &v6) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.interface_address='", options.interface_address,
          "' is not an IP address literal; use the local interface's address, e.g. 127.0.0.1"));
    }
  }
  auto state = std::make_shared<State>();
  state->rank = rank;
  state->size = size;
  state->options = options;
  state->store = store;
  state->peer_names.assign(size, {});
  state->names.group = options.group_name;
  state->names.global_ranks = options.global_ranks;
  state->hosts = {{0}};
  state->transport.hosts = 1;
  state->transport.local_ranks = 1;
  if (size > 1) {
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.interface_address;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(ToMs(options.connect_timeout));
      StoreAdapter adapter(store, options.connect_timeout);
      context->connectFullMesh(adapter, device);
      context->setTimeout(ToMs(options.timeout));
      gloo_internal::AddPeerNames(*context, adapter, [](int r) { return r; }, &state->peer_names);
      state->context = std::move(context);
      absl::Status transport = state->SetUpTransport(device);
      if (!transport.ok()) {
        return absl::Status(transport.code(), absl::StrCat("bootstrapping rank ", rank, " of ",
                                                           size, ": ", transport.message()));
      }
    } catch (const StoreError& e) {
      return absl::Status(e.status.code(), absl::StrCat("bootstrapping rank ", rank, " of ", size,
                                                        ": ", e.status.message()));
    } catch (const gloo::IoException& e) {
      std::string msg = e.what();
      if (absl::StrContains(msg, "imeout") || absl::StrContains(msg, "imed out"))
        return absl::DeadlineExceededError(absl::StrCat("connecting rank ", rank, ": ", msg));
      return absl::UnavailableError(absl::StrCat("connecting rank ", rank, ": ", msg));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("creating Gloo device on interface_address='",
                                                     options.interface_address, "' for rank ", rank,
                                                     ": ", e.what()));
    }
  }
  return std::unique_ptr<Backend>(new GlooBackend(std::move(state)));
}

}  // namespace shardline::worker

#include "worker/comm/shm_group.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/comm/reduce_kernels.h"

namespace shardline::worker::shm {

using gloo_checks::CallDesc;

namespace {

// How long a waiter spins (when every local rank has a CPU of its own) and
// how often it yields before it sleeps on the futex; the longest it sleeps
// before it looks at the deadline, the abort flag and the peer's state
// again; how often it asks whether the peer's process is still running.
constexpr absl::Duration kSpin = absl::Microseconds(3);
constexpr int kYields = 4;
constexpr absl::Duration kSleepSlice = absl::Milliseconds(10);
constexpr absl::Duration kLivenessEvery = absl::Milliseconds(10);
// Abort waits at most this long for the op thread to leave the caller's
// buffers (it only has to finish one step's copy).
constexpr absl::Duration kAbortGrace = absl::Seconds(2);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

inline const char* At(const void* p, size_t bytes) { return static_cast<const char*>(p) + bytes; }
inline char* At(void* p, size_t bytes) { return static_cast<char*>(p) + bytes; }

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// From this many bytes written to the caller's buffer, a collective copies
// out of the staging buffers with streaming stores (kernels::CopyStreaming):
// such an output outgrows the caches anyway.
constexpr size_t kStreamingBytes = size_t{8} << 20;

void CopyOut(void* dst, const void* src, size_t bytes, bool streaming) {
  if (streaming) {
    kernels::CopyStreaming(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// Elements of each all_reduce slice: 1/n of the chunk, rounded up to 16
// elements so that slices start on cache-line boundaries.
size_t SliceElements(size_t len, int n) {
  const size_t per = CeilDiv(len, static_cast<size_t>(n));
  return (per + 15) / 16 * 16;
}

}  // namespace

class ShmGroup::Active {
 public:
  explicit Active(ShmGroup* g) : g_(g) { g_->active_.store(true, std::memory_order_seq_cst); }
  ~Active() { g_->active_.store(false, std::memory_order_seq_cst); }
  Active(const Active&) = delete;
  Active& operator=(const Active&) = delete;

 private:
  ShmGroup* g_;
};

ShmGroup::ShmGroup(std::unique_ptr<Segment> segment, Options options,
                   gloo_checks::GroupNames names,
                   std::function<std::string(const std::string&)> on_loss)
    : segment_(std::move(segment)),
      options_(std::move(options)),
      names_(std::move(names)),
      on_loss_(std::move(on_loss)) {
  watches_.resize(options_.group_ranks.size());
}

ShmGroup::~ShmGroup() = default;

void ShmGroup::Join() {
  RankControl* me = Me();
  const ProcessId id = ThisProcess();
  me->pid = id.pid;
  me->start_time = id.start_time;
  me->state.store(kAlive, std::memory_order_release);
}

void ShmGroup::WatchPeers() {
  const pid_t self = ::getpid();
  for (int j = 0; j < local_size(); ++j) {
    if (j == options_.local_rank) continue;
    const RankControl* c = segment_->control(j);
    // Ranks in this process (threads) cannot die alone: their state says
    // when they leave.
    if (c->pid > 0 && c->pid != self) watches_[j] = ProcessWatch({c->pid, c->start_time});
  }
}

absl::Status ShmGroup::Aborted(const OpContext& ctx) const {
  return absl::AbortedError(absl::StrCat(ctx.op, ": backend was aborted"));
}

absl::Status ShmGroup::Lost(int local, const std::string& why, const OpContext& ctx) {
  const std::string what = absl::StrCat("lost peer rank ", GroupRank(local));
  std::string suffix;
  if (!lost_.exchange(true) && on_loss_) suffix = on_loss_(what);
  MarkGone();
  return absl::UnavailableError(absl::StrCat(ctx.op, " on rank ", GroupRank(options_.local_rank),
                                             ": ", what, suffix, ": ", why, " (shared memory)"));
}

absl::Status ShmGroup::WaitFor(int local, uint32_t target, const OpContext& ctx) {
  RankControl* c = segment_->control(local);
  auto reached = [&] { return Reached(c->arrived.load(std::memory_order_acquire), target); };
  if (reached()) return absl::OkStatus();
  if (options_.spin) {
    const absl::Time spin_until = absl::Now() + kSpin;
    for (;;) {
      for (int i = 0; i < 32; ++i) {
        CpuRelax();
        if (reached()) return absl::OkStatus();
      }
      if (aborted_.load(std::memory_order_relaxed) || absl::Now() >= spin_until) break;
    }
  }
  for (int i = 0; i < kYields; ++i) {
    ::sched_yield();
    if (reached()) return absl::OkStatus();
  }
  absl::Time next_liveness = absl::InfinitePast();
  for (;;) {
    if (reached()) return absl::OkStatus();
    if (aborted_.load(std::memory_order_acquire)) return Aborted(ctx);
    if (c->state.load(std::memory_order_acquire) == kGone) {
      // It may have arrived and then left (its arrival came first).
      if (reached()) return absl::OkStatus();
      return Lost(local, "it left the group (aborted, destroyed, or failed)", ctx);
    }
    const absl::Time now = absl::Now();
    if (now >= ctx.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          ctx.op, " on rank ", GroupRank(options_.local_rank), " did not finish within ",
          absl::FormatDuration(options_.timeout), ": waiting for ",
          names_.Rank(GroupRank(local)), " (shared memory)"));
    }
    if (now >= next_liveness) {
      if (watches_[local].Exited()) {
        if (reached()) return absl::OkStatus();
        return Lost(local, absl::StrCat("its process ", c->pid, " exited"), ctx);
      }
      next_liveness = now + kLivenessEvery;
    }
    c->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c->arrived.load(std::memory_order_seq_cst);
    if (!Reached(seen, target) && !aborted_.load(std::memory_order_seq_cst)) {
      FutexWait(&c->arrived, seen, std::min(kSleepSlice, ctx.deadline - now));
    }
    c->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

absl::Status ShmGroup::Sync(const CallDesc* desc, const OpContext& ctx) {
  if (aborted_.load(std::memory_order_seq_cst)) return Aborted(ctx);
  const uint32_t k = ++syncs_;
  RankControl* me = Me();
  if (desc != nullptr) me->desc[k & 1] = *desc;
  me->arrived.store(k, std::memory_order_seq_cst);
  if (me->sleepers.load(std::memory_order_seq_cst) != 0) FutexWake(&me->arrived);
  for (int j = 0; j < local_size(); ++j) {
    if (j == options_.local_rank) continue;
    absl::Status s = WaitFor(j, k, ctx);
    if (!s.ok()) return s;
  }
  if (desc == nullptr) return absl::OkStatus();
  std::vector<CallDesc> all(local_size());
  for (int j = 0; j < local_size(); ++j) {
    all[j] = j == options_.local_rank ? *desc : segment_->control(j)->desc[k & 1];
  }
  return gloo_checks::CompareCollective(all, desc->sequence, names_);
}

absl::Status ShmGroup::Check(const CallDesc& desc, const OpContext& ctx) {
  Active active(this);
  return Sync(&desc, ctx);
}

absl::Status ShmGroup::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                 const CallDesc& desc, const OpContext& ctx) {
  Active active(this);
  if (count == 0) return Sync(&desc, ctx);
  // Two ranks: reducing both buffers costs each rank about what its share
  // of reduce-scatter + all-gather does, with one sync per step instead of
  // two.
  const size_t direct = local_size() == 2 ? segment_->buffer_bytes() : kDirectBytes;
  if (count * ElementSize(dtype) <= direct) {
    return AllReduceDirect(data, count, dtype, op, desc, ctx);
  }
  return AllReduceChunked(data, count, dtype, op, desc, ctx);
}

absl::Status ShmGroup::AllReduceDirect(void* data, size_t count, DType dtype, ReduceOp op,
                                       const CallDesc& desc, const OpContext& ctx) {
  const int n = local_size(), me = options_.local_rank;
  const size_t es = ElementSize(dtype);
  const size_t chunk = segment_->buffer_bytes() / es;
  std::vector<const void*> sources(n);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t len = std::min(chunk, count - off);
    char* src = At(data, off * es);
    std::memcpy(Mine(), src, len * es);
    absl::Status s = Sync(off == 0 ? &desc : nullptr, ctx);
    if (!s.ok()) return s;
    for (int j = 0; j < n; ++j) sources[j] = j == me ? src : Theirs(j);
    kernels::Reduce(sources.data(), n, len, dtype, op, src, nullptr, options_.group_size);
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::AllReduceChunked(void* data, size_t count, DType dtype, ReduceOp op,
                                        const CallDesc& desc, const OpContext& ctx) {
  const int n = local_size(), me = options_.local_rank;
  const size_t es = ElementSize(dtype);
  const size_t chunk = segment_->buffer_bytes() / es;
  const uint64_t chunks = CeilDiv(count, chunk);
  // Chunk c: its elements from `off` on, and slice j of it [begin(j), end(j)).
  struct Chunk {
    size_t off, len, per;
    size_t begin(int j) const { return std::min(per * j, len); }
    size_t end(int j) const { return std::min(per * (j + 1), len); }
  };
  auto chunk_at = [&](uint64_t c) {
    const size_t off = c * chunk;
    const size_t len = std::min(chunk, count - off);
    return Chunk{off, len, SliceElements(len, n)};
  };
  const bool streaming = count * es >= kStreamingBytes;
  std::vector<const void*> sources(n);
  for (uint64_t c = 0; c <= chunks; ++c) {
    if (c < chunks) {
      // Every slice of chunk c but this rank's own: only this rank reads its
      // own slice, and it reads it from `data`.
      const Chunk k = chunk_at(c);
      const char* src = At(data, k.off * es);
      char* mine = Mine(c);
      std::memcpy(mine, src, k.begin(me) * es);
      std::memcpy(mine + k.end(me) * es, src + k.end(me) * es, (k.len - k.end(me)) * es);
    }
    absl::Status s = Sync(c == 0 ? &desc : nullptr, ctx);
    if (!s.ok()) return s;
    if (c > 0) {
      // Chunk c - 1's slices, reduced by their owners before this sync.
      const Chunk k = chunk_at(c - 1);
      char* dst = At(data, k.off * es);
      for (int j = 0; j < n; ++j) {
        if (j == me || k.end(j) == k.begin(j)) continue;
        CopyOut(dst + k.begin(j) * es, Theirs(j, c - 1) + k.begin(j) * es,
                (k.end(j) - k.begin(j)) * es, streaming);
      }
    }
    if (c < chunks) {
      const Chunk k = chunk_at(c);
      if (k.end(me) > k.begin(me)) {
        char* src = At(data, (k.off + k.begin(me)) * es);
        for (int j = 0; j < n; ++j) {
          sources[j] = j == me ? src : At(Theirs(j, c), k.begin(me) * es);
        }
        kernels::Reduce(sources.data(), n, k.end(me) - k.begin(me), dtype, op, src,
                        Mine(c) + k.begin(me) * es, options_.group_size);
      }
    }
  }
  step_ += chunks;
  return absl::OkStatus();
}

absl::Status ShmGroup::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                     DType dtype, ReduceOp op, const CallDesc& desc,
                                     const OpContext& ctx) {
  Active active(this);
  const int n = local_size(), me = options_.local_rank;
  const size_t es = ElementSize(dtype);
  size_t largest = 0;
  std::vector<size_t> offsets(n);
  for (int p = 0; p < n; ++p) {
    offsets[p] = p == 0 ? 0 : offsets[p - 1] + counts[p - 1];
    largest = std::max(largest, counts[p]);
  }
  if (largest == 0) return Sync(&desc, ctx);
  // Elements of each piece per step; piece p's chunk at p * per in the buffer.
  size_t per = segment_->buffer_bytes() / es / n;
  if (per >= 16) per = per / 16 * 16;
  std::vector<const void*> sources(n);
  for (size_t base = 0; base < largest; base += per) {
    auto length = [&](int p) { return counts[p] > base ? std::min(per, counts[p] - base) : 0; };
    char* mine = Mine();
    for (int p = 0; p < n; ++p) {
      if (p == me || length(p) == 0) continue;
      std::memcpy(mine + p * per * es, At(in, (offsets[p] + base) * es), length(p) * es);
    }
    absl::Status s = Sync(base == 0 ? &desc : nullptr, ctx);
    if (!s.ok()) return s;
    if (length(me) > 0) {
      for (int j = 0; j < n; ++j) {
        sources[j] = j == me ? At(in, (offsets[me] + base) * es) : At(Theirs(j), me * per * es);
      }
      kernels::Reduce(sources.data(), n, length(me), dtype, op, At(out, base * es), nullptr,
                      options_.group_size);
    }
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::AllGather(const void* in, size_t count, void* out, DType dtype,
                                 const CallDesc& desc, const OpContext& ctx) {
  Active active(this);
  const int n = local_size(), me = options_.local_rank;
  const size_t bytes = count * ElementSize(dtype);
  if (bytes == 0) return Sync(&desc, ctx);
  const size_t step_bytes = segment_->buffer_bytes();
  char* own = At(out, me * bytes);
  // Out of place, this rank's own piece goes to `own` while it is copied to
  // the buffer (read once), except the first chunk: nothing is written to
  // `out` before the descriptors matched.
  const bool copy_own = own != in;
  const bool streaming = bytes * n >= kStreamingBytes;
  for (size_t off = 0; off < bytes; off += step_bytes) {
    const size_t len = std::min(step_bytes, bytes - off);
    if (copy_own && off > 0) {
      kernels::CopyTwice(Mine(), own + off, At(in, off), len, streaming);
    } else {
      std::memcpy(Mine(), At(in, off), len);
    }
    absl::Status s = Sync(off == 0 ? &desc : nullptr, ctx);
    if (!s.ok()) return s;
    if (copy_own && off == 0) CopyOut(own, Mine(), len, streaming);
    for (int j = 0; j < n; ++j) {
      if (j != me) CopyOut(At(out, j * bytes + off), Theirs(j), len, streaming);
    }
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::Broadcast(void* data, size_t bytes, int root, const CallDesc& desc,
                                 const OpContext& ctx) {
  Active active(this);
  if (bytes == 0) return Sync(&desc, ctx);
  const size_t step_bytes = segment_->buffer_bytes();
  const bool streaming = bytes >= kStreamingBytes;
  for (size_t off = 0; off < bytes; off += step_bytes) {
    const size_t len = std::min(step_bytes, bytes - off);
    if (options_.local_rank == root) std::memcpy(Mine(), At(data, off), len);
    absl::Status s = Sync(off == 0 ? &desc : nullptr, ctx);
    if (!s.ok()) return s;
    if (options_.local_rank != root) CopyOut(At(data, off), Theirs(root), len, streaming);
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::BroadcastLocal(void* data, size_t bytes, int root, const OpContext& ctx) {
  Active active(this);
  const size_t step_bytes = segment_->buffer_bytes();
  const bool streaming = bytes >= kStreamingBytes;
  for (size_t off = 0; off < bytes; off += step_bytes) {
    const size_t len = std::min(step_bytes, bytes - off);
    if (options_.local_rank == root) std::memcpy(Mine(), At(data, off), len);
    absl::Status s = Sync(nullptr, ctx);
    if (!s.ok()) return s;
    if (options_.local_rank != root) CopyOut(At(data, off), Theirs(root), len, streaming);
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::ReduceToLeader(const void* in, size_t count, DType dtype, ReduceOp op,
                                      float* acc, const OpContext& ctx) {
  Active active(this);
  const int n = local_size();
  const bool leader = options_.local_rank == 0;
  const size_t es = ElementSize(dtype);
  const size_t chunk = segment_->buffer_bytes() / es;
  if (op == ReduceOp::kAvg) op = ReduceOp::kSum;  // the caller divides at the end
  std::vector<const void*> sources(n);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t len = std::min(chunk, count - off);
    if (!leader) std::memcpy(Mine(), At(in, off * es), len * es);
    absl::Status s = Sync(nullptr, ctx);
    if (!s.ok()) return s;
    if (leader) {
      if (dtype == DType::kFloat32) {
        sources[0] = At(in, off * es);
        for (int j = 1; j < n; ++j) sources[j] = Theirs(j);
        kernels::Reduce(sources.data(), n, len, dtype, op, acc + off, nullptr, 1);
      } else {
        kernels::ToFloat32(At(in, off * es), len, dtype, acc + off);
        for (int j = 1; j < n; ++j) kernels::Accumulate(acc + off, Theirs(j), len, dtype, op);
      }
    }
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::GatherToLeader(const void* in, size_t bytes, const std::vector<char*>& dst,
                                      const OpContext& ctx) {
  Active active(this);
  const int n = local_size();
  const bool leader = options_.local_rank == 0;
  const size_t step_bytes = segment_->buffer_bytes();
  for (size_t off = 0; off < bytes; off += step_bytes) {
    const size_t len = std::min(step_bytes, bytes - off);
    if (!leader) std::memcpy(Mine(), At(in, off), len);
    absl::Status s = Sync(nullptr, ctx);
    if (!s.ok()) return s;
    if (leader) {
      for (int j = 1; j < n; ++j) std::memcpy(dst[j] + off, Theirs(j), len);
    }
    ++step_;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::ScatterFromLeader(const std::vector<const char*>& src,
                                         const std::vector<size_t>& bytes, void* out,
                                         const OpContext& ctx) {
  Active active(this);
  const int n = local_size(), me = options_.local_rank;
  size_t per = segment_->buffer_bytes() / n;
  if (per >= 64) per = per / 64 * 64;
  size_t largest = 0;
  for (int j = 1; j < n; ++j) largest = std::max(largest, bytes[j]);
  for (size_t base = 0; base < largest; base += per) {
    auto length = [&](int j) { return bytes[j] > base ? std::min(per, bytes[j] - base) : 0; };
    if (me == 0) {
      for (int j = 1; j < n; ++j) {
        if (length(j) > 0) std::memcpy(Mine() + j * per, src[j] + base, length(j));
      }
    }
    absl::Status s = Sync(nullptr, ctx);
    if (!s.ok()) return s;
    if (me != 0 && length(me) > 0) std::memcpy(At(out, base), Theirs(0) + me * per, length(me));
    ++step_;
  }
  return absl::OkStatus();
}

void ShmGroup::MarkGone() {
  RankControl* me = Me();
  me->state.store(kGone, std::memory_order_seq_cst);
  FutexWake(&me->arrived);
}

void ShmGroup::Abort() {
  aborted_.store(true, std::memory_order_seq_cst);
  MarkGone();
  const absl::Time deadline = absl::Now() + kAbortGrace;
  for (;;) {
    // Wakes the op thread wherever it sleeps (on some peer's word).
    for (int j = 0; j < local_size(); ++j) FutexWake(&segment_->control(j)->arrived);
    if (!active_.load(std::memory_order_seq_cst) || absl::Now() >= deadline) return;
    absl::SleepFor(absl::Microseconds(200));
  }
}

}  // namespace shardline::worker::shm

// Mismatch checks of the Gloo backend (gloo_backend.cc): the fixed-size
// descriptors ranks exchange before an operation moves data, their
// comparison, and the FailedPrecondition messages naming both ranks and both
// calls. backend.h ("FailedPrecondition") describes the protocol as callers
// see it. Only gloo_backend.cc includes this.
//
// Thread-safety: plain values and pure functions.
#ifndef SHARDLINE_WORKER_COMM_GLOO_CHECKS_H_
#define SHARDLINE_WORKER_COMM_GLOO_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/backend.h"

namespace shardline::worker::gloo_checks {

// The operation a descriptor describes.
enum class Op : uint32_t {
  kAllReduce = 1,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kBarrier,
  kSend,
  kRecv,
};
// "all_reduce", ... (OpProgress::operation's names).
const char* OpName(Op op);

// One call as this rank issued it. Trivially copyable, fixed size on every
// rank and every build (it crosses the wire as raw bytes between processes
// of the same program), so exchanging it can never itself mismatch.
struct CallDesc {
  uint32_t magic = 0;  // kMagic: tells a descriptor from stray bytes
  uint32_t op = 0;     // Op
  uint64_t sequence = 0;
  // Elements: the buffer for all_reduce / broadcast / send / recv, this
  // rank's piece for all_gather, the whole input for reduce_scatter, 0 for
  // all_to_all (its splits legitimately differ; its own exchange checks
  // them) and barrier.
  uint64_t count = 0;
  // reduce_scatter: a hash of the counts vector (must be equal everywhere).
  uint64_t counts_hash = 0;
  uint32_t dtype = 0;      // DType
  int32_t reduce_op = -1;  // ReduceOp, -1 where the op has none
  int32_t root = -1;       // broadcast; -1 otherwise
  uint32_t tag = 0;        // send / recv
  uint64_t reserved[3] = {0, 0, 0};

  static constexpr uint32_t kMagic = 0x53484c31;  // "SHL1"
};
static_assert(sizeof(CallDesc) == 72, "CallDesc crosses the wire: keep its size fixed");

// How many descriptors each rank contributes to one check exchange of a
// group of `size` (the same on every rank): up to 8, at most 512 in all.
inline int CheckBatch(int size) { return size >= 512 ? 1 : (size > 64 ? 512 / size : 8); }

// The descriptor of an ordered collective (`reduce_op` / `root` -1 where
// the op has none).
CallDesc Collective(Op op, uint64_t sequence, uint64_t count, DType dtype, int reduce_op = -1,
                    int root = -1, uint64_t counts_hash = 0);
// The descriptor of a send or receive.
CallDesc PointToPoint(bool send, uint64_t count, DType dtype, uint32_t tag);

// FNV-1a over the elements.
uint64_t HashCounts(const std::vector<size_t>& counts);

// How errors name ranks: "rank 3 (dp/0 rank 1)" with a group name and the
// members' global ranks, else "rank 1" (the group rank).
struct GroupNames {
  std::string group;              // e.g. "dp/0"; may be empty
  std::vector<int> global_ranks;  // by group rank; empty or one per member
  std::string Rank(int group_rank) const;
  // "group dp/0", or "this group" without a name.
  std::string Group() const;
};

// "all_reduce count=10 float32 sum", "broadcast count=4 float32 root=1",
// "reduce_scatter count=20 float32 sum counts_hash=0123abcd...",
// "send count=10 float32 tag=7"; for a descriptor that is not one (bad
// magic): "an unknown call".
std::string Describe(const CallDesc& d, bool with_hash = false);

// all[r] is rank r's descriptor (size() of them, the same on every rank after
// the exchange). OK when all match; else FailedPrecondition, the same text
// on every rank, naming rank 0 and the first rank that differs from it:
// "collective #12 of group dp/0 differs between ranks: rank 0 issued
// all_reduce count=10 float32 sum, rank 1 issued all_reduce count=20
// float32 sum".
absl::Status CompareCollective(const std::vector<CallDesc>& all, uint64_t sequence,
                               const GroupNames& names);

// A send's descriptor against its receiver's (`mine` is this rank's, `theirs`
// the peer's). OK when the peer issued the opposite call with the same
// count, dtype and tag; else FailedPrecondition, the same text on both
// sides: "send/recv with tag 7 differs between ranks: rank 0 issued send
// count=10 float32 to rank 1, rank 1 issued recv count=20 float32 from rank 0".
absl::Status CompareP2P(const CallDesc& mine, const CallDesc& theirs, int rank, int peer,
                        const GroupNames& names);

}  // namespace shardline::worker::gloo_checks

#endif  // SHARDLINE_WORKER_COMM_GLOO_CHECKS_H_

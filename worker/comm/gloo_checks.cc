#include "worker/comm/gloo_checks.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::worker {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

namespace gloo_checks {

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kBarrier:
      return "barrier";
    case Op::kSend:
      return "send";
    case Op::kRecv:
      return "recv";
  }
  return "unknown";
}

CallDesc Collective(Op op, uint64_t sequence, uint64_t count, DType dtype, int reduce_op,
                    int root, uint64_t counts_hash) {
  CallDesc d;
  d.magic = CallDesc::kMagic;
  d.op = static_cast<uint32_t>(op);
  d.sequence = sequence;
  d.count = count;
  d.counts_hash = counts_hash;
  d.dtype = static_cast<uint32_t>(dtype);
  d.reduce_op = reduce_op;
  d.root = root;
  return d;
}

CallDesc PointToPoint(bool send, uint64_t count, DType dtype, uint32_t tag) {
  CallDesc d;
  d.magic = CallDesc::kMagic;
  d.op = static_cast<uint32_t>(send ? Op::kSend : Op::kRecv);
  d.count = count;
  d.dtype = static_cast<uint32_t>(dtype);
  d.tag = tag;
  return d;
}

uint64_t HashCounts(const std::vector<size_t>& counts) {
  uint64_t h = 1469598103934665603ull;
  for (size_t c : counts) {
    const uint64_t v = c;
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

std::string GroupNames::Rank(int group_rank) const {
  if (group_rank >= 0 && static_cast<size_t>(group_rank) < global_ranks.size()) {
    return absl::StrCat("rank ", global_ranks[group_rank], " (",
                        group.empty() ? std::string("group") : group, " rank ", group_rank, ")");
  }
  return absl::StrCat("rank ", group_rank);
}

std::string GroupNames::Group() const {
  return group.empty() ? std::string("this group") : absl::StrCat("group ", group);
}

namespace {

bool Same(const CallDesc& a, const CallDesc& b) {
  return a.magic == b.magic && a.op == b.op && a.sequence == b.sequence && a.count == b.count &&
         a.counts_hash == b.counts_hash && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.root == b.root && a.tag == b.tag;
}

const char* DTypeText(uint32_t dtype) {
  return dtype <= static_cast<uint32_t>(DType::kBFloat16) ? DTypeName(static_cast<DType>(dtype))
                                                          : "unknown-dtype";
}

}  // namespace

std::string Describe(const CallDesc& d, bool with_hash) {
  if (d.magic != CallDesc::kMagic) return "an unknown call";
  const Op op = static_cast<Op>(d.op);
  std::string out = OpName(op);
  if (op == Op::kBarrier) return out;
  if (op != Op::kAllToAll) absl::StrAppend(&out, " count=", d.count);
  absl::StrAppend(&out, " ", DTypeText(d.dtype));
  if (d.reduce_op >= 0 && d.reduce_op <= static_cast<int>(ReduceOp::kMin))
    absl::StrAppend(&out, " ", ReduceOpName(static_cast<ReduceOp>(d.reduce_op)));
  if (op == Op::kBroadcast) absl::StrAppend(&out, " root=", d.root);
  if (with_hash && op == Op::kReduceScatter)
    absl::StrAppend(&out, " counts_hash=", absl::StrFormat("%016x", d.counts_hash));
  return out;
}

absl::Status CompareCollective(const std::vector<CallDesc>& all, uint64_t sequence,
                               const GroupNames& names) {
  for (size_t r = 1; r < all.size(); ++r) {
    if (Same(all[0], all[r])) continue;
    // Same text apart from the counts vector: show its hash, else the two
    // descriptions would read the same.
    const bool hash = Describe(all[0]) == Describe(all[r]);
    return absl::FailedPreconditionError(absl::StrCat(
        "collective #", sequence, " of ", names.Group(), " differs between ranks: ",
        names.Rank(0), " issued ", Describe(all[0], hash), ", ", names.Rank(static_cast<int>(r)),
        " issued ", Describe(all[r], hash)));
  }
  return absl::OkStatus();
}

absl::Status CompareP2P(const CallDesc& mine, const CallDesc& theirs, int rank, int peer,
                        const GroupNames& names) {
  const bool mine_send = mine.op == static_cast<uint32_t>(Op::kSend);
  const bool ok = theirs.magic == CallDesc::kMagic &&
                  theirs.op == static_cast<uint32_t>(mine_send ? Op::kRecv : Op::kSend) &&
                  theirs.count == mine.count && theirs.dtype == mine.dtype &&
                  theirs.tag == mine.tag;
  if (ok) return absl::OkStatus();
  // The sender first, so both sides print the same text.
  const CallDesc& s = mine_send ? mine : theirs;
  const CallDesc& r = mine_send ? theirs : mine;
  const int sender = mine_send ? rank : peer, receiver = mine_send ? peer : rank;
  return absl::FailedPreconditionError(absl::StrCat(
      "send/recv with tag ", mine.tag, " of ", names.Group(), " differs between ranks: ",
      names.Rank(sender), " issued ", Describe(s), " to ", names.Rank(receiver), ", ",
      names.Rank(receiver), " issued ", Describe(r), " from ", names.Rank(sender)));
}

}  // namespace gloo_checks
}  // namespace shardline::worker

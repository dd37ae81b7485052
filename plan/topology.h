// Rank layout and process groups for tp x dp x pp (docs/ARCHITECTURE.md "Rank layout").
//
//   absl::StatusOr<Topology> t = Topology::Create(/*tp=*/2, /*pp=*/2, /*dp=*/4);
//   t->RankOf({.tp_rank = 1, .dp_rank = 2, .pp_rank = 1});   // 13
//   t->dp_groups()[0];                                       // {0, 2, 4, 6}
//
// Megatron order: tp varies fastest, then dp, then pp:
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank).
// Immutable after Create; thread-safe.
#ifndef SHARDLINE_PLAN_TOPOLOGY_H_
#define SHARDLINE_PLAN_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::plan {

struct RankCoordinates {
  int tp_rank = 0;
  int dp_rank = 0;
  int pp_rank = 0;
  bool operator==(const RankCoordinates& o) const {
    return tp_rank == o.tp_rank && dp_rank == o.dp_rank && pp_rank == o.pp_rank;
  }
};

enum class GroupKind {
  kTp,         // same dp and pp coordinates: tensor-parallel collectives
  kDp,         // same tp and pp: gradient all-reduce / ZeRO collectives
  kPp,         // same tp and dp: the pipeline, stage 0 .. pp-1 in order
  kEmbedding,  // first and last pp stage of one pipeline (pp > 1 only): the
               // tied word-embedding gradient is all-reduced between them
};
absl::string_view GroupKindName(GroupKind kind);  // "tp", "dp", "pp", "embedding"

struct Group {
  GroupKind kind;
  std::vector<int> ranks;  // global ranks, ascending; index = rank in group
};

class Topology {
 public:
  // InvalidArgument when a degree is < 1 or tp*pp*dp exceeds kMaxWorldSize.
  static absl::StatusOr<Topology> Create(int tp, int pp, int dp);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int world_size() const { return tp_ * pp_ * dp_; }

  // Precondition: coordinates in range / 0 <= rank < world_size().
  int RankOf(const RankCoordinates& c) const { return c.tp_rank + tp_ * (c.dp_rank + dp_ * c.pp_rank); }
  // RankOf without the precondition: InvalidArgument naming the coordinates
  // and the degrees when they are outside this layout.
  absl::StatusOr<int> CheckedRankOf(const RankCoordinates& c) const;
  RankCoordinates CoordinatesOf(int rank) const;

  // Each list sorted by its lowest member; each group's ranks ascending.
  const std::vector<std::vector<int>>& tp_groups() const { return tp_groups_; }
  const std::vector<std::vector<int>>& dp_groups() const { return dp_groups_; }
  const std::vector<std::vector<int>>& pp_groups() const { return pp_groups_; }
  // {first stage, last stage} per pipeline; empty when pp == 1.
  const std::vector<std::vector<int>>& embedding_groups() const { return embedding_groups_; }

  // Every group in the one global order in which every rank must create its
  // communicators: all tp groups, then dp, then pp, then embedding, each
  // sorted by lowest member. A rank creates (or at least takes part in the
  // bootstrap of) only the groups it belongs to, in this order.
  std::vector<Group> GroupsInCreationOrder() const;

  // The groups that contain `rank`, in creation order.
  std::vector<Group> GroupsOf(int rank) const;

 private:
  Topology(int tp, int pp, int dp);
  int tp_, pp_, dp_;
  std::vector<std::vector<int>> tp_groups_, dp_groups_, pp_groups_, embedding_groups_;
};

}  // namespace shardline::plan

#endif  // SHARDLINE_PLAN_TOPOLOGY_H_

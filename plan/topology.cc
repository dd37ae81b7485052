#include "plan/topology.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plan/config.h"

namespace shardline::plan {

absl::string_view GroupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTp:
      return "tp";
    case GroupKind::kDp:
      return "dp";
    case GroupKind::kPp:
      return "pp";
    case GroupKind::kEmbedding:
      return "embedding";
  }
  return "unknown";
}

absl::StatusOr<int> Topology::CheckedRankOf(const RankCoordinates& c) const {
  if (c.tp_rank < 0 || c.tp_rank >= tp_ || c.dp_rank < 0 || c.dp_rank >= dp_ || c.pp_rank < 0 ||
      c.pp_rank >= pp_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinates (tp_rank=", c.tp_rank, ", dp_rank=", c.dp_rank, ", pp_rank=", c.pp_rank,
        ") out of range for tp=", tp_, " dp=", dp_, " pp=", pp_));
  }
  return RankOf(c);
}

absl::StatusOr<Topology> Topology::Create(int tp, int pp, int dp) {
  const std::pair<const char*, int> degrees[] = {{"tp", tp}, {"pp", pp}, {"dp", dp}};
  for (const auto& [field, value] : degrees) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "=", value, " is invalid; ", field, " must be >= 1"));
    }
  }
  if (int64_t{tp} * pp * dp > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size=tp*pp*dp=", int64_t{tp} * pp * dp,
                                                   " is too large; the limit is ", kMaxWorldSize,
                                                   " ranks"));
  }
  return Topology(tp, pp, dp);
}

Topology::Topology(int tp, int pp, int dp) : tp_(tp), pp_(pp), dp_(dp) {
  // Groups are generated in order of their lowest member, which for each kind
  // is the natural nested-loop order below.
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      std::vector<int> g;
      for (int t = 0; t < tp; ++t) g.push_back(RankOf({t, d, p}));
      tp_groups_.push_back(std::move(g));
    }
  }
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) {
      std::vector<int> g;
      for (int d = 0; d < dp; ++d) g.push_back(RankOf({t, d, p}));
      dp_groups_.push_back(std::move(g));
    }
  }
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      std::vector<int> g;
      for (int p = 0; p < pp; ++p) g.push_back(RankOf({t, d, p}));
      pp_groups_.push_back(std::move(g));
    }
  }
  if (pp > 1) {
    for (const auto& g : pp_groups_) embedding_groups_.push_back({g.front(), g.back()});
  }
  // Loop order already yields lowest-member order for tp and dp groups; make
  // it explicit for all four so the contract does not rest on loop shapes.
  auto by_lowest = [](const std::vector<int>& a, const std::vector<int>& b) { return a[0] < b[0]; };
  for (auto* groups : {&tp_groups_, &dp_groups_, &pp_groups_, &embedding_groups_}) {
    std::sort(groups->begin(), groups->end(), by_lowest);
  }
}

RankCoordinates Topology::CoordinatesOf(int rank) const {
  RankCoordinates c;
  c.tp_rank = rank % tp_;
  c.dp_rank = (rank / tp_) % dp_;
  c.pp_rank = rank / (tp_ * dp_);
  return c;
}

std::vector<Group> Topology::GroupsInCreationOrder() const {
  std::vector<Group> out;
  const std::pair<GroupKind, const std::vector<std::vector<int>>*> kinds[] = {
      {GroupKind::kTp, &tp_groups_},
      {GroupKind::kDp, &dp_groups_},
      {GroupKind::kPp, &pp_groups_},
      {GroupKind::kEmbedding, &embedding_groups_}};
  for (const auto& [kind, groups] : kinds) {
    for (const auto& g : *groups) out.push_back(Group{kind, g});
  }
  return out;
}

std::vector<Group> Topology::GroupsOf(int rank) const {
  std::vector<Group> out;
  for (Group& g : GroupsInCreationOrder()) {
    if (std::find(g.ranks.begin(), g.ranks.end(), rank) != g.ranks.end()) {
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace shardline::plan

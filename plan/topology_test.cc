#include "plan/topology.h"

#include <set>

#include "gtest/gtest.h"

namespace shardline::plan {
namespace {

using Groups = std::vector<std::vector<int>>;

// Case C11: W=16, tp=2, dp=4, pp=2.
TEST(TopologyTest, C11GroupConstructionOrder) {
  const auto t = Topology::Create(/*tp=*/2, /*pp=*/2, /*dp=*/4);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->world_size(), 16);
  EXPECT_EQ(t->tp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(t->dp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(t->pp_groups(), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(t->embedding_groups(), t->pp_groups());  // pp = 2: first and last stage are the group

  const std::vector<Group> order = t->GroupsInCreationOrder();
  ASSERT_EQ(order.size(), 8u + 4u + 8u + 8u);
  EXPECT_EQ(order[0].kind, GroupKind::kTp);
  EXPECT_EQ(order[8].kind, GroupKind::kDp);
  EXPECT_EQ(order[8].ranks, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(order[12].kind, GroupKind::kPp);
  EXPECT_EQ(order[20].kind, GroupKind::kEmbedding);
}

TEST(TopologyTest, RankFormulaAndInverse) {
  const auto t = Topology::Create(3, 4, 2);
  ASSERT_TRUE(t.ok());
  std::set<int> seen;
  for (int p = 0; p < 4; ++p) {
    for (int d = 0; d < 2; ++d) {
      for (int tp = 0; tp < 3; ++tp) {
        const int rank = t->RankOf({tp, d, p});
        EXPECT_EQ(rank, tp + 3 * (d + 2 * p));
        EXPECT_EQ(t->CoordinatesOf(rank), (RankCoordinates{tp, d, p}));
        seen.insert(rank);
      }
    }
  }
  EXPECT_EQ(seen.size(), 24u);
}

TEST(TopologyTest, EveryRankIsInExactlyOneGroupOfEachKind) {
  const auto t = Topology::Create(2, 3, 2);
  ASSERT_TRUE(t.ok());
  for (int rank = 0; rank < t->world_size(); ++rank) {
    int counts[4] = {0, 0, 0, 0};
    for (const Group& g : t->GroupsOf(rank)) ++counts[static_cast<int>(g.kind)];
    EXPECT_EQ(counts[0], 1);
    EXPECT_EQ(counts[1], 1);
    EXPECT_EQ(counts[2], 1);
    // Only the first and last stage (pp ranks 0 and 2) are in an embedding group.
    EXPECT_EQ(counts[3], t->CoordinatesOf(rank).pp_rank == 1 ? 0 : 1);
  }
  // Embedding groups pair stage 0 with stage pp-1 of one pipeline.
  EXPECT_EQ(t->embedding_groups()[0], (std::vector<int>{0, 8}));
}

// Case C11, second part: in W=4 with tp=2, the group [2, 3] is rooted at its
// lowest member, rank 2; ranks 0 and 1 are not members (so not blocked by it).
TEST(TopologyTest, SubgroupRootIsItsLowestMember) {
  const auto t = Topology::Create(2, 1, 2);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->tp_groups()[1], (std::vector<int>{2, 3}));
  for (int rank : {0, 1}) {
    for (const Group& g : t->GroupsOf(rank)) EXPECT_NE(g.ranks, (std::vector<int>{2, 3}));
  }
  EXPECT_TRUE(t->embedding_groups().empty());
}

TEST(TopologyTest, RejectsBadDegrees) {
  EXPECT_EQ(Topology::Create(0, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Topology::Create(1, 1, 1 << 21).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::plan

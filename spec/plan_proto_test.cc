// plan_proto's process groups: the compact form GroupsOfPlan makes decodes
// (GroupRanks) to the listed ranks, and a malformed group is refused.
#include "spec/plan_proto.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan.h"

namespace shardline::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GroupRanksTest, TheCompactFormOfEveryGroupDecodesToItsListedRanks) {
  plan::GptConfig model{.num_layers = 4, .hidden_size = 64, .num_heads = 4, .vocab_size = 256,
                        .seq_length = 32};
  plan::ParallelConfig parallel;
  parallel.tp = 2;
  parallel.pp = 2;
  parallel.dp = 4;
  parallel.micro_batches = 4;
  absl::StatusOr<plan::Plan> p = plan::MakePlan(model, parallel);
  ASSERT_TRUE(p.ok()) << p.status();
  const PlanGroups groups = GroupsOfPlan(*p);
  ASSERT_EQ(groups.groups.size(), groups.compact.size());
  int compact = 0;
  for (size_t i = 0; i < groups.groups.size(); ++i) {
    const v1::ProcessGroup& listed = groups.groups[i];
    compact += groups.compact[i].ranks_size() == 0;
    absl::StatusOr<std::vector<uint32_t>> got = GroupRanks(groups.compact[i], 16);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(*got, ::testing::ElementsAreArray(listed.ranks())) << listed.name();
  }
  EXPECT_GT(compact, 0) << "no group took the compact form";
}

TEST(GroupRanksTest, ListedAndCompactFormsAndTheirLimits) {
  v1::ProcessGroup listed;
  listed.set_name("dp/0");
  for (uint32_t r : {1u, 3u, 5u}) listed.add_ranks(r);
  EXPECT_THAT(*GroupRanks(listed, 8), ElementsAre(1u, 3u, 5u));
  v1::ProcessGroup compact;
  compact.set_name("dp/1");
  compact.set_first_rank(2);
  compact.set_rank_stride(3);
  compact.set_size(3);
  EXPECT_THAT(*GroupRanks(compact, 9), ElementsAre(2u, 5u, 8u));
  // Its last rank (8) is outside a world of 8.
  absl::Status s = GroupRanks(compact, 8).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("group dp/1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("world_size=8"));
  compact.set_rank_stride(0);  // every member the same rank
  EXPECT_TRUE(absl::IsInvalidArgument(GroupRanks(compact, 9).status()));
  listed.add_ranks(9);
  s = GroupRanks(listed, 8).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("lists rank 9"));
}

}  // namespace
}  // namespace shardline::spec

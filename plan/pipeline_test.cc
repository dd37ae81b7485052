#include "plan/pipeline.h"

#include <map>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::plan {
namespace {

using ::testing::HasSubstr;
using Kind = Action::Kind;
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

Ranges LayerRanges(const PipelinePlan& p) {
  Ranges out;
  for (const Chunk& c : p.chunks) out.push_back({c.first_layer, c.last_layer});
  return out;
}

// Case C5.
TEST(PartitionTest, C5LayersThatDoNotDivide) {
  EXPECT_EQ(LayerRanges(*PartitionLayers(30, 4, 1)), (Ranges{{0, 7}, {8, 15}, {16, 22}, {23, 29}}));
  EXPECT_EQ(LayerRanges(*PartitionLayers(10, 3, 1)), (Ranges{{0, 3}, {4, 6}, {7, 9}}));
  EXPECT_EQ(LayerRanges(*PartitionLayers(7, 2, 1)), (Ranges{{0, 3}, {4, 6}}));
  const absl::Status s = PartitionLayers(3, 4, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_layers=3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("pp=4"));
}

TEST(PartitionTest, EveryLayerExactlyOnceContiguousAndChunksRoundRobin) {
  for (int64_t layers = 1; layers <= 20; ++layers) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int vpp = 1; vpp <= 3; ++vpp) {
        const auto plan = PartitionLayers(layers, pp, vpp);
        if (layers < pp * vpp) {
          EXPECT_FALSE(plan.ok());
          continue;
        }
        ASSERT_TRUE(plan.ok());
        ASSERT_EQ(plan->chunks.size(), static_cast<size_t>(pp * vpp));
        int64_t next = 0, smallest = layers, largest = 0;
        for (const Chunk& c : plan->chunks) {
          EXPECT_EQ(c.first_layer, next);
          const int64_t size = c.last_layer - c.first_layer + 1;
          EXPECT_GE(size, 1);
          // Earlier chunks take the extra layers.
          EXPECT_LE(size, largest == 0 ? size : largest);
          smallest = std::min(smallest, size);
          largest = std::max(largest, size);
          EXPECT_EQ(c.pp_rank, c.index % pp);
          EXPECT_EQ(c.has_embedding, c.index == 0);
          EXPECT_EQ(c.has_head, c.index == pp * vpp - 1);
          next = c.last_layer + 1;
        }
        EXPECT_EQ(next, layers);
        EXPECT_LE(largest - smallest, 1);
      }
    }
  }
  const auto p = PartitionLayers(8, 2, 2);
  EXPECT_EQ(p->ChunksOfRank(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(p->ChunksOfRank(1), (std::vector<int>{1, 3}));
}

std::vector<int> Warmups(const PipelineSchedule& s) {
  std::vector<int> out;
  for (const RankSchedule& r : s.ranks) out.push_back(r.warmup);
  return out;
}

// Case C6: fewer micro-batches than stages.
TEST(ScheduleTest, C6FewerMicroBatchesThanStages) {
  const auto s1 = BuildSchedule(ScheduleKind::kOneFOneB, 4, 1, 1);
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_EQ(Warmups(*s1), (std::vector<int>{1, 1, 1, 0}));
  std::vector<int> steady;
  for (const RankSchedule& r : s1->ranks) steady.push_back(1 - r.warmup);
  EXPECT_EQ(steady, (std::vector<int>{0, 0, 0, 1}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(s1->ranks[r].actions,
              (std::vector<Action>{{Kind::kForward, 0, r}, {Kind::kBackward, 0, r}}));
  }
  const auto s2 = BuildSchedule(ScheduleKind::kOneFOneB, 4, 1, 2);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(Warmups(*s2), (std::vector<int>{2, 2, 1, 0}));
  // One micro-batch through four stages: 4 F + 4 B back to back.
  EXPECT_EQ(s1->simulation.makespan, 4 * 1 + 4 * 2);
}

TEST(ScheduleTest, ActionStringsAndOneFOneBOrder) {
  const auto s = BuildSchedule(ScheduleKind::kOneFOneB, 2, 1, 3);
  ASSERT_TRUE(s.ok());
  std::vector<std::string> r0;
  for (const Action& a : s->ranks[0].actions) r0.push_back(a.ToString());
  EXPECT_EQ(r0, (std::vector<std::string>{"F0.0", "F1.0", "B0.0", "F2.0", "B1.0", "B2.0"}));
  std::vector<std::string> r1;
  for (const Action& a : s->ranks[1].actions) r1.push_back(a.ToString());
  EXPECT_EQ(r1, (std::vector<std::string>{"F0.1", "B0.1", "F1.1", "B1.1", "F2.1", "B2.1"}));
}

TEST(ScheduleTest, InterleavedFollowsMegatronOrderAndWarmup) {
  const auto s = BuildSchedule(ScheduleKind::kInterleaved, 2, 2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  // warmup = min((pp - r - 1) * 2 + (vpp - 1) * pp, m * vpp)
  EXPECT_EQ(Warmups(*s), (std::vector<int>{4, 2}));
  std::vector<std::string> r0;
  for (const Action& a : s->ranks[0].actions) r0.push_back(a.ToString());
  EXPECT_EQ(r0, (std::vector<std::string>{"F0.0", "F1.0", "F0.2", "F1.2", "F2.0", "B0.2", "F3.0",
                                           "B1.2", "F2.2", "B0.0", "F3.2", "B1.0", "B2.2", "B3.2",
                                           "B2.0", "B3.0"}));
  const auto w = BuildSchedule(ScheduleKind::kInterleaved, 4, 2, 8);
  EXPECT_EQ(Warmups(*w), (std::vector<int>{10, 8, 6, 4}));
  // m == pp: all forwards first.
  const auto all = BuildSchedule(ScheduleKind::kInterleaved, 4, 2, 4);
  EXPECT_EQ(Warmups(*all), (std::vector<int>{8, 8, 8, 8}));
}

// The simulator's timeline must itself obey the dependency rules: no rank
// runs two actions at once, in its own order, and data dependencies hold.
void ExpectTimelineConsistent(const PipelineSchedule& s) {
  const int chunks = s.pp * s.vpp;
  std::map<std::tuple<int, int, int>, TimedAction> by_key;  // (kind, mb, chunk)
  for (int r = 0; r < s.pp; ++r) {
    const auto& line = s.simulation.timeline[r];
    ASSERT_EQ(line.size(), s.ranks[r].actions.size());
    for (size_t k = 0; k < line.size(); ++k) {
      EXPECT_EQ(line[k].action, s.ranks[r].actions[k]);
      EXPECT_EQ(line[k].end - line[k].start,
                line[k].action.kind == Kind::kForward ? s.simulation.t_forward : s.simulation.t_backward);
      if (k > 0) {
        EXPECT_GE(line[k].start, line[k - 1].end);
      }
      const Action& a = line[k].action;
      by_key[{static_cast<int>(a.kind), a.micro_batch, a.chunk}] = line[k];
    }
  }
  for (const auto& [key, t] : by_key) {
    const auto [kind, mb, c] = key;
    if (kind == static_cast<int>(Kind::kForward)) {
      if (c > 0) {
        EXPECT_GE(t.start, (by_key[{kind, mb, c - 1}].end));
      }
    } else {
      EXPECT_GE(t.start, (by_key[{static_cast<int>(Kind::kForward), mb, c}].end));
      if (c < chunks - 1) {
        EXPECT_GE(t.start, (by_key[{kind, mb, c + 1}].end));
      }
    }
  }
}

// Exhaustive properties for small pp, vpp, m: every (micro-batch, chunk) has
// exactly one F and one B on its owning rank, F before B, warmup is the F
// count before the first B, the timeline is consistent, and the bubble
// formulas of docs/ARCHITECTURE.md hold exactly.
TEST(ScheduleTest, ExhaustivePropertiesAndBubbleFormulas) {
  int built = 0, rejected = 0;
  for (ScheduleKind kind :
       {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved}) {
    for (int pp = 1; pp <= 6; ++pp) {
      for (int vpp = 1; vpp <= (kind == ScheduleKind::kInterleaved ? 4 : 1); ++vpp) {
        for (int m = 1; m <= 13; ++m) {
          SCOPED_TRACE(::testing::Message() << ScheduleName(kind) << " pp=" << pp
                                            << " vpp=" << vpp << " m=" << m);
          const auto s = BuildSchedule(kind, pp, vpp, m);
          if (!s.ok()) {
            // Only interleaved with m not a multiple of pp (and m > pp) may be
            // impossible; it must say so, not hang or return garbage.
            EXPECT_EQ(kind, ScheduleKind::kInterleaved);
            EXPECT_NE(m % pp, 0);
            EXPECT_GT(m, pp);
            EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
            EXPECT_THAT(std::string(s.status().message()), HasSubstr("multiple of pp"));
            ++rejected;
            continue;
          }
          ++built;
          for (int r = 0; r < pp; ++r) {
            std::map<std::pair<int, int>, int> f_at, b_at;
            int first_b = -1;
            const auto& actions = s->ranks[r].actions;
            for (int k = 0; k < static_cast<int>(actions.size()); ++k) {
              const Action& a = actions[k];
              EXPECT_EQ(a.chunk % pp, r);
              auto& at = a.kind == Kind::kForward ? f_at : b_at;
              EXPECT_TRUE(at.emplace(std::make_pair(a.micro_batch, a.chunk), k).second);
              if (a.kind == Kind::kBackward && first_b < 0) first_b = k;
            }
            EXPECT_EQ(f_at.size(), static_cast<size_t>(m * vpp));
            EXPECT_EQ(b_at.size(), static_cast<size_t>(m * vpp));
            for (const auto& [key, k] : f_at) EXPECT_LT(k, b_at.at(key));
            const int total = m * vpp;
            EXPECT_EQ(first_b, s->ranks[r].warmup == total ? total : s->ranks[r].warmup + 1);
          }
          ExpectTimelineConsistent(*s);
          EXPECT_EQ(s->simulation.ideal, 3 * m * vpp);
          if (kind != ScheduleKind::kInterleaved) {
            EXPECT_DOUBLE_EQ(s->simulation.bubble_ratio, static_cast<double>(pp - 1) / m);
          } else if (m % pp == 0) {
            EXPECT_DOUBLE_EQ(s->simulation.bubble_ratio, static_cast<double>(pp - 1) / (vpp * m));
          }
        }
      }
    }
  }
  EXPECT_GT(built, 300);
  EXPECT_GT(rejected, 0);
}

// A deep pipeline at scale: the simulator is linear in the number of
// actions, and the formulas still hold exactly.
TEST(ScheduleTest, DeepPipelineAtScale) {
  const auto s = BuildSchedule(ScheduleKind::kOneFOneB, 256, 1, 1024);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->simulation.bubble_ratio, 255.0 / 1024);
  EXPECT_EQ(s->simulation.makespan, 3 * (1024 + 255));
  const auto i = BuildSchedule(ScheduleKind::kInterleaved, 64, 4, 256);
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_DOUBLE_EQ(i->simulation.bubble_ratio, 63.0 / (4 * 256));
  EXPECT_EQ(BuildSchedule(ScheduleKind::kOneFOneB, 1 << 20, 1, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScheduleTest, InterleavedThatCannotCompleteIsRejectedWithAdvice) {
  const auto s = BuildSchedule(ScheduleKind::kInterleaved, 4, 3, 5);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("micro_batches=5"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("e.g. 8"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("deadlock"));
}

TEST(ScheduleTest, RejectsVppWithoutInterleavingAndBadDegrees) {
  EXPECT_EQ(BuildSchedule(ScheduleKind::kOneFOneB, 2, 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildSchedule(ScheduleKind::kGpipe, 0, 1, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildSchedule(ScheduleKind::kGpipe, 2, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SimulateTest, DetectsDeadlockOnOneRank) {
  // Backward before its own forward can never run.
  std::vector<RankSchedule> ranks = {{0, {{Kind::kBackward, 0, 0}, {Kind::kForward, 0, 0}}}};
  const auto sim = Simulate(ranks, 1, 1, 1);
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(sim.status().message()), HasSubstr("rank 0 at B0.0"));
}

TEST(SimulateTest, DetectsDeadlockAcrossRanks) {
  // Rank 0 waits for B0.1 before it sends F1.0; rank 1 wants F1.1 first.
  std::vector<RankSchedule> ranks = {
      {1, {{Kind::kForward, 0, 0}, {Kind::kBackward, 0, 0}, {Kind::kForward, 1, 0}, {Kind::kBackward, 1, 0}}},
      {0, {{Kind::kForward, 1, 1}, {Kind::kBackward, 1, 1}, {Kind::kForward, 0, 1}, {Kind::kBackward, 0, 1}}}};
  const auto sim = Simulate(ranks, 2, 1, 2);
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(sim.status().message()), HasSubstr("rank 0 at B0.0, rank 1 at F1.1"));
}

TEST(SimulateTest, RejectsIncompleteOrMisplacedActions) {
  std::vector<RankSchedule> missing = {{0, {{Kind::kForward, 0, 0}}}};
  EXPECT_EQ(Simulate(missing, 1, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<RankSchedule> wrong_rank = {{0, {{Kind::kForward, 0, 1}, {Kind::kBackward, 0, 1}}},
                                          {0, {{Kind::kForward, 0, 0}, {Kind::kBackward, 0, 0}}}};
  EXPECT_EQ(Simulate(wrong_rank, 2, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<RankSchedule> twice = {{0, {{Kind::kForward, 0, 0}, {Kind::kForward, 0, 0}}}};
  EXPECT_THAT(std::string(Simulate(twice, 1, 1, 1).status().message()), HasSubstr("more than once"));
}

TEST(SimulateTest, GpipeMakespanByHand) {
  // pp=3, m=2: forwards end at 4 on the last stage, backwards take 2*(2+3-1).
  const auto s = BuildSchedule(ScheduleKind::kGpipe, 3, 1, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->simulation.makespan, (2 + 3 - 1) * 3);
  EXPECT_EQ(s->simulation.timeline[2][0].start, 2);
}

}  // namespace
}  // namespace shardline::plan

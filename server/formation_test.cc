// World formation as a pure function: dp, who gets which rank, the spares,
// with join times from a fake clock.
#include "server/formation.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "testing/job_specs.h"

namespace shardline::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// SmallSpec (tp=1; L=2 so pp may be 2), resolved as CreateJob does.
v1::JobSpec Resolved(int min_workers, int max_workers, int global_batch, int pp = 1) {
  v1::JobSpec spec = fixtures::SmallSpec(min_workers, max_workers, global_batch);
  spec.mutable_parallel()->set_pp(pp);
  absl::StatusOr<v1::JobSpec> resolved = spec::ResolveJobSpec(spec);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved.ok() ? *resolved : spec;
}

class FormationTest : public ::testing::Test {
 protected:
  // A candidate that joined `after_start` into the test.
  FormationCandidate Candidate(const std::string& id, absl::Duration after_start,
                               int previous_rank = -1) {
    return {id, previous_rank, start_ + after_start};
  }

  // The worker_ids of `indices` into `candidates`.
  static std::vector<std::string> Ids(const std::vector<FormationCandidate>& candidates,
                                      const std::vector<size_t>& indices) {
    std::vector<std::string> out;
    for (size_t i : indices) out.push_back(candidates.at(i).worker_id);
    return out;
  }

  FakeClock clock_;
  const absl::Time start_ = clock_.Now();
};

TEST_F(FormationTest, FiveCandidatesForTp1Pp2Min2Max4FormDp2WithOneSpare) {
  const v1::JobSpec spec = Resolved(/*min=*/2, /*max=*/4, /*global_batch=*/12, /*pp=*/2);
  // Given by worker_id, as the coordinator does; joined in another order.
  const std::vector<FormationCandidate> candidates = {
      Candidate("w0", absl::Seconds(3)), Candidate("w1", absl::Seconds(1)),
      Candidate("w2", absl::Seconds(0)), Candidate("w3", absl::Seconds(4)),
      Candidate("w4", absl::Seconds(2))};
  absl::StatusOr<std::optional<Formation>> f = FormWorld(spec, candidates);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  const Formation& formation = **f;
  EXPECT_EQ(formation.dp, 2);
  EXPECT_EQ(formation.world_size, 4);
  EXPECT_EQ(formation.plan->parallel.world_size(), 4);
  EXPECT_EQ(formation.plan->parallel.dp, 2);
  EXPECT_EQ(formation.plan->parallel.pp, 2);
  // Ranks in join order; the last to join waits as the spare.
  EXPECT_THAT(Ids(candidates, formation.ranks), ElementsAre("w2", "w1", "w4", "w0"));
  EXPECT_THAT(Ids(candidates, formation.spares), ElementsAre("w3"));
}

TEST_F(FormationTest, FewerCandidatesThanMinWorkersFormNothing) {
  const v1::JobSpec spec = Resolved(/*min=*/3, /*max=*/4, /*global_batch=*/12);
  const std::vector<FormationCandidate> two = {Candidate("a", absl::Seconds(0)),
                                               Candidate("b", absl::Seconds(1))};
  absl::StatusOr<std::optional<Formation>> f = FormWorld(spec, two);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->has_value());

  absl::StatusOr<std::optional<Formation>> none = FormWorld(spec, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  // With tp*pp=2 one candidate cannot hold a model replica even at min 2.
  const v1::JobSpec pp2 = Resolved(/*min=*/2, /*max=*/4, /*global_batch=*/12, /*pp=*/2);
  absl::StatusOr<std::optional<Formation>> one = FormWorld(pp2, {Candidate("a", absl::Seconds(0))});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->has_value());
}

TEST_F(FormationTest, DpDividesTheGlobalBatchAndMaxWorkersCapsTheWorld) {
  // 3 candidates, global batch 4: dp 3 does not divide it, so dp 2.
  const v1::JobSpec batch4 = Resolved(/*min=*/1, /*max=*/3, /*global_batch=*/4);
  const std::vector<FormationCandidate> three = {Candidate("a", absl::Seconds(0)),
                                                 Candidate("b", absl::Seconds(1)),
                                                 Candidate("c", absl::Seconds(2))};
  absl::StatusOr<std::optional<Formation>> f = FormWorld(batch4, three);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  EXPECT_EQ((*f)->dp, 2);
  EXPECT_EQ((*f)->world_size, 2);
  EXPECT_THAT(Ids(three, (*f)->ranks), ElementsAre("a", "b"));
  EXPECT_THAT(Ids(three, (*f)->spares), ElementsAre("c"));

  // max_workers=2 of 5: world 2, three spares in join order.
  const v1::JobSpec max2 = Resolved(/*min=*/1, /*max=*/2, /*global_batch=*/12);
  const std::vector<FormationCandidate> five = {
      Candidate("a", absl::Seconds(4)), Candidate("b", absl::Seconds(3)),
      Candidate("c", absl::Seconds(2)), Candidate("d", absl::Seconds(1)),
      Candidate("e", absl::Seconds(0))};
  absl::StatusOr<std::optional<Formation>> capped = FormWorld(max2, five);
  ASSERT_TRUE(capped.ok()) << capped.status();
  ASSERT_TRUE(capped->has_value());
  EXPECT_EQ((*capped)->dp, 2);
  EXPECT_THAT(Ids(five, (*capped)->ranks), ElementsAre("e", "d"));
  EXPECT_THAT(Ids(five, (*capped)->spares), ElementsAre("c", "b", "a"));
}

TEST_F(FormationTest, SurvivorsComeFirstInTheOrderOfTheirPreviousRanks) {
  const v1::JobSpec spec = Resolved(/*min=*/1, /*max=*/4, /*global_batch=*/12);
  // "new" joined first but held no rank; the survivors held ranks 2 and 0
  // (rank 1 was lost). Survivors keep their relative order, not their
  // numbers: previous rank 2 becomes rank 1.
  const std::vector<FormationCandidate> candidates = {
      Candidate("new", absl::Seconds(0)), Candidate("old0", absl::Seconds(5), /*previous_rank=*/0),
      Candidate("old2", absl::Seconds(3), /*previous_rank=*/2)};
  absl::StatusOr<std::optional<Formation>> f = FormWorld(spec, candidates);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  EXPECT_EQ((*f)->dp, 3);
  EXPECT_THAT(Ids(candidates, (*f)->ranks), ElementsAre("old0", "old2", "new"));
  EXPECT_THAT((*f)->spares, IsEmpty());

  // When the world shrinks (max 2), the survivors keep the ranks and the
  // newcomer waits as a spare.
  const v1::JobSpec max2 = Resolved(/*min=*/1, /*max=*/2, /*global_batch=*/12);
  absl::StatusOr<std::optional<Formation>> shrunk = FormWorld(max2, candidates);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  ASSERT_TRUE(shrunk->has_value());
  EXPECT_THAT(Ids(candidates, (*shrunk)->ranks), ElementsAre("old0", "old2"));
  EXPECT_THAT(Ids(candidates, (*shrunk)->spares), ElementsAre("new"));
}

TEST_F(FormationTest, TiesGoByWorkerIdThenByTheOrderGiven) {
  const v1::JobSpec spec = Resolved(/*min=*/1, /*max=*/4, /*global_batch=*/12);
  // Same join time: by worker_id, whatever the order given.
  const std::vector<FormationCandidate> same_time = {Candidate("c", absl::Seconds(1)),
                                                     Candidate("a", absl::Seconds(1)),
                                                     Candidate("b", absl::Seconds(1))};
  absl::StatusOr<std::optional<Formation>> f = FormWorld(spec, same_time);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  EXPECT_THAT(Ids(same_time, (*f)->ranks), ElementsAre("a", "b", "c"));

  // Two that held the same rank (one in an older generation, then a spare):
  // the order given decides.
  const std::vector<FormationCandidate> same_rank = {
      Candidate("y", absl::Seconds(0), /*previous_rank=*/0),
      Candidate("x", absl::Seconds(9), /*previous_rank=*/0)};
  absl::StatusOr<std::optional<Formation>> g = FormWorld(spec, same_rank);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->has_value());
  EXPECT_THAT(Ids(same_rank, (*g)->ranks), ElementsAre("y", "x"));
}

TEST_F(FormationTest, ClockOrderBeatsWorkerIdOrder) {
  const v1::JobSpec spec = Resolved(/*min=*/1, /*max=*/2, /*global_batch=*/12);
  // Join times a nanosecond apart still order the candidates.
  const std::vector<FormationCandidate> candidates = {Candidate("a", absl::Nanoseconds(1)),
                                                      Candidate("b", absl::ZeroDuration())};
  absl::StatusOr<std::optional<Formation>> f = FormWorld(spec, candidates);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  EXPECT_THAT(Ids(candidates, (*f)->ranks), ElementsAre("b", "a"));
  EXPECT_THAT((*f)->spares, IsEmpty());
}

}  // namespace
}  // namespace shardline::server

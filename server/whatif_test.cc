// Coordinator::WhatIf on a fake clock: each prediction is checked against
// the real thing (the worker's session then breaks, the survivors re-join
// and the next generation forms), and WhatIf itself changes nothing.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/coordinator_test_fixture.h"

namespace shardline::server {
namespace {

using google::protobuf::util::MessageDifferencer;
using google::protobuf::util::TimeUtil;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class WhatIfTest : public CoordinatorFixture {
 protected:
  absl::StatusOr<v1::WhatIfResponse> WhatIf(const std::vector<std::string>& lose,
                                            const std::string& job = "job") {
    v1::WhatIfRequest r;
    r.set_job_id(job);
    for (const std::string& w : lose) r.add_lose_worker_ids(w);
    return coordinator_->WhatIf(r);
  }

  // Opens a session for each worker (so that CloseSession can break it).
  void OpenSessions(const std::vector<std::string>& workers) {
    for (const std::string& w : workers) {
      absl::StatusOr<uint64_t> s = coordinator_->OpenSession(Id(w));
      ASSERT_TRUE(s.ok()) << w << ": " << s.status();
      sessions_[w] = *s;
    }
  }

  // The real loss: the worker's session stream breaks.
  std::vector<GenerationEnded> Lose(const std::string& worker) {
    return coordinator_->CloseSession(Id(worker), sessions_.at(worker));
  }

  // The survivors re-join (same incarnation), as a healthy worker does on
  // RESTART_AT_GENERATION; then the coordinator ticks.
  void Rejoin(const std::vector<std::string>& workers) {
    for (const std::string& w : workers) ASSERT_TRUE(Join(w).ok()) << w;
    coordinator_->Tick();
  }

  // The workers of the current generation's ranks, in rank order.
  std::vector<std::string> RankWorkers() {
    std::map<uint32_t, std::string> by_rank;
    for (const auto& [id, m] : Members()) {
      if (m.state() == v1::MEMBER_STATE_ACTIVE) by_rank[m.rank()] = id;
    }
    std::vector<std::string> out;
    for (const auto& [rank, id] : by_rank) out.push_back(id);
    return out;
  }

  // Asserts that the job and its members are exactly as `job` and
  // `members` (WhatIf changed nothing).
  void ExpectUnchanged(const v1::Job& job, const std::map<std::string, v1::Member>& members) {
    EXPECT_TRUE(MessageDifferencer::Equals(Job(), job)) << Job().DebugString();
    const std::map<std::string, v1::Member> now = Members();
    ASSERT_EQ(now.size(), members.size());
    for (const auto& [id, m] : members) {
      EXPECT_TRUE(MessageDifferencer::Equals(now.at(id), m)) << id;
    }
  }

  static v1::CheckpointRef Ref(const std::string& id, uint64_t step) {
    v1::CheckpointRef ref;
    ref.set_checkpoint_id(id);
    ref.set_step(step);
    return ref;
  }

  std::map<std::string, uint64_t> sessions_;
};

TEST_F(WhatIfTest, ASpareCoversALostRank) {
  // max_workers 3: a, b, c form world 3 (dp 3, 12 / 3 = 4 micro-batches);
  // d joins the RUNNING job as a spare and cannot grow it.
  Create(Spec(2, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_TRUE(Join("d").ok());
  ASSERT_EQ(Job().world_size(), 3u);
  ASSERT_EQ(Members()["d"].state(), v1::MEMBER_STATE_SPARE);
  OpenSessions({"a", "b", "c", "d"});
  const v1::Job before = Job();
  const std::map<std::string, v1::Member> members = Members();

  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"b"});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectUnchanged(before, members);
  EXPECT_EQ(r->generation(), 1u);
  EXPECT_EQ(r->world_size(), 3u);
  EXPECT_EQ(r->dp(), 3u);
  ASSERT_EQ(r->losses_size(), 1);
  const v1::WhatIfLoss& loss = r->losses(0);
  EXPECT_EQ(loss.worker_id(), "b");
  EXPECT_EQ(loss.state(), v1::MEMBER_STATE_ACTIVE);
  ASSERT_TRUE(loss.has_rank());
  EXPECT_EQ(loss.rank(), 1u);
  EXPECT_EQ(loss.coordinates().dp_rank(), 1u);
  EXPECT_EQ(loss.coordinates().tp_rank(), 0u);
  EXPECT_EQ(loss.coordinates().pp_rank(), 0u);
  // ZeRO stage 0: every dp rank holds whole states; nothing is only b's.
  EXPECT_EQ(loss.num_zero_shards(), 0u);
  EXPECT_EQ(loss.zero_shard_elements(), 0u);
  EXPECT_TRUE(r->generation_ends());
  EXPECT_THAT(r->spares_used(), ElementsAre("d"));
  EXPECT_TRUE(r->spares_cover());
  EXPECT_FALSE(r->below_min_workers());
  EXPECT_EQ(r->new_world_size(), 3u);
  EXPECT_EQ(r->new_dp(), 3u);
  EXPECT_EQ(r->new_gradient_accumulation_steps(), 4u);
  // Survivors keep their order; the spare comes last.
  EXPECT_THAT(r->new_worker_ids(), ElementsAre("a", "c", "d"));
  EXPECT_FALSE(r->has_restore());
  EXPECT_THAT(r->summary(), HasSubstr("Losing rank 1 (b) ends generation 1."));
  EXPECT_THAT(r->summary(), HasSubstr("Spare d takes a rank."));
  EXPECT_THAT(r->summary(), HasSubstr("World 3 and dp 3 stay as they are"));

  // The real thing.
  ASSERT_EQ(Lose("b").size(), 1u);
  Rejoin({"a", "c", "d"});
  const v1::Job after = Job();
  ASSERT_EQ(after.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(after.generation(), 2u);
  EXPECT_EQ(after.world_size(), r->new_world_size());
  EXPECT_EQ(after.dp(), r->new_dp());
  EXPECT_EQ(AssignmentOf("d", 2).gradient_accumulation_steps(),
            r->new_gradient_accumulation_steps());
  EXPECT_EQ(RankWorkers(),
            std::vector<std::string>(r->new_worker_ids().begin(), r->new_worker_ids().end()));
}

TEST_F(WhatIfTest, WithoutASpareDpShrinksAndAccumulationGrowsFromTheLastCheckpoint) {
  // world 4 = dp 4, 3 micro-batches each; a checkpoint at step 10, the
  // ranks at step 14.
  Create(Spec(2, 4));
  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_EQ(Job().dp(), 4u);
  OpenSessions({"a", "b", "c", "d"});
  ASSERT_TRUE(coordinator_->NoteCheckpointCommitted("job", Ref("ckpt-10", 10), 1000).ok());
  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Beat(w, 1, 14).ok());
  ASSERT_EQ(Job().step(), 14u);

  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"c"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->generation_ends());
  EXPECT_THAT(r->spares_used(), IsEmpty());
  EXPECT_FALSE(r->spares_cover());
  EXPECT_FALSE(r->below_min_workers());
  EXPECT_EQ(r->new_world_size(), 3u);
  EXPECT_EQ(r->new_dp(), 3u);
  EXPECT_EQ(r->new_gradient_accumulation_steps(), 4u);  // 12 / 3
  EXPECT_THAT(r->new_worker_ids(), ElementsAre("a", "b", "d"));
  ASSERT_TRUE(r->has_restore());
  EXPECT_EQ(r->restore().checkpoint_id(), "ckpt-10");
  EXPECT_EQ(r->restore().step(), 10u);
  EXPECT_EQ(r->steps_retrained(), 4u);
  EXPECT_THAT(r->summary(), HasSubstr("No spare covers the lost ranks."));
  EXPECT_THAT(r->summary(),
              HasSubstr("world 4 -> 3, dp 4 -> 3, gradient accumulation 3 -> 4 micro-batches"));
  EXPECT_THAT(r->summary(), HasSubstr("restore checkpoint ckpt-10 (step 10) and train the 4 "
                                      "steps since again (the job is at step 14)"));

  ASSERT_EQ(Lose("c").size(), 1u);
  Rejoin({"a", "b", "d"});
  const v1::Job after = Job();
  ASSERT_EQ(after.phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(after.world_size(), r->new_world_size());
  EXPECT_EQ(after.dp(), r->new_dp());
  EXPECT_EQ(RankWorkers(),
            std::vector<std::string>(r->new_worker_ids().begin(), r->new_worker_ids().end()));
  for (const char* w : {"a", "b", "d"}) {
    const v1::Assignment a = AssignmentOf(w, 2);
    EXPECT_EQ(a.gradient_accumulation_steps(), r->new_gradient_accumulation_steps()) << w;
    EXPECT_EQ(a.restore().checkpoint_id(), r->restore().checkpoint_id()) << w;
    EXPECT_EQ(a.start_step(), r->restore().step()) << w;
  }
}

TEST_F(WhatIfTest, ARankThatNoLongerFitsWaitsAsASpare) {
  // global batch 8: dp must divide 8, so 3 survivors form dp 2 and the
  // last survivor by rank waits as a spare.
  Create(Spec(2, 4, /*pp=*/1, /*global_batch=*/8));
  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Join(w).ok());
  OpenSessions({"a", "b", "c", "d"});
  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"a"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->new_world_size(), 2u);
  EXPECT_EQ(r->new_dp(), 2u);
  EXPECT_EQ(r->new_gradient_accumulation_steps(), 4u);  // 8 / 2
  EXPECT_THAT(r->new_worker_ids(), ElementsAre("b", "c"));
  EXPECT_THAT(r->summary(), HasSubstr("d would wait as a spare."));
  EXPECT_THAT(r->summary(), HasSubstr("No checkpoint is committed: it would start from the "
                                      "seed and train all 0 steps again."));

  ASSERT_EQ(Lose("a").size(), 1u);
  Rejoin({"b", "c", "d"});
  EXPECT_EQ(Job().world_size(), 2u);
  EXPECT_EQ(RankWorkers(), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(Members()["d"].state(), v1::MEMBER_STATE_SPARE);
}

TEST_F(WhatIfTest, BelowMinWorkers) {
  Create(Spec(3, 3));
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Join(w).ok());
  OpenSessions({"a", "b", "c"});
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(Beat(w, 1, 6).ok());
  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"a"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->generation_ends());
  EXPECT_TRUE(r->below_min_workers());
  EXPECT_FALSE(r->spares_cover());
  EXPECT_EQ(r->new_world_size(), 0u);
  EXPECT_EQ(r->new_dp(), 0u);
  EXPECT_THAT(r->new_worker_ids(), IsEmpty());
  EXPECT_FALSE(r->has_restore());
  EXPECT_EQ(r->steps_retrained(), 6u);
  EXPECT_THAT(r->summary(), HasSubstr("The 2 live workers left would be fewer than the job "
                                      "needs (min_workers=3"));
  EXPECT_THAT(r->summary(), HasSubstr("FAIL after join_timeout 60s"));

  // The real thing: the survivors re-join and the job waits.
  ASSERT_EQ(Lose("a").size(), 1u);
  Rejoin({"b", "c"});
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(Job().world_size(), 0u);
}

TEST_F(WhatIfTest, LosingOnlyASpareEndsNothing) {
  Create(Spec(2, 2));
  for (const char* w : {"a", "b"}) ASSERT_TRUE(Join(w).ok());
  ASSERT_TRUE(Join("s").ok());
  OpenSessions({"a", "b", "s"});
  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"s"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses_size(), 1);
  EXPECT_EQ(r->losses(0).state(), v1::MEMBER_STATE_SPARE);
  EXPECT_FALSE(r->losses(0).has_rank());
  EXPECT_FALSE(r->generation_ends());
  EXPECT_FALSE(r->spares_cover());
  EXPECT_FALSE(r->below_min_workers());
  EXPECT_THAT(r->spares_used(), IsEmpty());
  EXPECT_EQ(r->new_world_size(), 0u);
  EXPECT_EQ(r->steps_retrained(), 0u);
  EXPECT_EQ(r->summary(),
            "Losing spare s ends nothing: generation 1 runs on (world 2, dp 2). 0 spares stay.");

  EXPECT_TRUE(Lose("s").empty());
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
}

TEST_F(WhatIfTest, SeveralWorkersAtOnceWithZeroShards) {
  // ZeRO stage 1, world 4 (dp 4) and two spares; lose ranks 0 and 2 and
  // one spare: the other spare takes a rank, dp 4 -> 3.
  v1::JobSpec spec = Spec(2, 4);
  spec.mutable_parallel()->set_zero_stage(1);
  Create(spec);
  for (const char* w : {"a", "b", "c", "d"}) ASSERT_TRUE(Join(w).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Join("s1").ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Join("s2").ok());
  OpenSessions({"a", "b", "c", "d", "s1", "s2"});
  // What the real assignments say a and c own.
  std::map<std::string, std::pair<uint32_t, uint64_t>> owned;
  for (const char* w : {"a", "c"}) {
    const v1::Assignment assignment = AssignmentOf(w, 1);
    for (const v1::ZeroShard& z : assignment.zero_shards()) {
      const uint64_t n = z.owned().end() - z.owned().begin();
      if (n == 0) continue;
      owned[w].first += 1;
      owned[w].second += n;
    }
    ASSERT_GT(owned[w].second, 0u) << w;
  }

  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"c", "s1", "a"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses_size(), 3);  // request order
  EXPECT_EQ(r->losses(0).worker_id(), "c");
  EXPECT_EQ(r->losses(0).rank(), 2u);
  EXPECT_EQ(r->losses(0).num_zero_shards(), owned["c"].first);
  EXPECT_EQ(r->losses(0).zero_shard_elements(), owned["c"].second);
  EXPECT_EQ(r->losses(1).worker_id(), "s1");
  EXPECT_EQ(r->losses(1).state(), v1::MEMBER_STATE_SPARE);
  EXPECT_FALSE(r->losses(1).has_rank());
  EXPECT_EQ(r->losses(1).num_zero_shards(), 0u);
  EXPECT_EQ(r->losses(2).worker_id(), "a");
  EXPECT_EQ(r->losses(2).rank(), 0u);
  EXPECT_EQ(r->losses(2).num_zero_shards(), owned["a"].first);
  EXPECT_EQ(r->losses(2).zero_shard_elements(), owned["a"].second);
  EXPECT_TRUE(r->generation_ends());
  EXPECT_THAT(r->spares_used(), ElementsAre("s2"));
  EXPECT_FALSE(r->spares_cover());
  EXPECT_EQ(r->new_world_size(), 3u);
  EXPECT_EQ(r->new_dp(), 3u);
  EXPECT_THAT(r->new_worker_ids(), ElementsAre("b", "d", "s2"));
  EXPECT_THAT(r->summary(), HasSubstr("Losing rank 2 (c), rank 0 (a) and spare s1 ends "
                                      "generation 1."));
  EXPECT_THAT(r->summary(), HasSubstr(absl::StrCat(
                                "ZeRO shards (", owned["a"].first + owned["c"].first, " units, ",
                                owned["a"].second + owned["c"].second, " elements)")));

  ASSERT_EQ(Lose("c").size(), 1u);
  EXPECT_TRUE(Lose("s1").empty());  // already FENCED by the end
  EXPECT_TRUE(Lose("a").empty());
  Rejoin({"b", "d", "s2"});
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Job().world_size(), r->new_world_size());
  EXPECT_EQ(Job().dp(), r->new_dp());
  EXPECT_EQ(RankWorkers(),
            std::vector<std::string>(r->new_worker_ids().begin(), r->new_worker_ids().end()));

  // Now a is LOST: supposing it lost again changes nothing.
  absl::StatusOr<v1::WhatIfResponse> again = WhatIf({"a"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->losses(0).state(), v1::MEMBER_STATE_LOST);
  EXPECT_FALSE(again->generation_ends());
  EXPECT_EQ(again->summary(),
            absl::StrCat("Losing no rank or spare: generation ", Job().generation(),
                         " runs on (world 3, dp 3). a (LOST) is not live: losing it changes "
                         "nothing. 0 spares stay."));
}

TEST_F(WhatIfTest, Errors) {
  Create(Spec(2, 2));
  ASSERT_TRUE(Join("a").ok());
  // Not formed yet (PENDING).
  absl::StatusOr<v1::WhatIfResponse> r = WhatIf({"a"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("has no formed generation (phase PENDING"));
  ASSERT_TRUE(Join("b").ok());
  ASSERT_EQ(Job().phase(), v1::JOB_PHASE_RUNNING);

  r = WhatIf({});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("lose_worker_ids is empty"));
  r = WhatIf({"a", "b", "a"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("lose_worker_ids[2]='a' repeats lose_worker_ids[0]"));
  r = WhatIf({"a", "zz"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("no worker 'zz' in job 'job'"));
  r = WhatIf({"a"}, "nope");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("no job 'nope'"));

  // RECOVERING: the next generation has not formed.
  OpenSessions({"a"});
  ASSERT_EQ(Lose("a").size(), 1u);
  r = WhatIf({"b"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("phase RECOVERING, generation 2"));

  // Terminal.
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job");
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  r = WhatIf({"b"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("is CANCELLED"));

  // An external job, formed.
  v1::JobSpec external;
  external.set_name("torchrun-external");
  external.mutable_external()->set_framework("torchrun");
  external.mutable_elastic()->set_min_workers(1);
  external.mutable_elastic()->set_max_workers(1);
  *external.mutable_elastic()->mutable_heartbeat_interval() = TimeUtil::SecondsToDuration(1);
  Create(external, "ext");
  v1::JoinJobRequest join;
  *join.mutable_worker() = Id("n0", 7, "ext");
  join.set_device("cpu");
  ASSERT_TRUE(coordinator_->JoinJob(join).ok());
  ASSERT_EQ(coordinator_->GetJob("ext")->world_size(), 1u);
  r = WhatIf({"n0"}, "ext");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("external job"));
}

}  // namespace
}  // namespace shardline::server

// Communicators::Progress: each group's Backend::Progress turned into the
// heartbeat's CollectiveProgress entries (group names, global peer ranks,
// skipped empty groups, the entry limit), on stub backends and on a real
// 2-rank Gloo group.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardline/v1/progress.pb.h"
#include "worker/comm/backend.h"
#include "worker/comm/store.h"
#include "worker/comm/test_util.h"
#include "worker/communicators.h"

namespace shardline::worker {
namespace {

namespace v1 = ::shardline::v1;

// A backend that only reports a fixed progress.
class ProgressStub : public Backend {
 public:
  ProgressStub(int rank, int size, BackendProgress progress)
      : rank_(rank), size_(size), progress_(std::move(progress)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  BackendProgress Progress() const override { return progress_; }
  std::shared_ptr<Work> AllReduce(void*, size_t, DType, ReduceOp) override { return nullptr; }
  std::shared_ptr<Work> AllGather(const void*, size_t, void*, DType) override { return nullptr; }
  std::shared_ptr<Work> ReduceScatter(const void*, void*, const std::vector<size_t>&, DType,
                                      ReduceOp) override {
    return nullptr;
  }
  std::shared_ptr<Work> AllToAll(const void*, const std::vector<size_t>&, void*,
                                 const std::vector<size_t>&, DType) override {
    return nullptr;
  }
  std::shared_ptr<Work> Broadcast(void*, size_t, DType, int) override { return nullptr; }
  std::shared_ptr<Work> Send(const void*, size_t, DType, int, uint32_t) override {
    return nullptr;
  }
  std::shared_ptr<Work> Recv(void*, size_t, DType, int, uint32_t) override { return nullptr; }
  std::shared_ptr<Work> Barrier() override { return nullptr; }
  void Abort() override {}

 private:
  const int rank_, size_;
  const BackendProgress progress_;
};

Communicators::Group StubGroup(const std::string& name, v1::GroupKind kind,
                               std::vector<uint32_t> ranks, int group_rank,
                               BackendProgress progress) {
  Communicators::Group g;
  g.name = name;
  g.kind = kind;
  g.group_rank = group_rank;
  const int size = static_cast<int>(ranks.size());
  g.ranks = std::move(ranks);
  g.backend = std::make_unique<ProgressStub>(group_rank, size, std::move(progress));
  return g;
}

TEST(CommunicatorsProgressTest, MapsEachGroupsOperationsAndPeersToGlobalRanks) {
  BackendProgress dp;
  dp.collective.operation = "all_reduce";
  dp.collective.sequence = 47;
  dp.collective.count = 1024;
  dp.collective.dtype = DType::kBFloat16;
  dp.collective.in_flight = true;
  dp.collective.elapsed = absl::Milliseconds(31200);
  BackendProgress pp;
  pp.collective.operation = "barrier";
  pp.collective.sequence = 1;
  pp.collective.elapsed = absl::Microseconds(250);
  OpProgress recv;
  recv.operation = "recv";
  recv.sequence = 9;
  recv.count = 64;
  recv.in_flight = true;
  recv.elapsed = absl::Seconds(2);
  recv.peer = 0;  // group rank 0 of pp/1 is global rank 1
  pp.p2p = recv;
  std::vector<Communicators::Group> groups;
  groups.push_back(StubGroup("tp/2", v1::GROUP_KIND_TP, {4, 5}, 1, {}));  // nothing issued
  groups.push_back(StubGroup("dp/1", v1::GROUP_KIND_DP, {1, 3, 5, 7}, 2, dp));
  groups.push_back(StubGroup("pp/1", v1::GROUP_KIND_PP, {1, 5}, 1, pp));
  std::unique_ptr<Communicators> comms = Communicators::FromGroups(3, std::move(groups));

  v1::RankProgress out;
  comms->Progress(&out);
  ASSERT_EQ(out.collectives_size(), 3) << out.DebugString();
  const v1::CollectiveProgress& a = out.collectives(0);
  EXPECT_EQ(a.group(), "dp/1");
  EXPECT_EQ(a.operation(), "all_reduce");
  EXPECT_EQ(a.sequence(), 47u);
  EXPECT_EQ(a.count(), 1024u);
  EXPECT_EQ(a.dtype(), "bfloat16");
  EXPECT_TRUE(a.in_flight());
  EXPECT_EQ(a.elapsed().seconds(), 31);
  EXPECT_EQ(a.elapsed().nanos(), 200000000);
  EXPECT_FALSE(a.has_peer_rank());
  const v1::CollectiveProgress& b = out.collectives(1);
  EXPECT_EQ(b.group(), "pp/1");
  EXPECT_EQ(b.operation(), "barrier");
  EXPECT_EQ(b.sequence(), 1u);
  EXPECT_EQ(b.dtype(), "float32");
  EXPECT_FALSE(b.in_flight());
  EXPECT_EQ(b.elapsed().nanos(), 250000);
  EXPECT_FALSE(b.has_peer_rank());
  const v1::CollectiveProgress& c = out.collectives(2);
  EXPECT_EQ(c.group(), "pp/1");
  EXPECT_EQ(c.operation(), "recv");
  EXPECT_EQ(c.sequence(), 9u);
  EXPECT_EQ(c.count(), 64u);
  EXPECT_TRUE(c.in_flight());
  ASSERT_TRUE(c.has_peer_rank());
  EXPECT_EQ(c.peer_rank(), 1u);
}

TEST(CommunicatorsProgressTest, AGroupWithOnlyPointToPointTrafficReportsItsSendAlone) {
  BackendProgress pp;
  OpProgress send;
  send.operation = "send";
  send.sequence = 3;
  send.count = 8;
  send.peer = 1;
  pp.p2p = send;
  std::vector<Communicators::Group> groups;
  groups.push_back(StubGroup("pp/0", v1::GROUP_KIND_PP, {2, 6}, 0, pp));
  v1::RankProgress out;
  Communicators::FromGroups(1, std::move(groups))->Progress(&out);
  ASSERT_EQ(out.collectives_size(), 1);
  EXPECT_EQ(out.collectives(0).operation(), "send");
  EXPECT_EQ(out.collectives(0).peer_rank(), 6u);
}

TEST(CommunicatorsProgressTest, AtMostTheCoordinatorsLimitOfEntries) {
  BackendProgress p;
  p.collective.operation = "all_gather";
  p.collective.sequence = 2;
  std::vector<Communicators::Group> groups;
  for (int i = 0; i < 70; ++i) {
    groups.push_back(StubGroup(absl::StrCat("tp/", i), v1::GROUP_KIND_TP, {0, 1}, 0, p));
  }
  v1::RankProgress out;
  Communicators::FromGroups(1, std::move(groups))->Progress(&out);
  ASSERT_EQ(out.collectives_size(), static_cast<int>(Communicators::kMaxProgressEntries));
  EXPECT_EQ(out.collectives(63).group(), "tp/63");
}

// A real 2-rank Gloo group: Progress after an all_reduce neither crashes nor
// reports anything but that group's all_reduce (the Gloo backend reports
// its operations once it implements Backend::Progress; until then nothing).
TEST(CommunicatorsProgressTest, RealGlooGroupAfterAnAllReduce) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::vector<std::unique_ptr<Backend>> backends(2);
  std::vector<absl::Status> created(2);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto b = CreateGlooBackend(store, r, 2, testing::TestOptions());
        created[r] = b.status();
        if (b.ok()) backends[r] = *std::move(b);
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(created[0].ok()) << created[0];
  ASSERT_TRUE(created[1].ok()) << created[1];
  std::vector<std::unique_ptr<Communicators>> comms;
  std::vector<std::vector<float>> data = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < 2; ++r) {
    works.push_back(backends[r]->AllReduce(data[r].data(), 4, DType::kFloat32, ReduceOp::kSum));
  }
  for (int r = 0; r < 2; ++r) SL_EXPECT_OK_WORK(works[r]);
  EXPECT_EQ(data[1][3], 44.0f);
  for (int r = 0; r < 2; ++r) {
    std::vector<Communicators::Group> groups;
    Communicators::Group g;
    g.name = "dp/0";
    g.kind = v1::GROUP_KIND_DP;
    g.ranks = {0, 1};
    g.group_rank = r;
    g.backend = std::move(backends[r]);
    groups.push_back(std::move(g));
    comms.push_back(Communicators::FromGroups(1, std::move(groups)));
  }
  for (int r = 0; r < 2; ++r) {
    // Both ranks are threads of this host.
    EXPECT_EQ(comms[r]->TransportSummary(),
              testing::TestsUseTcp()
                  ? "dp/0 TCP (2 ranks on this host: shared memory is off "
                    "(GlooOptions::shared_memory) on rank 0)"
                  : "dp/0 shared memory (2 ranks on this host)");
    v1::RankProgress out;
    comms[r]->Progress(&out);
    ASSERT_LE(out.collectives_size(), 1) << out.DebugString();
    for (const v1::CollectiveProgress& c : out.collectives()) {
      EXPECT_EQ(c.group(), "dp/0");
      EXPECT_EQ(c.operation(), "all_reduce");
      EXPECT_EQ(c.count(), 4u);
      EXPECT_EQ(c.dtype(), "float32");
      EXPECT_GE(c.sequence(), 1u);
      EXPECT_FALSE(c.in_flight());
    }
  }
}

}  // namespace
}  // namespace shardline::worker

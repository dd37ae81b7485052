#include "server/checkpoint_registry.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "common/clock.h"
#include "server/state_store.h"

namespace shardline::server {
namespace {

namespace v1 = ::shardline::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kJob[] = "job-a";
constexpr char kDir[] = "/ckpt/job-a";

// Wraps a StateStore: counts committed manifests written and fails writes on
// demand.
class TestStore final : public StateStore {
 public:
  TestStore() : inner_(NewMemoryStore()) {}
  absl::Status Write(const std::vector<Mutation>& mutations) override {
    if (fail_writes) return absl::UnavailableError("disk full (injected)");
    for (const Mutation& m : mutations) {
      if (m.kind == kCheckpointKind && m.value) {
        v1::Manifest manifest;
        if (manifest.ParseFromString(*m.value) &&
            manifest.state() == v1::CHECKPOINT_STATE_COMMITTED) {
          ++committed_writes;
        }
      }
    }
    return inner_->Write(mutations);
  }
  absl::StatusOr<std::vector<Record>> Scan(absl::string_view kind) const override {
    return inner_->Scan(kind);
  }
  std::atomic<bool> fail_writes{false};
  std::atomic<int> committed_writes{0};

 private:
  std::unique_ptr<StateStore> inner_;
};

CheckpointBeginParams Params(uint64_t generation, uint32_t world_size, uint64_t step,
                             uint32_t keep_last = 0) {
  CheckpointBeginParams p;
  p.job_id = kJob;
  p.generation = generation;
  p.world_size = world_size;
  p.step = step;
  p.directory = kDir;
  p.keep_last = keep_last;
  p.model.set_num_layers(2);
  p.model.set_hidden_size(8);
  p.parallel.set_tp(2);
  p.parallel.set_pp(1);
  p.parallel.set_zero_stage(1);
  p.dp = world_size / 2;
  p.seed = 1234;
  return p;
}

// Builds one rank's report; every piece goes to "rank-<r>.bin" back to back.
class ReportBuilder {
 public:
  ReportBuilder(uint32_t rank, std::string checkpoint_id, uint64_t data_cursor = 640)
      : file_(absl::StrFormat("rank-%05d.bin", rank)) {
    report_.rank = rank;
    report_.worker_id = absl::StrFormat("node0:cuda:%d", rank);
    report_.coordinates.set_tp_rank(rank % 2);
    report_.coordinates.set_dp_rank(rank / 2);
    report_.request.set_checkpoint_id(std::move(checkpoint_id));
    report_.request.set_data_cursor(data_cursor);
    report_.request.set_rng_state(absl::StrFormat("rng-%d", rank));
  }
  // A piece of `name` (fp32, `shape`): elements [begin, end) of `slice`
  // ({offset, length} per dim).
  ReportBuilder& Piece(const std::string& name, std::vector<uint64_t> shape,
                       std::vector<std::pair<uint64_t, uint64_t>> slice, uint64_t begin,
                       uint64_t end) {
    v1::SavedTensor* t = nullptr;
    for (v1::SavedTensor& x : *report_.request.mutable_tensors()) {
      if (x.name() == name) t = &x;
    }
    if (t == nullptr) {
      t = report_.request.add_tensors();
      t->set_name(name);
      t->set_dtype(v1::DTYPE_FLOAT32);
      for (uint64_t d : shape) t->add_global_shape(d);
    }
    v1::SavedPiece* p = t->add_pieces();
    for (auto [offset, length] : slice) {
      v1::DimSlice* d = p->mutable_slice()->add_dims();
      d->set_offset(offset);
      d->set_length(length);
    }
    p->mutable_range()->set_begin(begin);
    p->mutable_range()->set_end(end);
    p->set_file(file_);
    p->set_byte_offset(offset_);
    p->set_byte_length((end - begin) * 4);
    p->set_crc32c(static_cast<uint32_t>(begin * 31 + end));
    offset_ += (end - begin) * 4;
    return *this;
  }
  ShardReport Build() const {
    ShardReport r = report_;
    if (offset_ > 0) {
      v1::ShardFile* f = r.request.add_files();
      f->set_path(file_);
      f->set_size_bytes(offset_);
      f->set_crc32c(0xC0FFEE);
    }
    return r;
  }

 private:
  ShardReport report_;
  std::string file_;
  uint64_t offset_ = 0;
};

// W=4, tp=2, dp=2, ZeRO-1: "w" [8,6] split over tp along dim 1 (two 8x3
// slices, 24 elements each), each slice's range halved over dp; "b" [6]
// unsplit, saved by the tp_rank-0 ranks in halves.
ShardReport W4Report(uint32_t rank, const std::string& id, uint64_t data_cursor = 640) {
  const uint32_t tp_rank = rank % 2, dp_rank = rank / 2;
  ReportBuilder b(rank, id, data_cursor);
  b.Piece("w", {8, 6}, {{0, 8}, {3 * tp_rank, 3}}, 12 * dp_rank, 12 * dp_rank + 12);
  if (tp_rank == 0) b.Piece("b", {6}, {{0, 6}}, 3 * dp_rank, 3 * dp_rank + 3);
  return b.Build();
}

// C4: N=100 over D=8 with A=16: shard 16, rank r owns [16r, 16r+16) ∩ [0,100).
ShardReport C4Report(uint32_t rank, const std::string& id) {
  ReportBuilder b(rank, id);
  const uint64_t begin = std::min<uint64_t>(16 * rank, 100);
  const uint64_t end = std::min<uint64_t>(16 * rank + 16, 100);
  if (begin < end) b.Piece("u", {100}, {{0, 100}}, begin, end);
  return b.Build();
}

class CheckpointRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = Open(); }

  std::unique_ptr<CheckpointRegistry> Open(CheckpointRegistryOptions options = {}) {
    absl::StatusOr<std::unique_ptr<CheckpointRegistry>> r =
        CheckpointRegistry::Create(&store_, &clock_, std::move(options));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  std::string Begin(uint64_t generation, uint32_t world_size, uint64_t step,
                    uint32_t keep_last = 0) {
    absl::StatusOr<v1::BeginCheckpointResponse> r =
        registry_->Begin(Params(generation, world_size, step, keep_last));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->checkpoint_id() : "";
  }

  ReportShardResult Report(uint64_t generation, const ShardReport& report) {
    absl::StatusOr<ReportShardResult> r = registry_->ReportShard(kJob, generation, report);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ReportShardResult{};
  }

  // A full W=4 save of `step` in `generation`; returns its id.
  std::string SaveW4(uint64_t generation, uint64_t step, uint32_t keep_last = 0,
                     std::vector<ExpiredCheckpoint>* expired = nullptr) {
    const std::string id = Begin(generation, 4, step, keep_last);
    ReportShardResult last;
    for (uint32_t r = 0; r < 4; ++r) last = Report(generation, W4Report(r, id));
    EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED)
        << last.checkpoint.abort_reason();
    if (expired) *expired = last.expired;
    return id;
  }

  FakeClock clock_;
  TestStore store_;
  std::unique_ptr<CheckpointRegistry> registry_;
};

TEST_F(CheckpointRegistryTest, W4CommitsOnlyAfterAllFourReport) {
  absl::StatusOr<v1::BeginCheckpointResponse> begun = registry_->Begin(Params(1, 4, 10));
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ(begun->checkpoint_id(), "ckpt-step000000000010-gen1");
  EXPECT_EQ(begun->directory(), "/ckpt/job-a/ckpt-step000000000010-gen1");
  // Every rank joins the same checkpoint.
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::BeginCheckpointResponse> again = registry_->Begin(Params(1, 4, 10));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->checkpoint_id(), begun->checkpoint_id());
  }
  const std::string id = begun->checkpoint_id();
  for (uint32_t r : {3u, 0u, 2u}) {
    ReportShardResult res = Report(1, W4Report(r, id));
    EXPECT_EQ(res.checkpoint.state(), v1::CHECKPOINT_STATE_PENDING);
    EXPECT_EQ(res.committed_manifest, nullptr);
    EXPECT_FALSE(registry_->Latest(kJob).has_value());
  }
  EXPECT_EQ(store_.committed_writes, 0);
  absl::StatusOr<v1::Manifest> pending = registry_->GetManifest(kJob, id);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->state(), v1::CHECKPOINT_STATE_PENDING);
  EXPECT_EQ(pending->ranks_size(), 3);

  ReportShardResult last = Report(1, W4Report(1, id));
  EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(last.checkpoint.reported_ranks(), 4u);
  // Files: ranks 0 and 2 wrote 12*4 + 3*4 = 60 bytes, ranks 1 and 3 48.
  EXPECT_EQ(last.checkpoint.total_bytes(), 60u + 48u + 60u + 48u);
  EXPECT_TRUE(last.checkpoint.has_commit_time());
  ASSERT_NE(last.committed_manifest, nullptr);
  EXPECT_EQ(store_.committed_writes, 1);

  const v1::Manifest& m = *last.committed_manifest;
  EXPECT_EQ(m.state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(m.job_id(), kJob);
  EXPECT_EQ(m.step(), 10u);
  EXPECT_EQ(m.generation(), 1u);
  EXPECT_EQ(m.world_size(), 4u);
  EXPECT_EQ(m.dp(), 2u);
  EXPECT_EQ(m.seed(), 1234u);
  EXPECT_EQ(m.parallel().tp(), 2u);
  EXPECT_EQ(m.data_cursor(), 640u);
  EXPECT_EQ(m.directory(), begun->directory());
  ASSERT_EQ(m.ranks_size(), 4);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(m.ranks(r).rank(), r);
    EXPECT_EQ(m.ranks(r).worker_id(), absl::StrFormat("node0:cuda:%d", r));
    EXPECT_EQ(m.ranks(r).rng_state(), absl::StrFormat("rng-%d", r));
    ASSERT_EQ(m.ranks(r).files_size(), 1);
    EXPECT_EQ(m.ranks(r).files(0).path(), absl::StrFormat("rank-%05d.bin", r));
  }
  ASSERT_EQ(m.tensors_size(), 2);
  const v1::SavedTensor& b = m.tensors(0);
  EXPECT_EQ(b.name(), "b");
  EXPECT_THAT(b.global_shape(), ElementsAre(6u));
  ASSERT_EQ(b.pieces_size(), 2);
  EXPECT_EQ(b.pieces(0).rank(), 0u);
  EXPECT_EQ(b.pieces(0).range().begin(), 0u);
  EXPECT_EQ(b.pieces(1).rank(), 2u);
  EXPECT_EQ(b.pieces(1).range().begin(), 3u);
  EXPECT_EQ(b.pieces(1).byte_offset(), 48u);  // after rank 2's "w" piece
  const v1::SavedTensor& w = m.tensors(1);
  EXPECT_EQ(w.name(), "w");
  EXPECT_THAT(w.global_shape(), ElementsAre(8u, 6u));
  ASSERT_EQ(w.pieces_size(), 4);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(w.pieces(r).rank(), r);
    EXPECT_EQ(w.pieces(r).slice().dims(1).offset(), 3u * (r % 2));
    EXPECT_EQ(w.pieces(r).range().begin(), 12u * (r / 2));
    EXPECT_EQ(w.pieces(r).byte_length(), 48u);
  }

  std::optional<v1::CheckpointRef> latest = registry_->Latest(kJob);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->checkpoint_id(), id);
  EXPECT_EQ(latest->step(), 10u);
  absl::StatusOr<v1::Manifest> got = registry_->GetManifest(kJob, "");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*got, m));
  absl::StatusOr<v1::Manifest> only_b = registry_->GetManifest(kJob, id, {"b"});
  ASSERT_TRUE(only_b.ok());
  ASSERT_EQ(only_b->tensors_size(), 1);
  EXPECT_EQ(only_b->tensors(0).name(), "b");
  EXPECT_EQ(registry_->GetManifest(kJob, id, {"nope"}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointRegistryTest, C4PaddingNeverReachesCheckpointRank7ReportsNothing) {
  const std::string id = Begin(1, 8, 3);
  ReportShardResult last;
  for (uint32_t r = 0; r < 8; ++r) last = Report(1, C4Report(r, id));
  ASSERT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED)
      << last.checkpoint.abort_reason();
  const v1::Manifest& m = *last.committed_manifest;
  ASSERT_EQ(m.tensors_size(), 1);
  ASSERT_EQ(m.tensors(0).pieces_size(), 7);
  EXPECT_EQ(m.tensors(0).pieces(5).range().end(), 96u);
  EXPECT_EQ(m.tensors(0).pieces(6).rank(), 6u);
  EXPECT_EQ(m.tensors(0).pieces(6).range().begin(), 96u);
  EXPECT_EQ(m.tensors(0).pieces(6).range().end(), 100u);
  EXPECT_EQ(m.tensors(0).pieces(6).byte_length(), 16u);  // 4 real elements only
  ASSERT_EQ(m.ranks_size(), 8);
  EXPECT_EQ(m.ranks(7).files_size(), 0);
  EXPECT_EQ(last.checkpoint.total_bytes(), 400u);
}

TEST_F(CheckpointRegistryTest, GapAbortsWithDataLoss) {
  const std::string prev = SaveW4(1, 5);
  const std::string id = Begin(1, 8, 10);
  ReportShardResult last;
  for (uint32_t r = 0; r < 8; ++r) {
    ShardReport rep = C4Report(r, id);
    if (r == 6) rep = ReportBuilder(6, id).Piece("u", {100}, {{0, 100}}, 96, 99).Build();
    last = Report(1, rep);
  }
  EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(last.checkpoint.abort_reason(), StartsWith("DATA_LOSS: "));
  EXPECT_THAT(last.checkpoint.abort_reason(), HasSubstr("tensor \"u\""));
  EXPECT_THAT(last.checkpoint.abort_reason(), HasSubstr("[99, 100)"));
  EXPECT_EQ(last.committed_manifest, nullptr);
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), prev);
  EXPECT_EQ(store_.committed_writes, 1);  // only step 5
  // A later save of another step may start at once.
  EXPECT_TRUE(registry_->Begin(Params(1, 8, 11)).ok());
}

TEST_F(CheckpointRegistryTest, OverlapAbortsWithDataLoss) {
  const std::string id = Begin(1, 8, 10);
  ReportShardResult last;
  for (uint32_t r = 0; r < 8; ++r) {
    ShardReport rep = C4Report(r, id);
    if (r == 6) rep = ReportBuilder(6, id).Piece("u", {100}, {{0, 100}}, 90, 100).Build();
    last = Report(1, rep);
  }
  EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(last.checkpoint.abort_reason(), StartsWith("DATA_LOSS: "));
  EXPECT_THAT(last.checkpoint.abort_reason(),
              HasSubstr("[90, 96) of slice [0:100] are saved twice (ranks 5 and 6)"));
  EXPECT_FALSE(registry_->Latest(kJob).has_value());
  EXPECT_EQ(registry_->GetManifest(kJob, "").status().code(), absl::StatusCode::kNotFound);
  // Other ranks learn of it when they retry or report late.
  absl::StatusOr<ReportShardResult> retry = registry_->ReportShard(kJob, 1, C4Report(0, id));
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->checkpoint.state(), v1::CHECKPOINT_STATE_ABORTED);
}

TEST_F(CheckpointRegistryTest, MissingExpectedTensorAbortsWithDataLoss) {
  CheckpointBeginParams p = Params(1, 4, 10);
  p.expected_tensors = {"b", "w", "lm_head"};
  ASSERT_TRUE(registry_->Begin(p).ok());
  const std::string id = CheckpointRegistry::CheckpointId(1, 10);
  ReportShardResult last;
  for (uint32_t r = 0; r < 4; ++r) last = Report(1, W4Report(r, id));
  EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(last.checkpoint.abort_reason(), HasSubstr("\"lm_head\" was saved by no rank"));
}

// C10 (i): rank 2 dies before writing; the generation ends.
TEST_F(CheckpointRegistryTest, C10RankDiesBeforeWritingLatestStaysAtPreviousStep) {
  const std::string step5 = SaveW4(1, 5);
  const std::string id = Begin(1, 4, 10);
  for (uint32_t r : {0u, 1u, 3u}) Report(1, W4Report(r, id));
  std::optional<v1::CheckpointSummary> aborted = registry_->AbortPending(kJob, "rank 2 lost");
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->checkpoint_id(), id);
  EXPECT_EQ(aborted->state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_EQ(aborted->abort_reason(), "rank 2 lost");
  EXPECT_EQ(aborted->reported_ranks(), 3u);
  EXPECT_FALSE(registry_->AbortPending(kJob, "again").has_value());

  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), step5);
  EXPECT_EQ(registry_->Latest(kJob)->step(), 5u);
  EXPECT_EQ(registry_->GetManifest(kJob, "")->step(), 5u);
  // A late report of the dead attempt is refused with the reason.
  absl::StatusOr<ReportShardResult> late = registry_->ReportShard(kJob, 1, W4Report(2, id));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("rank 2 lost"));
  // The same (generation, step) cannot be reopened.
  absl::StatusOr<v1::BeginCheckpointResponse> reopen = registry_->Begin(Params(1, 4, 10));
  EXPECT_EQ(reopen.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reopen.status().message(), HasSubstr("aborted"));
  // Abort of an ABORTED one returns it unchanged; COMMITTED cannot be aborted.
  EXPECT_EQ(registry_->Abort(kJob, id, "x")->abort_reason(), "rank 2 lost");
  EXPECT_EQ(registry_->Abort(kJob, step5, "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->Abort(kJob, "nope", "x").status().code(), absl::StatusCode::kNotFound);
}

// C10 (ii): rank 2 wrote and reported its shard, then died before the commit.
TEST_F(CheckpointRegistryTest, C10RankDiesAfterItsShardBeforeCommit) {
  const std::string step5 = SaveW4(1, 5);
  const std::string id = Begin(1, 4, 10);
  for (uint32_t r : {0u, 1u, 2u}) Report(1, W4Report(r, id));
  ASSERT_TRUE(registry_->AbortPending(kJob, "rank 2 lost after its report").has_value());
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), step5);
  absl::StatusOr<ReportShardResult> late = registry_->ReportShard(kJob, 1, W4Report(3, id));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_.committed_writes, 1);
}

// C10 (iii): the retry of step 10 in generation 2 gets a new id and never
// mixes with the dead attempt's reports.
TEST_F(CheckpointRegistryTest, C10RetryInNewGenerationGetsNewIdAndNeverMixes) {
  SaveW4(1, 5);
  const std::string dead = Begin(1, 4, 10);
  for (uint32_t r : {0u, 1u, 2u}) {
    ShardReport rep =
        ReportBuilder(r, dead).Piece("u", {30}, {{0, 30}}, 10 * r, 10 * r + 10).Build();
    rep.request.mutable_files(0)->set_path("dead.bin");
    rep.request.mutable_tensors(0)->mutable_pieces(0)->set_file("dead.bin");
    Report(1, rep);
  }
  // Generation 2 forms with 3 ranks; the coordinator ends generation 1.
  ASSERT_TRUE(registry_->AbortPending(kJob, "generation 1 is over").has_value());
  const std::string retry = Begin(2, 3, 10);
  EXPECT_NE(retry, dead);
  EXPECT_EQ(retry, "ckpt-step000000000010-gen2");
  // A generation-1 caller cannot report into generation 2's checkpoint.
  absl::StatusOr<ReportShardResult> stale = registry_->ReportShard(
      kJob, 1, ReportBuilder(0, retry).Piece("u", {30}, {{0, 30}}, 0, 10).Build());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  ReportShardResult last;
  for (uint32_t r = 0; r < 3; ++r) {
    ShardReport rep =
        ReportBuilder(r, retry).Piece("u", {30}, {{0, 30}}, 10 * r, 10 * r + 10).Build();
    if (r < 2) {
      EXPECT_EQ(Report(2, rep).checkpoint.reported_ranks(), r + 1);
    } else {
      last = Report(2, rep);
    }
  }
  ASSERT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED);
  const v1::Manifest& m = *last.committed_manifest;
  EXPECT_EQ(m.generation(), 2u);
  EXPECT_EQ(m.world_size(), 3u);
  EXPECT_EQ(m.directory(), "/ckpt/job-a/ckpt-step000000000010-gen2");
  for (const v1::RankRecord& rr : m.ranks()) {
    for (const v1::ShardFile& f : rr.files()) EXPECT_NE(f.path(), "dead.bin");
  }
  for (const v1::SavedPiece& p : m.tensors(0).pieces()) EXPECT_NE(p.file(), "dead.bin");
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), retry);
  // The dead attempt stays ABORTED and is listed only with include_aborted.
  absl::StatusOr<v1::ListCheckpointsResponse> all = registry_->List(kJob, true, 0, "");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->checkpoints_size(), 3);
  EXPECT_EQ(all->checkpoints(0).checkpoint_id(),
            retry);                                      // step 10, generation 2
  EXPECT_EQ(all->checkpoints(1).checkpoint_id(), dead);  // step 10, generation 1
  EXPECT_EQ(all->checkpoints(1).state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_EQ(registry_->List(kJob, false, 0, "")->checkpoints_size(), 2);
}

// C10 during the commit: a generation end racing the commit waits for it;
// a durable commit stands, a failed one aborts and LATEST does not move.
TEST_F(CheckpointRegistryTest, C10AbortPendingDuringCommitWaitsForOutcome) {
  absl::Notification in_verify, release;
  CheckpointRegistryOptions options;
  options.verify_files = [&](const v1::Manifest& m) {
    if (m.step() == 10) {
      in_verify.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  registry_ = Open(std::move(options));
  SaveW4(1, 5);
  const std::string id = Begin(1, 4, 10);
  for (uint32_t r : {0u, 1u, 3u}) Report(1, W4Report(r, id));
  ReportShardResult last;
  std::thread committer([&] { last = Report(1, W4Report(2, id)); });
  in_verify.WaitForNotification();
  std::optional<v1::CheckpointSummary> aborted;
  std::atomic<bool> abort_returned{false};
  std::thread ender([&] {
    aborted = registry_->AbortPending(kJob, "rank 2 lost during the commit");
    abort_returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(abort_returned);  // waits for the commit in flight
  EXPECT_FALSE(registry_->Latest(kJob)->step() == 10);
  release.Notify();
  committer.join();
  ender.join();
  EXPECT_FALSE(aborted.has_value());
  EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(registry_->Latest(kJob)->step(), 10u);
}

TEST_F(CheckpointRegistryTest, StoreFailureAtCommitAbortsAndLatestDoesNotMove) {
  const std::string step5 = SaveW4(1, 5);
  const std::string id = Begin(1, 4, 10);
  for (uint32_t r : {0u, 1u, 2u}) Report(1, W4Report(r, id));
  store_.fail_writes = true;
  ReportShardResult last = Report(1, W4Report(3, id));
  store_.fail_writes = false;
  EXPECT_EQ(last.checkpoint.state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_THAT(last.checkpoint.abort_reason(), HasSubstr("disk full"));
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), step5);
  // After a restart it is still not restorable.
  registry_ = Open();
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), step5);
}

TEST_F(CheckpointRegistryTest, StoreFailureAtBeginLeavesNothingOpen) {
  store_.fail_writes = true;
  absl::StatusOr<v1::BeginCheckpointResponse> r = registry_->Begin(Params(1, 4, 10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  store_.fail_writes = false;
  EXPECT_EQ(registry_->List(kJob, true, 0, "")->checkpoints_size(), 0);
  EXPECT_TRUE(registry_->Begin(Params(1, 4, 10)).ok());  // the retry opens it
}

TEST_F(CheckpointRegistryTest, DuplicateIdenticalReportOkConflictingRejected) {
  const std::string id = Begin(1, 4, 10);
  Report(1, W4Report(0, id));
  // Identical retry (the fence and SavedPiece.rank are ignored).
  ShardReport again = W4Report(0, id);
  again.request.mutable_fence()->set_generation(1);
  again.request.mutable_tensors(0)->mutable_pieces(0)->set_rank(77);
  ReportShardResult res = Report(1, again);
  EXPECT_EQ(res.checkpoint.state(), v1::CHECKPOINT_STATE_PENDING);
  EXPECT_EQ(res.checkpoint.reported_ranks(), 1u);
  // Different content for the same rank.
  ShardReport other = W4Report(0, id);
  other.request.set_rng_state("different");
  EXPECT_EQ(registry_->ReportShard(kJob, 1, other).status().code(),
            absl::StatusCode::kAlreadyExists);
  for (uint32_t r = 1; r < 4; ++r) Report(1, W4Report(r, id));
  // The last reporter's retry after a lost answer sees the commit.
  EXPECT_EQ(Report(1, W4Report(3, id)).checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(store_.committed_writes, 1);
}

TEST_F(CheckpointRegistryTest, ReportValidationNamesTheField) {
  const std::string id = Begin(1, 4, 10);
  auto expect_invalid = [&](ShardReport rep, const std::string& needle) {
    absl::StatusOr<ReportShardResult> r = registry_->ReportShard(kJob, 1, rep);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(r.status().message(), HasSubstr(needle));
  };
  ShardReport rep = W4Report(0, id);
  rep.request.mutable_files(0)->set_path("/abs/rank.bin");
  expect_invalid(rep, "files[0].path \"/abs/rank.bin\"");
  rep = W4Report(0, id);
  rep.request.mutable_files(0)->set_path("../x.bin");
  expect_invalid(rep, "\"..\"");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->mutable_pieces(0)->set_file("other.bin");
  expect_invalid(rep, "tensor \"w\": pieces[0].file \"other.bin\" is not in files");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->mutable_pieces(0)->set_byte_length(47);
  expect_invalid(rep, "byte_length = 47; expected 12 elements * 4 bytes = 48");
  rep = W4Report(0, id);
  rep.request.mutable_files(0)->set_size_bytes(50);
  expect_invalid(rep, "tensor \"b\": pieces[0]: bytes [48, 60) are beyond the 50 bytes");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->mutable_pieces(0)->mutable_slice()->mutable_dims()->RemoveLast();
  expect_invalid(rep, "slice has 1 dims; global_shape [8,6] has 2");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->mutable_pieces(0)->mutable_slice()->mutable_dims(1)->set_offset(
      4);
  expect_invalid(rep, "slice.dims[1] = offset 4 + length 3 is outside global_shape[1] = 6");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->mutable_pieces(0)->mutable_range()->set_end(25);
  expect_invalid(rep, "range [0, 25) must be non-empty and inside its slice");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->set_name("");
  expect_invalid(rep, "tensors[0].name is empty");
  rep = W4Report(0, id);
  rep.request.mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  expect_invalid(rep, "dtype 0 is unspecified");
  rep = W4Report(0, id);
  rep.request.set_rng_state(std::string(checkpoint::kMaxRngStateBytes + 1, 'x'));
  expect_invalid(rep, "rng_state is 1048577 bytes");
  // C4 overhang: rank 6 saving its padding is refused at report time.
  rep = ReportBuilder(0, id).Piece("w", {8, 6}, {{0, 8}, {0, 3}}, 12, 28).Build();
  expect_invalid(rep, "range [12, 28)");

  // Cross-rank: dtype / shape / data_cursor must agree.
  Report(1, W4Report(0, id));
  rep = W4Report(1, id);
  rep.request.mutable_tensors(0)->set_dtype(v1::DTYPE_BFLOAT16);
  rep.request.mutable_tensors(0)->mutable_pieces(0)->set_byte_length(24);
  expect_invalid(rep,
                 "tensor \"w\": dtype DTYPE_BFLOAT16 global_shape [8,6] "
                 "disagrees with rank 0");
  expect_invalid(W4Report(1, id, /*data_cursor=*/641), "data_cursor 641 disagrees with 640");
  // Nothing was recorded by the refused reports.
  EXPECT_EQ(registry_->GetManifest(kJob, id)->ranks_size(), 1);

  // Unknown checkpoint, rank out of range.
  EXPECT_EQ(registry_->ReportShard(kJob, 1, W4Report(1, "nope")).status().code(),
            absl::StatusCode::kNotFound);
  rep = W4Report(0, id);
  rep.rank = 4;
  EXPECT_EQ(registry_->ReportShard(kJob, 1, rep).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointRegistryTest, BeginRules) {
  EXPECT_EQ(registry_->Begin(Params(1, 0, 10)).status().code(), absl::StatusCode::kInvalidArgument);
  CheckpointBeginParams no_dir = Params(1, 4, 10);
  no_dir.directory = "";
  EXPECT_EQ(registry_->Begin(no_dir).status().code(), absl::StatusCode::kInvalidArgument);

  SaveW4(1, 10);
  absl::StatusOr<v1::BeginCheckpointResponse> older = registry_->Begin(Params(1, 4, 10));
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  older = registry_->Begin(Params(2, 4, 9));
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.status().message(), HasSubstr("step 9 <= step 10"));

  const std::string pending = Begin(1, 4, 20);
  absl::StatusOr<v1::BeginCheckpointResponse> other = registry_->Begin(Params(1, 4, 30));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr(pending));
  EXPECT_THAT(other.status().message(), HasSubstr("PENDING"));
  // A newer generation supersedes a pending checkpoint the coordinator
  // forgot to abort.
  const std::string newer = Begin(2, 4, 30);
  absl::StatusOr<v1::ListCheckpointsResponse> all = registry_->List(kJob, true, 0, "");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->checkpoints_size(), 3);
  EXPECT_EQ(all->checkpoints(0).checkpoint_id(), newer);
  EXPECT_EQ(all->checkpoints(1).checkpoint_id(), pending);
  EXPECT_EQ(all->checkpoints(1).state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_EQ(all->checkpoints(1).abort_reason(), "superseded by generation 2");
}

TEST_F(CheckpointRegistryTest, CommitRpcListsMissingRanksAndAborts) {
  const std::string id = Begin(1, 4, 10);
  Report(1, W4Report(1, id));
  absl::StatusOr<v1::CheckpointSummary> s = registry_->Commit(kJob, id);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("ranks [0,2,3]"));
  EXPECT_EQ(registry_->List(kJob, true, 0, "")->checkpoints(0).state(),
            v1::CHECKPOINT_STATE_ABORTED);
  const std::string ok = SaveW4(1, 11);
  EXPECT_EQ(registry_->Commit(kJob, ok)->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(registry_->Commit(kJob, "nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointRegistryTest, CommitIsDurableAcrossRestartPendingIsNot) {
  const std::string step5 = SaveW4(1, 5);
  const std::string step7 = SaveW4(1, 7);
  const std::string pending = Begin(1, 4, 10);
  for (uint32_t r : {0u, 1u}) Report(1, W4Report(r, pending));
  const v1::Manifest before = *registry_->GetManifest(kJob, step7);

  registry_.reset();  // the coordinator dies
  registry_ = Open();
  ASSERT_NE(registry_, nullptr);
  std::optional<v1::CheckpointRef> latest = registry_->Latest(kJob);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->checkpoint_id(), step7);
  EXPECT_EQ(latest->step(), 7u);
  absl::StatusOr<v1::Manifest> after = registry_->GetManifest(kJob, "");
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, *after));
  EXPECT_EQ(registry_->GetManifest(kJob, step5)->step(), 5u);
  // A rank whose report's answer was lost in the restart retries it: the
  // raw reports are gone, but the manifest holds the same files, so it is
  // still a retry (answered with the summary). Different files are not.
  absl::StatusOr<ReportShardResult> retry = registry_->ReportShard(kJob, 1, W4Report(2, step7));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->checkpoint.checkpoint_id(), step7);
  EXPECT_EQ(retry->checkpoint.state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(retry->checkpoint.reported_ranks(), 4u);
  EXPECT_EQ(registry_->ReportShard(kJob, 1, W4Report(3, step7 + "x")).status().code(),
            absl::StatusCode::kNotFound);
  ShardReport other = W4Report(2, step7);
  other.request.mutable_files(0)->set_crc32c(other.request.files(0).crc32c() ^ 1);
  EXPECT_EQ(registry_->ReportShard(kJob, 1, other).status().code(),
            absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<v1::ListCheckpointsResponse> list = registry_->List(kJob, true, 0, "");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->checkpoints_size(), 3);
  EXPECT_EQ(list->checkpoints(0).checkpoint_id(), pending);
  EXPECT_EQ(list->checkpoints(0).state(), v1::CHECKPOINT_STATE_ABORTED);
  EXPECT_EQ(list->checkpoints(0).abort_reason(),
            "coordinator restarted while the checkpoint was pending");
  EXPECT_EQ(list->checkpoints(1).state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(list->checkpoints(1).reported_ranks(), 4u);
  EXPECT_EQ(list->checkpoints(1).total_bytes(), 216u);
  // The dead pending attempt's id is never reused; a new generation saves.
  EXPECT_EQ(registry_->Begin(Params(1, 4, 10)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  SaveW4(2, 10);
  // And a second restart keeps it all.
  registry_ = Open();
  EXPECT_EQ(registry_->Latest(kJob)->step(), 10u);
  EXPECT_EQ(registry_->List(kJob, true, 0, "")->checkpoints_size(), 4);
}

TEST_F(CheckpointRegistryTest, CorruptRecordIsDataLoss) {
  ASSERT_TRUE(store_.Write({Mutation::Put("checkpoint", "job-a/x", "\xff\xff garbage")}).ok());
  absl::StatusOr<std::unique_ptr<CheckpointRegistry>> r =
      CheckpointRegistry::Create(&store_, &clock_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
}

// A restore found the newest checkpoint corrupt and the coordinator fell
// back to the previous one: Latest moves back (durably), the lost steps can
// be saved again, and retention expires the corrupt one first.
TEST_F(CheckpointRegistryTest, MarkUnusableMovesLatestBackAndAllowsResaving) {
  const std::string s5 = SaveW4(1, 5, 2);
  const std::string s10 = SaveW4(1, 10, 2);
  ASSERT_EQ(registry_->Latest(kJob)->checkpoint_id(), s10);
  // A save at or below the newest committed step is refused...
  EXPECT_EQ(registry_->Begin(Params(2, 4, 10)).status().code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(registry_->MarkUnusable(kJob, s10, "crc32c mismatch").ok());
  ASSERT_TRUE(registry_->MarkUnusable(kJob, s10, "again").ok());  // idempotent
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), s5);
  EXPECT_EQ(registry_->GetManifest(kJob, "")->checkpoint_id(), s5);
  // ...it stays COMMITTED and readable by id, with the first reason...
  EXPECT_EQ(registry_->GetManifest(kJob, s10)->state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(registry_->GetManifest(kJob, s10)->unusable_reason(), "crc32c mismatch");
  EXPECT_EQ(registry_->GetManifest(kJob, s5)->unusable_reason(), "");
  // ...and the mark and the pointer survive a restart (both durable).
  registry_ = Open();
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), s5);
  EXPECT_EQ(registry_->UnusableReason(kJob, s10), "crc32c mismatch");
  EXPECT_FALSE(registry_->UnusableReason(kJob, s5).has_value());
  ASSERT_TRUE(registry_->MarkUnusable(kJob, s10, "crc32c mismatch").ok());

  // The re-trained step 10 is saved again in generation 2; retention
  // (keep_last 2) drops the corrupt one, not s5.
  std::vector<ExpiredCheckpoint> expired;
  const std::string again = SaveW4(2, 10, 2, &expired);
  EXPECT_NE(again, s10);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].ref.checkpoint_id(), s10);
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), again);

  // Marking every committed checkpoint leaves no latest, durably.
  ASSERT_TRUE(registry_->MarkUnusable(kJob, again, "short file").ok());
  ASSERT_TRUE(registry_->MarkUnusable(kJob, s5, "crc32c mismatch").ok());
  EXPECT_FALSE(registry_->Latest(kJob).has_value());
  EXPECT_EQ(registry_->GetManifest(kJob, "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_.Scan(kCheckpointLatestKind)->empty());
  // An id the registry never saw is remembered and harmless.
  EXPECT_TRUE(registry_->MarkUnusable("other-job", "ckpt-x", "gone").ok());
  EXPECT_FALSE(registry_->Latest("other-job").has_value());
  EXPECT_EQ(registry_->UnusableReason("other-job", "ckpt-x"), "gone");
  // A mark needs a reason.
  EXPECT_EQ(registry_->MarkUnusable(kJob, s5, "").code(), absl::StatusCode::kInvalidArgument);
}

// The marks are the registry's own durable records: ListCheckpoints shows
// their reasons, and the records the previous version's Coordinator wrote
// (kind "checkpoint_unusable", key "<job>/<id>", the reason) load as marks;
// a latest pointer still naming a marked checkpoint (its pointer write had
// failed) is moved at Create and rewritten.
TEST_F(CheckpointRegistryTest, UnusableMarksAreListedAndLoadFromTheStore) {
  const std::string s5 = SaveW4(1, 5);
  const std::string s10 = SaveW4(1, 10);
  ASSERT_TRUE(store_.Write({Mutation::Put(std::string(kCheckpointUnusableKind),
                                          absl::StrCat(kJob, "/", s10),
                                          "rank 0 (w0) reported DATA_LOSS: crc")})
                  .ok());
  registry_ = Open();
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), s5);
  absl::StatusOr<v1::ListCheckpointsResponse> list = registry_->List(kJob, false, 0, "");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->checkpoints_size(), 2);
  EXPECT_EQ(list->checkpoints(0).checkpoint_id(), s10);
  EXPECT_EQ(list->checkpoints(0).unusable_reason(), "rank 0 (w0) reported DATA_LOSS: crc");
  EXPECT_EQ(list->checkpoints(1).unusable_reason(), "");
  EXPECT_EQ(registry_->UnusableCheckpoints(kJob).size(), 1u);
  // The moved pointer was written: a second restart finds it in the store.
  absl::StatusOr<std::vector<Record>> latest = store_.Scan(kCheckpointLatestKind);
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 1u);
  v1::CheckpointRef ref;
  ASSERT_TRUE(ref.ParseFromString((*latest)[0].value));
  EXPECT_EQ(ref.checkpoint_id(), s5);
  // A mark is written with its pointer in one batch: a failed write fails
  // the mark (memory keeps it).
  store_.fail_writes = true;
  EXPECT_EQ(registry_->MarkUnusable(kJob, s5, "crc").code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(registry_->Latest(kJob).has_value());
  store_.fail_writes = false;
  registry_ = Open();
  EXPECT_EQ(registry_->Latest(kJob)->checkpoint_id(), s5);
  // A malformed key is DATA_LOSS.
  ASSERT_TRUE(
      store_.Write({Mutation::Put(std::string(kCheckpointUnusableKind), "no-slash", "x")}).ok());
  EXPECT_EQ(CheckpointRegistry::Create(&store_, &clock_).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointRegistryTest, KeepLastRetention) {
  std::vector<ExpiredCheckpoint> expired;
  const std::string s1 = SaveW4(1, 1, 2, &expired);
  EXPECT_TRUE(expired.empty());
  const std::string s2 = SaveW4(1, 2, 2, &expired);
  EXPECT_TRUE(expired.empty());
  const std::string s3 = SaveW4(1, 3, 2, &expired);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].ref.checkpoint_id(), s1);
  EXPECT_EQ(expired[0].ref.step(), 1u);
  EXPECT_EQ(expired[0].directory, "/ckpt/job-a/" + s1);
  const std::string s4 = SaveW4(1, 4, 2, &expired);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].ref.checkpoint_id(), s2);

  absl::StatusOr<v1::ListCheckpointsResponse> list = registry_->List(kJob, true, 0, "");
  ASSERT_EQ(list->checkpoints_size(), 2);
  EXPECT_EQ(list->checkpoints(0).checkpoint_id(), s4);
  EXPECT_EQ(list->checkpoints(1).checkpoint_id(), s3);
  EXPECT_EQ(registry_->GetManifest(kJob, s1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Scan(kCheckpointKind)->size(), 2u);
  // Cleanup sweep view, without removing anything.
  std::vector<ExpiredCheckpoint> beyond = registry_->BeyondRetention(kJob, 1);
  ASSERT_EQ(beyond.size(), 1u);
  EXPECT_EQ(beyond[0].ref.checkpoint_id(), s3);
  EXPECT_TRUE(registry_->BeyondRetention(kJob, 0).empty());
  // keep_last = 1 still keeps the newest.
  SaveW4(1, 5, 1, &expired);
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(registry_->Latest(kJob)->step(), 5u);
  registry_ = Open();
  EXPECT_EQ(registry_->List(kJob, false, 0, "")->checkpoints_size(), 1);
}

TEST_F(CheckpointRegistryTest, ListPages) {
  for (uint64_t step = 1; step <= 5; ++step) SaveW4(1, step);
  std::vector<uint64_t> steps;
  std::string token;
  do {
    absl::StatusOr<v1::ListCheckpointsResponse> page = registry_->List(kJob, false, 2, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->checkpoints_size(), 2);
    for (const auto& c : page->checkpoints()) steps.push_back(c.step());
    token = page->next_page_token();
  } while (!token.empty());
  EXPECT_THAT(steps, ElementsAre(5u, 4u, 3u, 2u, 1u));
  absl::StatusOr<v1::ListCheckpointsResponse> first = registry_->List(kJob, false, 2, "");
  EXPECT_EQ(registry_->List(kJob, true, 2, first->next_page_token()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->List(kJob, false, 2, "garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->List("other-job", false, 0, "")->checkpoints_size(), 0);
}

// 16 ranks begin and report from their own threads: one id, exactly one
// commit, repeated to shake out races.
TEST_F(CheckpointRegistryTest, SixteenRanksFromThreadsCommitExactlyOnce) {
  constexpr uint32_t kWorld = 16;
  for (uint64_t step = 1; step <= 20; ++step) {
    const int writes_before = store_.committed_writes;
    std::vector<std::string> ids(kWorld);
    std::vector<ReportShardResult> results(kWorld);
    std::vector<std::thread> threads;
    std::atomic<int> errors{0};
    for (uint32_t r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<v1::BeginCheckpointResponse> b = registry_->Begin(Params(1, kWorld, step));
        if (!b.ok()) {
          ++errors;
          return;
        }
        ids[r] = b->checkpoint_id();
        ReportBuilder builder(r, ids[r]);
        builder.Piece("emb", {kWorld * 4, 8}, {{r * 4, 4}, {0, 8}}, 0, 32);
        absl::StatusOr<ReportShardResult> rep = registry_->ReportShard(kJob, 1, builder.Build());
        if (!rep.ok()) {
          ++errors;
          return;
        }
        results[r] = *rep;
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_EQ(errors, 0);
    int committed_here = 0;
    for (uint32_t r = 0; r < kWorld; ++r) {
      EXPECT_EQ(ids[r], CheckpointRegistry::CheckpointId(1, step));
      if (results[r].committed_manifest != nullptr) ++committed_here;
    }
    EXPECT_EQ(committed_here, 1);
    EXPECT_EQ(store_.committed_writes - writes_before, 1);
    ASSERT_EQ(registry_->Latest(kJob)->step(), step);
    absl::StatusOr<v1::Manifest> m = registry_->GetManifest(kJob, "");
    ASSERT_EQ(m->ranks_size(), static_cast<int>(kWorld));
    ASSERT_EQ(m->tensors(0).pieces_size(), static_cast<int>(kWorld));
  }
}

}  // namespace
}  // namespace shardline::server

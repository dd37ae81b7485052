#include "checkpoint/geometry.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::checkpoint {
namespace {

namespace v1 = ::shardline::v1;
using ::testing::HasSubstr;

TEST(GeometryTest, DTypeBytesCoversEveryDType) {
  EXPECT_EQ(DTypeBytes(v1::DTYPE_FLOAT32), 4u);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_INT32), 4u);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_FLOAT16), 2u);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_INT64), 8u);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_UINT8), 1u);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeBytes(static_cast<v1::DType>(77)), 0u);
}

TEST(GeometryTest, NumelAndStrings) {
  v1::SavedTensor t;
  EXPECT_EQ(Numel(t.global_shape()), 1u);  // 0-d
  t.add_global_shape(8);
  t.add_global_shape(16);
  EXPECT_EQ(Numel(t.global_shape()), 128u);
  EXPECT_EQ(ShapeString(t.global_shape()), "[8,16]");
  t.add_global_shape(uint64_t{1} << 62);
  EXPECT_FALSE(Numel(t.global_shape()).has_value());
  v1::TensorSlice slice;
  auto* d = slice.add_dims();
  d->set_offset(0);
  d->set_length(4);
  d = slice.add_dims();
  d->set_offset(2);
  d->set_length(4);
  EXPECT_EQ(SliceString(slice), "[0:4,2:6]");
  EXPECT_EQ(SliceVolume(slice), 16u);
}

TEST(GeometryTest, ReportedPathsStayInsideTheDirectory) {
  EXPECT_TRUE(IsRelativeInsidePath("rank-00001.bin"));
  EXPECT_TRUE(IsRelativeInsidePath("sub/rank.bin"));
  EXPECT_FALSE(IsRelativeInsidePath(""));
  EXPECT_FALSE(IsRelativeInsidePath("/etc/passwd"));
  EXPECT_FALSE(IsRelativeInsidePath("../x"));
  EXPECT_FALSE(IsRelativeInsidePath("a/../../x"));
  v1::ReportShardRequest r;
  r.add_files()->set_path("../escape");
  absl::Status s = ValidateShardReport(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("files[0].path \"../escape\""));
  r.clear_files();
  r.set_rng_state(std::string(kMaxRngStateBytes + 1, 'x'));
  s = ValidateShardReport(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rng_state is 1048577 bytes"));
}

// Issue 14: a 300k-piece report made a 74.5 MB manifest. At most
// kMaxPiecesPerReport pieces over all tensors of one report.
TEST(GeometryTest, PiecesPerReportAreBounded) {
  v1::ReportShardRequest r;
  v1::ShardFile* f = r.add_files();
  f->set_path("rank-0.bin");
  f->set_size_bytes(uint64_t{4} * kMaxPiecesPerReport);
  auto add_tensor = [&](const std::string& name, uint64_t pieces) {
    v1::SavedTensor* t = r.add_tensors();
    t->set_name(name);
    t->set_dtype(v1::DTYPE_FLOAT32);
    t->add_global_shape(pieces);
    for (uint64_t i = 0; i < pieces; ++i) {
      v1::SavedPiece* p = t->add_pieces();
      v1::DimSlice* d = p->mutable_slice()->add_dims();
      d->set_offset(0);
      d->set_length(pieces);
      p->mutable_range()->set_begin(i);
      p->mutable_range()->set_end(i + 1);
      p->set_file("rank-0.bin");
      p->set_byte_offset(4 * i);
      p->set_byte_length(4);
    }
  };
  add_tensor("a", kMaxPiecesPerReport / 2);
  add_tensor("b", kMaxPiecesPerReport / 2);
  EXPECT_TRUE(ValidateShardReport(r).ok()) << ValidateShardReport(r);
  add_tensor("c", 1);
  absl::Status s = ValidateShardReport(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensors[].pieces: the report lists 65537 pieces in all; "
                                     "at most 65536 (kMaxPiecesPerReport)"));
}

TEST(CheckExactCoverTest, GeneralPathAcrossDifferentSlices) {
  // [4,6]: rows 0-1 saved as part of the whole-tensor slice, rows 2-3 as
  // their own slice: an exact cover the per-slice fast path cannot prove.
  v1::SavedTensor t;
  t.set_name("x");
  t.add_global_shape(4);
  t.add_global_shape(6);
  auto add = [&](uint64_t o0, uint64_t l0, uint64_t o1, uint64_t l1, uint64_t b, uint64_t e,
                 uint32_t rank) {
    v1::SavedPiece* p = t.add_pieces();
    auto* d0 = p->mutable_slice()->add_dims();
    d0->set_offset(o0);
    d0->set_length(l0);
    auto* d1 = p->mutable_slice()->add_dims();
    d1->set_offset(o1);
    d1->set_length(l1);
    p->mutable_range()->set_begin(b);
    p->mutable_range()->set_end(e);
    p->set_rank(rank);
  };
  add(0, 4, 0, 6, 0, 12, 0);
  add(2, 2, 0, 6, 0, 12, 1);
  EXPECT_TRUE(CheckExactCover(t).ok()) << CheckExactCover(t);
  // Rows 1-2 instead: rows 1 overlaps, row 3 missing.
  t.mutable_pieces(1)->mutable_slice()->mutable_dims(0)->set_offset(1);
  absl::Status s = CheckExactCover(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("elements [6, 12) (global row-major) are saved twice"));
  // Column split with a partial range on one side: runs across rows.
  t.clear_pieces();
  add(0, 4, 0, 3, 0, 6, 0);
  add(0, 4, 3, 3, 0, 12, 1);
  s = CheckExactCover(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("[12, 15) (global row-major) are in no piece"));
  add(0, 4, 3, 3, 0, 12, 2);  // duplicate of rank 1's half
  s = CheckExactCover(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("saved twice (ranks 1 and 2)"));
}

}  // namespace
// The tensors a plan's checkpoint holds: each parameter once (not per tp
// rank, never the tied copy, not when it has no element) with its two
// AdamW moments.
TEST(CheckpointTensorsTest, EveryParameterOnceWithItsMoments) {
  v1::Plan plan;
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
    v1::ZeroUnit* u = plan.add_units();
    u->set_tp_rank(tp_rank);
    v1::ZeroPiece* w = u->add_pieces();
    w->set_parameter("embedding.word_embeddings.weight");
    w->add_global_shape(16);
    w->add_global_shape(4);
    v1::ZeroPiece* empty = u->add_pieces();
    empty->set_parameter("empty.bias");
    empty->add_global_shape(0);
  }
  v1::ZeroUnit* head = plan.add_units();
  head->set_pp_rank(1);
  v1::ZeroPiece* tied = head->add_pieces();
  tied->set_parameter("head.tied");
  tied->add_global_shape(16);
  tied->set_tied_copy(true);
  v1::ZeroPiece* norm = head->add_pieces();
  norm->set_parameter("final_layernorm.weight");
  norm->add_global_shape(4);
  std::vector<std::string> names;
  for (const PlannedTensor& t : CheckpointTensors(plan)) {
    names.push_back(t.name);
    EXPECT_EQ(t.global_shape.size(), absl::StartsWith(t.name, "embedding") ? 2u : 1u) << t.name;
  }
  EXPECT_THAT(names, ::testing::ElementsAre(
                         "embedding.word_embeddings.weight",
                         "embedding.word_embeddings.weight/exp_avg",
                         "embedding.word_embeddings.weight/exp_avg_sq", "final_layernorm.weight",
                         "final_layernorm.weight/exp_avg", "final_layernorm.weight/exp_avg_sq"));
  EXPECT_TRUE(CheckpointTensors(v1::Plan()).empty());
}

}  // namespace shardline::checkpoint

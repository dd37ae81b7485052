// Checkpoint geometry: what a rank's ReportShard may say and whether the
// pieces of a tensor cover it exactly once. Element counts are elements;
// byte counts are bytes. Pieces are described in checkpoint.proto
// (proto/shardline/v1/checkpoint.proto): a piece is a TensorSlice of the
// global tensor plus a [begin, end) range of the slice's row-major elements.
//
//   if (absl::Status s = ValidateShardReport(request); !s.ok()) return s;
//   if (absl::Status s = CheckExactCover(tensor); !s.ok()) ...  // DATA_LOSS
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_CHECKPOINT_GEOMETRY_H_
#define SHARDLINE_CHECKPOINT_GEOMETRY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "shardline/v1/checkpoint.pb.h"
#include "shardline/v1/plan.pb.h"

namespace shardline::checkpoint {

// Largest rng_state a rank may report (bytes).
inline constexpr size_t kMaxRngStateBytes = 1 << 20;
// Pieces one ReportShard may list, over all its tensors (a rank's tensors
// times their ZeRO pieces; issue 14: a 300k-piece report made a 74.5 MB
// manifest and +326 MB RSS). About 250 bytes each in a manifest.
inline constexpr size_t kMaxPiecesPerReport = 65536;
// Pieces a checkpoint may hold, over all its ranks' reports
// (plan::kMaxShardRanges, the plan's own bound on the ranges it shards
// into); the registry refuses the report that would pass it.
inline constexpr size_t kMaxPiecesPerCheckpoint = 1 << 20;

// Bytes per element of `dtype` (FLOAT32/INT32 4, FLOAT16/BFLOAT16 2, INT64
// 8, UINT8 1); 0 for UNSPECIFIED or an unknown value.
uint64_t DTypeBytes(shardline::v1::DType dtype);

// The element count of `shape` (1 for a 0-d shape), or nullopt when it
// overflows uint64.
std::optional<uint64_t> Numel(const google::protobuf::RepeatedField<uint64_t>& shape);

// Elements of a slice (the product of its dims' lengths). Precondition:
// the slice was validated (no overflow).
uint64_t SliceVolume(const shardline::v1::TensorSlice& slice);

// "[0:4,2:6]" and "[8,16]" for messages.
std::string SliceString(const shardline::v1::TensorSlice& slice);
std::string ShapeString(const google::protobuf::RepeatedField<uint64_t>& shape);

// Whether `path` is non-empty, relative and free of ".." components: a
// file name a rank may report inside the checkpoint directory.
bool IsRelativeInsidePath(absl::string_view path);

// Checks one ReportShardRequest in itself: rng_state at most
// kMaxRngStateBytes; at most kMaxPiecesPerReport pieces in all; files with relative paths inside
// the checkpoint directory, each listed once; tensors named, with a dtype, a shape that does not
// overflow, pieces whose slice lies inside the shape and whose range lies inside the slice, in a
// file the report lists and inside its size. Errors: InvalidArgument naming the field
// (files[i].path, tensor "<name>" piece j ...) and what would be valid.
absl::Status ValidateShardReport(const shardline::v1::ReportShardRequest& report);

// Exact-cover check of one tensor's pieces (the commit check and the
// restore planner): OK when the pieces cover every element of
// `global_shape` exactly once. Assumes each piece was validated (slice
// inside the shape, range non-empty inside the slice). Errors: DataLoss
// naming the tensor and the first gap or overlap (global element ranges,
// or slice and ranges).
absl::Status CheckExactCover(const shardline::v1::SavedTensor& tensor);

// One tensor a checkpoint of `plan` must hold.
struct PlannedTensor {
  std::string name;
  std::vector<uint64_t> global_shape;  // elements per dimension
};

// Every tensor a checkpoint of `plan` saves (checkpoint.proto's names; the
// trainer's Slices, worker/train/trainer.cc): for each parameter of the
// plan's units with at least one element — once, whatever its tp split,
// and never its tied copy — the parameter "<name>" and its AdamW moments
// "<name>/exp_avg" and "<name>/exp_avg_sq", all of the parameter's global
// shape. Sorted by name. A plan without units gives nothing.
std::vector<PlannedTensor> CheckpointTensors(const shardline::v1::Plan& plan);

}  // namespace shardline::checkpoint

#endif  // SHARDLINE_CHECKPOINT_GEOMETRY_H_

#include "checkpoint/geometry.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardline::checkpoint {

namespace v1 = ::shardline::v1;

namespace {

// General exact-cover path: most contiguous runs examined per tensor.
constexpr size_t kMaxRunsPerTensor = size_t{1} << 25;

// a * b, or nullopt on uint64 overflow.
std::optional<uint64_t> Mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return std::nullopt;
  return a * b;
}

}  // namespace

uint64_t DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_UINT8:
      return 1;
    default:
      return 0;
  }
}

std::optional<uint64_t> Numel(const google::protobuf::RepeatedField<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    std::optional<uint64_t> m = Mul(n, d);
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

uint64_t SliceVolume(const v1::TensorSlice& slice) {
  uint64_t n = 1;
  for (const v1::DimSlice& d : slice.dims()) n *= d.length();  // validated: <= numel
  return n;
}

std::string SliceString(const v1::TensorSlice& slice) {
  std::vector<std::string> parts;
  for (const v1::DimSlice& d : slice.dims()) {
    parts.push_back(absl::StrCat(d.offset(), ":", d.offset() + d.length()));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

std::string ShapeString(const google::protobuf::RepeatedField<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

bool IsRelativeInsidePath(absl::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return false;
  }
  return true;
}

// Checks one report in itself (INVALID_ARGUMENT naming the field).
absl::Status ValidateShardReport(const v1::ReportShardRequest& r) {
  if (r.rng_state().size() > kMaxRngStateBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("rng_state is %d bytes; at most %d allowed",
                                                      r.rng_state().size(), kMaxRngStateBytes));
  }
  size_t pieces = 0;
  for (const v1::SavedTensor& t : r.tensors()) pieces += static_cast<size_t>(t.pieces_size());
  if (pieces > kMaxPiecesPerReport) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensors[].pieces: the report lists %d pieces in all; at most %d (kMaxPiecesPerReport)",
        pieces, kMaxPiecesPerReport));
  }
  std::map<std::string, uint64_t> file_size;
  for (int i = 0; i < r.files_size(); ++i) {
    const v1::ShardFile& f = r.files(i);
    if (!IsRelativeInsidePath(f.path())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("files[%d].path \"%s\" must be a non-empty path "
                          "relative to the checkpoint "
                          "directory, not absolute and without \"..\"",
                          i, f.path()));
    }
    if (!file_size.emplace(f.path(), f.size_bytes()).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("files[%d].path \"%s\" is listed twice", i, f.path()));
    }
  }
  std::set<std::string> names;
  for (int ti = 0; ti < r.tensors_size(); ++ti) {
    const v1::SavedTensor& t = r.tensors(ti);
    if (t.name().empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("tensors[%d].name is empty", ti));
    }
    const std::string where = absl::StrFormat("tensor \"%s\"", t.name());
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is reported twice"));
    }
    const uint64_t esize = DTypeBytes(t.dtype());
    if (esize == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: dtype %d is unspecified or unknown", where, t.dtype()));
    }
    const std::optional<uint64_t> numel = Numel(t.global_shape());
    if (!numel) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: global_shape %s overflows 64 bits",
                                                        where, ShapeString(t.global_shape())));
    }
    for (int pi = 0; pi < t.pieces_size(); ++pi) {
      const v1::SavedPiece& p = t.pieces(pi);
      const std::string pw = absl::StrFormat("%s: pieces[%d]", where, pi);
      if (p.slice().dims_size() != t.global_shape_size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s.slice has %d dims; global_shape %s has %d", pw, p.slice().dims_size(),
            ShapeString(t.global_shape()), t.global_shape_size()));
      }
      for (int d = 0; d < p.slice().dims_size(); ++d) {
        const v1::DimSlice& ds = p.slice().dims(d);
        const uint64_t extent = t.global_shape(d);
        if (ds.offset() > extent || ds.length() > extent - ds.offset()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s.slice.dims[%d] = offset %d + length %d is "
                              "outside global_shape[%d] = %d",
                              pw, d, ds.offset(), ds.length(), d, extent));
        }
      }
      const uint64_t volume = SliceVolume(p.slice());
      if (p.range().begin() >= p.range().end() || p.range().end() > volume) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s.range [%d, %d) must be non-empty and inside "
            "its slice %s of %d elements",
            pw, p.range().begin(), p.range().end(), SliceString(p.slice()), volume));
      }
      auto f = file_size.find(p.file());
      if (f == file_size.end()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s.file \"%s\" is not in files", pw, p.file()));
      }
      const uint64_t want = (p.range().end() - p.range().begin()) * esize;  // <= numel*8
      if (p.byte_length() != want) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s.byte_length = %d; expected %d elements * %d bytes = %d", pw,
                            p.byte_length(), p.range().end() - p.range().begin(), esize, want));
      }
      if (p.byte_offset() > f->second || p.byte_length() > f->second - p.byte_offset()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: bytes [%d, %d) are beyond the %d bytes of file \"%s\"", pw, p.byte_offset(),
            p.byte_offset() + p.byte_length(), f->second, p.file()));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

struct Run {
  uint64_t begin;
  uint64_t end;
  uint32_t rank;
  bool operator<(const Run& o) const { return std::tie(begin, end) < std::tie(o.begin, o.end); }
};

// Appends the global row-major runs of a validated piece; false if over `cap`.
bool AppendRuns(const v1::SavedTensor& t, const v1::SavedPiece& p, size_t cap,
                std::vector<Run>* runs) {
  const int n = t.global_shape_size();
  if (n == 0) {  // scalar: the one element
    runs->push_back({0, 1, p.rank()});
    return runs->size() <= cap;
  }
  std::vector<uint64_t> stride(n);
  stride[n - 1] = 1;
  for (int i = n - 2; i >= 0; --i) stride[i] = stride[i + 1] * t.global_shape(i + 1);
  // Blocks of `block` slice elements are contiguous globally: dims after j
  // are full, dim j is partial (or j == 0).
  int j = n - 1;
  uint64_t block = p.slice().dims(j).length();
  while (j > 0 && p.slice().dims(j).length() == t.global_shape(j)) {
    --j;
    block *= p.slice().dims(j).length();
  }
  const uint64_t b = p.range().begin(), e = p.range().end();
  for (uint64_t q = b / block; q * block < e; ++q) {
    // Global flat index of block q's first element.
    uint64_t rest = q, base = p.slice().dims(j).offset() * stride[j];
    for (int i = j - 1; i >= 0; --i) {
      const uint64_t len = p.slice().dims(i).length();
      base += (p.slice().dims(i).offset() + rest % len) * stride[i];
      rest /= len;
    }
    const uint64_t lo = std::max(b, q * block) - q * block;
    const uint64_t hi = std::min(e, (q + 1) * block) - q * block;
    runs->push_back({base + lo, base + hi, p.rank()});
    if (runs->size() > cap) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckExactCover(const v1::SavedTensor& t) {
  const uint64_t numel = *Numel(t.global_shape());
  const std::string where =
      absl::StrFormat("tensor \"%s\" (global_shape %s)", t.name(), ShapeString(t.global_shape()));
  // Fast path: pieces grouped by slice; each slice's ranges tile it, and the
  // distinct slices are disjoint and add up to the tensor.
  struct Box {
    const v1::TensorSlice* slice;
    std::vector<Run> ranges;  // slice-local
  };
  std::map<std::string, Box> boxes;
  for (const v1::SavedPiece& p : t.pieces()) {
    Box& box = boxes[p.slice().SerializeAsString()];
    box.slice = &p.slice();
    box.ranges.push_back({p.range().begin(), p.range().end(), p.rank()});
  }
  bool fast = true;
  uint64_t total = 0;
  for (auto& [key, box] : boxes) {
    std::sort(box.ranges.begin(), box.ranges.end());
    uint64_t cursor = 0;
    uint32_t last_rank = 0;
    for (const Run& r : box.ranges) {
      if (r.begin < cursor) {
        return absl::DataLossError(absl::StrFormat(
            "%s: elements [%d, %d) of slice %s are saved twice "
            "(ranks %d and %d)",
            where, r.begin, std::min(cursor, r.end), SliceString(*box.slice), last_rank, r.rank));
      }
      if (r.begin > cursor) fast = false;
      cursor = r.end;
      last_rank = r.rank;
    }
    const uint64_t volume = SliceVolume(*box.slice);
    if (cursor != volume) fast = false;
    total += volume;
  }
  if (fast && total == numel) {
    std::vector<const v1::TensorSlice*> list;
    for (const auto& [key, box] : boxes) list.push_back(box.slice);
    for (size_t a = 0; a < list.size() && fast; ++a) {
      for (size_t b = a + 1; b < list.size() && fast; ++b) {
        bool intersect = true;
        for (int d = 0; d < list[a]->dims_size(); ++d) {
          const v1::DimSlice &x = list[a]->dims(d), &y = list[b]->dims(d);
          if (x.offset() + x.length() <= y.offset() || y.offset() + y.length() <= x.offset()) {
            intersect = false;
            break;
          }
        }
        if (intersect) fast = false;
      }
    }
    if (fast) return absl::OkStatus();
  }
  // General path: global row-major runs.
  std::vector<Run> runs;
  for (const v1::SavedPiece& p : t.pieces()) {
    if (!AppendRuns(t, p, kMaxRunsPerTensor, &runs)) {
      return absl::DataLossError(
          absl::StrFormat("%s: pieces are too fragmented to verify (over %d contiguous runs)",
                          where, kMaxRunsPerTensor));
    }
  }
  std::sort(runs.begin(), runs.end());
  uint64_t cursor = 0;
  uint32_t last_rank = 0;
  for (const Run& r : runs) {
    if (r.begin > cursor) {
      return absl::DataLossError(absl::StrFormat(
          "%s: elements [%d, %d) (global row-major) are in no piece", where, cursor, r.begin));
    }
    if (r.begin < cursor) {
      return absl::DataLossError(
          absl::StrFormat("%s: elements [%d, %d) (global row-major) are saved twice (ranks %d "
                          "and %d)",
                          where, r.begin, std::min(cursor, r.end), last_rank, r.rank));
    }
    cursor = r.end;
    last_rank = r.rank;
  }
  if (cursor != numel) {
    return absl::DataLossError(absl::StrFormat(
        "%s: elements [%d, %d) (global row-major) are in no piece", where, cursor, numel));
  }
  return absl::OkStatus();
}

std::vector<PlannedTensor> CheckpointTensors(const v1::Plan& plan) {
  std::map<std::string, std::vector<uint64_t>> shapes;
  for (const v1::ZeroUnit& unit : plan.units()) {
    for (const v1::ZeroPiece& piece : unit.pieces()) {
      if (piece.tied_copy()) continue;
      const std::optional<uint64_t> numel = Numel(piece.global_shape());
      if (!numel || *numel == 0) continue;
      const std::vector<uint64_t> shape(piece.global_shape().begin(), piece.global_shape().end());
      for (const char* suffix : {"", "/exp_avg", "/exp_avg_sq"}) {
        shapes.emplace(absl::StrCat(piece.parameter(), suffix), shape);
      }
    }
  }
  std::vector<PlannedTensor> out;
  for (auto& [name, shape] : shapes) out.push_back({name, std::move(shape)});
  return out;
}

}  // namespace shardline::checkpoint

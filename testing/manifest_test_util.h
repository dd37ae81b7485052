// Test helper for checkpoint shard I/O tests: the manifest the coordinator
// builds at commit from the ranks' ReportShard requests.
#ifndef SHARDLINE_TESTING_MANIFEST_TEST_UTIL_H_
#define SHARDLINE_TESTING_MANIFEST_TEST_UTIL_H_

#include <map>
#include <string>

#include "shardline/v1/checkpoint.pb.h"

namespace shardline::checkpoint::testing {

namespace v1 = ::shardline::v1;

// One RankRecord per rank, pieces of each tensor ordered by rank then file
// position, rank filled in. Id, step, state and directory are left unset.
inline v1::Manifest MergeReports(const std::map<int, v1::ReportShardRequest>& reports) {
  v1::Manifest m;
  std::map<std::string, v1::SavedTensor*> by_name;
  for (const auto& [rank, report] : reports) {
    v1::RankRecord* r = m.add_ranks();
    r->set_rank(rank);
    *r->mutable_files() = report.files();
    for (const v1::SavedTensor& t : report.tensors()) {
      v1::SavedTensor*& dst = by_name[t.name()];
      if (dst == nullptr) {
        dst = m.add_tensors();
        dst->set_name(t.name());
        dst->set_dtype(t.dtype());
        *dst->mutable_global_shape() = t.global_shape();
      }
      for (const v1::SavedPiece& p : t.pieces()) {
        v1::SavedPiece* q = dst->add_pieces();
        *q = p;
        q->set_rank(rank);
      }
    }
  }
  return m;
}

}  // namespace shardline::checkpoint::testing

#endif  // SHARDLINE_TESTING_MANIFEST_TEST_UTIL_H_

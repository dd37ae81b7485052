// CheckpointRegistry: the read side (List, GetManifest). The rest is in
// checkpoint_registry.cc.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/checkpoint_registry.h"

namespace shardline::server {

namespace v1 = ::shardline::v1;

absl::StatusOr<v1::ListCheckpointsResponse> CheckpointRegistry::List(
    absl::string_view job_id, bool include_aborted, uint32_t page_size,
    absl::string_view page_token) const {
  const std::string flag = include_aborted ? "a" : "n";
  bool has_after = false;
  uint64_t after_step = 0, after_gen = 0;
  if (!page_token.empty()) {
    std::vector<std::string> parts = absl::StrSplit(page_token, ':');
    if (parts.size() != 4 || parts[0] != "v1" || (parts[1] != "a" && parts[1] != "n") ||
        !absl::SimpleAtoi(parts[2], &after_step) || !absl::SimpleAtoi(parts[3], &after_gen)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("page_token \"%s\" is malformed; pass "
                          "next_page_token of the previous page",
                          page_token));
    }
    if (parts[1] != flag) {
      return absl::InvalidArgumentError(
          "page_token is from a call with another include_aborted; start from "
          "the first page");
    }
    has_after = true;
  }
  if (page_size == 0) page_size = 50;
  page_size = std::min<uint32_t>(page_size, 1000);

  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> list;
  auto job = jobs_.find(job_id);
  if (job != jobs_.end()) {
    for (const auto& [id, e] : job->second.entries) {
      if (e.phase == Phase::kAborted && !include_aborted) continue;
      if (has_after && std::make_pair(e.manifest->step(), e.manifest->generation()) >=
                           std::make_pair(after_step, after_gen)) {
        continue;
      }
      list.push_back(&e);
    }
  }
  std::sort(list.begin(), list.end(), [](const Entry* a, const Entry* b) {
    return std::make_pair(a->manifest->step(), a->manifest->generation()) >
           std::make_pair(b->manifest->step(), b->manifest->generation());
  });
  v1::ListCheckpointsResponse response;
  for (size_t i = 0; i < list.size() && i < page_size; ++i) {
    v1::CheckpointSummary* c = response.add_checkpoints();
    *c = SummaryLocked(*list[i]);
    if (auto mark = job->second.unusable.find(c->checkpoint_id());
        mark != job->second.unusable.end()) {
      c->set_unusable_reason(mark->second);
    }
  }
  if (list.size() > page_size) {
    const v1::Manifest& last = *list[page_size - 1]->manifest;
    response.set_next_page_token(
        absl::StrFormat("v1:%s:%d:%d", flag, last.step(), last.generation()));
  }
  return response;
}

absl::StatusOr<v1::Manifest> CheckpointRegistry::GetManifest(
    absl::string_view job_id, absl::string_view checkpoint_id,
    const std::vector<std::string>& tensors) const {
  v1::Manifest m;
  {
    absl::MutexLock lock(&mu_);
    std::string id(checkpoint_id);
    if (id.empty()) {
      auto job = jobs_.find(job_id);
      if (job == jobs_.end() || job->second.latest_id.empty()) {
        return absl::NotFoundError(
            absl::StrFormat("job \"%s\" has no committed checkpoint yet", job_id));
      }
      id = job->second.latest_id;
    }
    const Entry* e = FindLocked(job_id, id);
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrFormat("no checkpoint \"%s\" in job \"%s\"", id, job_id));
    }
    m = BuildManifestLocked(*e);
    const JobCheckpoints& job = jobs_.find(job_id)->second;
    if (auto mark = job.unusable.find(id); mark != job.unusable.end()) {
      m.set_unusable_reason(mark->second);
    }
  }
  if (tensors.empty()) return m;
  std::set<std::string> wanted(tensors.begin(), tensors.end());
  google::protobuf::RepeatedPtrField<v1::SavedTensor> kept;
  for (v1::SavedTensor& t : *m.mutable_tensors()) {
    if (wanted.erase(t.name()) > 0) *kept.Add() = std::move(t);
  }
  if (!wanted.empty()) {
    return absl::NotFoundError(absl::StrFormat("tensor \"%s\" is not in checkpoint %s",
                                               *wanted.begin(), m.checkpoint_id()));
  }
  m.mutable_tensors()->Swap(&kept);
  return m;
}

}  // namespace shardline::server

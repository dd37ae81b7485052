#include "testing/fake_checkpoint_client.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "testing/manifest_test_util.h"

namespace shardline::client::testing {

FakeCheckpointClient::FakeCheckpointClient(const Clock* clock, std::string directory,
                                           uint32_t world_size)
    : clock_(clock), directory_(std::move(directory)), world_size_(world_size) {}

void FakeCheckpointClient::FailNext(const std::string& rpc, absl::Status status, int times) {
  absl::MutexLock lock(&mu_);
  failures_[rpc].emplace_back(std::move(status), times);
}

void FakeCheckpointClient::AbortNextCommit(std::string reason) {
  absl::MutexLock lock(&mu_);
  abort_next_commit_ = std::move(reason);
}

std::vector<std::string> FakeCheckpointClient::CallNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [rpc, time] : calls_) out.push_back(rpc);
  return out;
}

std::vector<absl::Time> FakeCheckpointClient::CallTimes(const std::string& rpc) const {
  absl::MutexLock lock(&mu_);
  std::vector<absl::Time> out;
  for (const auto& [name, time] : calls_) {
    if (name == rpc) out.push_back(time);
  }
  return out;
}

std::vector<v1::BeginCheckpointRequest> FakeCheckpointClient::begins() const {
  absl::MutexLock lock(&mu_);
  return begins_;
}

std::vector<v1::ReportShardRequest> FakeCheckpointClient::reports() const {
  absl::MutexLock lock(&mu_);
  return reports_;
}

std::vector<v1::GetManifestRequest> FakeCheckpointClient::manifest_requests() const {
  absl::MutexLock lock(&mu_);
  return manifest_requests_;
}

std::optional<v1::CheckpointSummary> FakeCheckpointClient::summary(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.summary;
}

std::optional<v1::Manifest> FakeCheckpointClient::manifest(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() ||
      it->second.summary.state() != v1::CHECKPOINT_STATE_COMMITTED) {
    return std::nullopt;
  }
  return it->second.manifest;
}

bool FakeCheckpointClient::AwaitCalls(const std::string& rpc, int n,
                                      absl::Duration real_timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::count_if(calls_.begin(), calls_.end(),
                         [&](const auto& c) { return c.first == rpc; }) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), real_timeout);
}

std::optional<absl::Status> FakeCheckpointClient::Begin(const std::string& rpc) {
  calls_.emplace_back(rpc, clock_->Now());
  auto it = failures_.find(rpc);
  if (it == failures_.end() || it->second.empty()) return std::nullopt;
  auto& [status, left] = it->second.front();
  absl::Status out = status;
  if (left != INT_MAX && --left <= 0) it->second.pop_front();
  return out;
}

void FakeCheckpointClient::CommitLocked(Entry& e) {
  if (abort_next_commit_.has_value()) {
    e.summary.set_state(v1::CHECKPOINT_STATE_ABORTED);
    e.summary.set_abort_reason(*abort_next_commit_);
    abort_next_commit_.reset();
    return;
  }
  e.manifest = checkpoint::testing::MergeReports(e.reports);
  e.manifest.set_checkpoint_id(e.summary.checkpoint_id());
  e.manifest.set_job_id(e.reports.begin()->second.fence().worker().job_id());
  e.manifest.set_step(e.summary.step());
  e.manifest.set_generation(e.summary.generation());
  e.manifest.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  e.manifest.set_directory(e.summary.directory());
  e.manifest.set_world_size(world_size_);
  e.manifest.set_data_cursor(e.reports.begin()->second.data_cursor());
  e.summary.set_state(v1::CHECKPOINT_STATE_COMMITTED);
}

absl::StatusOr<v1::BeginCheckpointResponse> FakeCheckpointClient::BeginCheckpoint(
    const v1::BeginCheckpointRequest& request) {
  absl::MutexLock lock(&mu_);
  begins_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("BeginCheckpoint")) return *failure;
  const std::string id =
      absl::StrFormat("ckpt-step%012d-gen%d", request.step(), request.fence().generation());
  Entry& e = entries_[id];
  if (e.summary.checkpoint_id().empty()) {
    e.summary.set_checkpoint_id(id);
    e.summary.set_step(request.step());
    e.summary.set_generation(request.fence().generation());
    e.summary.set_directory(absl::StrCat(directory_, "/", id));
    e.summary.set_world_size(world_size_);
    e.summary.set_state(v1::CHECKPOINT_STATE_PENDING);
  } else if (e.summary.state() == v1::CHECKPOINT_STATE_ABORTED) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", id, " was aborted; save a later step"));
  }
  v1::BeginCheckpointResponse response;
  response.set_checkpoint_id(id);
  response.set_directory(e.summary.directory());
  return response;
}

absl::StatusOr<v1::ReportShardResponse> FakeCheckpointClient::ReportShard(
    const v1::ReportShardRequest& request) {
  absl::MutexLock lock(&mu_);
  reports_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("ReportShard")) return *failure;
  auto it = entries_.find(request.checkpoint_id());
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", request.checkpoint_id()));
  }
  Entry& e = it->second;
  v1::ReportShardResponse response;
  if (e.summary.state() == v1::CHECKPOINT_STATE_PENDING) {
    e.reports[static_cast<int>(e.reports.size())] = request;
    e.summary.set_reported_ranks(static_cast<uint32_t>(e.reports.size()));
    if (e.reports.size() == world_size_) CommitLocked(e);
  }
  *response.mutable_checkpoint() = e.summary;
  return response;
}

absl::StatusOr<v1::CheckpointSummary> FakeCheckpointClient::CommitCheckpoint(
    const v1::CommitCheckpointRequest& request) {
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> failure = Begin("CommitCheckpoint")) return *failure;
  auto it = entries_.find(request.checkpoint_id());
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", request.checkpoint_id()));
  }
  Entry& e = it->second;
  if (e.summary.state() == v1::CHECKPOINT_STATE_PENDING) {
    if (e.reports.size() < world_size_) {
      return absl::FailedPreconditionError(absl::StrCat(
          e.reports.size(), " of ", world_size_, " ranks have reported"));
    }
    CommitLocked(e);
  }
  if (e.summary.state() == v1::CHECKPOINT_STATE_ABORTED) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", request.checkpoint_id(),
                                                      " was aborted: ", e.summary.abort_reason()));
  }
  return e.summary;
}

absl::StatusOr<v1::CheckpointSummary> FakeCheckpointClient::AbortCheckpoint(
    const v1::AbortCheckpointRequest& request) {
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> failure = Begin("AbortCheckpoint")) return *failure;
  auto it = entries_.find(request.checkpoint_id());
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", request.checkpoint_id()));
  }
  Entry& e = it->second;
  if (e.summary.state() == v1::CHECKPOINT_STATE_COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", request.checkpoint_id(), " is committed"));
  }
  if (e.summary.state() == v1::CHECKPOINT_STATE_PENDING) {
    e.summary.set_state(v1::CHECKPOINT_STATE_ABORTED);
    e.summary.set_abort_reason(request.reason());
  }
  return e.summary;
}

absl::StatusOr<v1::ListCheckpointsResponse> FakeCheckpointClient::ListCheckpoints(
    const v1::ListCheckpointsRequest& request) {
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> failure = Begin("ListCheckpoints")) return *failure;
  std::vector<const v1::CheckpointSummary*> listed;
  for (const auto& [id, e] : entries_) {
    if (request.include_aborted() || e.summary.state() != v1::CHECKPOINT_STATE_ABORTED) {
      listed.push_back(&e.summary);
    }
  }
  std::sort(listed.begin(), listed.end(),
            [](const v1::CheckpointSummary* a, const v1::CheckpointSummary* b) {
              return a->step() > b->step();
            });
  v1::ListCheckpointsResponse response;
  for (const v1::CheckpointSummary* s : listed) *response.add_checkpoints() = *s;
  return response;
}

absl::StatusOr<v1::Manifest> FakeCheckpointClient::GetManifest(
    const v1::GetManifestRequest& request) {
  absl::MutexLock lock(&mu_);
  manifest_requests_.push_back(request);
  if (std::optional<absl::Status> failure = Begin("GetManifest")) return *failure;
  const Entry* found = nullptr;
  for (const auto& [id, e] : entries_) {
    if (e.summary.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
    if (request.checkpoint_id().empty() ? found == nullptr ||
                                              e.summary.step() > found->summary.step()
                                        : id == request.checkpoint_id()) {
      found = &e;
    }
  }
  if (found == nullptr) {
    return absl::NotFoundError(request.checkpoint_id().empty()
                                   ? std::string("no checkpoint has been committed")
                                   : absl::StrCat("no checkpoint ", request.checkpoint_id()));
  }
  if (request.tensors().empty()) return found->manifest;
  v1::Manifest m = found->manifest;
  m.clear_tensors();
  const std::set<std::string> wanted(request.tensors().begin(), request.tensors().end());
  std::set<std::string> seen;
  for (const v1::SavedTensor& t : found->manifest.tensors()) {
    if (wanted.count(t.name()) > 0) {
      *m.add_tensors() = t;
      seen.insert(t.name());
    }
  }
  for (const std::string& name : wanted) {
    if (seen.count(name) == 0) {
      return absl::NotFoundError(absl::StrCat("no tensor '", name, "' in ",
                                              found->summary.checkpoint_id()));
    }
  }
  return m;
}

}  // namespace shardline::client::testing

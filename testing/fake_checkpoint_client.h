// FakeCheckpointClient: an in-memory client::CheckpointClient for unit tests
// of the worker's checkpointer, on a FakeClock. It keeps one job's
// checkpoints the way the coordinator does: BeginCheckpoint opens (or joins)
// "ckpt-step<step>-gen<generation>" under `directory`; the report that
// completes `world_size` ranks commits it (the manifest merged from the
// reports as testing/manifest_test_util.h does); GetManifest answers a
// committed one.
//
//   FakeClock clock;
//   auto checkpoints = std::make_shared<FakeCheckpointClient>(&clock, dir);
//   Checkpointer checkpointer(checkpoints, &clock);
//   checkpoints->FailNext("BeginCheckpoint", absl::UnavailableError("restarting"));
//
// Ranks: the n-th report of a checkpoint (0-based) is rank n.
//
// Thread-safety: thread-safe.
#ifndef SHARDLINE_TESTING_FAKE_CHECKPOINT_CLIENT_H_
#define SHARDLINE_TESTING_FAKE_CHECKPOINT_CLIENT_H_

#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "common/clock.h"

namespace shardline::client::testing {

class FakeCheckpointClient final : public CheckpointClient {
 public:
  // `clock` (not owned) stamps the calls.
  FakeCheckpointClient(const Clock* clock, std::string directory, uint32_t world_size = 1);

  // The next `times` calls of `rpc` fail with `status` (INT_MAX: all).
  void FailNext(const std::string& rpc, absl::Status status, int times = 1);
  // The next commit fails: the checkpoint is ABORTED with `reason` (the
  // completing ReportShard answers that summary).
  void AbortNextCommit(std::string reason);

  std::vector<std::string> CallNames() const;
  std::vector<absl::Time> CallTimes(const std::string& rpc) const;
  std::vector<v1::BeginCheckpointRequest> begins() const;
  std::vector<v1::ReportShardRequest> reports() const;
  std::vector<v1::GetManifestRequest> manifest_requests() const;
  // A checkpoint's summary / committed manifest, if there is one.
  std::optional<v1::CheckpointSummary> summary(const std::string& checkpoint_id) const;
  std::optional<v1::Manifest> manifest(const std::string& checkpoint_id) const;
  // Blocks until `rpc` was called `n` times; false after `real_timeout`.
  bool AwaitCalls(const std::string& rpc, int n,
                  absl::Duration real_timeout = absl::Seconds(60)) const;

  // CheckpointClient.
  absl::StatusOr<v1::BeginCheckpointResponse> BeginCheckpoint(
      const v1::BeginCheckpointRequest& request) override;
  absl::StatusOr<v1::ReportShardResponse> ReportShard(
      const v1::ReportShardRequest& request) override;
  absl::StatusOr<v1::CheckpointSummary> CommitCheckpoint(
      const v1::CommitCheckpointRequest& request) override;
  absl::StatusOr<v1::CheckpointSummary> AbortCheckpoint(
      const v1::AbortCheckpointRequest& request) override;
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request) override;
  absl::StatusOr<v1::Manifest> GetManifest(const v1::GetManifestRequest& request) override;

 private:
  struct Entry {
    v1::CheckpointSummary summary;
    std::map<int, v1::ReportShardRequest> reports;
    v1::Manifest manifest;  // once committed
  };

  // Records the call; the scripted failure, if any.
  std::optional<absl::Status> Begin(const std::string& rpc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits (or, scripted, aborts) `e`.
  void CommitLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const std::string directory_;
  const uint32_t world_size_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> abort_next_commit_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<std::pair<absl::Status, int>>> failures_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, absl::Time>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::BeginCheckpointRequest> begins_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportShardRequest> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GetManifestRequest> manifest_requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTING_FAKE_CHECKPOINT_CLIENT_H_

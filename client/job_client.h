// JobClient: jobs and everything an operator asks about them (JobService in
// proto/shardline/v1/coordinator.proto), as an interface and its gRPC
// implementation. shardctl's job, members, topology, owner, watch and whatif
// commands use it.
//
//   GrpcJobClient jobs(channel, options);
//   absl::StatusOr<v1::Job> job = jobs.GetJob(request);
//
// Errors: every method returns the coordinator's status code; the gRPC
// implementation's messages are client::FromGrpcStatus's (for an operator:
// they name the flag or the fix). The codes below are those particular to
// each call; any call may also return UNAVAILABLE, DEADLINE_EXCEEDED (no
// answer within --timeout), UNAUTHENTICATED, PERMISSION_DENIED (a worker
// token on an admin-only call or another job), INVALID_ARGUMENT (job_id
// empty or malformed) and NOT_FOUND (no such job).
//
// Retries: every call but DrainWorker is safe to repeat (CreateJob with the
// same job_id and spec). The gRPC implementation retries only between
// coordinator replicas, within the call's deadline (client/grpc_call.h:
// a follower's leader hint for every call; an ambiguous failure for all but
// DrainWorker); with one address it makes one attempt. WatchJob opens on the
// leader and, until its first event, follows a follower's hint.
//
// Deadlines: --timeout on every unary call; WatchJob has none.
//
// Thread-safety: implementations are thread-safe.
#ifndef SHARDLINE_CLIENT_JOB_CLIENT_H_
#define SHARDLINE_CLIENT_JOB_CLIENT_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/connection.h"
#include "client/coordinator_channels.h"
#include "grpcpp/grpcpp.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::client {

namespace v1 = ::shardline::v1;

namespace internal {
template <typename Service>
class ReplicaStubs;
}  // namespace internal

class JobClient {
 public:
  virtual ~JobClient() = default;

  // Creates a job (admin only); returns it with its worker token. Errors:
  // INVALID_ARGUMENT (a spec field missing or inconsistent: names it);
  // ALREADY_EXISTS (the id exists with another spec; the same spec answers
  // the existing job); RESOURCE_EXHAUSTED (too many jobs).
  virtual absl::StatusOr<v1::CreateJobResponse> CreateJob(const v1::CreateJobRequest& request) = 0;
  // Returns one job.
  virtual absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request) = 0;
  // Lists jobs newest first, a page at a time (admin only). Errors:
  // INVALID_ARGUMENT also for a page_token malformed or from other phases.
  virtual absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) = 0;
  // Cancels a job (admin only); a CANCELLED job is returned unchanged.
  // Errors: FAILED_PRECONDITION (COMPLETED or FAILED).
  virtual absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request) = 0;
  // Lists the job's workers, one entry per worker_id.
  virtual absl::StatusOr<v1::ListMembersResponse> ListMembers(
      const v1::ListMembersRequest& request) = 0;
  // Takes a worker out of the job gracefully (admin only); returns the
  // member as it is after the call. Errors: NOT_FOUND also for no such
  // worker; FAILED_PRECONDITION (the job is finished, the worker is not
  // live, or without force too few workers would stay).
  virtual absl::StatusOr<v1::Member> DrainWorker(const v1::DrainWorkerRequest& request) = 0;
  // Returns the plan of the latest formed generation. Errors:
  // FAILED_PRECONDITION (nothing formed yet).
  virtual absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& request) = 0;
  // Says which ranks hold a parameter's values, gradients and optimizer
  // states. Errors: NOT_FOUND also for no such parameter (lists close
  // names); INVALID_ARGUMENT (parameter empty, element_index too large);
  // FAILED_PRECONDITION (nothing formed yet).
  virtual absl::StatusOr<v1::GetShardOwnerResponse> GetShardOwner(
      const v1::GetShardOwnerRequest& request) = 0;
  // Streams the job's events in order (no deadline), calling `on_event` for
  // each. Returns OK when the stream ends (the job reached a terminal
  // phase) or when `on_event` returns false (the stream is then
  // cancelled); otherwise the stream's error: OUT_OF_RANGE (after_sequence
  // no longer retained or beyond the newest), RESOURCE_EXHAUSTED (the
  // watcher fell too far behind: reconnect after the last sequence).
  virtual absl::Status WatchJob(const v1::WatchJobRequest& request,
                                const std::function<bool(const v1::JobEvent&)>& on_event) = 0;
  // Says what losing the workers of request.lose_worker_ids at once would
  // do to the job (proto/shardline/v1/whatif.proto); changes nothing, so it
  // is safe to repeat. Errors: INVALID_ARGUMENT also for lose_worker_ids
  // empty, over kMaxWhatIfWorkers = 1024, or naming a worker twice;
  // NOT_FOUND also for a worker_id that never joined the job (named);
  // FAILED_PRECONDITION (the job is COMPLETED, FAILED or CANCELLED, is an
  // external job, or no generation has formed yet).
  virtual absl::StatusOr<v1::WhatIfResponse> WhatIf(const v1::WhatIfRequest& request) = 0;
};

// JobClient over gRPC: every call carries options.token and its deadline
// (client::Prepare); errors are client::FromGrpcStatus's.
class GrpcJobClient final : public JobClient {
 public:
  // One channel (one coordinator, or the first replica of options.address).
  GrpcJobClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options);
  // Every call to the leader of `channels` (client/coordinator_channels.h).
  GrpcJobClient(std::shared_ptr<CoordinatorChannels> channels, ConnectionOptions options);
  ~GrpcJobClient() override;

  absl::StatusOr<v1::CreateJobResponse> CreateJob(const v1::CreateJobRequest& request) override;
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request) override;
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) override;
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request) override;
  absl::StatusOr<v1::ListMembersResponse> ListMembers(
      const v1::ListMembersRequest& request) override;
  absl::StatusOr<v1::Member> DrainWorker(const v1::DrainWorkerRequest& request) override;
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& request) override;
  absl::StatusOr<v1::GetShardOwnerResponse> GetShardOwner(
      const v1::GetShardOwnerRequest& request) override;
  absl::Status WatchJob(const v1::WatchJobRequest& request,
                        const std::function<bool(const v1::JobEvent&)>& on_event) override;
  absl::StatusOr<v1::WhatIfResponse> WhatIf(const v1::WhatIfRequest& request) override;

 private:
  const ConnectionOptions options_;
  const std::unique_ptr<internal::ReplicaStubs<v1::JobService>> stubs_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_JOB_CLIENT_H_

// The client side of the coordinator API for shardctl: where the coordinator
// is, how to authenticate, and one method per RPC that returns absl::Status
// with a message an operator can act on.
//
//   ConnectionFlags flags;
//   ArgParser parser("shardctl job get");
//   flags.Register(parser);
//   ... parser.Parse(args) ...
//   absl::StatusOr<ConnectionOptions> options = flags.Resolve(parser);
//   absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
//       CoordinatorClient::Connect(*options);
//   absl::StatusOr<v1::Job> job = (*client)->GetJob("shakespeare");
//
// Where:  --coordinator HOST:PORT, else $SHARDLINE_COORDINATOR, else
//         127.0.0.1:7070.
// Auth:   --token, else $SHARDLINE_TOKEN, sent as "authorization: Bearer
//         <token>" (coordinator.proto); no token sends no metadata.
// TLS:    off unless --tls-ca FILE (PEM roots that sign the coordinator's
//         certificate) or --tls-cert FILE --tls-key FILE (client certificate
//         for mutual TLS; without --tls-ca the system roots are used).
// Deadline: --timeout (default 10s) on every unary call; WatchJob has none.
//
// A CoordinatorClient is thread-safe (gRPC stubs are); it holds one channel.
#ifndef SHARDLINE_CLIENT_COORDINATOR_CLIENT_H_
#define SHARDLINE_CLIENT_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::client {

inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
inline constexpr char kCoordinatorEnv[] = "SHARDLINE_COORDINATOR";
inline constexpr char kTokenEnv[] = "SHARDLINE_TOKEN";
inline constexpr absl::Duration kDefaultTimeout = absl::Seconds(10);
// coordinator.proto's kMaxMessageBytes: the largest request or response.
inline constexpr int kMaxMessageBytes = 64 << 20;

// Where and how to reach the coordinator.
struct ConnectionOptions {
  // "HOST:PORT" (IPv6 as "[::1]:7070"), or a gRPC target such as
  // "unix:/run/shardline.sock".
  std::string address = kDefaultCoordinator;
  // Where `address` came from, for messages: "--coordinator",
  // "SHARDLINE_COORDINATOR" or "the default".
  std::string address_source = "the default";
  // Bearer token; empty sends no authorization metadata.
  std::string token;
  // TLS: on when any of these is set. Paths of PEM files.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Deadline of each unary call.
  absl::Duration timeout = kDefaultTimeout;

  bool tls() const {
    return !tls_ca_file.empty() || !tls_cert_file.empty() || !tls_key_file.empty();
  }
};

// The connection flags every coordinator command takes. Register before
// ArgParser::Parse, Resolve after.
class ConnectionFlags {
 public:
  void Register(ArgParser& parser);

  // Applies flags, then the environment (`getenv`, injectable for tests),
  // then defaults. Errors (InvalidArgument, naming the flag or variable):
  // an address that is not HOST:PORT; --tls-cert without --tls-key or the
  // reverse; a --timeout that is not a positive duration; a token with
  // whitespace or control characters inside.
  absl::StatusOr<ConnectionOptions> Resolve(
      const ArgParser& parser,
      const std::function<const char*(const char*)>& getenv = nullptr) const;

 private:
  std::string coordinator_, token_, tls_ca_, tls_cert_, tls_key_, timeout_;
};

// grpc::Status → absl::Status (same code) with a message for operators:
//   UNAVAILABLE from the transport → "cannot reach the coordinator at
//     127.0.0.1:7070: connection refused; start shardline-coordinator or set
//     --coordinator / SHARDLINE_COORDINATOR" (also DNS and TLS failures);
//   DEADLINE_EXCEEDED of our own deadline → "no answer from the coordinator
//     at ... within 10s (--timeout) ...";
//   UNAUTHENTICATED / PERMISSION_DENIED → the server's message plus what
//     token to pass;
//   anything else → the server's message (it names the field and the fix).
// `rpc` names the call, e.g. "GetJob".
absl::Status FromGrpcStatus(const grpc::Status& status, const ConnectionOptions& options,
                            absl::string_view rpc);

// A channel to the coordinator with the options' TLS settings and a 64 MiB
// message limit; gRPC's transparent retries are off, so a refused connection
// is reported at once rather than retried for the whole deadline.
// InvalidArgument: a TLS file cannot be read (the message names the flag).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const ConnectionOptions& options);

class CoordinatorClient {
 public:
  // Opens a channel (lazily: nothing is sent until the first call, so an
  // unreachable coordinator shows up as the first call's UNAVAILABLE).
  // Errors: InvalidArgument naming the flag when a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(
      const ConnectionOptions& options);

  // Uses an existing channel (tests: an in-process server).
  CoordinatorClient(std::shared_ptr<grpc::Channel> channel, ConnectionOptions options);

  // One method per RPC; errors are FromGrpcStatus's, the codes each RPC can
  // return are listed in proto/shardline/v1/coordinator.proto.
  absl::StatusOr<v1::CreateJobResponse> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request);
  absl::StatusOr<v1::ListMembersResponse> ListMembers(const v1::ListMembersRequest& request);
  absl::StatusOr<v1::Member> DrainWorker(const v1::DrainWorkerRequest& request);
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& request);
  absl::StatusOr<v1::GetShardOwnerResponse> GetShardOwner(
      const v1::GetShardOwnerRequest& request);
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request);
  absl::StatusOr<v1::Manifest> GetManifest(const v1::GetManifestRequest& request);
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request);

  // Streams WatchJob, calling `on_event` for each event in order. Returns OK
  // when the stream ends (the job reached a terminal phase) or when
  // `on_event` returns false (the stream is then cancelled); otherwise the
  // stream's error. No deadline.
  absl::Status WatchJob(const v1::WatchJobRequest& request,
                        const std::function<bool(const v1::JobEvent&)>& on_event);

  const ConnectionOptions& options() const { return options_; }

 private:
  // Adds the bearer token and, when `deadline`, options_.timeout.
  void Prepare(grpc::ClientContext* context, bool deadline) const;

  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(absl::string_view rpc, Call call);

  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_COORDINATOR_CLIENT_H_

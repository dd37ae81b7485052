// Where the coordinator is and how to talk to it, for every program that
// does (shardctl, shardline-worker): connection options and their flags, the
// channel, the one preparation of a call (token + deadline) and the one
// conversion of a call's status into an operator's message.
//
//   ConnectionFlags flags;
//   ArgParser parser("shardctl job get");
//   flags.Register(parser);
//   ... parser.Parse(args) ...
//   absl::StatusOr<ConnectionOptions> options = flags.Resolve(parser);
//   absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeCoordinatorChannel(*options);
//
// Where:  --coordinator HOST:PORT, else $SHARDLINE_COORDINATOR, else
//         127.0.0.1:7070. With several coordinator replicas (high
//         availability, proto/shardline/v1/coordinator.proto "Replicas"):
//         every replica's address, comma-separated, e.g.
//         --coordinator c1:7070,c2:7070,c3:7070; the clients find the leader
//         (client/coordinator_channels.h).
// Auth:   --token, else --token-file FILE (its first line), else
//         $SHARDLINE_TOKEN, sent as "authorization: Bearer <token>"
//         (coordinator.proto); no token sends no metadata. A worker's
//         clients switch to its member token once JoinJob returned one
//         (MemberCredential below).
// TLS:    off unless --tls-ca FILE (PEM roots that sign the coordinator's
//         certificate) or --tls-cert FILE --tls-key FILE (client certificate
//         for mutual TLS; without --tls-ca the system roots are used).
// Deadline: --timeout (default 10s) on every short unary call (see each
//         service client for the calls that wait longer).
//
// Thread-safety: the functions are; a ConnectionFlags is used by one thread.
#ifndef SHARDLINE_CLIENT_CONNECTION_H_
#define SHARDLINE_CLIENT_CONNECTION_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"

namespace shardline::client {

inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
inline constexpr char kCoordinatorEnv[] = "SHARDLINE_COORDINATOR";
inline constexpr char kTokenEnv[] = "SHARDLINE_TOKEN";
inline constexpr absl::Duration kDefaultTimeout = absl::Seconds(10);
// coordinator.proto's kMaxMessageBytes: the largest request or response.
inline constexpr int kMaxMessageBytes = 64 << 20;
// The most replica addresses --coordinator / $SHARDLINE_COORDINATOR takes.
inline constexpr size_t kMaxCoordinatorAddresses = 16;

// The member token of one worker incarnation (coordinator.proto
// "Authentication"): GrpcWorkerClient::JoinJob stores the one a first join
// returns; while it holds one, Prepare sends it instead of
// ConnectionOptions::token (JoinJob re-joins included). Copies of a
// ConnectionOptions share it, so every client of one GrpcCoordinatorClients
// bundle (one worker) switches at once. One worker incarnation per bundle.
// Thread-safe.
class MemberCredential {
 public:
  void Set(std::string token) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    token_ = std::move(token);
  }
  // Empty until Set.
  std::string Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return token_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// Where and how to reach the coordinator.
struct ConnectionOptions {
  // "HOST:PORT" (IPv6 as "[::1]:7070"), or a gRPC target such as
  // "unix:/run/shardline.sock"; or a comma-separated list of such
  // addresses, one per coordinator replica (ParseCoordinatorAddresses).
  std::string address = kDefaultCoordinator;
  // Where `address` came from, for messages: "--coordinator",
  // "SHARDLINE_COORDINATOR" or "the default".
  std::string address_source = "the default";
  // Bearer token (the admin token, or a job's worker token); empty sends no
  // authorization metadata.
  std::string token;
  // A worker's member token, once it has one (null: never; see
  // MemberCredential). GrpcCoordinatorClients and GrpcWorkerClient make one
  // when it is null.
  std::shared_ptr<MemberCredential> member_credential;
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
  // an address list ParseCoordinatorAddresses refuses; --tls-cert without --tls-key or the
  // reverse; a --timeout that is not a positive duration; a token with
  // whitespace or control characters inside; both --token and
  // --token-file; a --token-file that cannot be read or is empty.
  absl::StatusOr<ConnectionOptions> Resolve(
      const ArgParser& parser,
      const std::function<const char*(const char*)>& getenv = nullptr) const;

 private:
  std::string coordinator_, token_, token_file_, tls_ca_, tls_cert_, tls_key_, timeout_;
};

// The replica addresses of a --coordinator / $SHARDLINE_COORDINATOR value:
// "A" or "A,B,C" (spaces around each are ignored), each HOST:PORT, "[v6]:PORT"
// or a gRPC URI target (unix:, dns:, ipv4:, ipv6:), in the order given.
// InvalidArgument starting with `source` (e.g. "--coordinator"): an empty
// list or entry ("a,,b"), an entry that is not HOST:PORT, the same address
// twice, more than kMaxCoordinatorAddresses.
absl::StatusOr<std::vector<std::string>> ParseCoordinatorAddresses(absl::string_view list,
                                                                   absl::string_view source);

// grpc::Status → absl::Status (same code) with a message for operators:
//   UNAVAILABLE from the transport → "cannot reach the coordinator at
//     127.0.0.1:7070: connection refused; start shardline-coordinator or set
//     --coordinator / SHARDLINE_COORDINATOR" (also DNS and TLS failures);
//   DEADLINE_EXCEEDED of our own deadline → "no answer from the coordinator
//     at ... within 10s (--timeout) ...";
//   UNAUTHENTICATED / PERMISSION_DENIED → the server's message plus what
//     token to pass;
//   anything else → the server's message (it names the field and the fix).
// `rpc` names the call, e.g. "GetJob". The messages name options.address
// (the client library's calls pass the replica they talked to last and add
// the others they tried).
absl::Status FromGrpcStatus(const grpc::Status& status, const ConnectionOptions& options,
                            absl::string_view rpc);

// The channel credentials of the options' TLS settings (insecure without
// TLS). InvalidArgument: a TLS file is missing, unreadable, not PEM of its
// kind or unparsable, or --tls-key is not the key of --tls-cert
// (common/tls_files.h; the message names the flag and the file).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCoordinatorCredentials(
    const ConnectionOptions& options);

// A channel to one coordinator address with `credentials` and a 64 MiB
// message limit; gRPC's transparent retries are off, so a refused connection
// is reported at once rather than retried for the whole deadline. Lazy:
// nothing is sent before the first call.
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials);

// MakeCoordinatorChannel to options.address (the first address of a list:
// several replicas need client/coordinator_channels.h) with
// MakeCoordinatorCredentials(options) and its errors.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const ConnectionOptions& options);

// The one preparation of every call to the coordinator: the bearer token
// (the member token when options.member_credential holds one, else
// options.token; none when both are empty) and a deadline `timeout` from now
// (none for absl::InfiniteDuration(), e.g. a stream open for the life of
// the process).
void Prepare(grpc::ClientContext* context, const ConnectionOptions& options,
             absl::Duration timeout);
// The same with an absolute deadline (absl::InfiniteFuture(): none): the
// attempts of one call that moves between replicas share one deadline.
void Prepare(grpc::ClientContext* context, const ConnectionOptions& options,
             absl::Time deadline);

// Extra gRPC deadline of a call that waits on the coordinator (a
// GetAssignment, KvGet, KvWait or Barrier with a wait timeout) beyond the
// wait the request asks for.
inline constexpr absl::Duration kWaitDeadlineSlack = absl::Seconds(5);

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_CONNECTION_H_

// A client of etcd v3's gRPC API (the subset Shardline uses, declared in
// proto/etcd/v3/rpc.proto with etcd's own field numbers): key ranges,
// transactions, leases and member status. No etcd C++ client is packaged
// by Debian, so this is ours; it speaks to a real etcd 3.4 server.
//
//   ClientOptions options;
//   options.endpoints = {"127.0.0.1:2379", "127.0.0.1:22379"};
//   absl::StatusOr<std::unique_ptr<Client>> etcd = Client::Connect(options);
//   absl::StatusOr<int64_t> lease = (*etcd)->LeaseGrant(absl::Seconds(2));
//   etcdserverpb::TxnRequest txn;  ... compares, success ops ...
//   absl::StatusOr<etcdserverpb::TxnResponse> r = (*etcd)->Txn(txn);
//
// Endpoints: a call goes to the current endpoint; when that one is
// unreachable (UNAVAILABLE from the transport) or answers that it has no
// raft leader, the next endpoint becomes current and the call is tried
// there, each endpoint at most once per call, all within the call's
// timeout. So a dead etcd member costs one failed attempt, not an outage.
// Only calls that are safe to repeat are retried that way (Range, Status,
// LeaseKeepAliveOnce, LeaseRevoke, LeaseTimeToLive; a Txn or LeaseGrant
// only when the connection was never established, i.e. the request cannot
// have reached a server, or when the member refused it for want of a raft
// leader, which etcd does before the request reaches raft). Each endpoint
// still untried gets an equal share of the time left, so a member that
// accepts connections but does not answer (paused) does not use it all; a
// Txn or LeaseGrant, once sent, has all the time left.
//
// Errors (every method): Unavailable when no endpoint answered (the message
// names each endpoint and its error, e.g. "etcd at 127.0.0.1:2379:
// connection refused; 127.0.0.1:22379: etcdserver: no leader"), or etcd
// has no quorum; DeadlineExceeded when options.timeout passed first;
// InvalidArgument for a request etcd refuses as malformed (e.g. too many
// operations in one Txn: etcd's --max-txn-ops, default 128; a request over
// --max-request-bytes, default 1.5 MiB); PermissionDenied /
// Unauthenticated from etcd's auth. Each message starts "etcd".
//
// Thread-safety: thread-safe; one Client is shared by the whole process.
#ifndef SHARDLINE_ETCD_CLIENT_H_
#define SHARDLINE_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/v3/rpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace shardline::etcd {

struct ClientOptions {
  // HOST:PORT of each etcd member (at least one).
  std::vector<std::string> endpoints;
  // nullptr: plaintext. Else TLS (see MakeEtcdCredentials).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Deadline of each call, all its endpoint attempts together.
  absl::Duration timeout = absl::Seconds(2);
};

// TLS to etcd from PEM files (the coordinator's --etcd-ca, --etcd-cert,
// --etcd-key). Empty ca_file: the system roots. cert_file and key_file
// together or neither. Errors name the flag and the file
// (common/tls_files.h): InvalidArgument, NotFound, PermissionDenied.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeEtcdCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file);

// The end of the range of every key that starts with `prefix` (etcd's
// "prefix" range_end: the prefix with its last byte incremented).
std::string PrefixRangeEnd(const std::string& prefix);

// One member's answer to Maintenance.Status.
struct MemberStatus {
  std::string endpoint;
  absl::Status status;      // OK when it answered
  std::string version;      // etcd version, e.g. "3.4.23"
  int64_t db_size_bytes = 0;
  uint64_t member_id = 0;
  uint64_t leader_id = 0;   // raft leader's member id (0: none)
  uint64_t raft_term = 0;
  bool is_leader() const { return status.ok() && member_id != 0 && member_id == leader_id; }
};

class Client {
 public:
  // Builds the channels; connects lazily (so an unreachable etcd is an
  // error of the first call, not of Connect). InvalidArgument: no
  // endpoints, an endpoint that is not HOST:PORT with a port in 1..65535,
  // or a timeout that is not positive.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  ~Client();

  const std::vector<std::string>& endpoints() const { return options_.endpoints; }

  // KV.Range as given (key, range_end, limit, revision...). Linearizable
  // unless request.serializable().
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& request);
  // Every key-value under `prefix`, in key order, paged by `page` keys
  // per Range at one revision (the first page's), so the result is one
  // consistent snapshot. `revision` (optional) gets that revision.
  absl::StatusOr<std::vector<etcdserverpb::KeyValue>> RangePrefix(const std::string& prefix,
                                                                  int64_t* revision = nullptr,
                                                                  int64_t page = 1000);
  // KV.Txn as given. A compare that fails is not an error: the answer's
  // succeeded() is false.
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);

  // Lease.LeaseGrant: a new lease of `ttl` (whole seconds, rounded up; etcd
  // raises a TTL below its minimum, 2 s with etcd's default election
  // timeout, to that minimum). Returns the lease ID.
  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl);
  // One keep-alive of lease `id`: a LeaseKeepAlive stream opened on the
  // endpoint's connection for this one request and answer (so the call's
  // timeout bounds it; etcd/client.cc says why). Returns the TTL the lease
  // has now. NotFound: the lease expired or was revoked (etcd answers TTL 0).
  absl::StatusOr<absl::Duration> LeaseKeepAliveOnce(int64_t id);
  // Lease.LeaseTimeToLive: the time lease `id` has left (whole seconds,
  // rounded down by etcd). NotFound: it expired or was revoked.
  absl::StatusOr<absl::Duration> LeaseTimeToLive(int64_t id);
  // Lease.LeaseRevoke: deletes the lease and every key attached to it.
  // Revoking a lease that does not exist is OK.
  absl::Status LeaseRevoke(int64_t id);

  // Maintenance.Status of every endpoint (each with its own `timeout`, in
  // parallel); never fails as a whole: each entry says how that member is.
  std::vector<MemberStatus> Status(absl::Duration timeout = absl::Seconds(1));

 private:
  class Impl;
  Client(ClientOptions options, std::unique_ptr<Impl> impl);
  const ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardline::etcd

#endif  // SHARDLINE_ETCD_CLIENT_H_

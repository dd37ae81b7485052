// shardctl status: the coordinator's replicas and the health of its state
// backend (CoordinatorService.GetStatus, served by every replica: the first
// of --coordinator's addresses that answers is asked).
//
//   shardctl status [--json]
//
// Text: which replica answered, the state backend, the leader's address
// (or that none is known), the election's lease TTL (etcd only), a table of
// the replicas (id, address, role, leader since, started) and, on etcd, a
// table of the etcd members (endpoint, healthy, raft leader, version, db
// size, raft term, error). --json: the CoordinatorStatus as protobuf JSON.
//
// Thread-compatible: writes only to the given stream.
#ifndef SHARDLINE_CLIENT_SHARDCTL_STATUS_COMMAND_H_
#define SHARDLINE_CLIENT_SHARDCTL_STATUS_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/coordinator_service_client.h"
#include "shardline/v1/replica.pb.h"

namespace shardline::shardctl {

// The text form above (pure; text from the coordinator is escaped by
// Printable).
std::string FormatCoordinatorStatus(const v1::CoordinatorStatus& status);

// GetStatus through `client`, then the text or JSON form to `out`. Errors:
// the client's (e.g. UNAVAILABLE naming every replica tried,
// PERMISSION_DENIED without the admin token); nothing is written then.
absl::Status PrintCoordinatorStatus(client::CoordinatorServiceClient& client, bool json,
                                    std::ostream& out);

// `shardctl status` with `args` (the words after "status"): the connection
// flags, --json, --help. InvalidArgument for a positional argument or a
// flag refused; otherwise PrintCoordinatorStatus's errors.
absl::Status RunStatusCommand(const std::vector<std::string>& args, std::ostream& out);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_STATUS_COMMAND_H_

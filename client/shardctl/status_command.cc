#include "client/shardctl/status_command.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/shardctl/command.h"
#include "client/shardctl/job_format.h"
#include "client/shardctl/table.h"

namespace shardline::shardctl {
namespace {

constexpr char kUsage[] =
    "Usage: shardctl status [--json]\n"
    "  The coordinator's replicas (which one leads, since when) and the health of its\n"
    "  state backend (each etcd member). Asks the first replica of --coordinator that\n"
    "  answers; needs the admin token.\n";

std::string Role(v1::ReplicaRole role) { return EnumName(v1::ReplicaRole_descriptor(), role); }

std::string YesNo(bool b) { return b ? "yes" : "no"; }

}  // namespace

std::string FormatCoordinatorStatus(const v1::CoordinatorStatus& status) {
  std::vector<std::pair<std::string, std::string>> head;
  head.emplace_back("Answered by",
                    status.replica_id().empty() ? "-" : Printable(status.replica_id()));
  head.emplace_back("State", status.state().empty() ? "-" : Printable(status.state()));
  head.emplace_back("Leader", status.leader_address().empty()
                                  ? "none known (election in progress, or etcd unreachable)"
                                  : Printable(status.leader_address()));
  if (status.has_lease_ttl()) {
    head.emplace_back("Lease TTL",
                      absl::FormatDuration(absl::Seconds(status.lease_ttl().seconds()) +
                                           absl::Nanoseconds(status.lease_ttl().nanos())));
  }
  std::string out = KeyValueBlock(head);

  out += "\n";
  if (status.replicas().empty()) {
    out += "No replicas registered.\n";
  } else {
    Table replicas({"REPLICA", "ADDRESS", "ROLE", "LEADER SINCE", "STARTED"});
    for (const v1::Replica& r : status.replicas()) {
      replicas.AddRow({Printable(r.replica_id(), 128), Printable(r.address(), 256), Role(r.role()),
                       r.has_leader_since() ? FormatTimestamp(r.leader_since()) : "-",
                       FormatTimestamp(r.start_time())});
    }
    out += replicas.Render();
  }
  if (!status.replicas_error().empty()) {
    out += "Only the answering replica is listed: " + Printable(status.replicas_error(), 512) +
           "\n";
  }

  if (!status.etcd().empty()) {
    out += "\n";
    Table etcd({"ETCD MEMBER", "HEALTHY", "LEADER", "VERSION", "DB SIZE", "RAFT TERM", "ERROR"});
    etcd.AlignRight(4);
    etcd.AlignRight(5);
    for (const v1::EtcdMemberStatus& m : status.etcd()) {
      const bool answered = m.healthy() || !m.version().empty();
      etcd.AddRow(
          {Printable(m.endpoint(), 256), YesNo(m.healthy()), answered ? YesNo(m.is_leader()) : "-",
           m.version().empty() ? "-" : Printable(m.version(), 64),
           answered ? HumanBytes(static_cast<uint64_t>(std::max<int64_t>(0, m.db_size_bytes())))
                    : "-",
           answered ? absl::StrCat(m.raft_term()) : "-",
           m.error().empty() ? "" : Printable(m.error(), 512)});
    }
    out += etcd.Render();
  }
  return out;
}

absl::Status PrintCoordinatorStatus(client::CoordinatorServiceClient& client, bool json,
                                    std::ostream& out) {
  absl::StatusOr<v1::CoordinatorStatus> status = client.GetStatus(v1::GetStatusRequest());
  if (!status.ok()) return status.status();
  Print(out, json ? ProtoToJson(*status) : FormatCoordinatorStatus(*status));
  return absl::OkStatus();
}

absl::Status RunStatusCommand(const std::vector<std::string>& args, std::ostream& out) {
  Command c("shardctl status");
  absl::StatusOr<std::optional<std::vector<std::string>>> positional = c.Parse(args, kUsage, out);
  if (!positional.ok()) return positional.status();
  if (!positional->has_value()) return absl::OkStatus();  // --help
  if (!(*positional)->empty()) {
    return Usage(absl::StrCat("shardctl status takes no arguments (got '", (**positional)[0], "')"),
                 kUsage);
  }
  absl::StatusOr<client::CoordinatorClients> clients = c.Connect();
  if (!clients.ok()) return clients.status();
  return PrintCoordinatorStatus(*clients->coordinator, c.json, out);
}

}  // namespace shardline::shardctl

// What every shardctl coordinator command shares (client/shardctl/
// job_commands.cc): its flags (the connection flags, --json, --help), the
// connection to the coordinator, and the helpers for usage errors and
// output.
//
//   Command c("shardctl job get");
//   auto positional = c.Parse(args, kUsage, out);
//   ...
//   absl::StatusOr<client::CoordinatorClients> clients = c.Connect();
//
// Thread-compatible.
#ifndef SHARDLINE_CLIENT_SHARDCTL_COMMAND_H_
#define SHARDLINE_CLIENT_SHARDCTL_COMMAND_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/coordinator_client.h"
#include "common/flags.h"

namespace shardline::shardctl {

// The connection flags' help, after every command's usage.
extern const char kConnectionHelp[];

struct Command {
  explicit Command(std::string name);

  // Parses `args`; on --help writes `usage` and the flags to `out` and
  // returns nullopt. InvalidArgument: a flag the parser refuses, or a
  // single-dash option (names it).
  absl::StatusOr<std::optional<std::vector<std::string>>> Parse(
      const std::vector<std::string>& args, const char* usage, std::ostream& out);

  // The coordinator's clients for the parsed connection flags (nothing is
  // sent yet). InvalidArgument: ConnectionFlags::Resolve's or a TLS file
  // that cannot be read.
  absl::StatusOr<client::CoordinatorClients> Connect();

  ArgParser parser;
  client::ConnectionFlags connection;
  bool json = false;
  bool help = false;
};

// InvalidArgument: `what`, then `usage`.
absl::Status Usage(const std::string& what, const char* usage);

// NotFound from a call naming a job can only mean the job: adds how to list
// the jobs.
absl::Status WithJobHint(const absl::Status& s);

// Job.job_id: 1..63 bytes of [a-z0-9-], starting with a letter;
// InvalidArgument starting with `what` (e.g. "--id=") otherwise.
absl::Status CheckJobId(const std::string& id, const std::string& what);

// Writes `text` and a final newline if it has none, and flushes.
void Print(std::ostream& out, const std::string& text);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_COMMAND_H_

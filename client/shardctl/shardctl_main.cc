// shardctl: the operator CLI. Subcommands:
//   plan         offline planning (no coordinator): layouts, schedules, ZeRO
//                shards, owners, memory.
//   job, members, topology, owner, checkpoint (checkpoints), watch, whatif,
//   kv           a running coordinator's jobs, over the v1 API
//                (client/shardctl/job_commands.h).
//   status       the coordinator's replicas and state backend
//                (client/shardctl/status_command.h).
// Exit codes: 0 success; 2 bad input (usage, a flag, a value, an unknown
// name); 1 any other failure (e.g. the coordinator cannot be reached).
// Messages go to stderr.
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "client/coordinator_client.h"
#include "client/shardctl/job_commands.h"
#include "client/shardctl/plan_command.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "spec/job_spec.h"

namespace {

constexpr char kUsage[] =
    "shardctl: operate Shardline training jobs\n"
    "\n"
    "Usage: shardctl COMMAND [flags]\n"
    "\n"
    "Offline:\n"
    "  plan      plan a layout offline: topology, pipeline schedule, ZeRO shards, memory\n"
    "            (shardctl plan --help)\n"
    "\n"
    "Against a coordinator (shardctl COMMAND --help for each):\n"
    "  job create SPEC_FILE [--id ID]      create a job from a YAML/JSON spec; prints its\n"
    "                                      worker token once\n"
    "  job get ID                          show a job\n"
    "  job list [--phase P[,P...]]         list jobs, newest first\n"
    "  job cancel ID [--reason TEXT]       cancel a job (already cancelled: says so,\n"
    "                                      exit 0; already completed/failed: exit 1)\n"
    "  members JOB                         the job's workers: state, rank, activity,\n"
    "                                      collective, straggler, heartbeat\n"
    "  drain JOB WORKER_ID [--reason TEXT] [--force]\n"
    "                                      take a worker out at a step boundary (after a\n"
    "                                      checkpoint); the job re-forms without it\n"
    "  topology JOB                        process groups and pipeline stages of the\n"
    "                                      current generation\n"
    "  owner JOB PARAMETER [--element I]   which ranks hold a parameter's state\n"
    "  checkpoint list JOB [--all]         the job's checkpoints, newest first\n"
    "                                      (also: checkpoints JOB)\n"
    "  checkpoint show JOB [ID] [--tensors]\n"
    "                                      a checkpoint's manifest (default: the restore\n"
    "                                      point)\n"
    "  checkpoint verify JOB [ID] | --dir DIR\n"
    "                                      check every shard file's and piece's checksum\n"
    "  checkpoint consolidate JOB [ID] | --dir DIR --out FILE [--optimizer]\n"
    "                                      write one unsharded safetensors file\n"
    "  watch JOB [--after SEQ] [--count N] stream the job's events, one line each\n"
    "  whatif JOB --lose WORKER[,WORKER...]\n"
    "                                      what losing those workers would do: ranks, spares,\n"
    "                                      new world / dp, checkpoint restored (changes nothing)\n"
    "  kv get JOB --generation G [--scope S] KEY\n"
    "                                      read a rendezvous key (debugging)\n"
    "  status                              the coordinator's replicas, which one leads,\n"
    "                                      and the health of each etcd member\n"
    "\n"
    "Connection flags, before or after the command: --coordinator HOST:PORT, or every\n"
    "replica's HOST:PORT comma-separated (else $SHARDLINE_COORDINATOR, else\n"
    "127.0.0.1:7070), --token T (else $SHARDLINE_TOKEN),\n"
    "--tls-ca FILE, --tls-cert FILE, --tls-key FILE, --timeout D (default 10s); --json\n"
    "prints responses as JSON.\n";

// Connection flags given before the command ("shardctl --coordinator A job
// list", as kubectl and etcdctl allow) move after it, where the commands
// parse them. Returns false (and says why) for a flag that is not one of them
// or lacks its value.
bool HoistConnectionFlags(std::vector<std::string>& args) {
  // The flags every coordinator command takes (ConnectionFlags and --json).
  shardline::ArgParser known("shardctl");
  shardline::client::ConnectionFlags connection;
  connection.Register(known);
  bool json = false;
  known.AddBool("json", &json, "");
  std::vector<std::string> flags;
  size_t i = 0;
  while (i < args.size() && args[i].rfind("--", 0) == 0 && args[i] != "--help") {
    const size_t eq = args[i].find('=');
    const std::string name = args[i].substr(2, eq == std::string::npos ? eq : eq - 2);
    const std::optional<bool> takes_value = known.TakesValue(name);
    if (!takes_value.has_value()) {
      std::cerr << "shardctl: '" << args[i]
                << "' before the command is not a connection flag; put the command first "
                   "(shardctl --help)\n";
      return false;
    }
    flags.push_back(args[i++]);
    if (*takes_value && eq == std::string::npos) {  // "--flag value", not "--flag=value"
      if (i >= args.size()) {
        std::cerr << "shardctl: --" << name << " needs a value\n";
        return false;
      }
      flags.push_back(args[i++]);
    }
  }
  if (flags.empty()) return true;
  args.erase(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i));
  if (args.empty()) {
    std::cerr << "shardctl: a command is missing after the connection flags (shardctl --help)\n";
    return false;
  }
  args.insert(args.end(), flags.begin(), flags.end());
  return true;
}

// An error as the terminal will show it: it may quote what the user or the
// coordinator sent, so control characters other than the line breaks of
// our own usage text are escaped, and each line is cut at 1 KiB.
std::string Shown(absl::string_view text) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    lines.push_back(shardline::AbbreviateValue(line, 1024));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!HoistConnectionFlags(args)) return 2;
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return 0;
  }
  // Everything shardctl sends is a protobuf string, which must be UTF-8.
  for (size_t a = 0; a < args.size(); ++a) {
    if (!shardline::IsUtf8(args[a])) {
      std::cerr << "shardctl: argument " << a + 1 << " ('"
                << shardline::AbbreviateValue(args[a])
                << "') is not UTF-8; give ids, names and reasons as UTF-8 text\n";
      return 2;
    }
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "plan") {
    const absl::Status s = shardline::shardctl::RunPlanCommand(args, std::cout);
    if (!s.ok()) {
      std::cerr << "shardctl plan: " << Shown(s.message()) << "\n";
      // 2: the input was wrong (a flag, a value, a name); 1: anything else.
      return shardline::shardctl::ExitCodeFor(s);
    }
    return 0;
  }
  if (shardline::shardctl::IsCoordinatorCommand(command)) {
    const absl::Status s = shardline::shardctl::RunCoordinatorCommand(command, args, std::cout);
    if (!s.ok()) {
      std::string name = "shardctl " + command;
      if ((command == "job" || command == "kv" || command == "checkpoint") && !args.empty() &&
          args[0][0] != '-') {
        name += " " + args[0];
      }
      std::cerr << Shown(name) << ": " << Shown(s.message()) << "\n";
      return shardline::shardctl::ExitCodeFor(s);
    }
    return 0;
  }
  std::cerr << "shardctl: unknown command '" << Shown(command) << "'\n\n" << kUsage;
  return 2;
}

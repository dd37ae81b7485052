// shardctl: the operator CLI. Subcommands:
//   plan    offline planning (no coordinator): layouts, schedules, ZeRO
//           shards, owners, memory.
// Exit codes: 0 success; 2 bad input (usage, a flag, a value, an unknown
// name); 1 any other failure. Messages go to stderr.
#include <iostream>
#include <string>
#include <vector>

#include "client/plan_command.h"

namespace {

constexpr char kUsage[] =
    "shardctl: operate Shardline training jobs\n"
    "\n"
    "Usage: shardctl COMMAND [flags]\n"
    "\n"
    "Commands:\n"
    "  plan      plan a layout offline: topology, pipeline schedule, ZeRO shards, memory\n"
    "            (shardctl plan --help)\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "plan") {
    const absl::Status s = shardline::client::RunPlanCommand(args, std::cout);
    if (!s.ok()) {
      std::cerr << "shardctl plan: " << s.message() << "\n";
      // 2: the input was wrong (a flag, a value, a name); 1: anything else.
      const bool bad_input = s.code() == absl::StatusCode::kInvalidArgument ||
                             s.code() == absl::StatusCode::kNotFound;
      return bad_input ? 2 : 1;
    }
    return 0;
  }
  std::cerr << "shardctl: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}

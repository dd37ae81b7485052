// `shardctl plan`: offline planning, no coordinator needed.
//
//   shardctl plan --layers 4 --hidden 128 --heads 4 --vocab 256 --seq 64
//       --tp 2 --pp 2 --dp 2 --zero 2 --micro-batches 4 [--json]   (one line)
//   shardctl plan --params 7500000000 --dp 64 --zero 3 --precision mixed
//   shardctl plan owner layers.0.mlp.fc1.weight [--element 17] <model flags>
//
// Thread-compatible (writes only to the given stream and the --schedule-svg
// file).
#ifndef SHARDLINE_CLIENT_SHARDCTL_PLAN_COMMAND_H_
#define SHARDLINE_CLIENT_SHARDCTL_PLAN_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardline::shardctl {

// Runs `shardctl plan` with `args` (everything after the word "plan") and
// writes the summary, or JSON with --json, to `out`. Errors:
//   InvalidArgument: a flag is unknown, malformed, missing or invalid (the
//     message names the flag and what would be valid), or the layout cannot
//     be planned (e.g. an interleaved schedule that would deadlock).
//   NotFound: `plan owner` with an unknown parameter name.
//   Unavailable: the --schedule-svg file could not be written.
// With "--help" it writes the usage to `out` and returns OK.
absl::Status RunPlanCommand(const std::vector<std::string>& args, std::ostream& out);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_PLAN_COMMAND_H_

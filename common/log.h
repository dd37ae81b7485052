// The one log line format of every Shardline program (stderr):
//
//   2026-12-01T18:26:32.123Z shardline-worker job=j gen=2 rank=1: restored ckpt-...
//   <time, UTC, ms>          <program> [<context>]: <text>
//
// The time is ISO 8601 in UTC with milliseconds, so lines of several
// programs and hosts sort and subtract; <program> is set once at start
// (SetLogProgram), <context> is optional key=value pairs naming where the
// line comes from. Each line is written with one write(2), so lines of
// several threads never interleave. Scripts parse it (deploy/local/demo.sh,
// bench/control_plane/node_loss.py): keep it stable.
//
// Thread-safe.
#ifndef SHARDLINE_COMMON_LOG_H_
#define SHARDLINE_COMMON_LOG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardline {

// The program name of every later line (default "shardline").
void SetLogProgram(absl::string_view program);

// Writes "<time> <program>: <text>\n".
void LogLine(absl::string_view text);
// Writes "<time> <program> <context>: <text>\n" (no context when empty).
void LogLine(absl::string_view context, absl::string_view text);

// The line LogLine(context, text) would write at `now`, without the newline.
std::string FormatLogLine(absl::Time now, absl::string_view program, absl::string_view context,
                          absl::string_view text);

}  // namespace shardline

#endif  // SHARDLINE_COMMON_LOG_H_

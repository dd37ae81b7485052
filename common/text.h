// Text a person gave or will read: UTF-8 checks, the escaped display form
// of control and invisible formatting characters, abbreviation for error
// messages, and the free-text field check the coordinator and shardctl share.
//
//   CheckText("reason", request.reason(), /*max_bytes=*/1024);
//   std::string shown = AbbreviateValue(untrusted);  // one short line
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_COMMON_TEXT_H_
#define SHARDLINE_COMMON_TEXT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardline {

// A value as an error message may quote it: control characters written as
// \n, \t, \xNN (C0, DEL, stray bytes) or \u00NN (C1), and anything past
// the first 64 bytes replaced by "... (N bytes)", cut on a UTF-8 character
// boundary. So a message naming a field stays one short line whatever the
// caller sent:
//   AbbreviateValue(std::string(20000, 'a')) ==
//       std::string(64, 'a') + "... (20000 bytes)"
// `shown` bytes instead of 64 for longer text (a whole error message).
std::string AbbreviateValue(absl::string_view value, size_t shown = 64);

// One character of `text` at byte i as messages and shardctl show it: the
// character itself, or an escape (\n, \t; \xNN for C0, DEL and bytes that
// are not UTF-8; \uNNNN for C1 and invisible formatting characters such as
// U+202E, which reorders the rest of a line). *consumed: the bytes it took
// (at least 1).
std::string DisplayCharacter(absl::string_view text, size_t i, size_t* consumed);

// The length of the UTF-8 character starting at text[i] (i < text.size()):
// 1 for ASCII, 2..4 for a well-formed sequence, 0 when malformed.
size_t Utf8Length(absl::string_view text, size_t i);

// Whether `text` is well-formed UTF-8.
bool IsUtf8(absl::string_view text);

// Whether `text` is well-formed UTF-8 without control characters (C0
// 0x00-0x1f, DEL, C1 U+0080-U+009F): what a terminal shows as typed.
bool IsDisplayText(absl::string_view text);

// Checks free text a person gave: at most `max_bytes`, well-formed UTF-8,
// no control characters (terminal escapes, newlines that fake output
// lines). Empty is fine unless `required`. InvalidArgument names `field`:
//   "reason='a\x1b[2Jb' contains control characters or malformed UTF-8;
//    use at most 1024 bytes of printable text on one line"
absl::Status CheckText(absl::string_view field, absl::string_view value, size_t max_bytes,
                       bool required = false);

// Names for a sentence: "" (none), "a", "a and b", "a, b and c"; past
// `max_shown` names the first max_shown and "and N more":
//   JoinForPeople({"w1", ..., "w10"}, 8) == "w1, w2, ..., w8 and 2 more"
std::string JoinForPeople(const std::vector<std::string>& names, size_t max_shown = 8);

}  // namespace shardline

#endif  // SHARDLINE_COMMON_TEXT_H_

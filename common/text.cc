#include "common/text.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardline {
namespace {

// C0, DEL, or a C1 control (U+0080..U+009F, UTF-8 C2 80..C2 9F): the
// character at text[i] of length `n`.
bool IsControl(absl::string_view text, size_t i, size_t n) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (n == 1) return c < 0x20 || c == 0x7f;
  return n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0;
}

// The code point of a well-formed 3-byte sequence at text[i] if it is an
// invisible formatting character a terminal acts on: zero-width ones
// (U+200B..U+200F, U+2060..U+2064, U+FEFF) and bidirectional overrides and
// isolates (U+202A..U+202E, U+2066..U+2069), which reorder the rest of a
// line. 0 otherwise.
uint32_t FormatCharacter(absl::string_view text, size_t i, size_t n) {
  if (n != 3) return 0;
  const uint32_t cp = ((static_cast<unsigned char>(text[i]) & 0x0Fu) << 12) |
                      ((static_cast<unsigned char>(text[i + 1]) & 0x3Fu) << 6) |
                      (static_cast<unsigned char>(text[i + 2]) & 0x3Fu);
  const bool format = (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x202A && cp <= 0x202E) ||
                      (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x2069) ||
                      cp == 0xFEFF;
  return format ? cp : 0;
}

}  // namespace

std::string DisplayCharacter(absl::string_view text, size_t i, size_t* consumed) {
  size_t n = Utf8Length(text, i);
  const bool stray = n == 0;
  if (stray) n = 1;
  *consumed = n;
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (c == '\n') return "\\n";
  if (c == '\t') return "\\t";
  if (stray || (n == 1 && (c < 0x20 || c >= 0x7f))) return absl::StrFormat("\\x%02x", c);
  if (IsControl(text, i, n)) {
    return absl::StrFormat("\\u%04x", static_cast<unsigned char>(text[i + 1]));
  }
  if (const uint32_t cp = FormatCharacter(text, i, n); cp != 0) {
    return absl::StrFormat("\\u%04x", cp);
  }
  return std::string(text.substr(i, n));
}

std::string AbbreviateValue(absl::string_view value, size_t shown) {
  std::string out;
  size_t i = 0;
  while (i < value.size()) {
    size_t n = 0;
    std::string piece = DisplayCharacter(value, i, &n);
    if (i + n > shown) break;
    out += piece;
    i += n;
  }
  if (i < value.size()) absl::StrAppend(&out, "... (", value.size(), " bytes)");
  return out;
}

bool IsUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8Length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool IsDisplayText(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8Length(text, i);
    if (n == 0 || IsControl(text, i, n) || FormatCharacter(text, i, n) != 0) return false;
    i += n;
  }
  return true;
}

absl::Status CheckText(absl::string_view field, absl::string_view value, size_t max_bytes,
                       bool required) {
  const std::string rule = absl::StrCat("use ", required ? "1.." : "at most ", max_bytes,
                                        " bytes of printable text on one line");
  if (required && value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty; ", rule));
  if (required && absl::StripAsciiWhitespace(value).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, "='", AbbreviateValue(value), "' is blank; ", rule));
  }
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, "='", AbbreviateValue(value), "' is too long; ", rule));
  }
  if (!IsDisplayText(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, "='", AbbreviateValue(value),
                                "' contains control characters or malformed UTF-8; ", rule));
  }
  return absl::OkStatus();
}

size_t Utf8Length(absl::string_view text, size_t i) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return 1;
  const size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

std::string JoinForPeople(const std::vector<std::string>& names, size_t max_shown) {
  if (names.empty()) return "";
  if (names.size() == 1) return names[0];
  const size_t shown = std::max<size_t>(1, std::min(names.size(), max_shown));
  std::vector<std::string> head(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown));
  if (shown < names.size()) {
    return absl::StrCat(absl::StrJoin(head, ", "), " and ", names.size() - shown, " more");
  }
  const std::string last = head.back();
  head.pop_back();
  return absl::StrCat(absl::StrJoin(head, ", "), " and ", last);
}

}  // namespace shardline

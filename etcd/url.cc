#include "etcd/url.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/text.h"

namespace shardline::etcd {
namespace {

constexpr char kScheme[] = "etcd://";
constexpr char kShape[] =
    "expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX, e.g. etcd://127.0.0.1:2379/shardline";

bool IsHostNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-'; }
bool IsIpv6Char(char c) { return absl::ascii_isxdigit(c) || c == ':' || c == '.'; }
bool IsPathChar(char c) {
  return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/';
}

absl::Status UrlError(absl::string_view flag, absl::string_view url, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, "='", AbbreviateValue(url, 200), "': ", what, "; ", kShape));
}

}  // namespace

absl::Status CheckEndpoint(absl::string_view endpoint, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", AbbreviateValue(endpoint), "' ", why,
        "; an endpoint is HOST:PORT (a DNS name, an IPv4 address or [IPv6]) with a port in "
        "1..65535, e.g. 127.0.0.1:2379 or [::1]:2379"));
  };
  if (endpoint.empty()) return bad("is empty");
  absl::string_view host;
  absl::string_view port;
  if (endpoint.front() == '[') {
    const size_t close = endpoint.find(']');
    if (close == absl::string_view::npos) return bad("has '[' without ']'");
    host = endpoint.substr(1, close - 1);
    if (host.empty()) return bad("has an empty IPv6 address");
    for (char c : host) {
      if (!IsIpv6Char(c)) return bad("has a character not allowed in an IPv6 address");
    }
    if (!absl::StrContains(host, ':')) return bad("has brackets around a non-IPv6 host");
    absl::string_view rest = endpoint.substr(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return bad("has no :PORT after the IPv6 address");
    port = rest;
  } else {
    const size_t colon = endpoint.rfind(':');
    if (colon == absl::string_view::npos) return bad("has no :PORT");
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    if (host.empty()) return bad("has no HOST");
    for (char c : host) {
      if (c == ':') return bad("has an IPv6 address without brackets");
      if (!IsHostNameChar(c)) return bad("has a character not allowed in a host name");
    }
  }
  if (port.empty()) return bad("has an empty port");
  for (char c : port) {
    if (!absl::ascii_isdigit(c)) return bad("has a port that is not a number");
  }
  uint32_t number = 0;
  if (port.size() > 5 || !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return bad("has a port outside 1..65535");
  }
  return absl::OkStatus();
}

std::string EtcdUrl::ToString() const {
  // prefix is "/" PATH "/": the URL shows PATH without the trailing slash.
  absl::string_view path = prefix;
  absl::ConsumeSuffix(&path, "/");
  return absl::StrCat(kScheme, absl::StrJoin(endpoints, ","), path);
}

absl::StatusOr<EtcdUrl> ParseEtcdUrl(absl::string_view url, absl::string_view flag) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, kScheme))
    return UrlError(flag, url, "does not start with etcd://");
  if (rest.find_first_of("?#") != absl::string_view::npos) {
    return UrlError(flag, url,
                    "has a query or fragment ('?' or '#'), which etcd:// URLs do not take");
  }
  const size_t slash = rest.find('/');
  const absl::string_view authority = rest.substr(0, slash);
  if (authority.empty()) return UrlError(flag, url, "names no endpoint");

  EtcdUrl out;
  const std::vector<absl::string_view> endpoints = absl::StrSplit(authority, ',');
  if (endpoints.size() > static_cast<size_t>(kMaxEndpoints)) {
    return UrlError(flag, url,
                    absl::StrCat("names ", endpoints.size(), " endpoints, more than the ",
                                 kMaxEndpoints, " allowed"));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (absl::Status s =
            CheckEndpoint(endpoints[i], absl::StrCat("endpoint ", i + 1, " of ", flag));
        !s.ok()) {
      return s;
    }
    if (!seen.insert(absl::AsciiStrToLower(endpoints[i])).second) {
      return UrlError(
          flag, url,
          absl::StrCat("names endpoint '", endpoints[i], "' twice; list each etcd member once"));
    }
    out.endpoints.emplace_back(endpoints[i]);
  }

  if (slash == absl::string_view::npos) {
    return UrlError(flag, url, "has no /PREFIX (the key prefix of this coordinator's state)");
  }
  absl::string_view path = rest.substr(slash + 1);
  if (absl::StartsWith(path, "/")) {
    return UrlError(flag, url, "has an empty PREFIX segment (\"//\")");
  }
  absl::ConsumeSuffix(&path, "/");  // one trailing slash is the same prefix
  if (path.empty()) {
    return UrlError(flag, url, "has no /PREFIX (the key prefix of this coordinator's state)");
  }
  for (char c : path) {
    if (!IsPathChar(c)) {
      return UrlError(flag, url, "has a PREFIX with a character outside [A-Za-z0-9._-/]");
    }
  }
  for (absl::string_view segment : absl::StrSplit(path, '/')) {
    if (segment.empty()) return UrlError(flag, url, "has an empty PREFIX segment (\"//\")");
  }
  out.prefix = absl::StrCat("/", path, "/");
  if (out.prefix.size() > static_cast<size_t>(kMaxPrefixBytes)) {
    return UrlError(
        flag, url,
        absl::StrCat("has a PREFIX of ", out.prefix.size(),
                     " bytes with its slashes, more than the ", kMaxPrefixBytes, " allowed"));
  }
  return out;
}

}  // namespace shardline::etcd

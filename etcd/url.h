// The coordinator's --state etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
//
//   absl::StatusOr<EtcdUrl> url = ParseEtcdUrl("etcd://10.0.0.1:2379,10.0.0.2:2379/shardline");
//   // url->endpoints = {"10.0.0.1:2379", "10.0.0.2:2379"}, url->prefix = "/shardline/"
//
// Thread-safety: a pure function.
#ifndef SHARDLINE_ETCD_URL_H_
#define SHARDLINE_ETCD_URL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::etcd {

// Most endpoints in one URL, and the longest prefix (bytes, the slashes
// included).
inline constexpr int kMaxEndpoints = 16;
inline constexpr int kMaxPrefixBytes = 256;

struct EtcdUrl {
  std::vector<std::string> endpoints;  // HOST:PORT each, in the URL's order
  // Every key of this coordinator's state starts with it: "/" + the URL's
  // path + "/" ("/shardline/" for ".../shardline"; the path is required).
  std::string prefix;
  // The URL back, in canonical form (etcd://A,B/PATH), for messages.
  std::string ToString() const;
};

// InvalidArgument, naming `flag` (e.g. "--state") and what would be valid:
// not starting with "etcd://"; no endpoint; an endpoint that is not
// HOST:PORT with a port in 1..65535 (IPv6 as [::1]:2379); a repeated
// endpoint; more than kMaxEndpoints; no path, an empty path segment ("//"),
// or a path with characters outside [A-Za-z0-9._-/] or over
// kMaxPrefixBytes; a query or fragment ("?", "#").
absl::StatusOr<EtcdUrl> ParseEtcdUrl(absl::string_view url, absl::string_view flag = "--state");

// One endpoint, HOST:PORT: HOST a DNS name or IPv4 address ([A-Za-z0-9.-])
// or an IPv6 address in brackets; PORT 1..65535. InvalidArgument naming
// `what` (e.g. "endpoint 2 of --state") otherwise.
absl::Status CheckEndpoint(absl::string_view endpoint, absl::string_view what);

}  // namespace shardline::etcd

#endif  // SHARDLINE_ETCD_URL_H_

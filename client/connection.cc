#include "client/connection.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/tls_files.h"

namespace shardline::client {
namespace {

std::string FormatTimeout(absl::Duration d) { return absl::FormatDuration(d); }

// "HOST:PORT" with a port in 1..65535, "[v6]:PORT", or a gRPC URI target.
absl::Status CheckAddress(const std::string& address, absl::string_view source) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "dns:") ||
      absl::StartsWith(address, "ipv4:") || absl::StartsWith(address, "ipv6:")) {
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  const bool ok = colon != std::string::npos && colon > 0 &&
                  absl::SimpleAtoi(address.substr(colon + 1), &port) && port > 0 &&
                  port <= 65535 && address.find_first_of(" \t/") == std::string::npos &&
                  (address.find(':') == colon || (address[0] == '[' && address[colon - 1] == ']'));
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      source, "='", address, "' is not HOST:PORT; give e.g. 127.0.0.1:7070, coord.example:7070 "
      "or [::1]:7070"));
}

// A TLS file, checked (common/tls_files.h); every problem is InvalidArgument
// here (MakeCoordinatorChannel's contract), naming the flag and the file.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag, PemKind kind) {
  absl::StatusOr<std::string> pem = ReadPemFile(path, flag, kind);
  if (!pem.ok()) return absl::InvalidArgumentError(pem.status().message());
  return pem;
}

// The transport's reason in a few words, from gRPC's UNAVAILABLE message,
// e.g. "failed to connect to all addresses; last error: UNKNOWN:
// ipv4:127.0.0.1:7070: Failed to connect to remote host: Connection refused".
// Empty when the message is the coordinator's own (starting, stopping).
std::string TransportReason(const std::string& message, const ConnectionOptions& o) {
  const std::string m = absl::AsciiStrToLower(message);
  if (absl::StrContains(m, "connection refused")) return "connection refused";
  if (absl::StrContains(m, "dns resolution failed") || absl::StrContains(m, "name not found") ||
      absl::StrContains(m, "domain name not found") ||
      absl::StrContains(m, "name or service not known")) {
    return "the host name does not resolve";
  }
  // gRPC reports a refused plaintext connect as "tcp handshaker shutdown"
  // too: only call it TLS when TLS is configured or named.
  const bool names_tls = absl::StrContains(m, "ssl") || absl::StrContains(m, "tls") ||
                         absl::StrContains(m, "certificate");
  if (absl::StrContains(m, "handshake") && !names_tls && !o.tls()) {
    return "could not connect (nothing listening there, or a firewall)";
  }
  if (absl::StrContains(m, "handshake") || names_tls) {
    return absl::StrCat("TLS handshake failed (", message,
                        "); check --tls-ca, --tls-cert and --tls-key against the coordinator's "
                        "certificates");
  }
  if (absl::StrContains(m, "failed parsing http/2")) {
    return "the server there does not speak gRPC (is this the coordinator's port?)";
  }
  if (absl::StrContains(m, "no route to host")) return "no route to host";
  if (absl::StrContains(m, "network is unreachable")) return "network is unreachable";
  if (absl::StrContains(m, "connection reset") || absl::StrContains(m, "socket closed") ||
      absl::StrContains(m, "connection closed") || absl::StrContains(m, "broken pipe")) {
    return o.tls() ? "the connection was closed"
                   : "the connection was closed (if the coordinator serves TLS, pass --tls-ca)";
  }
  if (absl::StrContains(m, "timed out") || absl::StrContains(m, "timeout")) {
    return "connection timed out";
  }
  if (absl::StrContains(m, "failed to connect") ||
      absl::StrContains(m, "connections to all backends failing") ||
      absl::StrContains(m, "no such file or directory")) {
    return message;
  }
  return "";
}

}  // namespace

void ConnectionFlags::Register(ArgParser& parser) {
  parser.AddString("coordinator", &coordinator_,
                   "coordinator address HOST:PORT, or every replica's, comma-separated "
                   "(default $SHARDLINE_COORDINATOR, else 127.0.0.1:7070)");
  parser.AddString("token", &token_,
                   "bearer token (default $SHARDLINE_TOKEN; prefer the variable: flags show "
                   "in ps)");
  parser.AddString("token-file", &token_file_,
                   "file holding the bearer token (its first line), instead of --token");
  parser.AddString("tls-ca", &tls_ca_, "PEM file of the CA that signed the coordinator (TLS)");
  parser.AddString("tls-cert", &tls_cert_, "PEM client certificate for mutual TLS (with --tls-key)");
  parser.AddString("tls-key", &tls_key_, "PEM client private key for mutual TLS (with --tls-cert)");
  parser.AddString("timeout", &timeout_, "deadline of each call, e.g. 10s, 500ms (default 10s)");
}

absl::StatusOr<ConnectionOptions> ConnectionFlags::Resolve(
    const ArgParser& parser, const std::function<const char*(const char*)>& getenv) const {
  auto env = [&](const char* name) -> std::string {
    const char* v = getenv ? getenv(name) : std::getenv(name);
    return v == nullptr ? "" : v;
  };
  ConnectionOptions o;
  if (parser.WasSet("coordinator")) {
    o.address = coordinator_;
    o.address_source = "--coordinator";
  } else if (std::string a = env(kCoordinatorEnv); !a.empty()) {
    o.address = a;
    o.address_source = kCoordinatorEnv;
  }
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseCoordinatorAddresses(o.address, o.address_source);
  if (!addresses.ok()) return addresses.status();
  o.address = absl::StrJoin(*addresses, ",");  // as messages will name it

  const char* token_source = "--token";
  if (parser.WasSet("token") && parser.WasSet("token-file")) {
    return absl::InvalidArgumentError("give --token or --token-file, not both");
  }
  if (parser.WasSet("token")) {
    o.token = token_;
  } else if (parser.WasSet("token-file")) {
    token_source = "--token-file";
    std::ifstream file(token_file_, std::ios::binary);
    if (!file) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read --token-file '", token_file_,
                                                     "': ", std::strerror(errno)));
    }
    std::getline(file, o.token);
    if (absl::StripAsciiWhitespace(o.token).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--token-file '", token_file_, "' is empty; its first line must hold the token"));
    }
  } else {
    o.token = env(kTokenEnv);
    token_source = kTokenEnv;
  }
  o.token = std::string(absl::StripAsciiWhitespace(o.token));
  for (unsigned char c : o.token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          token_source, " holds a space or control character; a token is printable ASCII "
          "without spaces (check for a pasted line break)"));
    }
  }

  o.tls_ca_file = tls_ca_;
  o.tls_cert_file = tls_cert_;
  o.tls_key_file = tls_key_;
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"tls-ca", &tls_ca_},
                                    {"tls-cert", &tls_cert_},
                                    {"tls-key", &tls_key_}}) {
    if (parser.WasSet(flag) && value->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs a file path"));
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "mutual TLS needs both --tls-cert and --tls-key (the client certificate and its key)");
  }

  if (parser.WasSet("timeout")) {
    absl::Duration d;
    if (!absl::ParseDuration(timeout_, &d) || d <= absl::ZeroDuration() ||
        d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--timeout='", timeout_, "' is not a positive duration; give e.g. --timeout=30s"));
    }
    o.timeout = d;
  }
  return o;
}

absl::StatusOr<std::vector<std::string>> ParseCoordinatorAddresses(absl::string_view list,
                                                                   absl::string_view source) {
  const std::vector<absl::string_view> parts = absl::StrSplit(list, ',');
  if (parts.size() > kMaxCoordinatorAddresses) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " lists ", parts.size(), " addresses; at most ", kMaxCoordinatorAddresses,
        " coordinator replicas are supported"));
  }
  std::vector<std::string> out;
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string address(absl::StripAsciiWhitespace(parts[i]));
    if (address.empty()) {
      if (parts.size() == 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, " is empty; give the coordinator's HOST:PORT, e.g. 127.0.0.1:7070, or every "
            "replica's, comma-separated"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          source, "='", list, "' has an empty address at position ", i + 1,
          "; give HOST:PORT,HOST:PORT,... without empty entries"));
    }
    const std::string what = parts.size() == 1 ? std::string(source)
                                               : absl::StrCat(source, " address ", i + 1);
    if (absl::Status s = CheckAddress(address, what); !s.ok()) return s;
    if (!seen.insert(address).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " lists ", address, " twice; give each coordinator replica once"));
    }
    out.push_back(address);
  }
  return out;
}

absl::Status FromGrpcStatus(const grpc::Status& status, const ConnectionOptions& o,
                            absl::string_view rpc) {
  const absl::Status plain = ::shardline::FromGrpcStatus(status);  // common/grpc_status.h
  if (plain.ok()) return plain;
  const absl::StatusCode code = plain.code();
  const std::string message(plain.message());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: {
      const std::string reason = TransportReason(message, o);
      if (!reason.empty()) {
        return absl::Status(
            code, absl::StrCat("cannot reach the coordinator at ", o.address, ": ", reason,
                               "; start shardline-coordinator or set --coordinator / ",
                               kCoordinatorEnv));
      }
      // The server's message may say how to retry already (a replica's
      // "...; retry with backoff"): then once is enough.
      return absl::Status(
          code, absl::StrCat("the coordinator at ", o.address, " is unavailable: ", message,
                             absl::StrContains(message, "retry") ? "" : "; retry shortly"));
    }
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (message.empty() || message == "Deadline Exceeded") {
        return absl::Status(
            code, absl::StrCat("no answer from the coordinator at ", o.address, " to ", rpc,
                               " within ", FormatTimeout(o.timeout),
                               " (--timeout); check that it is running and reachable, or give a "
                               "longer --timeout"));
      }
      return absl::Status(code, message);
    case grpc::StatusCode::UNAUTHENTICATED:
      if (o.token.empty()) {
        return absl::Status(code, absl::StrCat("the coordinator at ", o.address,
                                               " requires a token (", message,
                                               "); pass --token or set ", kTokenEnv));
      }
      return absl::Status(code, absl::StrCat(message, "; check the token given by --token or ",
                                             kTokenEnv));
    case grpc::StatusCode::PERMISSION_DENIED:
      // The coordinator's message already says which token to use.
      if (absl::StrContains(message, "member token") ||
          absl::StrContains(message, "member_token")) {
        return plain;
      }
      if (absl::StrContains(message, "admin token")) {
        return absl::Status(code, absl::StrCat(message, " (--token or ", kTokenEnv, ")"));
      }
      return absl::Status(
          code, absl::StrCat(message, "; ", rpc,
                             " needs the coordinator's admin token (a job's worker token only "
                             "reads its own job)"));
    case grpc::StatusCode::UNIMPLEMENTED:
      if (absl::StartsWith(message, "Received http2 header with status")) {
        return absl::Status(code, absl::StrCat("the server at ", o.address,
                                               " is not a Shardline coordinator (", message,
                                               "); check --coordinator / ", kCoordinatorEnv));
      }
      return absl::Status(code, absl::StrCat("the coordinator at ", o.address,
                                             " does not implement ", rpc, " (", message,
                                             "); is it an older version than shardctl?"));
    case grpc::StatusCode::CANCELLED:
      return absl::Status(code, absl::StrCat(rpc, " was cancelled",
                                             message.empty() ? "" : ": " + message));
    default:
      if (message.empty()) {
        return absl::Status(code, absl::StrCat(rpc, " failed with ",
                                               absl::StatusCodeToString(code),
                                               " and no message from the coordinator"));
      }
      return plain;
  }
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCoordinatorCredentials(
    const ConnectionOptions& options) {
  if (!options.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> pem =
        ReadPem(options.tls_ca_file, "--tls-ca", PemKind::kCertificates);
    if (!pem.ok()) return pem.status();
    ssl.pem_root_certs = *pem;
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem(options.tls_cert_file, "--tls-cert", PemKind::kCertificates);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem(options.tls_key_file, "--tls-key", PemKind::kPrivateKey);
    if (!key.ok()) return key.status();
    if (absl::Status s = CheckKeyMatchesCertificate(
            *cert, absl::StrCat("--tls-cert file '", options.tls_cert_file, "'"), *key,
            absl::StrCat("--tls-key file '", options.tls_key_file, "'"));
        !s.ok()) {
      return s;
    }
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    bool replicas) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // A coordinator restarting on its state file is back within seconds;
  // gRPC's default reconnect backoff (1 s growing to 120 s) would keep
  // workers away long after it is up and get them declared lost. Reconnect
  // every 100 ms at first, never waiting more than 1 s between tries.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left at gRPC's 20 s: it is also the
  // time a connect attempt may take (doc/connection-backoff.md's
  // MIN_CONNECT_TIMEOUT). At 100 ms, calls from shardctl and the tests to a
  // live loopback coordinator failed with "connection timed out" on a
  // loaded 2-core machine (CI), where a handshake can take longer. A
  // refused connect still fails at once, and with replicas an attempt moves
  // on after kConnectWait (grpc_call.h).
  // (How soon a finished connect is noticed: common/grpc_backup_poll.h.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (replicas) {
    // A replica that stops answering without closing its connections (a
    // paused process, a cut-off host) must not hold a worker's heartbeats
    // or Session stream for a whole deadline while another replica leads:
    // keepalive pings every 2 s, answered within 2 s, or the connection
    // fails (UNAVAILABLE) and the calls move on (client/grpc_call.h). The
    // coordinator accepts pings every second (server/rpc/coordinator_server.cc).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const ConnectionOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeCoordinatorCredentials(options);
  if (!credentials.ok()) return credentials.status();
  const std::string first(
      absl::StripAsciiWhitespace(absl::string_view(options.address).substr(
          0, options.address.find(','))));
  return MakeCoordinatorChannel(first, *credentials);
}

void Prepare(grpc::ClientContext* context, const ConnectionOptions& options,
             absl::Duration timeout) {
  Prepare(context, options,
          timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout);
}

void Prepare(grpc::ClientContext* context, const ConnectionOptions& options,
             absl::Time deadline) {
  std::string token =
      options.member_credential != nullptr ? options.member_credential->Get() : std::string();
  if (token.empty()) token = options.token;
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  // gRPC deadlines are real time, whatever clock the caller waits on.
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace shardline::client

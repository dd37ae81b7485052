// shardline-coordinator: serves the v1 coordinator API (one per cluster).
//
//   shardline-coordinator --listen 127.0.0.1:7070 --state ./shardline-state.db
//       --admin-token-file /etc/shardline/admin-token --metrics-port 9090
//       (one command line; --admin-token / $SHARDLINE_ADMIN_TOKEN also work,
//       but a flag is visible in /proc/PID/cmdline; metrics and the probes'
//       /healthz on the --listen host unless --metrics-host says otherwise)
//
// Prints "listening on HOST:PORT" on stdout once it serves (tests start it
// with --listen 127.0.0.1:0 and read the port from there), logs one line per
// event on stderr, and shuts down cleanly on SIGTERM or SIGINT. Exit codes:
// 0 after a clean shutdown, 2 for bad flags, 1 when it cannot start.
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <netdb.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/log.h"
#include "checkpoint/checkpoint_files.h"
#include "server/auth.h"
#include "server/checkpoint_registry.h"
#include "common/clock.h"
#include "server/coordinator.h"
#include "server/rpc/coordinator_server.h"
#include "metrics/metrics.h"
#include "server/rendezvous.h"
#include "server/replica.h"
#include "server/state_store.h"
#include "etcd/client.h"
#include "etcd/url.h"
#include "absl/strings/match.h"

namespace shardline::server {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "shardline-coordinator: %s\n", status.ToString().c_str());
  return 1;
}

// Serves the metrics port (when metrics_port > 0, on metrics_host or else
// the host of `address`), prints "listening on ADDRESS", waits for SIGTERM
// or SIGINT, then stops the metrics and calls `shutdown`. The exit code.
int ServeUntilSignal(const std::string& address, metrics::Metrics* metrics, int metrics_port,
                     const std::string& metrics_host, sigset_t signals,
                     const std::function<void()>& shutdown) {
  std::unique_ptr<metrics::MetricsHttpServer> metrics_server;
  if (metrics_port > 0) {
    const std::string host =
        !metrics_host.empty() ? metrics_host : address.substr(0, address.rfind(':'));
    absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> started =
        metrics::MetricsHttpServer::Start(host, metrics_port, metrics);
    if (!started.ok()) return Fail(started.status());
    metrics_server = *std::move(started);
    std::fprintf(stdout, "metrics on %s\n", metrics_server->address().c_str());
  }
  std::fprintf(stdout, "listening on %s\n", address.c_str());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::fprintf(stderr, "shardline-coordinator: signal %d, shutting down\n", signal_number);
  if (metrics_server != nullptr) metrics_server->Stop();
  shutdown();
  return 0;
}

// What a replica (--state etcd://) is started with, beyond ServerOptions.
struct ReplicaFlags {
  etcd::EtcdUrl url;
  absl::Duration lease_ttl = absl::Seconds(2);
  std::string replica_id, advertise;
  int max_txn_ops = 128;
  std::string etcd_ca, etcd_cert, etcd_key;
};

// One coordinator replica on etcd until SIGTERM/SIGINT (server/replica.h).
int ServeReplica(const ReplicaFlags& flags, ServerOptions server_options,
                 const CoordinatorOptions& coordinator_options, int metrics_port,
                 const std::string& metrics_host, sigset_t signals) {
  etcd::ClientOptions etcd_options;
  etcd_options.endpoints = flags.url.endpoints;
  if (!flags.etcd_ca.empty() || !flags.etcd_cert.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        etcd::MakeEtcdCredentials(flags.etcd_ca, flags.etcd_cert, flags.etcd_key);
    if (!credentials.ok()) return Fail(credentials.status());
    etcd_options.credentials = *std::move(credentials);
  }
  // State writes wait up to 2 s for etcd; the election's keep-alives a
  // quarter of the lease, so that one cannot outlast the lease.
  etcd_options.timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<etcd::Client>> etcd = etcd::Client::Connect(etcd_options);
  if (!etcd.ok()) return Fail(etcd.status());
  etcd::ClientOptions election_options = etcd_options;
  election_options.timeout = flags.lease_ttl / 4;
  absl::StatusOr<std::unique_ptr<etcd::Client>> election_etcd =
      etcd::Client::Connect(election_options);
  if (!election_etcd.ok()) return Fail(election_etcd.status());

  ReplicaOptions options;
  options.prefix = flags.url.prefix;
  options.state = flags.url.ToString();
  options.lease_ttl = flags.lease_ttl;
  options.max_txn_ops = flags.max_txn_ops;
  const std::string listen = server_options.listen_address;
  const std::string listen_host = listen.substr(0, listen.rfind(':'));
  if (flags.advertise.empty() &&
      (listen_host == "0.0.0.0" || listen_host == "[::]" || listen_host.empty())) {
    std::fprintf(stderr,
                 "shardline-coordinator: --listen=%s is a wildcard address; give --advertise "
                 "HOST:PORT, the address clients reach this replica at\n",
                 listen.c_str());
    return 2;
  }
  options.self.set_address(flags.advertise);
  options.self.set_replica_id(flags.replica_id.empty() ? flags.advertise : flags.replica_id);
  options.server = std::move(server_options);
  options.coordinator = coordinator_options;
  options.checkpoints.verify_files = checkpoint::VerifyShardFiles;
  absl::StatusOr<std::unique_ptr<Replica>> replica =
      Replica::Start(etcd->get(), election_etcd->get(), std::move(options));
  if (!replica.ok()) return Fail(replica.status());
  return ServeUntilSignal((*replica)->address(), (*replica)->metrics(), metrics_port, metrics_host,
                          signals, [&replica] { (*replica)->Shutdown(); });
}

// Whether `host`:`port` can be bound here: 0, or the errno of the last
// failed bind (EADDRNOTAVAIL: not an address of this machine; EADDRINUSE:
// taken), or -1 when the host does not resolve. The port is released at
// once; the server binds it for real right after (a race with another
// program is then reported by the server).
int TryBind(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (::getaddrinfo(h.empty() ? nullptr : h.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  int err = -1;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC does
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    err = bound ? 0 : errno;
    ::close(fd);
    if (bound) break;
  }
  ::freeaddrinfo(found);
  return err;
}

int Main(int argc, char** argv) {
  std::string listen = "127.0.0.1:7070";
  std::string state = "./shardline-state.db";
  std::string admin_token, admin_token_file;
  std::string tls_cert, tls_key, tls_client_ca;
  int64_t metrics_port = 0;
  bool init_state = false;
  std::string finished_job_retention = "168h";
  int64_t max_finished_jobs = 1000;
  bool help = false;
  ArgParser args("shardline-coordinator");
  args.AddString("listen", &listen, "HOST:PORT to serve gRPC on (port 0: any free port)");
  args.AddString("state", &state,
                 "SQLite state file, 'memory' (nothing survives a restart), or "
                 "etcd://HOST:PORT[,HOST:PORT...]/PREFIX: state in etcd, several replicas on one "
                 "prefix elect a leader");
  std::string etcd_ca, etcd_cert, etcd_key, lease_ttl_flag = "2s", replica_id, advertise;
  int64_t etcd_max_txn_ops = 128;
  args.AddString("etcd-ca", &etcd_ca, "PEM CA bundle that signs the etcd members' certificates "
                                      "(TLS to etcd; with --state etcd:// only)");
  args.AddString("etcd-cert", &etcd_cert, "PEM client certificate for etcd (mutual TLS)");
  args.AddString("etcd-key", &etcd_key, "PEM private key of --etcd-cert");
  args.AddString("lease-ttl", &lease_ttl_flag,
                 "leader lease TTL, whole seconds in 2s..60s (etcd's minimum is 2s): a dead "
                 "leader is replaced within about this time");
  args.AddString("replica-id", &replica_id,
                 "this replica's name on the prefix, 1..128 of [A-Za-z0-9._:-] (default: the "
                 "--advertise address)");
  args.AddString("advertise", &advertise,
                 "HOST:PORT clients reach this replica at, named to them by followers "
                 "(default: the --listen address, which must then not be a wildcard)");
  args.AddInt("etcd-max-txn-ops", &etcd_max_txn_ops,
              "the etcd cluster's --max-txn-ops (operations per transaction), 16..100000");
  args.AddBool("init-state", &init_state,
               "accept an existing empty (0-byte) --state file as new, empty state (without it "
               "such a file is refused: it was truncated or is not a state file)");
  args.AddString("admin-token", &admin_token,
                 "admin bearer token, at least 16 bytes (default: $SHARDLINE_ADMIN_TOKEN; none: "
                 "no auth, local tests only; prefer --admin-token-file: flags show in ps)");
  args.AddString("admin-token-file", &admin_token_file,
                 "file holding the admin token (mode 0600 or stricter; one trailing newline "
                 "is stripped)");
  args.AddString("tls-cert", &tls_cert, "PEM server certificate (enables TLS)");
  args.AddString("tls-key", &tls_key, "PEM private key of --tls-cert");
  args.AddString("tls-client-ca", &tls_client_ca,
                 "PEM CA bundle; when set, clients must present a certificate it signed (mTLS)");
  args.AddInt("metrics-port", &metrics_port,
              "port of Prometheus /metrics and the probes' /healthz on --metrics-host (0: off)");
  std::string metrics_host;
  args.AddString("metrics-host", &metrics_host,
                 "address the metrics port listens on (default: the --listen host)");
  args.AddString("finished-job-retention", &finished_job_retention,
                 "forget a COMPLETED/FAILED/CANCELLED job (its records, not its checkpoint "
                 "files) this long after it finished, e.g. 168h; 0: never for its age");
  args.AddInt("max-finished-jobs", &max_finished_jobs,
              "keep at most this many finished jobs, forgetting the oldest first; 0: no cap");
  args.AddBool("help", &help, "print this help");
  absl::StatusOr<std::vector<std::string>> positional =
      args.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!positional.ok() || help) {
    if (!positional.ok()) {
      std::fprintf(stderr, "shardline-coordinator: %s\n",
                   std::string(positional.status().message()).c_str());
    }
    std::fprintf(help ? stdout : stderr, "%s", args.Usage().c_str());
    return help ? 0 : 2;
  }
  if (!positional->empty()) {
    std::fprintf(stderr, "shardline-coordinator: unexpected argument '%s'\n%s",
                 positional->front().c_str(), args.Usage().c_str());
    return 2;
  }
  {
    // HOST:PORT with a port in 0..65535 (gRPC would wrap 99999 around, and
    // take an empty port as 443).
    const size_t colon = listen.rfind(':');
    int port = -1;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535 ||
        listen.substr(colon + 1).find_first_not_of("0123456789") != std::string::npos) {
      std::fprintf(stderr,
                   "shardline-coordinator: --listen='%s' is not HOST:PORT with a port in "
                   "0..65535 (e.g. 127.0.0.1:7070, [::1]:0)\n",
                   listen.c_str());
      return 2;
    }
    // Say why the address cannot be served on before gRPC tries (its own
    // message is a raw log line).
    const int err = TryBind(listen.substr(0, colon), listen.substr(colon + 1));
    auto refuse = [&](int rc, const std::string& why) {
      std::fprintf(stderr, "shardline-coordinator: --listen='%s'%s\n", listen.c_str(),
                   why.c_str());
      return rc;
    };
    if (err == -1) {
      return refuse(2, ": the host does not resolve; give an address or name of this machine "
                       "(e.g. 127.0.0.1:7070, 0.0.0.0:7070)");
    }
    if (err == EADDRNOTAVAIL) {
      return refuse(2, absl::StrCat(" is not an address of this machine (", std::strerror(err),
                                    "); give one of its addresses, or 0.0.0.0 for all of them"));
    }
    if (err == EADDRINUSE) {
      return refuse(1, absl::StrCat(": the port is in use (", std::strerror(err),
                                    "); stop what holds it or choose another port (0: any free "
                                    "one)"));
    }
  }
  if (metrics_port < 0 || metrics_port > 65535) {
    std::fprintf(stderr, "shardline-coordinator: --metrics-port=%lld is not in 0..65535\n",
                 static_cast<long long>(metrics_port));
    return 2;
  }
  CoordinatorOptions coordinator_options;
  if (!absl::ParseDuration(finished_job_retention, &coordinator_options.finished_job_retention) ||
      coordinator_options.finished_job_retention < absl::ZeroDuration() ||
      coordinator_options.finished_job_retention == absl::InfiniteDuration()) {
    std::fprintf(stderr,
                 "shardline-coordinator: --finished-job-retention='%s' is not a duration >= 0 "
                 "(e.g. 168h, 30m; 0 keeps finished jobs regardless of age)\n",
                 finished_job_retention.c_str());
    return 2;
  }
  if (max_finished_jobs < 0 || max_finished_jobs > 1000000) {
    std::fprintf(stderr, "shardline-coordinator: --max-finished-jobs=%lld is not in 0..1000000\n",
                 static_cast<long long>(max_finished_jobs));
    return 2;
  }
  coordinator_options.max_finished_jobs = static_cast<int>(max_finished_jobs);
  const char* admin_token_source = "--admin-token";
  bool admin_token_given = false;
  if (args.WasSet("admin-token") && args.WasSet("admin-token-file")) {
    std::fprintf(stderr,
                 "shardline-coordinator: give --admin-token or --admin-token-file, not both\n");
    return 2;
  }
  if (args.WasSet("admin-token-file")) {
    absl::StatusOr<std::string> t = ReadAdminTokenFile(admin_token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "shardline-coordinator: %s\n",
                   std::string(t.status().message()).c_str());
      return 2;
    }
    admin_token = *std::move(t);
    admin_token_source = "--admin-token-file";
  } else if (!args.WasSet("admin-token")) {
    if (const char* env = std::getenv("SHARDLINE_ADMIN_TOKEN"); env != nullptr) {
      admin_token = env;
      admin_token_given = true;
    }
    admin_token_source = "SHARDLINE_ADMIN_TOKEN";
  } else {
    admin_token_given = true;
  }
  // A token that was asked for but came out empty (a failed $(openssl ...),
  // a typo) must not silently turn authentication off.
  if (admin_token_given && admin_token.empty()) {
    std::fprintf(stderr,
                 "shardline-coordinator: %s is set but empty; give a token of at least 16 bytes "
                 "(e.g. openssl rand -hex 32), or unset it to run without authentication "
                 "(local tests only)\n",
                 admin_token_source);
    return 2;
  }
  if (absl::Status s = CheckAdminToken(admin_token, admin_token_source); !s.ok()) {
    std::fprintf(stderr, "shardline-coordinator: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (admin_token.empty()) {
    std::fprintf(stderr,
                 "shardline-coordinator: warning: no admin token, so authentication is off: "
                 "anyone who can reach --listen can create and cancel jobs (set "
                 "--admin-token-file, --admin-token or SHARDLINE_ADMIN_TOKEN outside local "
                 "tests)\n");
  }
  if (tls_cert.empty() != tls_key.empty() || (!tls_client_ca.empty() && tls_cert.empty())) {
    std::fprintf(stderr,
                 "shardline-coordinator: TLS needs --tls-cert and --tls-key together "
                 "(--tls-client-ca only with them)\n");
    return 2;
  }

  // A client that disconnects mid-answer (a metrics scraper, a worker that
  // died) must cost a failed write (EPIPE), not the coordinator.
  std::signal(SIGPIPE, SIG_IGN);

  // Block the shutdown signals in every thread; the main thread waits for
  // them with sigwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The server's address, token and TLS, for either kind of state.
  ServerOptions options;
  options.listen_address = listen;
  options.admin_token = admin_token;
  if (!tls_cert.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        MakeServerCredentials(tls_cert, tls_key, tls_client_ca);
    if (!credentials.ok()) return Fail(credentials.status());
    options.credentials = *std::move(credentials);
  }
  const bool on_etcd = absl::StartsWith(state, "etcd://");
  for (const char* flag : {"etcd-ca", "etcd-cert", "etcd-key", "lease-ttl", "replica-id",
                           "advertise", "etcd-max-txn-ops"}) {
    if (!on_etcd && args.WasSet(flag)) {
      std::fprintf(stderr,
                   "shardline-coordinator: --%s is only for replicas with --state etcd://...\n",
                   flag);
      return 2;
    }
  }
  if (on_etcd) {
    ReplicaFlags r;
    absl::StatusOr<etcd::EtcdUrl> url = etcd::ParseEtcdUrl(state, "--state");
    if (!url.ok()) {
      std::fprintf(stderr, "shardline-coordinator: %s\n", std::string(url.status().message()).c_str());
      return 2;
    }
    r.url = *std::move(url);
    absl::Duration ttl;
    if (!absl::ParseDuration(lease_ttl_flag, &ttl) || ttl < absl::Seconds(2) ||
        ttl > absl::Seconds(60) || ttl != absl::Seconds(absl::ToInt64Seconds(ttl))) {
      std::fprintf(stderr,
                   "shardline-coordinator: --lease-ttl='%s' is not a duration of whole seconds, "
                   "with its unit, in 2s..60s, e.g. 2s or 5s (etcd grants no lease under 2s "
                   "with its default election timeout)\n",
                   lease_ttl_flag.c_str());
      return 2;
    }
    r.lease_ttl = ttl;
    if (args.WasSet("replica-id") &&
        (replica_id.empty() || replica_id.size() > 128 ||
         replica_id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                      "0123456789._:-") != std::string::npos)) {
      std::fprintf(stderr,
                   "shardline-coordinator: --replica-id='%s' must be 1..128 of [A-Za-z0-9._:-]\n",
                   replica_id.c_str());
      return 2;
    }
    r.replica_id = replica_id;
    if (args.WasSet("advertise")) {
      // Followers hand it to clients as gRPC metadata: plain HOST:PORT only.
      absl::Status s = etcd::CheckEndpoint(advertise, "--advertise");
      const std::string host = advertise.substr(0, advertise.rfind(':'));
      if (s.ok() && (host == "0.0.0.0" || host == "[::]")) {
        s = absl::InvalidArgumentError(
            "--advertise is a wildcard address; give the address clients reach this replica at");
      }
      if (!s.ok()) {
        std::fprintf(stderr, "shardline-coordinator: %s (the address clients reach this replica at)\n",
                     std::string(s.message()).c_str());
        return 2;
      }
    }
    r.advertise = advertise;
    if (etcd_max_txn_ops < 16 || etcd_max_txn_ops > 100000) {
      std::fprintf(stderr, "shardline-coordinator: --etcd-max-txn-ops=%lld is not in 16..100000\n",
                   static_cast<long long>(etcd_max_txn_ops));
      return 2;
    }
    r.max_txn_ops = static_cast<int>(etcd_max_txn_ops);
    if (etcd_cert.empty() != etcd_key.empty()) {
      std::fprintf(stderr, "shardline-coordinator: --etcd-cert and --etcd-key go together\n");
      return 2;
    }
    r.etcd_ca = etcd_ca;
    r.etcd_cert = etcd_cert;
    r.etcd_key = etcd_key;
    const std::string host = args.WasSet("metrics-host") ? metrics_host : "";
    return ServeReplica(r, std::move(options), coordinator_options, static_cast<int>(metrics_port),
                        host, signals);
  }
  std::unique_ptr<StateStore> store;
  if (state == "memory") {
    store = NewMemoryStore();
  } else {
    if (state.empty()) {
      std::fprintf(stderr, "shardline-coordinator: --state needs a file path or \"memory\"\n");
      return 2;
    }
    if (const size_t scheme = state.find("://"); scheme != std::string::npos) {
      std::fprintf(stderr,
                   "shardline-coordinator: --state='%s': unknown scheme '%s://'; give a SQLite "
                   "file path, memory, or etcd://HOST:PORT[,HOST:PORT...]/PREFIX\n",
                   state.c_str(), state.substr(0, scheme).c_str());
      return 2;
    }
    if (struct stat st; ::stat(state.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::fprintf(stderr,
                   "shardline-coordinator: --state='%s' is a directory; give the path of the "
                   "state file in it (e.g. %s/shardline-state.db)\n",
                   state.c_str(), state.c_str());
      return 2;
    }
    // One coordinator per state file: the store holds a lock on the file
    // itself (any path to it) while it is open; a second one would diverge.
    SqliteStoreOptions store_options;
    store_options.initialize_empty = init_state;
    absl::StatusOr<std::unique_ptr<StateStore>> opened = OpenSqliteStore(state, store_options);
    if (!opened.ok()) return Fail(opened.status());
    store = *std::move(opened);
  }
  RealClock clock;
  Coordinator coordinator(&clock, store.get(), coordinator_options);
  if (absl::Status s = coordinator.Recover(); !s.ok()) return Fail(s);
  // The coordinator sees the checkpoint directories (it writes manifest.json
  // next to the shards), so it checks at commit that every reported file is
  // there with its size (checkpoint/checkpoint_files.h).
  CheckpointRegistryOptions checkpoint_options;
  checkpoint_options.verify_files = checkpoint::VerifyShardFiles;
  absl::StatusOr<std::unique_ptr<CheckpointRegistry>> checkpoints =
      CheckpointRegistry::Create(store.get(), &clock, checkpoint_options);
  if (!checkpoints.ok()) return Fail(checkpoints.status());
  Rendezvous rendezvous(&clock);
  metrics::Metrics metrics([&coordinator] { return SnapshotJobs(coordinator); });

  options.state = state == "memory" ? state : absl::StrCat("sqlite:", state);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(
      {&coordinator, &rendezvous, checkpoints->get(), &metrics}, options);
  if (!server.ok()) return Fail(server.status());

  return ServeUntilSignal((*server)->address(), &metrics, static_cast<int>(metrics_port),
                          args.WasSet("metrics-host") ? metrics_host : "", signals,
                          [&server] { (*server)->Shutdown(); });
}

}  // namespace
}  // namespace shardline::server

int main(int argc, char** argv) {
  // Debian's Abseil is built with its debug-mode lock-order graph on, which
  // records every acquisition: at thousands of workers it was 6% of the
  // coordinator's CPU. The tests keep it (they link the same library and do
  // not come through here).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  shardline::SetLogProgram("shardline-coordinator");
  return shardline::server::Main(argc, argv);
}

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
#include <sys/file.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <cstdlib>
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
#include "server/state_store.h"

namespace shardline::server {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "shardline-coordinator: %s\n", status.ToString().c_str());
  return 1;
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
  args.AddString("state", &state, "SQLite state file, or 'memory' (nothing survives a restart)");
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

  std::unique_ptr<StateStore> store;
  if (state == "memory") {
    store = NewMemoryStore();
  } else {
    if (state.empty()) {
      std::fprintf(stderr, "shardline-coordinator: --state needs a file path or \"memory\"\n");
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

  ServerOptions options;
  options.listen_address = listen;
  options.admin_token = admin_token;
  if (!tls_cert.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        MakeServerCredentials(tls_cert, tls_key, tls_client_ca);
    if (!credentials.ok()) return Fail(credentials.status());
    options.credentials = *std::move(credentials);
  }
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(
      {&coordinator, &rendezvous, checkpoints->get(), &metrics}, options);
  if (!server.ok()) return Fail(server.status());

  std::unique_ptr<metrics::MetricsHttpServer> metrics_server;
  if (metrics_port > 0) {
    const std::string& address = (*server)->address();
    const std::string host =
        args.WasSet("metrics-host") ? metrics_host : address.substr(0, address.rfind(':'));
    absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> started =
        metrics::MetricsHttpServer::Start(host, static_cast<int>(metrics_port), &metrics);
    if (!started.ok()) return Fail(started.status());
    metrics_server = *std::move(started);
    std::fprintf(stdout, "metrics on %s\n", metrics_server->address().c_str());
  }
  std::fprintf(stdout, "listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::fprintf(stderr, "shardline-coordinator: signal %d, shutting down\n", signal_number);
  if (metrics_server != nullptr) metrics_server->Stop();
  (*server)->Shutdown();
  return 0;
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

// The coordinator's Prometheus metrics (text exposition format 0.0.4) and a
// small HTTP/1.1 server that serves them on GET /metrics (the worker serves
// its own series through the same server).
//
//   Metrics metrics([&] { return SnapshotJobs(coordinator); });
//   metrics.CountJoin();
//   metrics.ObserveRpc("WorkerService/Heartbeat", absl::Milliseconds(2), absl::StatusCode::kOk);
//   absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
//       MetricsHttpServer::Start("127.0.0.1", /*port=*/0, &metrics);
//   // curl http://127.0.0.1:<(*http)->port()>/metrics
//
// Series (rates are the scraper's job, so only totals are exported):
//   shardline_joins_total                          counter, successful JoinJob calls
//   shardline_heartbeats_total                     counter, Heartbeat calls answered OK
//   shardline_job_generation{job}                  gauge, current generation
//   shardline_job_members{job,state}               gauge, members by MemberState
//   shardline_job_stragglers{job}                  gauge, ranks flagged as stragglers
//   shardline_job_hangs_detected_total{job}        counter, hangs found (this process)
//   shardline_rpc_duration_seconds{method,le}      histogram of handler time, fixed
//                                                  buckets kRpcLatencyBuckets (seconds)
//   shardline_rpcs_total{method,code}              counter, calls by final status code
// Streams (Session, WatchJob) observe their whole lifetime.
//
// The HTTP server is for a scraper on a trusted network: no TLS, no auth.
// It serves GET /metrics (the exposition text) and GET /healthz (200 "ok"
// while the process serves; for probes, which need no series), HEAD of both.
// One thread runs an event loop over non-blocking sockets, so an idle or slow
// client costs a file descriptor and a few bytes, never a thread a scraper
// waits for: each connection must send its request within kRequestTimeout
// of being accepted (a total, not per read: a client dribbling a byte a
// second is cut off like an idle one) and take its answer within
// kResponseTimeout. At most kMaxConnections are open, at most
// kMaxConnectionsPerPeer from one IP address; a connection beyond either cap
// is still served: the oldest connection of that peer (or of all) that has
// not sent its whole request yet is closed with a 503 instead (the oldest
// of any when every one is being answered). A request head (request line
// and headers, through the blank line) is at most kMaxRequestBytes (else
// 431); methods other than GET and HEAD get 405; every answer is
// "Connection: close". A request not in time is answered 408. Civetweb
// (Debian's libcivetweb-dev 1.15) was measured and not used: it gives every
// connection a worker thread until its request_timeout_ms, so num_threads
// idle connections make each scrape wait a whole timeout (8 threads, 64
// idle "GET /metr" connections, 2 s: a scrape took 15.8 s).
//
// Thread-safety: Metrics is thread-safe; the job snapshot callback is called
// from the HTTP server's thread without any Metrics lock held.
#ifndef SHARDLINE_METRICS_METRICS_H_
#define SHARDLINE_METRICS_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::metrics {

// Upper bounds of the RPC latency buckets (seconds); +Inf is implied.
inline constexpr std::array<double, 16> kRpcLatencyBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1,      2.5,   5,    10,    60,   300};

// What the gauges show of one job at scrape time.
struct JobSnapshot {
  std::string job_id;
  uint64_t generation = 0;
  // Lower-case MemberState name without prefix ("active", "spare", ...) →
  // count. States with no member may be missing (then exported as 0).
  std::map<std::string, int64_t> members_by_state;
  // Ranks of the current generation flagged as stragglers (Job.num_stragglers).
  uint32_t stragglers = 0;
  // Hangs found in the job since the coordinator process started
  // (HangDetected events; Coordinator::HangsDetected).
  uint64_t hangs_detected = 0;
};

class Metrics {
 public:
  using JobSnapshotFn = std::function<std::vector<JobSnapshot>()>;

  // `jobs` (may be empty) is called at every Render.
  explicit Metrics(JobSnapshotFn jobs = nullptr);

  void CountJoin() { joins_.fetch_add(1, std::memory_order_relaxed); }
  void CountHeartbeat() { heartbeats_.fetch_add(1, std::memory_order_relaxed); }
  // `method` is "Service/Method", e.g. "WorkerService/Heartbeat".
  void ObserveRpc(absl::string_view method, absl::Duration latency, absl::StatusCode code)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The exposition text (format 0.0.4).
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Histogram {
    std::array<uint64_t, kRpcLatencyBuckets.size()> buckets{};  // non-cumulative
    uint64_t count = 0;
    double sum_seconds = 0;
  };

  const JobSnapshotFn jobs_;
  std::atomic<uint64_t> joins_{0};
  std::atomic<uint64_t> heartbeats_{0};
  mutable absl::Mutex mu_;
  std::map<std::string, Histogram> latency_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, absl::StatusCode>, uint64_t> calls_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value for the exposition format (\\, \", \n).
std::string EscapeLabelValue(absl::string_view value);

// GET /metrics and /healthz over HTTP/1.1 from one event-loop thread (see
// the file comment). Lifecycle: Start → serving → Stop (or destruction).
// Thread-safe.
class MetricsHttpServer {
 public:
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr absl::Duration kRequestTimeout = absl::Seconds(2);
  static constexpr absl::Duration kResponseTimeout = absl::Seconds(10);
  // Far above what scrapers and probes need (one connection each at a time),
  // and small next to the process's file descriptor limit (1024 by default).
  static constexpr int kMaxConnections = 256;
  static constexpr int kMaxConnectionsPerPeer = 32;
  // Answers not yet taken by their clients, all connections together; a
  // scrape beyond it is answered 503 without rendering.
  static constexpr size_t kMaxPendingResponseBytes = size_t{64} << 20;

  // Binds host:port (port 0 picks a free one) and starts serving `metrics`
  // (not owned; must outlive the server). `host` is an IPv4 or IPv6 literal
  // (brackets allowed: "[::1]") or a name; the server listens on that one
  // address ("0.0.0.0" or "::" for every interface). Errors:
  // InvalidArgument for a bad host or port; Unavailable when it cannot bind
  // or listen (the message gives errno's text).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host,
                                                                   int port,
                                                                   const Metrics* metrics);
  // The same for any exposition text: `render` is called (from the server's
  // thread, so it must be thread-safe) for every GET /metrics. The worker
  // serves its own series this way.
  using RenderFn = std::function<std::string()>;
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host,
                                                                   int port, RenderFn render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // The address the socket is bound to, as getsockname reports it:
  // "127.0.0.1:9464", "[::1]:9464", "0.0.0.0:9464".
  const std::string& address() const { return address_; }
  // Connections open now (accepted and not yet closed).
  int open_connections() const { return open_.load(); }
  // Stops serving, closes every connection and joins the thread (at once:
  // it does not wait for clients). Idempotent.
  void Stop();

 private:
  class Loop;  // metrics_http_server.cc
  MetricsHttpServer(int listen_fd, int wake_fd, int port, std::string address, RenderFn render);

  const int listen_fd_;
  const int wake_fd_;  // eventfd: Stop wakes the loop's poll
  const int port_;
  const std::string address_;
  std::atomic<bool> stop_{false};
  std::atomic<int> open_{0};
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace shardline::metrics

#endif  // SHARDLINE_METRICS_METRICS_H_

#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace shardline::metrics {
namespace {

// Prometheus float text: the shortest of %.15g / %.17g that reads back as v.
std::string FormatDouble(double v) {
  std::string s = absl::StrFormat("%.15g", v);
  double back = 0;
  if (absl::SimpleAtod(s, &back) && back == v) return s;
  return absl::StrFormat("%.17g", v);
}

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);  // e.g. "DEADLINE_EXCEEDED"
  return name.empty() ? absl::StrCat(static_cast<int>(code)) : name;
}

void SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // peer gone; nothing to do
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void SendResponse(int fd, absl::string_view status, absl::string_view content_type,
                  absl::string_view body, bool head_only, absl::string_view extra_headers = "") {
  std::string head = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                                  "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                  "Connection: close\r\n\r\n");
  SendAll(fd, head);
  if (!head_only) SendAll(fd, body);
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Metrics::Metrics(JobSnapshotFn jobs) : jobs_(std::move(jobs)) {}

void Metrics::ObserveRpc(absl::string_view method, absl::Duration latency, absl::StatusCode code) {
  const double seconds = absl::ToDoubleSeconds(latency);
  absl::MutexLock lock(&mu_);
  Histogram& h = latency_[std::string(method)];
  for (size_t i = 0; i < kRpcLatencyBuckets.size(); ++i) {
    if (seconds <= kRpcLatencyBuckets[i]) {
      ++h.buckets[i];
      break;
    }
  }
  ++h.count;
  h.sum_seconds += seconds;
  ++calls_[{std::string(method), code}];
}

std::string Metrics::Render() const {
  std::string out;
  absl::StrAppend(&out,
                  "# HELP shardline_joins_total Successful JoinJob calls.\n"
                  "# TYPE shardline_joins_total counter\n"
                  "shardline_joins_total ",
                  joins_.load(std::memory_order_relaxed), "\n",
                  "# HELP shardline_heartbeats_total Heartbeat calls answered OK.\n"
                  "# TYPE shardline_heartbeats_total counter\n"
                  "shardline_heartbeats_total ",
                  heartbeats_.load(std::memory_order_relaxed), "\n");

  // Called without mu_: the callback takes the coordinator's lock.
  std::vector<JobSnapshot> jobs = jobs_ ? jobs_() : std::vector<JobSnapshot>{};
  absl::StrAppend(&out,
                  "# HELP shardline_job_generation Current generation of the job.\n"
                  "# TYPE shardline_job_generation gauge\n");
  for (const JobSnapshot& job : jobs) {
    absl::StrAppend(&out, "shardline_job_generation{job=\"", EscapeLabelValue(job.job_id),
                    "\"} ", job.generation, "\n");
  }
  static const char* const kStates[] = {"joining", "active", "spare", "fenced", "lost", "left"};
  absl::StrAppend(&out,
                  "# HELP shardline_job_members Members of the job by state.\n"
                  "# TYPE shardline_job_members gauge\n");
  for (const JobSnapshot& job : jobs) {
    std::set<std::string> states(std::begin(kStates), std::end(kStates));
    for (const auto& [state, n] : job.members_by_state) states.insert(state);
    for (const std::string& state : states) {
      auto it = job.members_by_state.find(state);
      absl::StrAppend(&out, "shardline_job_members{job=\"", EscapeLabelValue(job.job_id),
                      "\",state=\"", EscapeLabelValue(state), "\"} ",
                      it == job.members_by_state.end() ? 0 : it->second, "\n");
    }
  }

  absl::MutexLock lock(&mu_);
  absl::StrAppend(&out,
                  "# HELP shardline_rpc_duration_seconds Time in the RPC handler (streams: "
                  "their lifetime).\n"
                  "# TYPE shardline_rpc_duration_seconds histogram\n");
  for (const auto& [method, h] : latency_) {
    const std::string m = EscapeLabelValue(method);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kRpcLatencyBuckets.size(); ++i) {
      cumulative += h.buckets[i];
      absl::StrAppend(&out, "shardline_rpc_duration_seconds_bucket{method=\"", m, "\",le=\"",
                      FormatDouble(kRpcLatencyBuckets[i]), "\"} ", cumulative, "\n");
    }
    absl::StrAppend(&out, "shardline_rpc_duration_seconds_bucket{method=\"", m,
                    "\",le=\"+Inf\"} ", h.count, "\n");
    absl::StrAppend(&out, "shardline_rpc_duration_seconds_sum{method=\"", m, "\"} ",
                    FormatDouble(h.sum_seconds), "\n");
    absl::StrAppend(&out, "shardline_rpc_duration_seconds_count{method=\"", m, "\"} ", h.count,
                    "\n");
  }
  absl::StrAppend(&out,
                  "# HELP shardline_rpcs_total RPCs by final status code.\n"
                  "# TYPE shardline_rpcs_total counter\n");
  for (const auto& [key, n] : calls_) {
    absl::StrAppend(&out, "shardline_rpcs_total{method=\"", EscapeLabelValue(key.first),
                    "\",code=\"", CodeName(key.second), "\"} ", n, "\n");
  }
  return out;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const Metrics* metrics) {
  return Start(host, port, [metrics] { return metrics->Render(); });
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, RenderFn render) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is not in 0..65535"));
  }
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = absl::StrCat(port);
  int rc = ::getaddrinfo(h.empty() ? nullptr : h.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics host '", host, "' does not resolve: ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 16) == 0) break;
    last_error = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", host, ":", port, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int bound_port = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, bound_port, std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int fd, int port, RenderFn render)
    : listen_fd_(fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  ::close(listen_fd_);
}

void MetricsHttpServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  // Connection threads see stop_ within one 100 ms poll.
  while (active_.load() > 0) absl::SleepFor(absl::Milliseconds(10));
}

void MetricsHttpServer::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, 100);  // wake every 100 ms to see stop_
    if (rc <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // Each connection on its own thread, so a slow or idle client cannot
    // hold up a scrape; beyond kMaxConnections at once, answer 503 at once.
    if (active_.load() >= kMaxConnections) {
      SendResponse(fd, "503 Service Unavailable", "text/plain; charset=utf-8",
                   "too many connections\n", false);
      ::close(fd);
      continue;
    }
    active_.fetch_add(1);
    std::thread([this, fd] {
      HandleConnection(fd);
      ::close(fd);
      active_.fetch_sub(1);
    }).detach();
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  const absl::Time deadline = absl::Now() + kRequestTimeout;
  std::string request;
  char buf[1024];
  size_t header_end = std::string::npos;
  while (header_end == std::string::npos) {
    if (request.size() > kMaxRequestBytes) {
      SendResponse(fd, "431 Request Header Fields Too Large", "text/plain; charset=utf-8",
                   "request too large\n", false);
      return;
    }
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0 || stop_.load()) {
      SendResponse(fd, "408 Request Timeout", "text/plain; charset=utf-8", "request timeout\n",
                   false);
      return;
    }
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left_ms < 100 ? left_ms : 100));
    if (rc < 0 && errno != EINTR) return;
    if (rc <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // closed before a full request
    request.append(buf, static_cast<size_t>(n));
    header_end = request.find("\r\n\r\n");
    if (header_end == std::string::npos) header_end = request.find("\n\n");
  }
  if (header_end > kMaxRequestBytes) {
    SendResponse(fd, "431 Request Header Fields Too Large", "text/plain; charset=utf-8",
                 "request too large\n", false);
    return;
  }
  absl::string_view line = absl::string_view(request).substr(0, request.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    SendResponse(fd, "400 Bad Request", "text/plain; charset=utf-8", "bad request\n", false);
    return;
  }
  const bool head = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head) {
    SendResponse(fd, "405 Method Not Allowed", "text/plain; charset=utf-8",
                 "only GET /metrics\n", false, "Allow: GET, HEAD\r\n");
    return;
  }
  absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") {
    SendResponse(fd, "404 Not Found", "text/plain; charset=utf-8", "try /metrics\n", head);
    return;
  }
  SendResponse(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", render_(),
               head);
}

}  // namespace shardline::metrics

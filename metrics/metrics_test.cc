#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardline::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port and returns everything the server sent
// until it closed the connection.
std::string Exchange(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (request too large)
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

std::string Body(const std::string& response) {
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

TEST(MetricsTest, RendersCountersGaugesAndHistograms) {
  Metrics metrics([] {
    JobSnapshot a;
    a.job_id = "job-a";
    a.generation = 3;
    a.members_by_state = {{"active", 4}, {"spare", 1}};
    a.stragglers = 2;
    a.hangs_detected = 3;
    JobSnapshot b;
    b.job_id = "we\"ird\\job";
    b.generation = 1;
    return std::vector<JobSnapshot>{a, b};
  });
  metrics.CountJoin();
  metrics.CountJoin();
  metrics.CountHeartbeat();
  metrics.ObserveRpc("WorkerService/Heartbeat", absl::Microseconds(300), absl::StatusCode::kOk);
  metrics.ObserveRpc("WorkerService/Heartbeat", absl::Milliseconds(7), absl::StatusCode::kOk);
  metrics.ObserveRpc("WorkerService/Heartbeat", absl::Seconds(1000), absl::StatusCode::kAborted);

  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\nshardline_joins_total 2\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_heartbeats_total 1\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_generation{job=\"job-a\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_generation{job=\"we\\\"ird\\\\job\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_members{job=\"job-a\",state=\"active\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_members{job=\"job-a\",state=\"spare\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_members{job=\"job-a\",state=\"lost\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_stragglers{job=\"job-a\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_stragglers{job=\"we\\\"ird\\\\job\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\nshardline_job_hangs_detected_total{job=\"job-a\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE shardline_job_hangs_detected_total counter\n"));
  const std::string bucket = "shardline_rpc_duration_seconds_bucket{method=\"WorkerService/Heartbeat\"";
  EXPECT_THAT(text, HasSubstr(bucket + ",le=\"0.0005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(bucket + ",le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(bucket + ",le=\"0.01\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(bucket + ",le=\"300\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(bucket + ",le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr(
                        "shardline_rpc_duration_seconds_count{method=\"WorkerService/Heartbeat\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("shardline_rpcs_total{method=\"WorkerService/Heartbeat\","
                              "code=\"ABORTED\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE shardline_rpc_duration_seconds histogram\n"));
  // Every line is a comment or "name{labels} value".
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(line[0] == '#' || line.find(' ') != absl::string_view::npos) << line;
  }
}

TEST(MetricsHttpServerTest, ServesMetricsOverLoopback) {
  Metrics metrics([] {
    JobSnapshot a;
    a.job_id = "job-a";
    a.generation = 5;
    a.members_by_state = {{"active", 2}};
    return std::vector<JobSnapshot>{a};
  });
  for (int i = 0; i < 7; ++i) metrics.CountHeartbeat();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  std::string response = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(response, HasSubstr("Connection: close"));
  EXPECT_THAT(Body(response), HasSubstr("\nshardline_heartbeats_total 7\n"));
  EXPECT_THAT(Body(response), HasSubstr("shardline_job_generation{job=\"job-a\"} 5\n"));
  EXPECT_THAT(Body(response),
              HasSubstr("shardline_job_members{job=\"job-a\",state=\"active\"} 2\n"));

  // Values are live.
  metrics.CountHeartbeat();
  EXPECT_THAT(Body(Exchange(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n")),
              HasSubstr("\nshardline_heartbeats_total 8\n"));

  EXPECT_THAT(Exchange(port, "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(Exchange(port, "garbage\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  std::string head = Exchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(Body(head), "");
  // A huge request is refused, and the server keeps serving.
  std::string huge = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  EXPECT_THAT(Exchange(port, huge), StartsWith("HTTP/1.1 431"));
  // A client that sends half a request and goes away does not wedge it.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::send(fd, "GET /metr", 9, MSG_NOSIGNAL);
    ::close(fd);
  }
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200"));

  (*server)->Stop();
  (*server)->Stop();  // idempotent
}

TEST(MetricsHttpServerTest, BadPortIsInvalidArgument) {
  Metrics metrics;
  EXPECT_EQ(MetricsHttpServer::Start("127.0.0.1", 70000, &metrics).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::metrics

namespace shardline::metrics {
namespace {

// A connected TCP socket to 127.0.0.1:port, from the local address `from`
// (e.g. "127.0.0.2"; empty: the kernel's choice).
int Connect(int port, const char* from = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  if (from != nullptr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    EXPECT_EQ(::inet_pton(AF_INET, from, &local.sin_addr), 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0) << from;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// A client that sent part of a request line and nothing more.
int IdleClient(int port, const char* from = nullptr) {
  int fd = Connect(port, from);
  EXPECT_EQ(::send(fd, "GET /metr", 9, MSG_NOSIGNAL), 9);
  return fd;
}

// Everything the server sends on `fd` until it closes the connection.
std::string ReadToEnd(int fd) {
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  return response;
}

// Waits (without a time limit: the test's own timeout is the limit) until
// the server has `n` connections open.
void AwaitOpenConnections(const MetricsHttpServer& server, int n) {
  while (server.open_connections() != n) absl::SleepFor(absl::Milliseconds(5));
}

// Idle clients cost the server no thread: with 64 of them open (each sent
// "GET /metr" and nothing more; four times the 16 connections the
// thread-per-connection server allowed, which answered these scrapes 503),
// 8 concurrent scrapers, 3 scrapes each, all get the series.
TEST(MetricsHttpServerTest, IdleClientsDoNotStarveScrapes) {
  Metrics metrics([] {
    JobSnapshot a;
    a.job_id = "job-a";
    a.generation = 4;
    return std::vector<JobSnapshot>{a};
  });
  metrics.CountHeartbeat();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) idle.push_back(IdleClient(port));

  constexpr int kScrapers = 8, kScrapesEach = 3;
  std::vector<std::string> responses(kScrapers * kScrapesEach);
  std::vector<std::thread> scrapers;
  for (int t = 0; t < kScrapers; ++t) {
    scrapers.emplace_back([&, t] {
      for (int i = 0; i < kScrapesEach; ++i) {
        responses[t * kScrapesEach + i] =
            Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
      }
    });
  }
  for (std::thread& t : scrapers) t.join();
  for (const std::string& response : responses) {
    EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
    EXPECT_THAT(Body(response), HasSubstr("\nshardline_heartbeats_total 1\n"));
    EXPECT_THAT(Body(response), HasSubstr("\nshardline_job_generation{job=\"job-a\"} 4\n"));
  }
  for (int fd : idle) ::close(fd);
}

// One address may hold kMaxConnectionsPerPeer connections; the next one is
// served, and the oldest idle one of that address is closed with a 503.
TEST(MetricsHttpServerTest, PerPeerCapClosesTheOldestIdleConnection) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < MetricsHttpServer::kMaxConnectionsPerPeer; ++i) {
    idle.push_back(IdleClient(port));
  }
  AwaitOpenConnections(**server, MetricsHttpServer::kMaxConnectionsPerPeer);

  // One over the cap: a scrape, which is answered...
  const std::string scrape = Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(scrape, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(scrape), "up 1\n");
  // ...and the oldest idle connection was told why it was closed.
  const std::string first = ReadToEnd(idle[0]);
  EXPECT_THAT(first, StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_THAT(Body(first), HasSubstr("too many connections from this address"));
  // One under the cap once the scrape has closed (idle[1..]); `another`
  // fills it, and one more idle client over it: the next oldest goes.
  AwaitOpenConnections(**server, MetricsHttpServer::kMaxConnectionsPerPeer - 1);
  int another = IdleClient(port);
  AwaitOpenConnections(**server, MetricsHttpServer::kMaxConnectionsPerPeer);
  int one_more = IdleClient(port);
  EXPECT_THAT(ReadToEnd(idle[1]), StartsWith("HTTP/1.1 503"));
  ::close(one_more);

  // Another address is not limited by this one's connections.
  int other_fd = Connect(port, "127.0.0.2");
  const std::string request = "GET /healthz HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(other_fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  EXPECT_THAT(ReadToEnd(other_fd), StartsWith("HTTP/1.1 200 OK\r\n"));
  ::close(other_fd);
  ::close(another);
  for (int fd : idle) ::close(fd);
}

// kMaxConnections in all: one more (from an address under its own cap)
// closes the oldest idle connection of any address.
TEST(MetricsHttpServerTest, GlobalCapClosesTheOldestIdleConnection) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  constexpr int kPeers =
      MetricsHttpServer::kMaxConnections / MetricsHttpServer::kMaxConnectionsPerPeer;
  static_assert(kPeers * MetricsHttpServer::kMaxConnectionsPerPeer ==
                MetricsHttpServer::kMaxConnections);
  std::vector<int> idle;
  for (int p = 0; p < kPeers; ++p) {
    const std::string from = absl::StrCat("127.0.1.", p + 1);
    for (int i = 0; i < MetricsHttpServer::kMaxConnectionsPerPeer; ++i) {
      idle.push_back(IdleClient(port, from.c_str()));
    }
  }
  AwaitOpenConnections(**server, MetricsHttpServer::kMaxConnections);
  int fd = Connect(port, "127.0.2.1");
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  const std::string scrape = ReadToEnd(fd);
  ::close(fd);
  EXPECT_THAT(scrape, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(scrape), "up 1\n");
  const std::string first = ReadToEnd(idle[0]);
  EXPECT_THAT(first, StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_THAT(Body(first), HasSubstr("too many connections\n"));
  for (int idle_fd : idle) ::close(idle_fd);
}

// The server listens on the host it was given, and only there.
TEST(MetricsHttpServerTest, BindsTheConfiguredHost) {
  auto render = [] { return std::string("up 1\n"); };
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> loopback =
      MetricsHttpServer::Start("127.0.0.1", 0, render);
  ASSERT_TRUE(loopback.ok()) << loopback.status();
  const int port = (*loopback)->port();
  EXPECT_EQ((*loopback)->address(), absl::StrCat("127.0.0.1:", port));
  // 127.0.0.2 is another local address (all of 127/8 is); nothing listens
  // on it at this port.
  auto reachable_at = [](const char* ip, int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(::inet_pton(AF_INET, ip, &addr.sin_addr), 1);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
  };
  EXPECT_TRUE(reachable_at("127.0.0.1", port));
  EXPECT_FALSE(reachable_at("127.0.0.2", port));
  (*loopback)->Stop();

  // Every interface: then 127.0.0.2 reaches it too.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> any =
      MetricsHttpServer::Start("0.0.0.0", 0, render);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ((*any)->address(), absl::StrCat("0.0.0.0:", (*any)->port()));
  EXPECT_TRUE(reachable_at("127.0.0.2", (*any)->port()));

  // IPv6, with or without brackets.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> v6 =
      MetricsHttpServer::Start("[::1]", 0, render);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ((*v6)->address(), absl::StrCat("[::1]:", (*v6)->port()));

  EXPECT_EQ(MetricsHttpServer::Start("", 0, render).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("no-such-host.invalid", 0, render).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// /healthz answers without rendering the series (a probe costs nothing).
TEST(MetricsHttpServerTest, HealthzAnswersOkWithoutRendering) {
  std::atomic<int> renders{0};
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, [&renders] {
        renders.fetch_add(1);
        return std::string("up 1\n");
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string health = Exchange(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(health, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(health, HasSubstr("Content-Length: 3\r\n"));
  EXPECT_EQ(Body(health), "ok\n");
  const std::string head = Exchange(port, "HEAD /healthz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(head), "");
  EXPECT_EQ(renders.load(), 0);
  EXPECT_EQ(Body(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n")), "up 1\n");
  EXPECT_EQ(renders.load(), 1);
  EXPECT_THAT(Exchange(port, "GET /healthz/x HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404"));
}

// Sizes and methods: the status says what was wrong.
TEST(MetricsHttpServerTest, RefusesOversizeAndNonGetRequests) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // A head of exactly kMaxRequestBytes is served; one byte more is not.
  const std::string start = "GET /metrics HTTP/1.1\r\nX-Pad: ";
  const size_t pad = MetricsHttpServer::kMaxRequestBytes - start.size() - 4;
  EXPECT_THAT(Exchange(port, start + std::string(pad, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(Exchange(port, start + std::string(pad + 1, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.1 431"));
  // A request line that never ends.
  EXPECT_THAT(Exchange(port, "GET /" + std::string(3 * MetricsHttpServer::kMaxRequestBytes, 'm')),
              StartsWith("HTTP/1.1 431"));
  for (const char* method : {"POST", "PUT", "DELETE", "OPTIONS"}) {
    const std::string response = Exchange(port, absl::StrCat(method, " /metrics HTTP/1.1\r\n\r\n"));
    EXPECT_THAT(response, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n")) << method;
    EXPECT_THAT(response, HasSubstr("\r\nAllow: GET, HEAD\r\n")) << method;
  }
  EXPECT_THAT(Exchange(port, "POST /healthz HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 405"));
}

// kRequestTimeout bounds the whole request, not each read: a client that
// dribbles a byte of a never-ending head every 50 ms is cut off with a 408
// long before it reaches kMaxRequestBytes (a per-read timeout would let it
// hold its connection until then).
TEST(MetricsHttpServerTest, DribblingClientIsCutOffAtTheRequestDeadline) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  int fd = Connect((*server)->port());
  const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: ";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  size_t sent = head.size();
  while (sent < MetricsHttpServer::kMaxRequestBytes) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 0) break;  // the server answered (or closed)
    if (::send(fd, "a", 1, MSG_NOSIGNAL) != 1) break;
    ++sent;
  }
  EXPECT_LT(sent, MetricsHttpServer::kMaxRequestBytes / 2);
  EXPECT_THAT(ReadToEnd(fd), StartsWith("HTTP/1.1 408 Request Timeout\r\n"));
  ::close(fd);
}

// Stop closes the connections still open at once, whatever their clients do.
TEST(MetricsHttpServerTest, StopClosesIdleConnections) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(IdleClient((*server)->port()));
  AwaitOpenConnections(**server, 3);
  (*server)->Stop();
  EXPECT_EQ((*server)->open_connections(), 0);
  for (int fd : idle) {
    char c;
    EXPECT_EQ(::recv(fd, &c, 1, 0), 0);  // closed: EOF, not a hang
    ::close(fd);
  }
}

}  // namespace
}  // namespace shardline::metrics

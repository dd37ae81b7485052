#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

// Idle clients each hold their own connection thread: a scrape next to five
// of them answers at once instead of after their request timeouts.
TEST(MetricsHttpServerTest, IdleClientsDoNotDelayAScrape) {
  Metrics metrics([] { return std::vector<JobSnapshot>{}; });
  metrics.CountHeartbeat();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(100));  // let the server accept them
  const absl::Time start = absl::Now();
  const std::string response = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));  // serially: >= 2 s, the idle timeout
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(Body(response), ::testing::HasSubstr("shardline_heartbeats_total 1\n"));
  for (int fd : idle) ::close(fd);
}

}  // namespace
}  // namespace shardline::metrics

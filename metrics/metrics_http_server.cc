// MetricsHttpServer (metrics/metrics.h): one thread polls the listening
// socket, an eventfd that Stop writes, and every open connection. Each
// connection moves kReading → kWriting → kDraining → closed:
//   kReading   collects the request head (up to kMaxRequestBytes) until
//              accepted + kRequestTimeout (then the answer is a 408);
//   kWriting   sends the whole answer until kResponseTimeout after it was
//              made;
//   kDraining  after shutdown(SHUT_WR), reads and drops what the client still
//              sends (a bounded amount, briefly), so that closing with unread
//              bytes does not reset the connection before the client has read
//              the answer (a 431 to a client still sending its huge head).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "metrics/metrics.h"

namespace shardline::metrics {
namespace {

// How long, and how many bytes, a closing connection's leftover input is
// read and dropped for.
constexpr absl::Duration kDrainTimeout = absl::Seconds(1);
constexpr size_t kMaxDrainBytes = size_t{1} << 20;
// Accepts per loop iteration, so a flood of connects cannot starve the
// connections already open.
constexpr int kAcceptsPerRound = 64;

constexpr absl::string_view kText = "text/plain; charset=utf-8";

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, bool head_only, absl::string_view extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", head_only ? "" : body);
}

// "1.2.3.4" / "::1" of a peer, the key of the per-peer cap.
std::string PeerAddress(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text,
                sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {  // ::ffff:1.2.3.4 is 1.2.3.4's connection
      ::inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof(text));
    } else {
      ::inet_ntop(AF_INET6, &a6, text, sizeof(text));
    }
  }
  return text;
}

}  // namespace

class MetricsHttpServer::Loop {
 public:
  Loop(MetricsHttpServer* server, RenderFn render) : server_(server), render_(std::move(render)) {}

  void Run() {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;  // ids[i] is the connection of fds[i + 2]
    bool accept_paused = false;
    while (!server_->stop_.load()) {
      fds.clear();
      ids.clear();
      fds.push_back({server_->wake_fd_, POLLIN, 0});
      fds.push_back({accept_paused ? -1 : server_->listen_fd_, POLLIN, 0});
      absl::Time next_deadline = absl::Now() + absl::Seconds(1);
      for (const auto& [id, c] : connections_) {
        fds.push_back({c.fd, static_cast<short>(c.state == State::kWriting ? POLLOUT : POLLIN), 0});
        ids.push_back(id);
        next_deadline = std::min(next_deadline, c.deadline);
      }
      const int64_t wait_ms =
          std::max<int64_t>(0, absl::ToInt64Milliseconds(next_deadline - absl::Now()) + 1);
      // After EMFILE, retry accepting in 100 ms rather than spin on it.
      const int rc =
          ::poll(fds.data(), fds.size(),
                 static_cast<int>(accept_paused ? std::min<int64_t>(wait_ms, 100) : wait_ms));
      if (rc < 0 && errno != EINTR) break;
      accept_paused = false;
      if (rc > 0) {
        for (size_t i = 0; i < ids.size(); ++i) {
          if (fds[i + 2].revents != 0) Progress(ids[i]);
        }
        if (fds[1].revents != 0) accept_paused = !AcceptSome();
      }
      Expire();
    }
    for (auto& [id, c] : connections_) ::close(c.fd);
    connections_.clear();
    server_->open_.store(0);
  }

 private:
  enum class State { kReading, kWriting, kDraining };
  struct Connection {
    int fd = -1;
    std::string peer;
    State state = State::kReading;
    absl::Time deadline;
    std::string in;
    std::string out;
    size_t sent = 0;
    size_t drained = 0;
  };

  // Accepts up to kAcceptsPerRound connections; false when out of file
  // descriptors (then accepting pauses briefly).
  bool AcceptSome() {
    for (int i = 0; i < kAcceptsPerRound; ++i) {
      sockaddr_storage peer{};
      socklen_t len = sizeof(peer);
      const int fd = ::accept4(server_->listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Make room for the next one, if there is anything to give up.
          if (!connections_.empty()) Evict(Oldest(nullptr), "server out of file descriptors");
          return false;
        }
        return true;  // EAGAIN: none left
      }
      Connection c;
      c.fd = fd;
      c.peer = PeerAddress(peer);
      c.deadline = absl::Now() + kRequestTimeout;
      int& from_peer = per_peer_[c.peer];
      if (from_peer >= kMaxConnectionsPerPeer) {
        Evict(Oldest(&c.peer), "too many connections from this address");
      } else if (static_cast<int>(connections_.size()) >= kMaxConnections) {
        Evict(Oldest(nullptr), "too many connections");
      }
      ++per_peer_[c.peer];
      connections_.emplace(next_id_++, std::move(c));
      server_->open_.store(static_cast<int>(connections_.size()));
    }
    return true;
  }

  // The oldest connection (of `peer`, when given) still reading its request,
  // else the oldest of all of them. Ids grow, so the map is oldest first.
  uint64_t Oldest(const std::string* peer) const {
    uint64_t any = 0;
    bool have_any = false;
    for (const auto& [id, c] : connections_) {
      if (peer != nullptr && c.peer != *peer) continue;
      if (c.state == State::kReading) return id;
      if (!have_any) {
        any = id;
        have_any = true;
      }
    }
    return any;
  }

  void Evict(uint64_t id, absl::string_view why) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    if (it->second.state == State::kReading) {
      TellAndClose(it, Response("503 Service Unavailable", kText, absl::StrCat(why, "\n"), false));
    } else {
      Close(it);
    }
  }

  // For a connection given up while reading its request: drops the input
  // already there (closing with unread input would reset the connection and
  // lose the answer), sends `answer` with one non-blocking send (best effort:
  // the client learns why) and closes.
  void TellAndClose(std::map<uint64_t, Connection>::iterator it, const std::string& answer) {
    const int fd = it->second.fd;
    char buf[4096];
    for (size_t dropped = 0; dropped < kMaxRequestBytes;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      dropped += static_cast<size_t>(n);
    }
    (void)::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    Close(it);
  }

  void Close(std::map<uint64_t, Connection>::iterator it) {
    ::close(it->second.fd);
    pending_bytes_ -= it->second.out.size() - it->second.sent;
    auto peer = per_peer_.find(it->second.peer);
    if (peer != per_peer_.end() && --peer->second <= 0) per_peer_.erase(peer);
    connections_.erase(it);
    server_->open_.store(static_cast<int>(connections_.size()));
  }

  // Connections past their deadline: one whose request did not arrive in
  // time is answered 408 (and closes like any answered one, but within
  // kDrainTimeout); one not taking its answer in time is closed.
  void Expire() {
    const absl::Time now = absl::Now();
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      Connection& c = it->second;
      if (c.deadline <= now) {
        if (c.state == State::kReading) {
          c.in.clear();
          c.out = Response("408 Request Timeout", kText, "request timeout\n", false);
          pending_bytes_ += c.out.size();
          c.state = State::kWriting;
          c.deadline = now + kDrainTimeout;
          Progress(it->first);  // may close it; `next` stays valid
        } else {
          Close(it);
        }
      }
      it = next;
    }
  }

  // Moves one connection on as far as its socket allows.
  void Progress(uint64_t id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = it->second;
    char buf[4096];
    if (c.state == State::kReading) {
      while (true) {
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {  // closed (or reset) before a whole request
          Close(it);
          return;
        }
        c.in.append(buf, static_cast<size_t>(n));
        // The head's length, its closing blank line included.
        size_t head_size = c.in.find("\r\n\r\n");
        if (head_size != std::string::npos) {
          head_size += 4;
        } else if ((head_size = c.in.find("\n\n")) != std::string::npos) {
          head_size += 2;
        }
        if (head_size == std::string::npos && c.in.size() <= kMaxRequestBytes) continue;
        Answer(c, head_size);
        break;
      }
    }
    if (c.state == State::kWriting) {
      while (c.sent < c.out.size()) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {  // peer gone
          Close(it);
          return;
        }
        c.sent += static_cast<size_t>(n);
        pending_bytes_ -= static_cast<size_t>(n);
      }
      ::shutdown(c.fd, SHUT_WR);
      c.state = State::kDraining;
      c.deadline = absl::Now() + kDrainTimeout;
    }
    if (c.state == State::kDraining) {
      while (true) {
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c.drained += n > 0 ? static_cast<size_t>(n) : 0;
        if (n <= 0 || c.drained > kMaxDrainBytes) {
          Close(it);
          return;
        }
      }
    }
  }

  // Makes the answer to the request head in c.in (head_size: its length,
  // npos when it grew past kMaxRequestBytes without ending) and starts
  // sending it.
  void Answer(Connection& c, size_t head_size) {
    c.out = AnswerFor(c.in, head_size);
    c.in.clear();
    c.in.shrink_to_fit();
    pending_bytes_ += c.out.size();
    c.state = State::kWriting;
    c.deadline = absl::Now() + kResponseTimeout;
  }

  std::string AnswerFor(const std::string& request, size_t head_size) {
    if (head_size == std::string::npos || head_size > kMaxRequestBytes) {
      return Response("431 Request Header Fields Too Large", kText,
                      absl::StrCat("request head over ", kMaxRequestBytes, " bytes\n"), false);
    }
    absl::string_view line = absl::string_view(request).substr(0, request.find('\n'));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
      return Response("400 Bad Request", kText, "bad request\n", false);
    }
    const bool head = parts[0] == "HEAD";
    if (parts[0] != "GET" && !head) {
      return Response("405 Method Not Allowed", kText, "only GET /metrics or /healthz\n", false,
                      "Allow: GET, HEAD\r\n");
    }
    const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (path == "/healthz") return Response("200 OK", kText, "ok\n", head);
    if (path != "/metrics") {
      return Response("404 Not Found", kText, "try /metrics or /healthz\n", head);
    }
    if (pending_bytes_ >= kMaxPendingResponseBytes) {
      return Response("503 Service Unavailable", kText,
                      "busy: too many answers not yet read by their clients\n", head);
    }
    return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_(), head);
  }

  MetricsHttpServer* const server_;
  const RenderFn render_;
  std::map<uint64_t, Connection> connections_;  // by id: oldest first
  std::map<std::string, int> per_peer_;         // open connections by peer address
  uint64_t next_id_ = 1;
  size_t pending_bytes_ = 0;  // answer bytes made and not yet sent
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const Metrics* metrics) {
  return Start(host, port, [metrics] { return metrics->Render(); });
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host,
                                                                            int port,
                                                                            RenderFn render) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is not in 0..65535"));
  }
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty()) {
    return absl::InvalidArgumentError(
        "metrics host is empty; give an address to listen on (127.0.0.1, ::1, 0.0.0.0 for every "
        "IPv4 interface, :: for every interface)");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = ::getaddrinfo(h.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics host '", host, "' does not resolve: ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    last_error = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", host, ":", port, ": ", last_error));
  }
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("metrics server: eventfd: ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  char text[INET6_ADDRSTRLEN] = "?";
  int bound_port = 0;
  std::string address;
  if (bound.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&bound);
    ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof(text));
    bound_port = ntohs(a6->sin6_port);
    address = absl::StrCat("[", text, "]:", bound_port);
  } else {
    const auto* a4 = reinterpret_cast<const sockaddr_in*>(&bound);
    ::inet_ntop(AF_INET, &a4->sin_addr, text, sizeof(text));
    bound_port = ntohs(a4->sin_port);
    address = absl::StrCat(text, ":", bound_port);
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, wake, bound_port, std::move(address), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, int port, std::string address,
                                     RenderFn render)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      address_(std::move(address)),
      loop_(std::make_unique<Loop>(this, std::move(render))) {
  thread_ = std::thread([this] { loop_->Run(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void MetricsHttpServer::Stop() {
  stop_.store(true);
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

}  // namespace shardline::metrics

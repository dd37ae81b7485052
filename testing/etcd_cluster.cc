#include "testing/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "etcd/client.h"

extern char** environ;

namespace shardline::testing {

absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status error;
  for (int i = 0; i < count && error.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      error = absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      error = absl::UnavailableError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(errno)));
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  if (!error.ok()) return error;
  return ports;
}

namespace {

constexpr int kStartTries = 3;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempRoot() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(EtcdClusterOptions options) {
  if (options.members < 1) {
    return absl::InvalidArgumentError(absl::StrCat("members=", options.members));
  }
  absl::Status last;
  for (int attempt = 1; attempt <= kStartTries; ++attempt) {
    std::unique_ptr<EtcdCluster> cluster(new EtcdCluster(options));
    absl::BitGen gen;
    cluster->token_ = absl::StrCat("shardline-test-", ::getpid(), "-", absl::Uniform<uint64_t>(gen),
                                   "-", attempt);
    cluster->dir_ = options.dir.empty() ? absl::StrCat(TempRoot(), "/etcd-", cluster->token_)
                                        : absl::StrCat(options.dir, "/try-", attempt);
    std::error_code ec;
    std::filesystem::create_directories(cluster->dir_, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("mkdir ", cluster->dir_, ": ", ec.message()));
    }
    absl::StatusOr<std::vector<int>> ports = FreeLoopbackPorts(2 * options.members);
    if (!ports.ok()) return ports.status();
    for (int i = 0; i < options.members; ++i) {
      Member m;
      m.name = absl::StrCat("m", i);
      m.client_port = (*ports)[2 * i];
      m.peer_port = (*ports)[2 * i + 1];
      m.data_dir = absl::StrCat(cluster->dir_, "/", m.name, ".data");
      m.log = absl::StrCat(cluster->dir_, "/", m.name, ".log");
      cluster->members_.push_back(std::move(m));
    }
    absl::Status s;
    for (Member& m : cluster->members_) {
      s.Update(cluster->Spawn(m));
    }
    std::vector<int> all;
    for (int i = 0; i < options.members; ++i) all.push_back(i);
    if (s.ok()) s = cluster->WaitServing(all, options.start_timeout);
    if (s.ok()) return cluster;
    bool port_taken = false;
    for (const Member& m : cluster->members_) {
      port_taken = port_taken || absl::StrContains(ReadAll(m.log), "address already in use");
    }
    last = absl::Status(s.code(), absl::StrCat("etcd cluster in ", cluster->dir_, " (try ", attempt,
                                               "): ", s.message(), "\n", cluster->LogTails(30)));
    if (!port_taken) break;
    // The destructor kills the members; the next try uses new ports.
  }
  return last;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) {
    if (members_[i].pid > 0) Kill(i);
  }
  // Each member preallocates a 64 MB WAL: do not leave them behind.
  if (options_.dir.empty() && !dir_.empty()) {
    std::error_code ec;
    for (const Member& m : members_) std::filesystem::remove_all(m.data_dir, ec);
  }
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

std::string EtcdCluster::endpoint(int i) const {
  return absl::StrCat("127.0.0.1:", members_[i].client_port);
}

std::string EtcdCluster::Url(const std::string& prefix) const {
  return absl::StrCat("etcd://", absl::StrJoin(endpoints(), ","), prefix);
}

std::vector<std::string> EtcdCluster::Flags(const Member& m) const {
  std::vector<std::string> peers;
  for (const Member& p : members_) {
    peers.push_back(absl::StrCat(p.name, "=http://127.0.0.1:", p.peer_port));
  }
  const std::string client_url = absl::StrCat("http://127.0.0.1:", m.client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> flags = {
      "--name=" + m.name,
      "--data-dir=" + m.data_dir,
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=" + absl::StrJoin(peers, ","),
      // Ignored by a member that restarts on its data directory.
      "--initial-cluster-state=new",
      "--initial-cluster-token=" + token_,
      // As every deploy file sets it (deploy/systemd/etcd.default): a
      // member that comes back cannot depose the raft leader with a higher
      // term (etcd 3.4 has it off by default).
      "--pre-vote",
      "--logger=zap",
      "--log-outputs=stderr",
  };
  flags.insert(flags.end(), options_.extra_flags.begin(), options_.extra_flags.end());
  return flags;
}

absl::Status EtcdCluster::Spawn(Member& m) {
  const std::vector<std::string> flags = Flags(m);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(options_.etcd_binary.c_str()));
  for (const std::string& f : flags) argv.push_back(const_cast<char*>(f.c_str()));
  argv.push_back(nullptr);
  // etcd reads ETCD_* variables as flags: none of the caller's may leak in.
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "ETCD")) env.push_back(*e);
  }
  env.push_back(nullptr);
  {
    std::ofstream log(m.log, std::ios::app);
    log << "=== " << absl::FormatTime(absl::Now()) << " starting " << m.name << ": "
        << options_.etcd_binary << " " << absl::StrJoin(flags, " ") << "\n";
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Dies with the test, even when the test crashes.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) std::_Exit(1);
    const int fd = ::open(m.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int null = ::open("/dev/null", O_RDONLY);
    if (fd < 0 || null < 0) std::_Exit(126);
    ::dup2(null, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), env.data());
    std::_Exit(127);
  }
  m.pid = pid;
  m.paused = false;
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitServing(const std::vector<int>& members, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("not tried yet");
  while (absl::Now() < deadline) {
    // New clients (new connections) each round: a connection made while a
    // member has bound its port but not yet joined waits for its first
    // answer up to gRPC's connect timeout (etcd/client.cc).
    std::vector<std::unique_ptr<etcd::Client>> clients;
    for (int i : members) {
      etcd::ClientOptions o;
      o.endpoints = {endpoint(i)};
      o.timeout = absl::Seconds(1);
      absl::StatusOr<std::unique_ptr<etcd::Client>> c = etcd::Client::Connect(o);
      if (!c.ok()) return c.status();
      clients.push_back(*std::move(c));
    }
    bool all = true;
    for (size_t k = 0; k < members.size() && all; ++k) {
      Member& m = members_[members[k]];
      int status = 0;
      if (m.pid > 0 && ::waitpid(m.pid, &status, WNOHANG) == m.pid) {
        m.pid = -1;
        return absl::UnavailableError(
            absl::StrCat("etcd member ", m.name, " exited (",
                         WIFEXITED(status) ? absl::StrCat("status ", WEXITSTATUS(status))
                                           : absl::StrCat("signal ", WTERMSIG(status)),
                         ") before it served"));
      }
      // A linearizable read needs the member to know a leader and to have
      // caught up with it.
      etcdserverpb::RangeRequest probe;
      probe.set_key("/shardline-test/probe");
      absl::StatusOr<etcdserverpb::RangeResponse> r = clients[k]->Range(probe);
      if (!r.ok()) {
        last = r.status();
        all = false;
      }
    }
    if (all) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd did not serve within ",
                                                  absl::FormatDuration(timeout),
                                                  "; last error: ", last.message()));
}

void EtcdCluster::Signal(int i, int signal) {
  if (members_[i].pid > 0) ::kill(members_[i].pid, signal);
}

void EtcdCluster::Wait(int i, absl::Duration grace) {
  Member& m = members_[i];
  if (m.pid <= 0) return;
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (::waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
      m.pid = -1;
      m.paused = false;
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ::kill(m.pid, SIGKILL);
  ::waitpid(m.pid, nullptr, 0);
  m.pid = -1;
  m.paused = false;
}

void EtcdCluster::Kill(int i) {
  Signal(i, SIGKILL);
  Wait(i, absl::Seconds(10));
}

void EtcdCluster::Stop(int i) {
  if (members_[i].paused) Resume(i);
  Signal(i, SIGTERM);
  Wait(i, absl::Seconds(10));
}

absl::Status EtcdCluster::Restart(int i) {
  Member& m = members_[i];
  if (m.pid > 0) {
    return absl::FailedPreconditionError(absl::StrCat("etcd member ", m.name, " is running"));
  }
  if (absl::Status s = Spawn(m); !s.ok()) return s;
  absl::Status s = WaitServing({i}, options_.start_timeout);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("restart of etcd member ", m.name, ": ", s.message(),
                                               "\n", LogTail(i, 30)));
  }
  return absl::OkStatus();
}

void EtcdCluster::Pause(int i) {
  Signal(i, SIGSTOP);
  members_[i].paused = true;
}

void EtcdCluster::Resume(int i) {
  Signal(i, SIGCONT);
  members_[i].paused = false;
}

bool EtcdCluster::running(int i) const { return members_[i].pid > 0; }

std::string EtcdCluster::LogTail(int i, int lines) const {
  std::vector<std::string> all = absl::StrSplit(ReadAll(members_[i].log), '\n');
  while (!all.empty() && all.back().empty()) all.pop_back();
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrCat("--- ", members_[i].log, " (last ", all.size() - from, " lines) ---\n",
                      absl::StrJoin(all.begin() + from, all.end(), "\n"), "\n");
}

std::string EtcdCluster::LogTails(int lines) const {
  std::string out;
  for (int i = 0; i < size(); ++i) absl::StrAppend(&out, LogTail(i, lines));
  return out;
}

}  // namespace shardline::testing

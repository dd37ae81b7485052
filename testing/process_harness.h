// Test helpers for end-to-end tests with real processes: a child process
// with its output in a log file, runfile paths, and a coordinator started on
// an ephemeral port.
#ifndef SHARDLINE_TESTING_PROCESS_HARNESS_H_
#define SHARDLINE_TESTING_PROCESS_HARNESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardline::worker {

inline std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

inline std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/shardline/", path);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A child process whose stdout and stderr go to `log`, with `env`'s
// variables set (over the parent's environment).
class Child {
 public:
  Child(const std::string& binary, const std::vector<std::string>& args, std::string log,
        const std::vector<std::pair<std::string, std::string>>& env = {})
      : log_(std::move(log)) {
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* f = std::fopen(log_.c_str(), "w");
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
      ::unsetenv("SHARDLINE_TOKEN");
      ::unsetenv("SHARDLINE_COORDINATOR");
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(binary.c_str()));
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      std::_Exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Sends `signal` (e.g. SIGSTOP / SIGCONT) without waiting.
  void Signal(int signal) { ::kill(pid_, signal); }
  void Kill() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Exit status, or -1 if still running at `timeout`.
  int WaitExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return -1;
  }
  std::string Log() const { return ReadFile(log_); }
  // Waits until the log contains `text`.
  bool WaitFor(const std::string& text, absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (absl::StrContains(Log(), text)) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

// GET `path` from 127.0.0.1:`port` (HTTP/1.1, Connection: close); the whole
// response with headers, or "" when the connection fails.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  ::close(fd);
  return response;
}

// The address a coordinator child printed ("listening on ADDR"), or "".
inline std::string ListeningAddress(const Child& coordinator) {
  std::string address;
  for (absl::string_view line : absl::StrSplit(coordinator.Log(), '\n')) {
    if (absl::ConsumePrefix(&line, "listening on ")) {
      address = std::string(absl::StripAsciiWhitespace(line));
    }
  }
  return address;
}

// Starts shardline-coordinator on a free loopback port with its state in
// memory, its output in `log`, into *coordinator, and waits up to 20 s for
// it to serve. Returns its address; "" when it did not start (its Log()
// says why).
inline std::string StartMemoryCoordinator(std::unique_ptr<Child>* coordinator,
                                          const std::string& log) {
  *coordinator = std::make_unique<Child>(Runfile("server/shardline-coordinator"),
                                         std::vector<std::string>{"--listen", "127.0.0.1:0",
                                                                  "--state", "memory"},
                                         log);
  if (!(*coordinator)->WaitFor("listening on ", absl::Seconds(20))) return "";
  return ListeningAddress(**coordinator);
}

}  // namespace shardline::worker

#endif  // SHARDLINE_TESTING_PROCESS_HARNESS_H_

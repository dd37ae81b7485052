// Test helpers for end-to-end tests of the built programs: runfile paths,
// the real shardline-coordinator as a child process, and running a shell
// command for its exit code and output.
//
//   CoordinatorProcess coordinator;  // --listen 127.0.0.1:0 --state memory
//   ASSERT_FALSE(coordinator.address().empty());
//   CommandResult r = RunCommand(absl::StrCat(Runfile("client/shardctl/shardctl"), " job list"));
#ifndef SHARDLINE_TESTING_COORDINATOR_PROCESS_H_
#define SHARDLINE_TESTING_COORDINATOR_PROCESS_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardline::e2e {

// The path of a runfile of the main repository, e.g. "client/shardctl/shardctl".
inline std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/shardline/", path);
}

// The coordinator as a child process; SIGTERM on destruction. address() is
// empty when it did not print "listening on HOST:PORT".
class CoordinatorProcess {
 public:
  CoordinatorProcess() {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      const std::string binary = Runfile("server/shardline-coordinator");
      execl(binary.c_str(), binary.c_str(), "--listen", "127.0.0.1:0", "--state", "memory",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    stdout_ = fdopen(out[0], "r");
    char line[512];
    // "listening on HOST:PORT" once it serves.
    while (stdout_ != nullptr && std::fgets(line, sizeof(line), stdout_) != nullptr) {
      std::string l(line);
      if (absl::StartsWith(l, "listening on ")) {
        address_ = l.substr(13, l.find_last_not_of("\r\n") - 12);
        break;
      }
    }
  }
  ~CoordinatorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_ != nullptr) std::fclose(stdout_);
  }
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;

  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  std::string address_;
};

struct CommandResult {
  int rc = -1;         // exit status; -1 when it could not run or did not exit
  std::string output;  // its stdout
};

// Runs `command` with popen (sh -c) and reads its stdout to the end.
inline CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), p)) > 0) {
    r.output.append(buffer.data(), n);
  }
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace shardline::e2e

#endif  // SHARDLINE_TESTING_COORDINATOR_PROCESS_H_

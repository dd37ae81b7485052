// End-to-end test of the shardline-coordinator binary: start it on a SQLite
// file, form a generation, kill -9 it, start it again on the same file, and
// check that the job, generation, members and ranks survived and that the
// workers carry on; then SIGTERM shuts it down cleanly.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/grpc_test_util.h"

namespace shardline::server {
namespace {

using ::testing::HasSubstr;
using testing::JoinAll;
using testing::MakeChannel;
using testing::Pointers;
using testing::Prepare;
using testing::SimWorker;
using testing::SmallSpec;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/shardline/server/shardline-coordinator");
}

// A port that was free a moment ago.
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string Scrape(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// A running shardline-coordinator process.
class Process {
 public:
  // Starts the binary with `args` (and `env` entries added) and waits for
  // "listening on HOST:PORT" on its stdout.
  Process(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    int out[2];
    EXPECT_EQ(::pipe(out), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      static std::string binary = BinaryPath();
      argv.push_back(binary.data());
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      std::_Exit(127);
    }
    ::close(out[1]);
    stdout_ = ::fdopen(out[0], "r");
    char line[512];
    while (std::fgets(line, sizeof(line), stdout_) != nullptr) {
      absl::string_view l(line);
      if (absl::ConsumePrefix(&l, "listening on ")) {
        address_ = std::string(absl::StripTrailingAsciiWhitespace(l));
        break;
      }
    }
    EXPECT_FALSE(address_.empty()) << "the coordinator did not print its address";
  }
  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
    if (stdout_ != nullptr) std::fclose(stdout_);
  }

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  void Signal(int sig) { ::kill(pid_, sig); }
  // waitpid; returns the raw wait status.
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  std::string address_;
};

TEST(CoordinatorBinaryTest, SurvivesKillNine) {
  const std::string state = TempDir() + "/kill9.db";
  std::remove(state.c_str());
  const std::string admin = "admin-token-for-test";
  const int metrics_port = FreePort();
  auto process = std::make_unique<Process>(
      std::vector<std::string>{"--listen", "127.0.0.1:0", "--state", state, "--admin-token", admin,
                               "--metrics-port", absl::StrCat(metrics_port)});
  ASSERT_FALSE(process->address().empty());

  auto jobs = v1::JobService::NewStub(MakeChannel(process->address()));
  v1::CreateJobRequest create;
  create.set_job_id("durable");
  *create.mutable_spec() = SmallSpec(2, 2, 4);
  v1::CreateJobResponse created;
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, admin);
    grpc::Status s = jobs->CreateJob(&ctx, create, &created);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string token = created.worker_token();
  ASSERT_FALSE(token.empty());

  std::vector<std::unique_ptr<SimWorker>> workers;
  std::map<std::string, uint32_t> rank_of;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<SimWorker>(MakeChannel(process->address()), "durable",
                                                  absl::StrCat("w", i), 70 + i, token));
  }
  {
    std::vector<absl::StatusOr<v1::Assignment>> got = JoinAll(Pointers(workers), true);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_EQ(got[i]->generation(), 1u);
      rank_of[workers[i]->worker_id()] = got[i]->rank();
    }
  }
  v1::HeartbeatResponse hb;
  ASSERT_TRUE(workers[0]->Heartbeat(&hb).ok());
  const std::string metrics = Scrape(metrics_port);
  EXPECT_THAT(metrics, HasSubstr("shardline_job_generation{job=\"durable\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("shardline_job_members{job=\"durable\",state=\"active\"} 2\n"));
  EXPECT_THAT(metrics, HasSubstr("shardline_joins_total 2\n"));
  EXPECT_THAT(metrics, HasSubstr("shardline_heartbeats_total 1\n"));

  // kill -9.
  process->Signal(SIGKILL);
  int status = process->Wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  process.reset();

  // Again, on the same file; the admin token from the environment this time.
  process = std::make_unique<Process>(
      std::vector<std::string>{"--listen", "127.0.0.1:0", "--state", state},
      std::vector<std::string>{"SHARDLINE_ADMIN_TOKEN=" + admin});
  ASSERT_FALSE(process->address().empty());
  jobs = v1::JobService::NewStub(MakeChannel(process->address()));
  {
    v1::GetJobRequest req;
    req.set_job_id("durable");
    v1::Job job;
    grpc::ClientContext ctx;
    Prepare(&ctx, admin);
    grpc::Status s = jobs->GetJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(job.generation(), 1u);
    EXPECT_EQ(job.phase(), v1::JOB_PHASE_RUNNING);
    EXPECT_EQ(job.world_size(), 2u);
  }
  {
    v1::ListMembersRequest req;
    req.set_job_id("durable");
    v1::ListMembersResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, token);  // the worker token survived too
    grpc::Status s = jobs->ListMembers(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.members_size(), 2);
    for (const v1::Member& m : resp.members()) {
      EXPECT_EQ(m.state(), v1::MEMBER_STATE_ACTIVE) << m.worker_id();
      EXPECT_EQ(m.rank(), rank_of[m.worker_id()]) << m.worker_id();
    }
  }
  for (auto& w : workers) {
    w->SetChannel(MakeChannel(process->address()));
    w->ClearMessages();
    grpc::Status s = w->OpenSession();
    ASSERT_TRUE(s.ok()) << s.error_message();
    std::optional<v1::SessionMessage> assignment = w->WaitMessage(
        [](const v1::SessionMessage& m) { return m.has_assignment(); }, absl::Seconds(5));
    ASSERT_TRUE(assignment.has_value());
    EXPECT_EQ(assignment->assignment().generation(), 1u);
    EXPECT_EQ(assignment->assignment().rank(), rank_of[w->worker_id()]);
    grpc::Status beat = w->Heartbeat(&hb);
    EXPECT_TRUE(beat.ok()) << beat.error_message();
  }

  // SIGTERM with the sessions still open: a clean exit 0, promptly, and
  // the workers' streams end UNAVAILABLE (retry), not with a verdict.
  const absl::Time term_at = absl::Now();
  process->Signal(SIGTERM);
  status = process->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(absl::Now() - term_at, absl::Seconds(5));
  for (auto& w : workers) {
    std::optional<grpc::Status> end = w->SessionEnd(absl::Seconds(5));
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE) << end->error_message();
  }
}

// Runs the binary to its exit; its exit code (-1: killed) and stderr.
std::pair<int, std::string> RunToExit(const std::vector<std::string>& args) {
  int err[2];
  EXPECT_EQ(::pipe(err), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(err[1], 2);
    ::close(err[0]);
    ::close(err[1]);
    std::string binary = BinaryPath();
    std::vector<char*> argv = {binary.data()};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    std::_Exit(127);
  }
  ::close(err[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(err[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

// Issue 14 defect 10: the lock was "<--state>.lock" by path string, so a
// second coordinator started through a symlink or a hard link to the same
// state file, and the two diverged. Both are refused now, naming the holder.
TEST(CoordinatorBinaryTest, SecondCoordinatorOnTheSameStateFileIsRefused) {
  const std::string state = TempDir() + "/locked.db";
  const std::string symlinked = TempDir() + "/locked-symlink.db";
  const std::string hardlinked = TempDir() + "/locked-hardlink.db";
  for (const std::string& f : {state, symlinked, hardlinked}) std::remove(f.c_str());
  Process first({"--listen", "127.0.0.1:0", "--state", state});
  ASSERT_FALSE(first.address().empty());
  ASSERT_EQ(::symlink(state.c_str(), symlinked.c_str()), 0);
  ASSERT_EQ(::link(state.c_str(), hardlinked.c_str()), 0);
  for (const std::string& other : {state, symlinked, hardlinked}) {
    auto [code, err] = RunToExit({"--listen", "127.0.0.1:0", "--state", other});
    EXPECT_EQ(code, 1) << other;
    EXPECT_THAT(err, HasSubstr(absl::StrCat("state database ", other)));
    EXPECT_THAT(err, HasSubstr(absl::StrCat("is held by another coordinator (pid ", first.pid(),
                                            ")")));
  }
}

// Issue 14 defects 12 and 3: an empty state file silently started empty;
// state files were 0644; bad TLS files said "bad TLS files?".
TEST(CoordinatorBinaryTest, StartUpRefusalsNameTheFile) {
  const std::string empty = TempDir() + "/empty.db";
  { std::ofstream touch(empty); }
  auto [code, err] = RunToExit({"--listen", "127.0.0.1:0", "--state", empty});
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err, HasSubstr(absl::StrCat("state database ", empty,
                                          " is an empty (0-byte) file")));
  EXPECT_THAT(err, HasSubstr("--init-state"));
  {
    Process init({"--listen", "127.0.0.1:0", "--state", empty, "--init-state"});
    EXPECT_FALSE(init.address().empty());
    struct stat st;
    ASSERT_EQ(::stat(empty.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }

  const std::string missing = TempDir() + "/no-such.crt";
  std::tie(code, err) = RunToExit(
      {"--listen", "127.0.0.1:0", "--state", "memory", "--tls-cert", missing, "--tls-key", missing});
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err, HasSubstr(absl::StrCat("cannot read --tls-cert file '", missing,
                                          "': it does not exist")));
  EXPECT_THAT(err, ::testing::Not(HasSubstr("bad TLS files?")));
}

TEST(CoordinatorBinaryTest, BadFlagsExitWithTwo) {
  EXPECT_EQ(RunToExit({"--no-such-flag"}).first, 2);
}


// Admin tokens under 16 bytes are refused at start, from any source; a
// --admin-token-file readable by group or others is refused naming its
// mode; a private one (trailing newline stripped) works.
TEST(CoordinatorBinaryTest, AdminTokenRules) {
  auto [code, err] = RunToExit({"--listen", "127.0.0.1:0", "--state", "memory",
                                "--admin-token", "short-token"});
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("--admin-token is 11 bytes; an admin token needs at least 16"));
  // Set but empty (a failed $(openssl rand ...)) is refused, not "auth off".
  std::tie(code, err) =
      RunToExit({"--listen", "127.0.0.1:0", "--state", "memory", "--admin-token", ""});
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("--admin-token is set but empty"));
  ASSERT_EQ(::setenv("SHARDLINE_ADMIN_TOKEN", "", 1), 0);  // the child inherits it
  std::tie(code, err) = RunToExit({"--listen", "127.0.0.1:0", "--state", "memory"});
  ::unsetenv("SHARDLINE_ADMIN_TOKEN");
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("SHARDLINE_ADMIN_TOKEN is set but empty"));

  const std::string file = TempDir() + "/admin-token";
  std::remove(file.c_str());
  const std::string token = "admin-token-from-a-file";
  {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const std::string line = token + "\n";
    ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
    ::close(fd);
    ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  }
  std::tie(code, err) = RunToExit(
      {"--listen", "127.0.0.1:0", "--state", "memory", "--admin-token-file", file});
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("has mode 0644"));
  EXPECT_THAT(err, HasSubstr("chmod 600"));

  // A directory or a FIFO is refused at once (a FIFO used to hang the start).
  const std::string fifo = TempDir() + "/admin-token-fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::tie(code, err) = RunToExit(
      {"--listen", "127.0.0.1:0", "--state", "memory", "--admin-token-file", fifo});
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("is not a regular file (a FIFO)"));
  std::tie(code, err) = RunToExit(
      {"--listen", "127.0.0.1:0", "--state", "memory", "--admin-token-file", TempDir()});
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("is not a regular file (a directory)"));

  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  Process process({"--listen", "127.0.0.1:0", "--state", "memory", "--admin-token-file", file});
  ASSERT_FALSE(process.address().empty());
  auto jobs = v1::JobService::NewStub(MakeChannel(process.address()));
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token);  // without the newline
  grpc::Status s = jobs->ListJobs(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace shardline::server

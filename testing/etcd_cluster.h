// A real etcd cluster (/usr/bin/etcd, etcd 3.4) for tests: N members on
// free loopback ports, each with its own data directory and log file, that
// a test can kill, stop, restart, pause and resume.
//
//   absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start();
//   ASSERT_TRUE(cluster.ok()) << cluster.status();
//   etcd::ClientOptions options;
//   options.endpoints = (*cluster)->endpoints();
//   (*cluster)->Kill(0);  // SIGKILL member 0; the other two keep a quorum
//   (*cluster)->Restart(0);  // same data directory and ports
//
// Members run with etcd's default heartbeat (100 ms) and election timeout
// (1 s), so the shortest lease is 2 s, and with --pre-vote, as the deploy
// files run them. Their logs (etcd's zap JSON lines)
// go to DIR/mI.log; errors of Start and Restart end with the tail of each
// member's log, and LogTails() gives them for a test's failure message.
//
// Thread-safety: not thread-safe; use from the test's thread.
#ifndef SHARDLINE_TESTING_ETCD_CLUSTER_H_
#define SHARDLINE_TESTING_ETCD_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline::testing {

// `count` distinct free loopback ports: each bound to port 0 (the kernel
// picks), all held open until every one is picked, then closed. A port can
// still be taken before the caller binds it (EtcdCluster::Start retries on
// that). Unavailable when a socket cannot be bound.
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count);

struct EtcdClusterOptions {
  int members = 3;
  // Where the members' data directories and logs go; empty: a new
  // directory under $TEST_TMPDIR (or /tmp).
  std::string dir;
  // More etcd flags for every member, e.g. {"--max-txn-ops=16"}.
  std::vector<std::string> extra_flags;
  // How long Start and Restart wait for the cluster to serve.
  absl::Duration start_timeout = absl::Seconds(30);
  std::string etcd_binary = "/usr/bin/etcd";
};

class EtcdCluster {
 public:
  // Starts every member (--initial-cluster-state new, a cluster token of
  // its own) and waits until each answers Maintenance.Status and a
  // linearizable Range succeeds, i.e. the cluster has a leader. A member
  // that exits at once because a port was taken meanwhile ("address
  // already in use") makes Start try again on new ports (3 tries).
  // Unavailable / DeadlineExceeded with the members' log tails otherwise.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(EtcdClusterOptions options = {});
  // SIGKILLs every member still running.
  ~EtcdCluster();

  int size() const { return static_cast<int>(members_.size()); }
  // HOST:PORT of each member's client URL, in member order.
  std::vector<std::string> endpoints() const;
  std::string endpoint(int i) const;
  // "etcd://A,B,C" + prefix (prefix "/shardline" gives ".../shardline").
  std::string Url(const std::string& prefix) const;
  const std::string& dir() const { return dir_; }

  // SIGKILL and wait for the exit.
  void Kill(int i);
  // SIGTERM and wait for the exit (SIGKILL after 10 s).
  void Stop(int i);
  // Starts member i again on its data directory and ports (it must have
  // been killed or stopped) and waits until it answers Status and the
  // cluster serves a linearizable Range through it; when the rest has no
  // quorum without it, that is when the cluster is whole again.
  absl::Status Restart(int i);
  // SIGSTOP / SIGCONT: a member that holds its connections but answers
  // nothing.
  void Pause(int i);
  void Resume(int i);
  bool running(int i) const;

  // The last `lines` lines of member i's log, and of every member's.
  std::string LogTail(int i, int lines = 20) const;
  std::string LogTails(int lines = 20) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log;
    pid_t pid = -1;
    bool paused = false;
  };

  explicit EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)) {}
  std::vector<std::string> Flags(const Member& m) const;
  absl::Status Spawn(Member& m);
  absl::Status WaitServing(const std::vector<int>& members, absl::Duration timeout);
  void Signal(int i, int signal);
  void Wait(int i, absl::Duration grace);

  EtcdClusterOptions options_;
  std::string dir_;
  std::string token_;
  std::vector<Member> members_;
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTING_ETCD_CLUSTER_H_

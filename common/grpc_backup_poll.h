// How soon a gRPC client channel notices that a connection attempt finished,
// set for every Shardline program and library user before main().
//
// gRPC learns that a connect succeeded or failed only when some thread
// polls the channel's file descriptors. A fail-fast call on a channel in
// TRANSIENT_FAILURE (every call of //client and //etcd: none waits for
// ready) fails at once without polling, so while no call waits on the
// channel, connects are noticed by gRPC's backup poller alone, which runs
// every GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS (an environment
// variable gRPC reads when it initialises): 5000 ms by default. Measured on Debian's gRPC 1.51
// (tests:elastic_training_test, by hand with a 200 ms probe): a worker whose
// coordinator restarted 1.5 s after a SIGKILL kept failing its heartbeats
// with the stale "connection refused" for 8.5 s after the new coordinator
// served, the connect attempts having completed unnoticed for 3 and 5 s;
// with 100 ms it was through 0.2 s after the restart (the reconnect backoff
// of client/connection.cc then sets the pace).
//
// Linking //common:grpc_backup_poll (alwayslink) sets the variable to
// kBackupPollIntervalMs during static initialisation, before gRPC can have
// read it (at its first grpc_init), unless the environment already sets it
// (an operator's value wins; 0 turns the backup poller off). Its cost is
// one poll of an empty set per interval per process. The worker does not
// depend on it to reconnect: after an UNAVAILABLE heartbeat it watches the
// connection itself (client::WorkerClient::AwaitConnection), which polls;
// with the backup poller off (tests:elastic_training_test
// CoordinatorRestartWithoutGrpcBackupPoller) it reconnected 0.2 s after
// the coordinator served, and never without that watch. A program that
// initialised gRPC before this library's static initialisers ran (another
// library's static constructor creating a channel) keeps gRPC's default.
#ifndef SHARDLINE_COMMON_GRPC_BACKUP_POLL_H_
#define SHARDLINE_COMMON_GRPC_BACKUP_POLL_H_

namespace shardline {

inline constexpr char kBackupPollIntervalVariable[] = "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS";
inline constexpr int kBackupPollIntervalMs = 100;

}  // namespace shardline

#endif  // SHARDLINE_COMMON_GRPC_BACKUP_POLL_H_

#include "server/replica.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "google/protobuf/util/time_util.h"
#include "server/etcd_state_store.h"
#include "server/rendezvous.h"
#include "server/state_store.h"

namespace shardline::server {

// Everything one leadership term serves; built when elected, dropped when
// deposed. Members are destroyed in reverse order: the server first.
struct Replica::Term {
  RealClock clock;
  std::unique_ptr<StateStore> store;
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<CheckpointRegistry> checkpoints;
  std::unique_ptr<Rendezvous> rendezvous;
  std::unique_ptr<CoordinatorServer> server;
};

// The follower's answer to every RPC it does not serve itself: UNAVAILABLE
// naming the leader, with the leader's address in trailing metadata.
class Replica::NotLeaderService final : public grpc::CallbackGenericService {
 public:
  explicit NotLeaderService(const Replica* replica) : replica_(replica) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Refusal final : public grpc::ServerGenericBidiReactor {
     public:
      Refusal(grpc::GenericCallbackServerContext* ctx, const Replica* replica) {
        std::string leader;
        const absl::Status refusal = replica->NotLeader(&leader);
        if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
        Finish(ToGrpcStatus(refusal));
      }
      void OnDone() override { delete this; }
    };
    return new Refusal(ctx, replica_);
  }

 private:
  const Replica* const replica_;
};

Replica::Replica(etcd::Client* etcd, ReplicaOptions options)
    : etcd_(etcd),
      options_(std::move(options)),
      metrics_([this]() -> std::vector<metrics::JobSnapshot> {
        absl::MutexLock lock(&mu_);
        if (term_ == nullptr) return {};
        return SnapshotJobs(*term_->coordinator);
      }) {}

absl::StatusOr<std::unique_ptr<Replica>> Replica::Start(etcd::Client* etcd,
                                                        etcd::Client* election_etcd,
                                                        ReplicaOptions options) {
  // The prefix holds our format (or is empty and gets it) before anything
  // else happens: another version's data is refused at start.
  EtcdStoreOptions check;
  check.prefix = options.prefix;
  check.max_txn_ops = options.max_txn_ops;
  if (absl::StatusOr<std::unique_ptr<StateStore>> store = OpenEtcdStore(etcd, check); !store.ok()) {
    return store.status();
  }
  std::unique_ptr<Replica> replica(new Replica(etcd, std::move(options)));
  Replica* raw = replica.get();
  {
    absl::MutexLock lock(&replica->mu_);
    if (absl::Status s = replica->StartFollowerServer(); !s.ok()) return s;
  }
  ElectionOptions election;
  election.prefix = replica->options_.prefix;
  election.self = replica->options_.self;
  if (election.self.address().empty()) election.self.set_address(replica->address_);
  if (election.self.replica_id().empty()) election.self.set_replica_id(replica->address_);
  // Two processes under one replica id would share one registration (and
  // confuse operators): a live registration of the id at another address
  // is refused. The same address is this replica restarted (its old
  // registration lives until its lease runs out).
  {
    etcdserverpb::RangeRequest get;
    get.set_key(election.prefix + "replicas/" + election.self.replica_id());
    absl::StatusOr<etcdserverpb::RangeResponse> r = etcd->Range(get);
    v1::Replica other;
    if (r.ok() && r->kvs_size() > 0 && r->kvs(0).lease() != 0 &&
        other.ParseFromString(r->kvs(0).value()) && other.address() != election.self.address()) {
      absl::MutexLock lock(&replica->mu_);
      replica->StopFollowerServer();
      return absl::FailedPreconditionError(absl::StrCat(
          "--replica-id '", election.self.replica_id(), "' is in use by the replica at ",
          other.address(), " on this prefix; give each replica its own id"));
    }
  }
  election.lease_ttl = replica->options_.lease_ttl;
  election.poll_interval = replica->options_.poll_interval;
  replica->election_ = std::make_unique<LeaderElection>(election_etcd, election);
  replica->election_->Start({[raw](const LeaderTerm& t) { raw->OnElected(t); },
                             [raw](const std::string& why) { raw->OnDeposed(why); }});
  LogLine(absl::StrCat("replica ", election.self.replica_id(), " on ", replica->address_,
                       " state=", replica->options_.state,
                       " lease_ttl=", absl::FormatDuration(replica->options_.lease_ttl)));
  return replica;
}

Replica::~Replica() { Shutdown(); }

absl::Status Replica::StartFollowerServer() {
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials = options_.server.credentials != nullptr
                                                             ? options_.server.credentials
                                                             : grpc::InsecureServerCredentials();
  // The first bind takes the listen address as given (port 0: any free
  // port); later ones (after a term) the port it got.
  const std::string listen = address_.empty() ? options_.server.listen_address : address_;
  int port = 0;
  builder.AddListeningPort(listen, credentials, &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients given several replicas ping every 2 s (client/connection.h).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  // gRPC binds a service to one server for good: fresh ones each time.
  status_service_ = std::make_unique<rpc::CoordinatorServiceImpl>(options_.server.admin_token,
                                                                  [this] { return Status(); });
  not_leader_ = std::make_unique<NotLeaderService>(this);
  builder.RegisterService(status_service_.get());
  builder.RegisterCallbackGenericService(not_leader_.get());
  follower_server_ = builder.BuildAndStart();
  if (follower_server_ == nullptr || port == 0) {
    follower_server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on '", listen,
                                               "': the address is in use or not a local address"));
  }
  if (address_.empty()) address_ = BoundAddress(listen, port);
  return absl::OkStatus();
}

void Replica::StopFollowerServer() {
  if (follower_server_ == nullptr) return;
  // Its calls answer at once; nothing waits in them.
  follower_server_->Shutdown(std::chrono::system_clock::now());
  follower_server_->Wait();
  follower_server_.reset();
  not_leader_.reset();
  status_service_.reset();
}

absl::Status Replica::NotLeader(std::string* leader) const {
  leader->clear();
  if (election_ == nullptr) {
    return absl::UnavailableError(
        "not the leader yet: this coordinator replica is starting; retry with backoff");
  }
  const std::string error = election_->LastError();
  // What etcd last said, when it did not answer: the leader named may be
  // out of date then.
  const std::string etcd_said =
      error.empty() ? "" : absl::StrCat("; etcd does not answer this replica: ", error);
  std::optional<v1::Replica> l = election_->Leader();
  if (l.has_value() && l->replica_id() != election_->options().self.replica_id()) {
    *leader = l->address();
    return absl::UnavailableError(
        absl::StrCat("not the leader: the leader is ", l->address(), " (replica ", l->replica_id(),
                     "); send the call there (clients given every replica's address follow the \"",
                     kLeaderMetadataKey, "\" metadata)", etcd_said));
  }
  if (election_->leading()) {
    return absl::UnavailableError(absl::StrCat(
        "not the leader now: this replica's lease is not confirmed (etcd has not answered its "
        "keep-alives for the lease TTL, ",
        absl::FormatDuration(options_.lease_ttl), "); it serves again once etcd answers", etcd_said,
        "; retry with backoff"));
  }
  return absl::UnavailableError(
      absl::StrCat("not the leader, and no leader is known: ",
                   error.empty() ? "an election is in progress" : absl::StrCat("etcd: ", error),
                   "; retry with backoff"));
}

void Replica::OnElected(const LeaderTerm& elected) {
  auto term = std::make_unique<Term>();
  LeaderElection* election = election_.get();
  EtcdStoreOptions store_options;
  store_options.prefix = options_.prefix;
  store_options.fence_key = elected.leader_key;
  store_options.fence_revision = elected.revision;
  store_options.max_txn_ops = options_.max_txn_ops;
  store_options.on_write_failed = [election](const absl::Status& error, bool fenced) {
    election->Resign(
        absl::StrCat(fenced ? "fenced: another replica leads" : "a state write to etcd failed",
                     " (", error.message(), ")"));
  };
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenEtcdStore(etcd_, store_options);
  const absl::Time start = absl::Now();
  absl::Status failed;
  if (!store.ok()) {
    failed = store.status();
  } else {
    term->store = *std::move(store);
    term->coordinator =
        std::make_unique<Coordinator>(&term->clock, term->store.get(), options_.coordinator);
    failed = term->coordinator->Recover();
  }
  if (failed.ok()) {
    absl::StatusOr<std::unique_ptr<CheckpointRegistry>> checkpoints =
        CheckpointRegistry::Create(term->store.get(), &term->clock, options_.checkpoints);
    if (checkpoints.ok()) {
      term->checkpoints = *std::move(checkpoints);
    } else {
      failed = checkpoints.status();
    }
  }
  if (failed.ok()) {
    term->rendezvous = std::make_unique<Rendezvous>(&term->clock);
    ServerOptions server_options = options_.server;
    server_options.listen_address = address_;
    server_options.state = options_.state;
    server_options.gate = [this]() -> absl::Status {
      if (election_->LeaseValid()) return absl::OkStatus();
      std::string leader;
      return NotLeader(&leader);
    };
    server_options.status = [this] { return Status(); };
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    StopFollowerServer();
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(
        {term->coordinator.get(), term->rendezvous.get(), term->checkpoints.get(), &metrics_},
        server_options);
    if (server.ok()) {
      term->server = *std::move(server);
      term_ = std::move(term);
      LogLine(absl::StrCat("replica ", election_->options().self.replica_id(),
                           ": serving as the leader (", "state loaded and serving ",
                           absl::FormatDuration(absl::Now() - start), " after the election)"));
      return;
    }
    failed = server.status();
    StartFollowerServer().IgnoreError();  // retried at the next term
  }
  LogLine(absl::StrCat("replica ", election_->options().self.replica_id(),
                       ": elected but cannot serve: ", failed.message()));
  election->Resign(absl::StrCat("cannot serve: ", failed.message()));
}

void Replica::OnDeposed(const std::string& reason) {
  std::unique_ptr<Term> term;
  {
    absl::MutexLock lock(&mu_);
    term = std::move(term_);
  }
  if (term != nullptr) {
    // New calls are refused at once (the gate), open ones end; the
    // workers' sessions end with UNAVAILABLE, not as failures.
    term->server->Shutdown();
    term.reset();
  }
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  if (absl::Status s = StartFollowerServer(); !s.ok()) {
    LogLine(absl::StrCat("replica ", election_->options().self.replica_id(),
                         ": cannot serve as a follower after '", reason, "': ", s.message()));
  }
}

v1::CoordinatorStatus Replica::Status() const {
  v1::CoordinatorStatus out;
  out.set_state(options_.state);
  if (election_ == nullptr) return out;
  const v1::Replica self = election_->Self();
  out.set_replica_id(self.replica_id());
  absl::StatusOr<std::vector<v1::Replica>> replicas = election_->Replicas();
  if (replicas.ok() && !replicas->empty()) {
    for (v1::Replica& r : *replicas) *out.add_replicas() = std::move(r);
  } else {
    *out.add_replicas() = self;
    out.set_replicas_error(replicas.ok() ? "this replica is not registered yet"
                                         : std::string(replicas.status().message()));
  }
  if (std::optional<v1::Replica> leader = election_->Leader(); leader.has_value()) {
    out.set_leader_address(leader->address());
  }
  for (const etcd::MemberStatus& m : etcd_->Status()) {
    v1::EtcdMemberStatus* e = out.add_etcd();
    e->set_endpoint(m.endpoint);
    e->set_healthy(m.status.ok());
    e->set_is_leader(m.is_leader());
    e->set_version(m.version);
    e->set_db_size_bytes(m.db_size_bytes);
    e->set_raft_term(m.raft_term);
    if (!m.status.ok()) e->set_error(std::string(m.status.message()));
  }
  *out.mutable_lease_ttl() = google::protobuf::util::TimeUtil::NanosecondsToDuration(
      absl::ToInt64Nanoseconds(options_.lease_ttl));
  return out;
}

void Replica::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
  }
  // A leader is deposed here ("shutting down"), which drops its term.
  if (election_ != nullptr) election_->Stop();
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  StopFollowerServer();
}

}  // namespace shardline::server

#include "server/rpc/coordinator_server.h"

#include <chrono>
#include <utility>

#include <grpcpp/resource_quota.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"
#include "common/tls_files.h"
#include "server/all_jobs.h"
#include "google/protobuf/util/time_util.h"
#include "server/rpc/checkpoint_service.h"
#include "server/rpc/coordinator_service.h"
#include "server/rpc/job_service.h"
#include "server/rpc/rendezvous_service.h"
#include "server/rpc/session_stream.h"
#include "server/rpc/worker_service.h"

namespace shardline::server {
namespace {

// Idle sync-server threads kept for the next calls (see BuildAndStart).
constexpr int kSyncPollers = 256;

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file,
    const std::string& client_ca_file) {
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  absl::StatusOr<std::string> cert = ReadPemFile(cert_file, "--tls-cert", PemKind::kCertificates);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(key_file, "--tls-key", PemKind::kPrivateKey);
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckKeyMatchesCertificate(
          *cert, absl::StrCat("--tls-cert file '", cert_file, "'"), *key,
          absl::StrCat("--tls-key file '", key_file, "'"));
      !s.ok()) {
    return s;
  }
  grpc::SslServerCredentialsOptions options(
      client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPemFile(client_ca_file, "--tls-client-ca", PemKind::kCertificates);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

std::string BoundAddress(const std::string& listen_address, int port) {
  const size_t colon = listen_address.rfind(':');
  return absl::StrCat(
      colon == std::string::npos ? listen_address : listen_address.substr(0, colon), ":", port);
}

std::vector<metrics::JobSnapshot> SnapshotJobs(const Coordinator& coordinator) {
  std::vector<metrics::JobSnapshot> out;
  for (const v1::Job& job : AllJobs(coordinator)) {
    metrics::JobSnapshot s;
    s.job_id = job.job_id();
    s.generation = job.generation();
    s.stragglers = job.num_stragglers();
    if (absl::StatusOr<uint64_t> hangs = coordinator.HangsDetected(job.job_id()); hangs.ok()) {
      s.hangs_detected = *hangs;
    }
    absl::StatusOr<v1::ListMembersResponse> members = coordinator.ListMembers(job.job_id());
    if (members.ok()) {
      for (const v1::Member& m : members->members()) {
        std::string state = v1::MemberState_Name(m.state());
        absl::string_view prefix = "MEMBER_STATE_";
        if (absl::StartsWith(state, prefix)) state = state.substr(prefix.size());
        ++s.members_by_state[absl::AsciiStrToLower(state)];
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

CoordinatorServer::CoordinatorServer(ServiceDeps deps) : deps_(deps) {}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    ServiceDeps deps, ServerOptions options) {
  if (deps.coordinator == nullptr || deps.rendezvous == nullptr || deps.checkpoints == nullptr) {
    return absl::InvalidArgumentError(
        "CoordinatorServer needs a coordinator, a rendezvous and a checkpoint registry");
  }
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer(deps));
  CoordinatorServer* raw = server.get();
  const CheckpointFlow::PassOnFn pass_on = [raw](const std::vector<GenerationEnded>& ended) {
    raw->PassOn(ended);
  };
  server->calls_ = std::make_unique<rpc::CallRunner>(deps.coordinator, options.admin_token,
                                                     deps.metrics, options.gate);
  server->flow_ = std::make_unique<CheckpointFlow>(deps.coordinator, deps.checkpoints, pass_on);
  server->sessions_ =
      std::make_unique<rpc::SessionStreams>(server->calls_.get(), deps.coordinator, pass_on);
  server->watches_ = std::make_unique<rpc::WatchStreams>(server->calls_.get(), deps.coordinator,
                                                         options.watch_limits);
  server->job_service_ =
      std::make_unique<rpc::JobServiceImpl>(server->calls_.get(), deps.coordinator, deps.rendezvous,
                                            server->flow_.get(), pass_on, server->watches_.get());
  server->worker_service_ = std::make_unique<rpc::WorkerServiceImpl>(
      server->calls_.get(), deps.coordinator, server->flow_.get(), server->sessions_.get(),
      pass_on);
  server->rendezvous_service_ = std::make_unique<rpc::RendezvousServiceImpl>(
      server->calls_.get(), deps.coordinator, deps.rendezvous);
  server->checkpoint_service_ = std::make_unique<rpc::CheckpointServiceImpl>(
      server->calls_.get(), deps.coordinator, server->flow_.get());
  rpc::CoordinatorServiceImpl::StatusFn status = options.status;
  if (status == nullptr) {
    const std::string state = options.state;
    status = [raw, state] {
      v1::CoordinatorStatus out;
      out.set_state(state);
      out.set_replica_id(raw->address());
      v1::Replica* self = out.add_replicas();
      self->set_replica_id(raw->address());
      self->set_address(raw->address());
      self->set_role(v1::REPLICA_ROLE_LEADER);
      *self->mutable_start_time() = raw->start_time_;
      *self->mutable_leader_since() = raw->start_time_;
      out.set_leader_address(raw->address());
      return out;
    };
  }
  server->coordinator_service_ =
      std::make_unique<rpc::CoordinatorServiceImpl>(options.admin_token, std::move(status));
  server->start_time_ = google::protobuf::util::TimeUtil::GetCurrentTime();
  server->flow_->RecoverCheckpointFiles();

  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials();
  int port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Workers may send their own keepalive pings once a second.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  // Two coordinators on one port would split the clients between them.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The sync server starts a thread per concurrent call: bounded, so a
  // flood of calls gets RESOURCE_EXHAUSTED instead of exhausting the
  // process's threads (which left calls unanswered and shutdown hanging).
  // No waiting call is a sync call any more (they hold no thread), so the
  // bound only meets a flood of short ones.
  grpc::ResourceQuota quota("shardline-coordinator");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  // A sync thread that finishes its call exits when more than MAX_POLLERS
  // threads are idle (gRPC's default: 2), and a call that finds no idle one
  // starts a thread. A burst of N concurrent sync calls thus started and
  // ended about N threads. Keeping up to kSyncPollers idle threads serves
  // such bursts without a thread start (measured when Barrier was a sync
  // call: 1.25-1.74x the rounds/s at 16-256 members, bench coordinator_kv,
  // same machine, A/B; no waiting call is a sync call any more).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kSyncPollers);
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->worker_service_.get());
  builder.RegisterService(server->rendezvous_service_.get());
  builder.RegisterService(server->checkpoint_service_.get());
  builder.RegisterService(server->coordinator_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen_address,
                     "': the address is in use or not a local address",
                     options.credentials != nullptr
                         ? " (or gRPC refused the TLS credentials: see its log line above; "
                           "MakeServerCredentials checks the files themselves)"
                         : ""));
  }
  server->port_ = port;
  server->address_ = BoundAddress(options.listen_address, port);
  if (options.tick_interval > absl::ZeroDuration()) {
    const absl::Duration interval = options.tick_interval;
    server->tick_thread_ =
        std::thread([raw, interval, gate = options.gate] { raw->TickLoop(interval, gate); });
  }
  LogLine(absl::StrCat("serving address=", server->address_,
                   " tls=", options.credentials != nullptr ? "on" : "off",
                   " auth=", options.admin_token.empty() ? "off" : "on"));
  return server;
}

void CoordinatorServer::TickLoop(absl::Duration interval, std::function<absl::Status()> gate) {
  absl::Time next_sweep = absl::Now();
  bool gate_closed = false;
  while (!stop_tick_.WaitForNotificationWithTimeout(interval)) {
    // A replica that cannot confirm its lease judges nobody: its view of
    // heartbeats may be stale (it was paused, or cut off). When it serves
    // again, the heartbeats it refused meanwhile do not count as missed.
    if (gate != nullptr) {
      if (!gate().ok()) {
        gate_closed = true;
        continue;
      }
      if (gate_closed) {
        deps_.coordinator->RestartHeartbeatClocks();
        gate_closed = false;
      }
    }
    PassOn(deps_.coordinator->Tick());
    PruneFinishedJobs();
    if (absl::Now() >= next_sweep) {
      SweepRendezvous();
      next_sweep = absl::Now() + kRendezvousSweepInterval;
    }
  }
}

void CoordinatorServer::SweepRendezvous() {
  for (const std::string& job_id : deps_.rendezvous->JobsHoldingState()) {
    absl::StatusOr<v1::Job> job = deps_.coordinator->GetJob(job_id);
    if (absl::IsNotFound(job.status())) {
      deps_.rendezvous->ForgetJob(job_id);
    } else if (job.ok() && rpc::IsTerminal(job->phase())) {
      deps_.rendezvous->DropJob(job_id);
    }
  }
}

int CoordinatorServer::PruneFinishedJobs() {
  int pruned = 0;
  for (const std::string& job_id : deps_.coordinator->FinishedJobsToPrune()) {
    // Checkpoint records first: a crash after this leaves a finished job
    // that is pruned again, never checkpoint rows of a forgotten job.
    if (absl::Status s = deps_.checkpoints->ForgetJob(job_id); !s.ok()) {
      if (!absl::IsFailedPrecondition(s)) {
        LogLine(absl::StrCat("job ", job_id, ": checkpoint records not pruned: ", s.message()));
      }
      continue;
    }
    deps_.rendezvous->DropJob(job_id);
    absl::Status s = deps_.coordinator->PruneJob(job_id);
    if (s.ok()) {
      ++pruned;
    } else if (!absl::IsFailedPrecondition(s) && !absl::IsNotFound(s)) {
      LogLine(absl::StrCat("job ", job_id, ": not pruned: ", s.message()));
    }
  }
  return pruned;
}

void CoordinatorServer::PassOn(const std::vector<GenerationEnded>& ended) {
  for (const GenerationEnded& e : ended) {
    LogLine(absl::StrCat("generation ended job=", e.job_id, " generation=", e.generation,
                     " reason=\"", e.reason, "\""));
    // A job that finished drops its rendezvous state at once, so that its
    // waiting calls hear that the job is gone rather than "re-join" (which
    // a finished job refuses).
    absl::StatusOr<v1::Job> job = deps_.coordinator->GetJob(e.job_id);
    if (job.ok() && rpc::IsTerminal(job->phase())) {
      deps_.rendezvous->DropJob(e.job_id);
    } else {
      deps_.rendezvous->EndGeneration(e.job_id, e.generation);
    }
    flow_->AbortPendingCheckpoint(e.job_id, e.reason);
  }
}

void CoordinatorServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    LogLine(absl::StrCat("shutting down address=", address_));
    // New calls get UNAVAILABLE; open Session streams end with UNAVAILABLE
    // right away (workers reconnect to the next coordinator; none is
    // declared lost).
    calls_->BeginShutdown();
    sessions_->EndAll();
    if (worker_service_ != nullptr) worker_service_->EndAssignmentWaits();
    watches_->EndAll();
    if (!stop_tick_.HasBeenNotified()) stop_tick_.Notify();
    if (tick_thread_.joinable()) tick_thread_.join();
    // Ends every blocked rendezvous call.
    for (const v1::Job& job : AllJobs(*deps_.coordinator)) {
      deps_.rendezvous->DropJob(job.job_id());
    }
    if (server_ != nullptr) {  // null when Start failed to listen
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
    }
    LogLine("shut down");
  });
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace shardline::server

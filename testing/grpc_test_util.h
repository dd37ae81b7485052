// Test helpers for the coordinator's gRPC tests: a small job spec, bearer
// metadata, and a simulated worker (JoinJob, Session stream on its own
// thread, GetAssignment, a heartbeat loop on its own thread) -- the calls a
// real shardline-worker makes, without training.
//
//   SimWorker w(channel, "job", "w0", /*incarnation=*/7, job_token);
//   ASSERT_TRUE(w.Join().ok());   // with the job token; keeps the member token
//   ... every later call (Join included) carries the member token ...
//   ASSERT_TRUE(w.OpenSession().ok());
//   absl::StatusOr<v1::Assignment> a = w.GetAssignment(/*wait=*/true, absl::Seconds(10));
//
// Thread-safety: SimWorker is thread-safe.
//
// Harness: the coordinator's components (store, Coordinator, Rendezvous,
// CheckpointRegistry, Metrics) and a real in-process server on 127.0.0.1
// (port 0) over them.
#ifndef SHARDLINE_TESTING_GRPC_TEST_UTIL_H_
#define SHARDLINE_TESTING_GRPC_TEST_UTIL_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "testing/job_specs.h"
#include "server/checkpoint_registry.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "server/coordinator.h"
#include "server/rpc/coordinator_server.h"
#include "metrics/metrics.h"
#include "server/rendezvous.h"
#include "server/state_store.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server::testing {

namespace v1 = ::shardline::v1;

using ::shardline::fixtures::SmallSpec;

// A channel that may send and receive 128 MiB (so oversize tests reach the
// server's limit, not the client's).
inline std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials()) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(128 << 20);
  args.SetMaxReceiveMessageSize(128 << 20);
  return grpc::CreateCustomChannel(address, credentials, args);
}

// Sets the bearer token (if any) and a deadline on a client context.
inline void Prepare(grpc::ClientContext* ctx, const std::string& token,
                    absl::Duration deadline = absl::Seconds(30)) {
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
}

// CreateJob with `token` (an admin token), expecting success; returns the
// answer (its worker_token is the job token).
inline v1::CreateJobResponse CreateJobAs(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& token, const std::string& job_id,
                                         const v1::JobSpec& spec) {
  auto jobs = v1::JobService::NewStub(channel);
  v1::CreateJobRequest req;
  req.set_job_id(job_id);
  *req.mutable_spec() = spec;
  v1::CreateJobResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, token);
  grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

struct HarnessOptions {
  std::string admin_token;
  std::string state_path;  // empty: memory store
  std::shared_ptr<grpc::ServerCredentials> credentials;
  CheckpointRegistryOptions checkpoints;  // e.g. verify_files
  bool metrics = true;                    // false: the server gets no metrics::Metrics
  int max_threads = ServerOptions().max_threads;
  rpc::WatchLimits watch_limits;
  std::function<absl::Status()> gate;  // ServerOptions::gate
};

// The coordinator's components and a server over them.
class Harness {
 public:
  explicit Harness(HarnessOptions options) {
    if (options.state_path.empty()) {
      store_ = NewMemoryStore();
    } else {
      absl::StatusOr<std::unique_ptr<StateStore>> s = OpenSqliteStore(options.state_path);
      EXPECT_TRUE(s.ok()) << s.status();
      store_ = *std::move(s);
    }
    coordinator_ = std::make_unique<Coordinator>(&clock_, store_.get());
    absl::Status recovered = coordinator_->Recover();
    EXPECT_TRUE(recovered.ok()) << recovered;
    rendezvous_ = std::make_unique<Rendezvous>(&clock_);
    absl::StatusOr<std::unique_ptr<CheckpointRegistry>> registry =
        CheckpointRegistry::Create(store_.get(), &clock_, std::move(options.checkpoints));
    EXPECT_TRUE(registry.ok()) << registry.status();
    checkpoints_ = *std::move(registry);
    if (options.metrics) {
      metrics_ = std::make_unique<metrics::Metrics>([this] { return SnapshotJobs(*coordinator_); });
    }
    ServerOptions server_options;
    server_options.listen_address = "127.0.0.1:0";
    server_options.admin_token = options.admin_token;
    server_options.credentials = std::move(options.credentials);
    server_options.max_threads = options.max_threads;
    server_options.watch_limits = options.watch_limits;
    server_options.gate = std::move(options.gate);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(
        {coordinator_.get(), rendezvous_.get(), checkpoints_.get(), metrics_.get()},
        server_options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  // `state_path` empty: memory store.
  explicit Harness(const std::string& admin_token = "", const std::string& state_path = "",
                   std::shared_ptr<grpc::ServerCredentials> credentials = nullptr)
      : Harness(Options(admin_token, state_path, std::move(credentials))) {}
  ~Harness() { Kill(); }

  // Destroys the server and every component, like a crashed process (the
  // store keeps what was durable).
  void Kill() {
    server_.reset();
    checkpoints_.reset();
    rendezvous_.reset();
    coordinator_.reset();
    store_.reset();
  }

  const std::string& address() const { return server_->address(); }
  std::shared_ptr<grpc::Channel> Channel() { return MakeChannel(address()); }
  Coordinator& coordinator() { return *coordinator_; }
  Rendezvous& rendezvous() { return *rendezvous_; }
  CoordinatorServer& server() { return *server_; }
  metrics::Metrics& metrics() { return *metrics_; }

 private:
  static HarnessOptions Options(const std::string& admin_token, const std::string& state_path,
                                std::shared_ptr<grpc::ServerCredentials> credentials) {
    HarnessOptions options;
    options.admin_token = admin_token;
    options.state_path = state_path;
    options.credentials = std::move(credentials);
    return options;
  }

  RealClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Rendezvous> rendezvous_;
  std::unique_ptr<CheckpointRegistry> checkpoints_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<CoordinatorServer> server_;
};

class SimWorker {
 public:
  SimWorker(std::shared_ptr<grpc::Channel> channel, std::string job_id, std::string worker_id,
            uint64_t incarnation, std::string token = "")
      : job_id_(std::move(job_id)),
        worker_id_(std::move(worker_id)),
        incarnation_(incarnation),
        token_(std::move(token)) {
    SetChannel(std::move(channel));
  }
  ~SimWorker() {
    StopHeartbeats();
    KillSession();
    if (session_thread_.joinable()) session_thread_.join();
  }

  // Points later calls at another server (after a coordinator restart).
  void SetChannel(std::shared_ptr<grpc::Channel> channel) {
    absl::MutexLock lock(&mu_);
    workers_ = v1::WorkerService::NewStub(channel);
    rendezvous_ = v1::RendezvousService::NewStub(channel);
    jobs_ = v1::JobService::NewStub(channel);
  }

  const std::string& worker_id() const { return worker_id_; }
  uint64_t generation() const { return generation_.load(); }
  void set_generation(uint64_t g) { generation_.store(g); }

  v1::WorkerIdentity identity() const {
    v1::WorkerIdentity w;
    w.set_job_id(job_id_);
    w.set_worker_id(worker_id_);
    w.set_incarnation(incarnation_);
    return w;
  }
  v1::Fence fence() const {
    v1::Fence f;
    *f.mutable_worker() = identity();
    f.set_generation(generation());
    return f;
  }

  grpc::Status Join() {
    v1::JoinJobRequest req;
    *req.mutable_worker() = identity();
    req.set_host("host-" + worker_id_);
    req.set_device("cpu");
    v1::JoinJobResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, CallToken());  // the job token first, then the member token
    grpc::Status s = Workers()->JoinJob(&ctx, req, &resp);
    if (s.ok()) generation_.store(resp.generation());
    if (s.ok() && !resp.member_token().empty()) {
      absl::MutexLock lock(&mu_);
      member_token_ = resp.member_token();
    }
    return s;
  }

  // The token of this worker's calls: its member token once JoinJob
  // returned one, else the token it was made with (the job's worker token).
  std::string CallToken() const {
    absl::MutexLock lock(&mu_);
    return member_token_.empty() ? token_ : member_token_;
  }
  std::string member_token() const {
    absl::MutexLock lock(&mu_);
    return member_token_;
  }

  // Opens the Session stream on a reader thread and waits for its first
  // message (SessionOpened) or its end.
  grpc::Status OpenSession(absl::Duration timeout = absl::Seconds(10)) {
    if (session_thread_.joinable()) session_thread_.join();
    {
      absl::MutexLock lock(&mu_);
      session_ctx_ = std::make_unique<grpc::ClientContext>();
      const std::string token = member_token_.empty() ? token_ : member_token_;
      if (!token.empty()) session_ctx_->AddMetadata("authorization", "Bearer " + token);
      session_done_ = false;
      session_opened_ = false;
    }
    grpc::ClientContext* ctx = session_ctx_.get();
    auto* stub = Workers();
    session_thread_ = std::thread([this, ctx, stub] {
      v1::SessionRequest req;
      *req.mutable_worker() = identity();
      std::unique_ptr<grpc::ClientReader<v1::SessionMessage>> reader = stub->Session(ctx, req);
      v1::SessionMessage msg;
      while (reader->Read(&msg)) {
        absl::MutexLock lock(&mu_);
        if (msg.has_opened()) session_opened_ = true;
        messages_.push_back(msg);
      }
      grpc::Status s = reader->Finish();
      absl::MutexLock lock(&mu_);
      session_status_ = s;
      session_done_ = true;
    });
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return session_opened_ || session_done_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no SessionOpened");
    }
    return session_opened_ ? grpc::Status::OK : session_status_;
  }

  // Cancels the session's ClientContext (as if the process died).
  void KillSession() {
    absl::MutexLock lock(&mu_);
    if (session_ctx_ != nullptr) session_ctx_->TryCancel();
  }

  // Forgets the session messages received so far.
  void ClearMessages() {
    absl::MutexLock lock(&mu_);
    messages_.clear();
  }

  // Waits for the session to end and returns its status.
  std::optional<grpc::Status> SessionEnd(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return session_done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) return std::nullopt;
    return session_status_;
  }

  // The first session message (of all received so far, or arriving within
  // `timeout`) that matches `pred`.
  std::optional<v1::SessionMessage> WaitMessage(
      const std::function<bool(const v1::SessionMessage&)>& pred, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    std::optional<v1::SessionMessage> found;
    auto match = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const v1::SessionMessage& m : messages_) {
        if (pred(m)) {
          found = m;
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&match), timeout);
    return found;
  }

  absl::StatusOr<v1::Assignment> GetAssignment(bool wait, absl::Duration timeout) {
    v1::GetAssignmentRequest req;
    *req.mutable_fence() = fence();
    req.set_wait(wait);
    req.mutable_timeout()->set_seconds(absl::ToInt64Seconds(timeout));
    v1::Assignment a;
    grpc::ClientContext ctx;
    Prepare(&ctx, CallToken(), timeout + absl::Seconds(5));
    grpc::Status s = Workers()->GetAssignment(&ctx, req, &a);
    if (!s.ok()) return FromGrpcStatus(s);
    generation_.store(a.generation());
    return a;
  }

  grpc::Status Heartbeat(v1::HeartbeatResponse* resp) {
    v1::HeartbeatRequest req;
    *req.mutable_fence() = fence();
    req.set_state(v1::WORKER_STATE_TRAINING);
    grpc::ClientContext ctx;
    Prepare(&ctx, CallToken(), absl::Seconds(5));
    return Workers()->Heartbeat(&ctx, req, resp);
  }

  void StartHeartbeats(absl::Duration interval) {
    heartbeat_stop_.store(false);
    heartbeat_thread_ = std::thread([this, interval] {
      while (!heartbeat_stop_.load()) {
        v1::HeartbeatResponse resp;
        grpc::Status s = Heartbeat(&resp);
        {
          absl::MutexLock lock(&mu_);
          heartbeat_codes_.insert(s.error_code());
        }
        absl::SleepFor(interval);
      }
    });
  }
  void StopHeartbeats() {
    heartbeat_stop_.store(true);
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  }
  bool SawHeartbeatCode(grpc::StatusCode code, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto saw = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeat_codes_.count(code) > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&saw), timeout);
  }

  v1::RendezvousService::Stub* Rendezvous() {
    absl::MutexLock lock(&mu_);
    return rendezvous_.get();
  }
  v1::JobService::Stub* Jobs() {
    absl::MutexLock lock(&mu_);
    return jobs_.get();
  }
  v1::WorkerService::Stub* Workers() {
    absl::MutexLock lock(&mu_);
    return workers_.get();
  }
  const std::string& token() const { return token_; }

 private:
  const std::string job_id_;
  const std::string worker_id_;
  const uint64_t incarnation_;
  const std::string token_;
  std::atomic<uint64_t> generation_{0};

  mutable absl::Mutex mu_;
  std::string member_token_ ABSL_GUARDED_BY(mu_);  // from the first JoinJob
  std::unique_ptr<v1::WorkerService::Stub> workers_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<v1::JobService::Stub> jobs_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::ClientContext> session_ctx_;  // written before the reader starts
  std::thread session_thread_;
  bool session_opened_ ABSL_GUARDED_BY(mu_) = false;
  bool session_done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status session_status_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SessionMessage> messages_ ABSL_GUARDED_BY(mu_);

  std::atomic<bool> heartbeat_stop_{false};
  std::thread heartbeat_thread_;
  std::set<grpc::StatusCode> heartbeat_codes_ ABSL_GUARDED_BY(mu_);
};

inline bool IsRestart(const v1::SessionMessage& m, uint64_t generation) {
  return m.has_directive() && m.directive().has_restart_at_generation() &&
         m.directive().restart_at_generation().generation() == generation;
}

// Each worker joins (and opens its Session when `open_session`) on its own
// thread, then waits up to `timeout` for its assignment, as real workers
// start at once. Results by index; a failed join or session open is that
// worker's error.
inline std::vector<absl::StatusOr<v1::Assignment>> JoinAll(
    const std::vector<SimWorker*>& workers, bool open_session,
    absl::Duration timeout = absl::Seconds(15)) {
  std::vector<absl::StatusOr<v1::Assignment>> got(workers.size(),
                                                  absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] {
      if (grpc::Status joined = workers[i]->Join(); !joined.ok()) {
        got[i] = absl::InternalError(absl::StrCat("join: ", joined.error_message()));
        return;
      }
      if (open_session) {
        if (grpc::Status opened = workers[i]->OpenSession(); !opened.ok()) {
          got[i] = absl::InternalError(absl::StrCat("session: ", opened.error_message()));
          return;
        }
      }
      got[i] = workers[i]->GetAssignment(/*wait=*/true, timeout);
    });
  }
  for (std::thread& t : threads) t.join();
  return got;
}

// Raw pointers to owned workers, for JoinAll.
inline std::vector<SimWorker*> Pointers(const std::vector<std::unique_ptr<SimWorker>>& workers) {
  std::vector<SimWorker*> out;
  for (const auto& w : workers) out.push_back(w.get());
  return out;
}

}  // namespace shardline::server::testing

#endif  // SHARDLINE_TESTING_GRPC_TEST_UTIL_H_

#include "server/grpc_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include <grpcpp/resource_quota.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "server/auth.h"
#include "checkpoint/checkpoint_files.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server {
namespace {

namespace v1 = ::shardline::v1;

void Log(absl::string_view line) { LogLine(line); }

bool IsTerminal(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_COMPLETED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

absl::Status RequireJobId(absl::string_view job_id, absl::string_view field) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be non-empty"));
  }
  return absl::OkStatus();
}

// The request's timeout: nullopt when unset. InvalidArgument when malformed,
// negative or over `max`.
absl::StatusOr<std::optional<absl::Duration>> ParseTimeout(bool has,
                                                           const google::protobuf::Duration& d,
                                                           absl::Duration max,
                                                           absl::string_view field) {
  if (!has) return std::nullopt;
  if (d.nanos() <= -1000000000 || d.nanos() >= 1000000000 ||
      (d.seconds() > 0 && d.nanos() < 0) || (d.seconds() < 0 && d.nanos() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is not a valid google.protobuf.Duration (nanos=", d.nanos(), ")"));
  }
  absl::Duration t = absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
  if (t < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "=", absl::FormatDuration(t), " is negative; give 0 or more"));
  }
  if (t > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, "=", absl::FormatDuration(t),
                                                   " is over the maximum of ",
                                                   absl::FormatDuration(max)));
  }
  return t;
}

absl::Time RpcDeadline(const grpc::ServerContextBase& ctx) {
  const auto d = ctx.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

std::vector<absl::string_view> AuthorizationValues(const grpc::ServerContextBase& ctx) {
  std::vector<absl::string_view> out;
  auto range = ctx.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    out.emplace_back(it->second.data(), it->second.size());
  }
  return out;
}

std::string Who(const v1::WorkerIdentity& w) {
  return absl::StrCat("job=", w.job_id(), " worker=", w.worker_id(),
                      " incarnation=", w.incarnation());
}

v1::Coordinates CoordinatesOf(uint32_t rank, uint32_t tp, uint32_t dp) {
  tp = std::max<uint32_t>(tp, 1);
  dp = std::max<uint32_t>(dp, 1);
  v1::Coordinates c;
  c.set_tp_rank(rank % tp);
  c.set_dp_rank((rank / tp) % dp);
  c.set_pp_rank(rank / (tp * dp));
  return c;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file,
    const std::string& client_ca_file) {
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  auto read = [](const std::string& path) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
    std::ostringstream s;
    s << in.rdbuf();
    if (in.bad()) return absl::UnavailableError(absl::StrCat("error reading '", path, "'"));
    return s.str();
  };
  absl::StatusOr<std::string> cert = read(cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = read(key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(
      client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = read(client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

namespace {

// Every job id (all pages of ListJobs).
std::vector<v1::Job> AllJobs(const Coordinator& coordinator) {
  std::vector<v1::Job> out;
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  for (int pages = 0; pages < 1000; ++pages) {
    absl::StatusOr<v1::ListJobsResponse> page = coordinator.ListJobs(request);
    if (!page.ok()) break;
    for (v1::Job& job : *page->mutable_jobs()) out.push_back(std::move(job));
    if (page->next_page_token().empty()) break;
    request.set_page_token(page->next_page_token());
  }
  return out;
}

}  // namespace

std::vector<metrics::JobSnapshot> SnapshotJobs(const Coordinator& coordinator) {
  std::vector<metrics::JobSnapshot> out;
  for (const v1::Job& job : AllJobs(coordinator)) {
    metrics::JobSnapshot s;
    s.job_id = job.job_id();
    s.generation = job.generation();
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

// A few threads that run the callback-API handlers' work, so that gRPC's own
// threads (which also move the bytes of every connection) never wait on the
// coordinator's lock: a reaction that blocks stalls I/O for other calls,
// and at 4096 workers that meant unanswered keepalive pings. Open Session
// streams hold no thread at all (a sync server held one per worker:
// thousands of threads waking every poll_interval on 2 cores). Post() may be
// called with the coordinator's lock held (session wakers): it only queues.
// Thread-safe. Runs each posted item once, FIFO; items posted after Stop()
// are dropped.
class HandlerPool {
 public:
  using Item = std::function<void()>;
  explicit HandlerPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~HandlerPool() { Stop(); }

  void Post(Item item) {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    queue_.push_back(std::move(item));
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() {
    while (true) {
      Item item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopped_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopped
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      item();
    }
  }

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------------------
// The services.

class Services {
 public:
  Services(ServiceDeps deps, const ServerOptions& options)
      : deps_(deps),
        poll_interval_(options.poll_interval),
        max_waiting_gets_(options.max_waiting_gets),
        auth_(options.admin_token,
              {[this](absl::string_view job_id) -> std::optional<std::string> {
                 absl::StatusOr<std::string> t =
                     deps_.coordinator->WorkerToken(std::string(job_id));
                 if (!t.ok()) return std::nullopt;
                 return *std::move(t);
               },
               [this] {
                 std::vector<std::string> ids;
                 for (const v1::Job& job : AllJobs(*deps_.coordinator)) {
                   ids.push_back(job.job_id());
                 }
                 return ids;
               }}),
        job_(this),
        worker_(this),
        rendezvous_(this),
        checkpoint_(this) {}

  void Register(grpc::ServerBuilder* builder) {
    builder->RegisterService(&job_);
    builder->RegisterService(&worker_);
    builder->RegisterService(&rendezvous_);
    builder->RegisterService(&checkpoint_);
  }

  Coordinator* coordinator() const { return deps_.coordinator; }
  // Open Session streams end with UNAVAILABLE right away (workers reconnect
  // to the next coordinator; none is declared lost).
  void BeginShutdown() {
    shutting_down_.store(true);
    std::vector<std::shared_ptr<SessionStream>> open;
    {
      absl::MutexLock lock(&streams_mu_);
      for (auto& [raw, weak] : streams_) {
        if (auto st = weak.lock()) open.push_back(std::move(st));
      }
    }
    for (auto& st : open) st->Wake();
  }
  bool shutting_down() const { return shutting_down_.load(); }

  // Ends every blocked rendezvous call (see the header's Shutdown).
  void DropAllRendezvous() {
    for (const v1::Job& job : AllJobs(*deps_.coordinator)) {
      deps_.rendezvous->DropJob(job.job_id());
    }
  }

  // At start, before serving (see the header's "Checkpoint files"): deletes
  // the directories of ABORTED checkpoints (including those the registry
  // aborted because the previous coordinator died while they were pending)
  // and rewrites manifest.json and LATEST of each job's newest committed
  // checkpoint when they are missing or LATEST names another one (a
  // coordinator that died between the durable commit and the file writes).
  void RecoverCheckpointFiles() {
    for (const v1::Job& job : AllJobs(*deps_.coordinator)) {
      const std::string root = JobCheckpointRoot(job);
      if (root.empty()) continue;
      std::string token;
      for (int pages = 0; pages < 1000; ++pages) {
        absl::StatusOr<v1::ListCheckpointsResponse> page =
            deps_.checkpoints->List(job.job_id(), /*include_aborted=*/true, 1000, token);
        if (!page.ok()) break;
        for (const v1::CheckpointSummary& c : page->checkpoints()) {
          if (c.state() == v1::CHECKPOINT_STATE_ABORTED) {
            RemoveAbortedDirectory(job.job_id(), root, c.checkpoint_id(), c.directory());
          }
        }
        token = page->next_page_token();
        if (token.empty()) break;
      }
      RepairLatestFiles(job.job_id(), root);
    }
  }

  // The job's COMMITTED checkpoints (every page), for the restore fallback.
  std::vector<v1::CheckpointRef> CommittedCheckpoints(const std::string& job_id) {
    std::vector<v1::CheckpointRef> committed;
    std::string token;
    for (int pages = 0; pages < 1000; ++pages) {
      absl::StatusOr<v1::ListCheckpointsResponse> page =
          deps_.checkpoints->List(job_id, /*include_aborted=*/false, 1000, token);
      if (!page.ok()) break;
      for (const v1::CheckpointSummary& c : page->checkpoints()) {
        if (c.state() != v1::CHECKPOINT_STATE_COMMITTED) continue;
        v1::CheckpointRef ref;
        ref.set_checkpoint_id(c.checkpoint_id());
        ref.set_step(c.step());
        committed.push_back(std::move(ref));
      }
      token = page->next_page_token();
      if (token.empty()) break;
    }
    return committed;
  }

  void PassOn(const std::vector<GenerationEnded>& ended) {
    for (const GenerationEnded& e : ended) {
      Log(absl::StrCat("generation ended job=", e.job_id, " generation=", e.generation,
                       " reason=\"", e.reason, "\""));
      deps_.rendezvous->EndGeneration(e.job_id, e.generation);
      AbortPendingCheckpoint(e.job_id, e.reason);
      absl::StatusOr<v1::Job> job = deps_.coordinator->GetJob(e.job_id);
      if (job.ok() && IsTerminal(job->phase())) deps_.rendezvous->DropJob(e.job_id);
    }
  }

 private:
  // --- Helpers shared by the services -----------------------------------

  // Runs one handler: UNAVAILABLE while shutting down, metrics, the status
  // mapping.
  template <typename F>
  grpc::Status Run(absl::string_view method, F&& body) {
    const absl::Time start = absl::Now();
    absl::Status status;
    if (shutting_down()) {
      status = absl::UnavailableError("the coordinator is shutting down; retry with backoff");
    } else {
      status = body();
      // A call that failed because the server is going away (its waits were
      // ended) should be retried, not acted upon.
      if (!status.ok() && shutting_down()) {
        status = absl::UnavailableError("the coordinator is shutting down; retry with backoff");
      }
    }
    if (deps_.metrics != nullptr) deps_.metrics->ObserveRpc(method, absl::Now() - start, status.code());
    if (status.code() == absl::StatusCode::kInternal) {
      Log(absl::StrCat("internal error method=", method, " status=\"", status.ToString(), "\""));
    }
    return ToGrpcStatus(status);
  }

  // Run() for a handler on the callback API: `body` runs on pool_, not on
  // the gRPC thread that received the call and not on a sync-server thread
  // (whose hand-off put 70 ms on the p99 of heartbeats at 256/s). `body`
  // must capture by value (the handler has returned when it runs); the
  // request, response and context stay valid until Finish. Only for
  // handlers that never wait long: a few such bodies fill the pool.
  template <typename F>
  grpc::ServerUnaryReactor* RunPooled(grpc::CallbackServerContext* ctx, const char* method,
                                      F body) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    pool_->Post([this, reactor, method, body = std::move(body)]() mutable {
      reactor->Finish(Run(method, body));
    });
    return reactor;
  }

  absl::StatusOr<Principal> Authorize(const grpc::ServerContextBase& ctx, Access access,
                                      absl::string_view job_id) {
    return auth_.Authorize(AuthorizationValues(ctx), access, job_id);
  }

  // A worker-level call on `job_id` (named `field` in errors): the caller
  // holds the job's worker token or the admin token, and the id is present.
  absl::Status AuthorizeWorker(const grpc::ServerContextBase& ctx, const std::string& job_id,
                               const char* field) {
    if (auto p = Authorize(ctx, Access::kWorker, job_id); !p.ok()) return p.status();
    return RequireJobId(job_id, field);
  }

  // Authentication, then the fence.
  absl::StatusOr<FencedWorker> AuthorizeFence(const grpc::ServerContextBase& ctx,
                                              const v1::Fence& fence) {
    if (absl::Status st = AuthorizeWorker(ctx, fence.worker().job_id(), "fence.worker.job_id");
        !st.ok()) {
      return st;
    }
    return deps_.coordinator->CheckFence(fence);
  }

  // A blocking wait cut into slices of at most kWaitSlice so that cancelled
  // callers and shutdown are noticed. `call(remaining, slice_end)` waits
  // until slice_end at most. Returns its first answer that is not
  // DeadlineExceeded, or DeadlineExceeded once `deadline` passed.
  template <typename T>
  absl::StatusOr<T> SlicedWait(
      grpc::ServerContextBase* ctx, absl::Time deadline,
      const std::function<absl::StatusOr<T>(absl::Duration remaining, absl::Time slice_end)>&
          call) {
    const absl::Time start = absl::Now();
    while (true) {
      const absl::Time now = absl::Now();
      const absl::Duration remaining = std::max(deadline - now, absl::ZeroDuration());
      absl::StatusOr<T> r = call(remaining, std::min(deadline, now + kWaitSlice));
      if (r.ok() || r.status().code() != absl::StatusCode::kDeadlineExceeded) return r;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            r.status().message(), " (waited ", absl::FormatDuration(absl::Now() - start),
            " in all)"));
      }
      if (ctx->IsCancelled()) return absl::CancelledError("the caller cancelled");
      if (shutting_down()) return absl::UnavailableError("the coordinator is shutting down");
    }
  }

  // The earlier of now + the request's timeout (or `default_timeout`) and
  // the gRPC deadline.
  static absl::Time WaitDeadline(const grpc::ServerContextBase& ctx,
                                 std::optional<absl::Duration> timeout,
                                 absl::Duration default_timeout) {
    return std::min(absl::Now() + timeout.value_or(default_timeout), RpcDeadline(ctx));
  }

  void AbortPendingCheckpoint(const std::string& job_id, const std::string& reason) {
    std::optional<v1::CheckpointSummary> aborted =
        deps_.checkpoints->AbortPending(job_id, reason);
    if (aborted) {
      Log(absl::StrCat("checkpoint aborted job=", job_id, " generation=", aborted->generation(),
                       " checkpoint=", aborted->checkpoint_id(), " reason=\"", reason, "\""));
      deps_.coordinator->NoteCheckpointAborted(job_id, aborted->checkpoint_id(), aborted->step(),
                                               reason);
      RemoveAbortedDirectory(job_id, CheckpointRoot(job_id), aborted->checkpoint_id(),
                             aborted->directory());
    }
  }

  // --- Checkpoint files (server/checkpoint_files.h) --------------------------

  // The job's checkpoint root: <spec.checkpoint.directory>/<job_id>, so that
  // jobs sharing a directory (one spec file created twice) never overwrite
  // each other's checkpoints or LATEST; "" without a directory.
  static std::string JobCheckpointRoot(const v1::Job& job) {
    const std::string& dir = job.spec().checkpoint().directory();
    if (dir.empty()) return std::string();
    return absl::StrCat(absl::StripSuffix(dir, "/"), "/", job.job_id());
  }
  std::string CheckpointRoot(const std::string& job_id) {
    absl::StatusOr<v1::Job> job = deps_.coordinator->GetJob(job_id);
    return job.ok() ? JobCheckpointRoot(*job) : std::string();
  }

  // Makes <root>/LATEST name the registry's Latest() (the newest committed
  // checkpoint not marked unusable) with its manifest.json in place, or
  // removes LATEST when there is none: a reader of LATEST is never sent to a
  // checkpoint known to be corrupt, nor left behind the store (a coordinator
  // that died between a durable commit and the file writes).
  void RepairLatestFiles(const std::string& job_id, const std::string& root) {
    if (root.empty()) return;
    std::optional<v1::CheckpointRef> latest = deps_.checkpoints->Latest(job_id);
    absl::StatusOr<std::string> on_disk = checkpoint::ReadLatestFile(root);
    if (!latest) {
      if (!on_disk.ok()) return;
      absl::MutexLock lock(&files_mu_);
      std::error_code ec;
      std::filesystem::remove(std::filesystem::path(root) / std::string(checkpoint::kLatestFileName), ec);
      Log(absl::StrCat("checkpoint LATEST removed job=", job_id, " (it named ", *on_disk,
                       "; no committed checkpoint is usable)",
                       ec ? absl::StrCat(" status=\"", ec.message(), "\"") : std::string()));
      return;
    }
    absl::StatusOr<v1::Manifest> manifest =
        deps_.checkpoints->GetManifest(job_id, latest->checkpoint_id());
    if (!manifest.ok()) return;
    const bool latest_right = on_disk.ok() && *on_disk == latest->checkpoint_id();
    if (latest_right && checkpoint::ReadManifestFile(manifest->directory()).ok()) return;
    Log(latest_right
            ? absl::StrCat("checkpoint files repaired job=", job_id, " checkpoint=",
                           latest->checkpoint_id(), " (manifest.json was missing)")
            : absl::StrCat("checkpoint LATEST moved job=", job_id, " checkpoint=",
                           latest->checkpoint_id(), " (it named ",
                           on_disk.ok() ? *on_disk : std::string("nothing"),
                           "; the newest committed checkpoint not marked unusable)"));
    WriteCommittedFiles(job_id, *manifest, {});
  }

  // After the registry made `manifest` durable: manifest.json, then LATEST
  // (only while the registry still names this checkpoint the newest), then
  // the expired directories. A failure is logged and ends the sequence: the
  // checkpoint stays committed (the store is the authority and GetManifest
  // serves it), LATEST is not moved past a checkpoint without its
  // manifest.json, and expired directories are kept rather than deleted
  // while LATEST may still name one of them. The next start repairs
  // manifest.json and LATEST (RecoverCheckpointFiles).
  void WriteCommittedFiles(const std::string& job_id, const v1::Manifest& manifest,
                           const std::vector<ExpiredCheckpoint>& expired) {
    const std::string root = CheckpointRoot(job_id);
    const std::string& id = manifest.checkpoint_id();
    absl::MutexLock lock(&files_mu_);
    absl::Status s = checkpoint::WriteManifestFile(root, manifest);
    if (!s.ok()) {
      Log(absl::StrCat("checkpoint manifest.json not written job=", job_id, " checkpoint=", id,
                       " status=\"", s.ToString(), "\" (the checkpoint is committed; LATEST "
                       "not moved)"));
      return;
    }
    std::optional<v1::CheckpointRef> latest = deps_.checkpoints->Latest(job_id);
    if (!latest || latest->checkpoint_id() != id) {
      Log(absl::StrCat("checkpoint LATEST not moved job=", job_id, " checkpoint=", id,
                       " (no longer the newest committed)"));
    } else if (s = checkpoint::WriteLatestFile(root, id); !s.ok()) {
      Log(absl::StrCat("checkpoint LATEST not moved job=", job_id, " checkpoint=", id,
                       " status=\"", s.ToString(), "\" (the checkpoint is committed)"));
      return;
    }
    for (const ExpiredCheckpoint& x : expired) {
      absl::Status removed = checkpoint::RemoveCheckpointDirectory(root, x.directory);
      Log(absl::StrCat("checkpoint expired job=", job_id, " checkpoint=", x.ref.checkpoint_id(),
                       " directory=", x.directory,
                       removed.ok() ? std::string(" (deleted)")
                                    : absl::StrCat(" status=\"", removed.ToString(),
                                                   "\" (not deleted; delete it by hand)")));
    }
  }

  // Deletes the directory of an ABORTED checkpoint: nothing of a dead
  // attempt lingers (case C10). A rank still writing may re-create it; the
  // next start deletes it again, and its id is never reused anyway.
  void RemoveAbortedDirectory(const std::string& job_id, const std::string& root,
                              const std::string& checkpoint_id, const std::string& directory) {
    if (root.empty() || directory.empty()) return;
    absl::MutexLock lock(&files_mu_);
    if (::access(directory.c_str(), F_OK) != 0) return;  // nothing written, or already gone
    absl::Status removed = checkpoint::RemoveCheckpointDirectory(root, directory);
    Log(absl::StrCat("checkpoint directory of aborted checkpoint job=", job_id,
                     " checkpoint=", checkpoint_id, " directory=", directory,
                     removed.ok() ? std::string(" (deleted)")
                                  : absl::StrCat(" status=\"", removed.ToString(),
                                                 "\" (not deleted)")));
  }

  void NoteCommitted(const std::string& job_id, const v1::CheckpointSummary& summary) {
    v1::CheckpointRef ref;
    ref.set_checkpoint_id(summary.checkpoint_id());
    ref.set_step(summary.step());
    Log(absl::StrCat("checkpoint committed job=", job_id, " generation=", summary.generation(),
                     " checkpoint=", summary.checkpoint_id(), " step=", summary.step(),
                     " bytes=", summary.total_bytes()));
    // A commit may grow the job (Coordinator::NoteCheckpointCommitted): the
    // generation it ends is passed on at once.
    std::vector<GenerationEnded> ended;
    absl::Status s =
        deps_.coordinator->NoteCheckpointCommitted(job_id, ref, summary.total_bytes(), &ended,
                                                   deps_.checkpoints);
    if (!s.ok()) {
      Log(absl::StrCat("note checkpoint committed failed job=", job_id, " status=\"",
                       s.ToString(), "\""));
    }
    PassOn(ended);
  }

  // Whether the member `w` has LEFT (so its Session ends with OK).
  bool HasLeft(const v1::WorkerIdentity& w) {
    absl::StatusOr<v1::ListMembersResponse> members = deps_.coordinator->ListMembers(w.job_id());
    if (!members.ok()) return false;
    for (const v1::Member& m : members->members()) {
      if (m.worker_id() == w.worker_id()) {
        return m.incarnation() == w.incarnation() && m.state() == v1::MEMBER_STATE_LEFT;
      }
    }
    return false;
  }

  // --- JobService ---------------------------------------------------------

  class JobServiceImpl final : public v1::JobService::Service {
   public:
    explicit JobServiceImpl(Services* s) : s_(s) {}

    grpc::Status CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* req,
                           v1::CreateJobResponse* resp) override {
      return s_->Run("JobService/CreateJob", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
          return p.status();
        }
        // A spec that is invalid anyway creates no directory (and a
        // directory with '..' is refused before anything is created).
        if (absl::StatusOr<v1::JobSpec> spec = spec::ResolveJobSpec(req->spec()); !spec.ok()) {
          return spec.status();
        }
        // The checkpoint directory must be usable before any worker trains
        // (a bad one would fail every save); it is created now.
        if (const std::string& dir = req->spec().checkpoint().directory();
            !dir.empty() && dir.front() == '/') {
          std::error_code ec;
          std::filesystem::create_directories(dir, ec);
          if (ec || !std::filesystem::is_directory(dir)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "spec.checkpoint.directory='", AbbreviateValue(dir),
                "' cannot be created by the coordinator: ",
                ec ? ec.message() : "not a directory",
                "; give a directory the coordinator and the workers can write"));
          }
        }
        absl::StatusOr<v1::CreateJobResponse> r = s_->deps_.coordinator->CreateJob(*req);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        if (!s_->auth_.enabled()) resp->clear_worker_token();
        Log(absl::StrCat("job created job=", resp->job().job_id(),
                         " generation=", resp->job().generation(),
                         " phase=", v1::JobPhase_Name(resp->job().phase())));
        return absl::OkStatus();
      });
    }

    grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                        v1::Job* resp) override {
      return Read("JobService/GetJob", *ctx, req->job_id(), resp,
                  [&] { return s_->deps_.coordinator->GetJob(req->job_id()); });
    }

    grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                          v1::ListJobsResponse* resp) override {
      return s_->Run("JobService/ListJobs", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kAdminOnly, ""); !p.ok()) return p.status();
        absl::StatusOr<v1::ListJobsResponse> r = s_->deps_.coordinator->ListJobs(*req);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                           v1::Job* resp) override {
      return s_->Run("JobService/CancelJob", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
          return p.status();
        }
        if (absl::Status st = RequireJobId(req->job_id(), "job_id"); !st.ok()) return st;
        absl::StatusOr<v1::Job> r = s_->deps_.coordinator->CancelJob(*req);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        const std::string reason =
            req->reason().empty() ? std::string("job cancelled") : req->reason();
        Log(absl::StrCat("job cancelled job=", req->job_id(), " generation=", resp->generation(),
                         " reason=\"", reason, "\""));
        s_->deps_.rendezvous->DropJob(req->job_id());
        s_->AbortPendingCheckpoint(req->job_id(), reason);
        return absl::OkStatus();
      });
    }

    grpc::Status ListMembers(grpc::ServerContext* ctx, const v1::ListMembersRequest* req,
                        v1::ListMembersResponse* resp) override {
      return Read("JobService/ListMembers", *ctx, req->job_id(), resp,
                  [&] { return s_->deps_.coordinator->ListMembers(req->job_id()); });
    }

    grpc::Status DrainWorker(grpc::ServerContext* ctx, const v1::DrainWorkerRequest* req,
                             v1::Member* resp) override {
      return s_->Run("JobService/DrainWorker", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
          return p.status();
        }
        if (absl::Status st = RequireJobId(req->job_id(), "job_id"); !st.ok()) return st;
        if (req->worker_id().empty()) {
          return absl::InvalidArgumentError("worker_id is empty; name the worker to drain");
        }
        std::vector<GenerationEnded> ended;
        absl::StatusOr<v1::Member> r =
            s_->deps_.coordinator->DrainWorker(req->job_id(), req->worker_id(), req->reason(),
                                               req->force(), &ended);
        s_->PassOn(ended);
        if (!r.ok()) return r.status();
        Log(absl::StrCat("worker drain job=", req->job_id(), " worker=", req->worker_id(),
                         " state=", v1::MemberState_Name(r->state()), " reason=\"",
                         req->reason(), "\""));
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status GetPlan(grpc::ServerContext* ctx, const v1::GetPlanRequest* req,
                        v1::Plan* resp) override {
      return Read("JobService/GetPlan", *ctx, req->job_id(), resp,
                  [&] { return s_->deps_.coordinator->GetPlan(req->job_id()); });
    }

    grpc::Status GetShardOwner(grpc::ServerContext* ctx, const v1::GetShardOwnerRequest* req,
                        v1::GetShardOwnerResponse* resp) override {
      return Read("JobService/GetShardOwner", *ctx, req->job_id(), resp,
                  [&] { return s_->deps_.coordinator->GetShardOwner(*req); });
    }

    grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                          grpc::ServerWriter<v1::JobEvent>* writer) override {
      return s_->Run("JobService/WatchJob", [&]() -> absl::Status {
        if (absl::Status st = s_->AuthorizeWorker(*ctx, req->job_id(), "job_id");
            !st.ok()) {
          return st;
        }
        return Watch(ctx, *req, writer);
      });
    }

   private:
    // A read of one job's state with the worker token or the admin token.
    template <typename Response, typename Fn>
    grpc::Status Read(const char* method, const grpc::ServerContext& ctx,
                      const std::string& job_id, Response* resp, Fn fn) {
      return s_->Run(method, [&]() -> absl::Status {
        if (absl::Status st = s_->AuthorizeWorker(ctx, job_id, "job_id"); !st.ok()) return st;
        absl::StatusOr<Response> r = fn();
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    absl::Status Watch(grpc::ServerContext* ctx, const v1::WatchJobRequest& req,
                       grpc::ServerWriter<v1::JobEvent>* writer) {
      Coordinator& c = *s_->deps_.coordinator;
      const std::string& job_id = req.job_id();
      absl::StatusOr<v1::Job> job = c.GetJob(job_id);
      if (!job.ok()) return job.status();
      const bool terminal_at_start = IsTerminal(job->phase());
      // Everything retained, without waiting.
      absl::StatusOr<std::vector<v1::JobEvent>> retained =
          c.WaitEvents(job_id, std::nullopt, absl::InfinitePast());
      if (!retained.ok()) return retained.status();
      const uint64_t oldest = retained->empty() ? 0 : retained->front().sequence();
      const uint64_t newest = retained->empty() ? 0 : retained->back().sequence();
      const uint64_t lowest_resume = oldest == 0 ? 0 : oldest - 1;
      uint64_t last = newest;
      if (req.has_after_sequence()) {
        last = req.after_sequence();
        if (last < lowest_resume || last > newest) {
          return absl::OutOfRangeError(absl::StrCat(
              "after_sequence=", last, " is outside the retained range [", lowest_resume, ", ",
              newest, "]; resume from within it, or leave after_sequence unset for live events"));
        }
      }
      // Writes `events` with sequence > last; true when the stream is done.
      bool done = false;
      auto send = [&](const std::vector<v1::JobEvent>& events, bool live) -> absl::Status {
        for (const v1::JobEvent& e : events) {
          if (e.sequence() <= last) continue;
          if (live && e.sequence() > last + 1) {
            return absl::ResourceExhaustedError(absl::StrCat(
                "the watcher fell behind: events ", last + 1, "..", e.sequence() - 1,
                " are no longer retained; reconnect with after_sequence=", last));
          }
          if (!writer->Write(e)) return absl::CancelledError("the watcher went away");
          last = e.sequence();
          if (e.has_phase_changed() && IsTerminal(e.phase_changed().new_phase())) {
            done = true;
            return absl::OkStatus();
          }
        }
        return absl::OkStatus();
      };
      if (absl::Status st = send(*retained, /*live=*/false); !st.ok() || done) return st;
      if (terminal_at_start) return absl::OkStatus();
      for (int round = 1;; ++round) {
        if (s_->shutting_down()) return absl::UnavailableError("the coordinator is shutting down");
        if (ctx->IsCancelled()) return absl::CancelledError("the watcher cancelled");
        absl::StatusOr<std::vector<v1::JobEvent>> events =
            c.WaitEvents(job_id, last, absl::Now() + s_->poll_interval_);
        if (!events.ok()) return events.status();
        if (absl::Status st = send(*events, /*live=*/true); !st.ok() || done) return st;
        if (events->empty() && round % 10 == 0) {
          // A terminal phase whose event we already passed (race at start).
          absl::StatusOr<v1::Job> now = c.GetJob(job_id);
          if (!now.ok()) return now.status();
          if (IsTerminal(now->phase())) return absl::OkStatus();
        }
      }
    }

    Services* const s_;
  };

  // --- WorkerService ------------------------------------------------------

  class WorkerServiceImpl final
      : public v1::WorkerService::WithCallbackMethod_Session<
            v1::WorkerService::WithCallbackMethod_Heartbeat<v1::WorkerService::Service>> {
   public:
    explicit WorkerServiceImpl(Services* s) : s_(s) {}

    grpc::Status JoinJob(grpc::ServerContext* ctx, const v1::JoinJobRequest* req,
                         v1::JoinJobResponse* resp) override {
      return s_->Run("WorkerService/JoinJob", [&]() -> absl::Status {
        const v1::WorkerIdentity& w = req->worker();
        if (absl::Status st = s_->AuthorizeWorker(*ctx, w.job_id(), "worker.job_id"); !st.ok()) {
          return st;
        }
        absl::StatusOr<v1::JoinJobResponse> r = s_->deps_.coordinator->JoinJob(*req);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        if (s_->deps_.metrics != nullptr) s_->deps_.metrics->CountJoin();
        Log(absl::StrCat("worker joined ", Who(w), " generation=", resp->generation(),
                         " state=", v1::MemberState_Name(resp->state())));
        return absl::OkStatus();
      });
    }

    grpc::ServerWriteReactor<v1::SessionMessage>* Session(grpc::CallbackServerContext* ctx,
                                                          const v1::SessionRequest* req) override {
      auto* reactor = new SessionReactor(s_, req->worker());
      SessionStream& stream = reactor->stream();
      const v1::WorkerIdentity& w = req->worker();
      if (s_->shutting_down()) {
        stream.FinishEarly(absl::UnavailableError("the coordinator is shutting down; retry"));
        return reactor;
      }
      if (absl::Status st = s_->AuthorizeWorker(*ctx, w.job_id(), "worker.job_id"); !st.ok()) {
        stream.FinishEarly(st);
        return reactor;
      }
      // A new stream of the same incarnation replaces an open one
      // (coordinator.proto): the coordinator ends the old session, which
      // then finishes with ABORTED without declaring the worker lost.
      absl::StatusOr<uint64_t> session = s_->deps_.coordinator->OpenSession(w, stream.Waker());
      if (!session.ok()) {
        stream.FinishEarly(session.status());
        return reactor;
      }
      Log(absl::StrCat("session opened ", Who(w), " session=", *session));
      stream.Opened(*session);
      return reactor;
    }

    grpc::Status GetAssignment(grpc::ServerContext* ctx, const v1::GetAssignmentRequest* req,
                               v1::Assignment* resp) override {
      return s_->Run("WorkerService/GetAssignment", [&]() -> absl::Status {
        const v1::Fence& fence = req->fence();
        if (absl::Status st = s_->AuthorizeWorker(*ctx, fence.worker().job_id(), "fence.worker.job_id");
            !st.ok()) {
          return st;
        }
        absl::StatusOr<std::optional<absl::Duration>> timeout =
            ParseTimeout(req->has_timeout(), req->timeout(), kMaxAssignmentTimeout, "timeout");
        if (!timeout.ok()) return timeout.status();
        Coordinator& c = *s_->deps_.coordinator;
        absl::StatusOr<v1::Assignment> r;
        if (!req->wait()) {
          r = c.GetAssignment(fence, false, absl::Now());
        } else {
          const absl::Time deadline = WaitDeadline(*ctx, *timeout, kDefaultAssignmentTimeout);
          r = s_->SlicedWait<v1::Assignment>(
              ctx, deadline, [&](absl::Duration, absl::Time slice_end) {
                return c.GetAssignment(fence, true, slice_end);
              });
        }
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    // Never waits: on the callback API (Services::RunPooled).
    grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
                                    v1::HeartbeatResponse* resp) override {
      return s_->RunPooled(ctx, "WorkerService/Heartbeat", [=]() -> absl::Status {
        const v1::Fence& fence = req->fence();
        if (absl::Status st = s_->AuthorizeWorker(*ctx, fence.worker().job_id(), "fence.worker.job_id");
            !st.ok()) {
          return st;
        }
        absl::StatusOr<v1::HeartbeatResponse> r = s_->deps_.coordinator->Heartbeat(*req);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        if (s_->deps_.metrics != nullptr) s_->deps_.metrics->CountHeartbeat();
        return absl::OkStatus();
      });
    }

    grpc::Status ReportError(grpc::ServerContext* ctx, const v1::ReportErrorRequest* req,
                             v1::ReportErrorResponse* resp) override {
      return s_->Run("WorkerService/ReportError", [&]() -> absl::Status {
        const v1::Fence& fence = req->fence();
        if (absl::Status st = s_->AuthorizeWorker(*ctx, fence.worker().job_id(), "fence.worker.job_id");
            !st.ok()) {
          return st;
        }
        // A DataLoss may be a corrupt restore point: the coordinator then
        // falls back to an older committed checkpoint and marks the corrupt
        // one in the registry, the marks' owner (Coordinator::ReportError).
        std::vector<v1::CheckpointRef> committed;
        if (req->code() == static_cast<int>(absl::StatusCode::kDataLoss)) {
          committed = s_->CommittedCheckpoints(fence.worker().job_id());
        }
        std::vector<GenerationEnded> ended;
        absl::StatusOr<v1::ReportErrorResponse> r =
            s_->deps_.coordinator->ReportError(*req, &ended, committed, s_->deps_.checkpoints);
        if (r.ok()) {
          Log(absl::StrCat("error reported ", Who(fence.worker()),
                           " generation=", fence.generation(), " code=", req->code(),
                           " operation=\"", req->operation(), "\" message=\"", req->message(),
                           "\""));
        }
        s_->PassOn(ended);
        if (r.ok() && req->code() == static_cast<int>(absl::StatusCode::kDataLoss)) {
          s_->RepairLatestFiles(fence.worker().job_id(),
                                s_->CheckpointRoot(fence.worker().job_id()));
        }
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status LeaveJob(grpc::ServerContext* ctx, const v1::LeaveJobRequest* req,
                          v1::LeaveJobResponse* resp) override {
      return s_->Run("WorkerService/LeaveJob", [&]() -> absl::Status {
        const v1::Fence& fence = req->fence();
        if (absl::Status st = s_->AuthorizeWorker(*ctx, fence.worker().job_id(), "fence.worker.job_id");
            !st.ok()) {
          return st;
        }
        std::vector<GenerationEnded> ended;
        absl::Status st = s_->deps_.coordinator->LeaveJob(*req, &ended);
        if (st.ok()) {
          Log(absl::StrCat("worker left ", Who(fence.worker()), " generation=", fence.generation(),
                           " reason=\"", req->reason(), "\""));
        }
        s_->PassOn(ended);
        return st;
      });
    }

   private:
    Services* const s_;
  };

  // --- RendezvousService ----------------------------------------------------

  class RendezvousServiceImpl final
      : public v1::RendezvousService::WithCallbackMethod_KvSet<
            v1::RendezvousService::WithCallbackMethod_KvGet<
            v1::RendezvousService::WithCallbackMethod_KvAdd<
                v1::RendezvousService::WithCallbackMethod_KvCompareAndSet<
                    v1::RendezvousService::WithCallbackMethod_KvDelete<
                        v1::RendezvousService::Service>>>>> {
   public:
    explicit RendezvousServiceImpl(Services* s) : s_(s) {}

    // Never waits: on the callback API (Services::RunPooled).
    grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* ctx, const v1::KvSetRequest* req,
                                    v1::KvSetResponse*) override {
      return s_->RunPooled(ctx, "RendezvousService/KvSet", [=]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        return s_->deps_.rendezvous->Set(fw->job_id, fw->generation, req->scope(), req->key(),
                                         req->value());
      });
    }

    // On the callback API: a read that does not wait runs on the pool
    // (Services::RunPooled); one that waits gets a thread of its own for
    // the wait, as the sync server would have given it.
    grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* req,
                                    v1::KvGetResponse* resp) override {
      if (!req->wait()) {
        return s_->RunPooled(ctx, "RendezvousService/KvGet", [=] { return Get(ctx, req, resp); });
      }
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      if (s_->waiting_gets_.fetch_add(1) >= s_->max_waiting_gets_) {
        s_->waiting_gets_.fetch_sub(1);
        reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
            "the coordinator already holds ", s_->max_waiting_gets_,
            " waiting KvGet calls; retry later (or wait with KvWait)"))));
        return reactor;
      }
      try {
        std::thread([this, ctx, req, resp, reactor] {
          grpc::Status status =
              s_->Run("RendezvousService/KvGet", [&] { return Get(ctx, req, resp); });
          s_->waiting_gets_.fetch_sub(1);
          // Finish is the last touch: the call (and maybe the server) may be
          // gone right after it.
          reactor->Finish(status);
        }).detach();
      } catch (const std::system_error& e) {  // the process is out of threads
        s_->waiting_gets_.fetch_sub(1);
        reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
            absl::StrCat("cannot start a thread for a waiting KvGet (", e.what(), "); retry"))));
      }
      return reactor;
    }

    // KvGet's body; waits only when req->wait().
    absl::Status Get(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* req,
                     v1::KvGetResponse* resp) {
      if (!req->has_fence()) return OperatorRead(*ctx, *req, resp);
      absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
      if (!fw.ok()) return fw.status();
      absl::StatusOr<std::optional<absl::Duration>> timeout =
          ParseTimeout(req->has_timeout(), req->timeout(), kMaxWaitTimeout, "timeout");
      if (!timeout.ok()) return timeout.status();
      Rendezvous& rv = *s_->deps_.rendezvous;
      absl::StatusOr<std::optional<std::string>> r;
      if (!req->wait()) {
        r = rv.Get(fw->job_id, fw->generation, req->scope(), req->key(), false, *timeout);
      } else {
        const absl::Time deadline = WaitDeadline(*ctx, *timeout, kDefaultWaitTimeout);
        r = s_->SlicedWait<std::optional<std::string>>(
            ctx, deadline, [&](absl::Duration remaining, absl::Time slice_end) {
              return rv.Get(fw->job_id, fw->generation, req->scope(), req->key(), true,
                            remaining, slice_end);
            });
      }
      if (!r.ok()) return r.status();
      resp->set_found(r->has_value());
      if (r->has_value()) resp->set_value(**std::move(r));
      return absl::OkStatus();
    }

    // KvGet without a fence: an operator's read-only look (admin token), which
    // proves nobody's liveness and never waits.
    absl::Status OperatorRead(const grpc::ServerContextBase& ctx, const v1::KvGetRequest& req,
                              v1::KvGetResponse* resp) {
      if (req.job_id().empty()) {
        return absl::InvalidArgumentError(
            "KvGet needs a fence, or job_id and generation for an operator read");
      }
      if (auto p = s_->Authorize(ctx, Access::kAdminOnly, req.job_id()); !p.ok()) {
        return p.status();
      }
      if (req.wait()) {
        return absl::InvalidArgumentError("an operator read (no fence) cannot wait; set wait=false");
      }
      absl::StatusOr<v1::Job> job = s_->deps_.coordinator->GetJob(req.job_id());
      if (!job.ok()) return job.status();
      if (req.generation() < job->generation()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "generation ", req.generation(), " of job ", req.job_id(), " is over (current ",
            job->generation(), "); its rendezvous keys were dropped when it ended"));
      }
      if (req.generation() > job->generation()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "generation=", req.generation(), " does not exist yet; job ", req.job_id(),
            " is at generation ", job->generation()));
      }
      absl::StatusOr<std::optional<std::string>> r = s_->deps_.rendezvous->Get(
          req.job_id(), req.generation(), req.scope(), req.key(), false, std::nullopt);
      if (!r.ok()) return r.status();
      resp->set_found(r->has_value());
      if (r->has_value()) resp->set_value(**std::move(r));
      return absl::OkStatus();
    }

    // Never waits: on the callback API (Services::RunPooled).
    grpc::ServerUnaryReactor* KvAdd(grpc::CallbackServerContext* ctx, const v1::KvAddRequest* req,
                                    v1::KvAddResponse* resp) override {
      return s_->RunPooled(ctx, "RendezvousService/KvAdd", [=]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        absl::StatusOr<int64_t> r = s_->deps_.rendezvous->Add(fw->job_id, fw->generation,
                                                              req->scope(), req->key(),
                                                              req->delta());
        if (!r.ok()) return r.status();
        resp->set_value(*r);
        return absl::OkStatus();
      });
    }

    // Never waits: on the callback API (Services::RunPooled).
    grpc::ServerUnaryReactor* KvCompareAndSet(grpc::CallbackServerContext* ctx, const v1::KvCompareAndSetRequest* req,
                                    v1::KvCompareAndSetResponse* resp) override {
      return s_->RunPooled(ctx, "RendezvousService/KvCompareAndSet", [=]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        std::optional<absl::string_view> expected;
        if (req->has_expected()) expected = req->expected();
        absl::StatusOr<Rendezvous::CasResult> r = s_->deps_.rendezvous->CompareAndSet(
            fw->job_id, fw->generation, req->scope(), req->key(), expected, req->desired());
        if (!r.ok()) return r.status();
        resp->set_swapped(r->swapped);
        if (r->current.has_value()) resp->set_current(*r->current);
        return absl::OkStatus();
      });
    }

    grpc::Status KvWait(grpc::ServerContext* ctx, const v1::KvWaitRequest* req,
                        v1::KvWaitResponse*) override {
      return s_->Run("RendezvousService/KvWait", [&]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        absl::StatusOr<std::optional<absl::Duration>> timeout =
            ParseTimeout(req->has_timeout(), req->timeout(), kMaxWaitTimeout, "timeout");
        if (!timeout.ok()) return timeout.status();
        const std::vector<std::string> keys(req->keys().begin(), req->keys().end());
        Rendezvous& rv = *s_->deps_.rendezvous;
        const absl::Time deadline = WaitDeadline(*ctx, *timeout, kDefaultWaitTimeout);
        return s_->SlicedWait<bool>(ctx, deadline,
                                    [&](absl::Duration remaining,
                                        absl::Time slice_end) -> absl::StatusOr<bool> {
                                      absl::Status st = rv.Wait(fw->job_id, fw->generation,
                                                                req->scope(), keys, remaining,
                                                                slice_end);
                                      if (!st.ok()) return st;
                                      return true;
                                    })
            .status();
      });
    }

    // Never waits: on the callback API (Services::RunPooled).
    grpc::ServerUnaryReactor* KvDelete(grpc::CallbackServerContext* ctx, const v1::KvDeleteRequest* req,
                                    v1::KvDeleteResponse* resp) override {
      return s_->RunPooled(ctx, "RendezvousService/KvDelete", [=]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        absl::StatusOr<bool> r =
            s_->deps_.rendezvous->Delete(fw->job_id, fw->generation, req->scope(), req->key());
        if (!r.ok()) return r.status();
        resp->set_deleted(*r);
        return absl::OkStatus();
      });
    }

    grpc::Status Barrier(grpc::ServerContext* ctx, const v1::BarrierRequest* req,
                         v1::BarrierResponse* resp) override {
      return s_->Run("RendezvousService/Barrier", [&]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = Fence(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        absl::StatusOr<std::optional<absl::Duration>> timeout =
            ParseTimeout(req->has_timeout(), req->timeout(), kMaxWaitTimeout, "timeout");
        if (!timeout.ok()) return timeout.status();
        // Not sliced: a barrier arrival that times out is withdrawn. The gRPC
        // deadline bounds it; shutdown ends it with DropJob.
        absl::StatusOr<uint32_t> r = s_->deps_.rendezvous->Barrier(
            fw->job_id, fw->generation, req->scope(), req->name(), fw->worker_id,
            req->participants(), *timeout, RpcDeadline(*ctx));
        if (!r.ok()) return r.status();
        resp->set_arrival(*r);
        return absl::OkStatus();
      });
    }

   private:
    absl::StatusOr<FencedWorker> Fence(const grpc::ServerContextBase& ctx, const v1::Fence& fence) {
      return s_->AuthorizeFence(ctx, fence);
    }

    Services* const s_;
  };

  // --- CheckpointService ----------------------------------------------------

  class CheckpointServiceImpl final : public v1::CheckpointService::Service {
   public:
    explicit CheckpointServiceImpl(Services* s) : s_(s) {}

    grpc::Status BeginCheckpoint(grpc::ServerContext* ctx, const v1::BeginCheckpointRequest* req,
                                 v1::BeginCheckpointResponse* resp) override {
      return s_->Run("CheckpointService/BeginCheckpoint", [&]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = FenceAndJob(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        absl::StatusOr<v1::Job> job = s_->deps_.coordinator->GetJob(fw->job_id);
        if (!job.ok()) return job.status();
        const v1::JobSpec& spec = job->spec();
        if (req->step() > spec.training().train_steps()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "step=", req->step(), " is beyond spec.training.train_steps=",
              spec.training().train_steps()));
        }
        if (!fw->active) {
          return absl::FailedPreconditionError(
              "the caller holds no rank in this generation (a spare, or not yet assigned); only "
              "ranks save checkpoints");
        }
        if (job->phase() != v1::JOB_PHASE_RUNNING) {
          return absl::FailedPreconditionError(absl::StrCat(
              "job '", fw->job_id, "' is ", v1::JobPhase_Name(job->phase()),
              ", not RUNNING; checkpoints are saved while running"));
        }
        if (spec.checkpoint().directory().empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "job '", fw->job_id, "' has no checkpoint directory (spec.checkpoint.directory)"));
        }
        CheckpointBeginParams params;
        params.job_id = fw->job_id;
        params.generation = fw->generation;
        params.world_size = static_cast<uint32_t>(fw->world_size);
        params.step = req->step();
        params.directory = s_->JobCheckpointRoot(*job);
        params.keep_last = spec.checkpoint().keep_last();
        params.model = spec.model();
        params.parallel = spec.parallel();
        params.dp = job->dp();
        params.seed = spec.training().seed();
        absl::StatusOr<v1::BeginCheckpointResponse> r = s_->deps_.checkpoints->Begin(params);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status ReportShard(grpc::ServerContext* ctx, const v1::ReportShardRequest* req,
                             v1::ReportShardResponse* resp) override {
      return s_->Run("CheckpointService/ReportShard", [&]() -> absl::Status {
        absl::StatusOr<FencedWorker> fw = FenceAndJob(*ctx, req->fence());
        if (!fw.ok()) return fw.status();
        if (!fw->active) {
          return absl::FailedPreconditionError(
              "the caller holds no rank in this generation; only ranks report shards");
        }
        absl::StatusOr<v1::Job> job = s_->deps_.coordinator->GetJob(fw->job_id);
        if (!job.ok()) return job.status();
        ShardReport report;
        report.rank = static_cast<uint32_t>(fw->rank);
        report.coordinates =
            CoordinatesOf(report.rank, job->spec().parallel().tp(), job->dp());
        report.worker_id = fw->worker_id;
        report.request = *req;
        absl::StatusOr<ReportShardResult> r =
            s_->deps_.checkpoints->ReportShard(fw->job_id, fw->generation, report);
        if (!r.ok()) return r.status();
        const v1::CheckpointSummary& summary = r->checkpoint;
        if (r->committed_manifest != nullptr) {
          // Files before the answer: a rank told COMMITTED finds
          // manifest.json and LATEST in place.
          s_->WriteCommittedFiles(fw->job_id, *r->committed_manifest, r->expired);
          s_->NoteCommitted(fw->job_id, summary);
        } else if (summary.state() == v1::CHECKPOINT_STATE_ABORTED &&
                   summary.reported_ranks() == summary.world_size()) {
          // The commit this report triggered failed.
          Log(absl::StrCat("checkpoint aborted job=", fw->job_id,
                           " generation=", summary.generation(),
                           " checkpoint=", summary.checkpoint_id(), " reason=\"",
                           summary.abort_reason(), "\""));
          s_->deps_.coordinator->NoteCheckpointAborted(fw->job_id, summary.checkpoint_id(),
                                                       summary.step(), summary.abort_reason());
          s_->RemoveAbortedDirectory(fw->job_id, s_->CheckpointRoot(fw->job_id),
                                     summary.checkpoint_id(), summary.directory());
        }
        *resp->mutable_checkpoint() = summary;
        return absl::OkStatus();
      });
    }

    grpc::Status CommitCheckpoint(grpc::ServerContext* ctx,
                                  const v1::CommitCheckpointRequest* req,
                                  v1::CheckpointSummary* resp) override {
      return s_->Run("CheckpointService/CommitCheckpoint", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kAdminOnly, req->job_id()); !p.ok()) {
          return p.status();
        }
        if (absl::Status st = RequireJob(req->job_id()); !st.ok()) return st;
        const std::optional<v1::CheckpointState> before =
            StateOf(req->job_id(), req->checkpoint_id());
        absl::StatusOr<v1::CheckpointSummary> r =
            s_->deps_.checkpoints->Commit(req->job_id(), req->checkpoint_id());
        if (!r.ok()) {
          const std::optional<v1::CheckpointState> after =
              StateOf(req->job_id(), req->checkpoint_id());
          if (before != after && after == v1::CHECKPOINT_STATE_ABORTED) {
            absl::StatusOr<v1::Manifest> m =
                s_->deps_.checkpoints->GetManifest(req->job_id(), req->checkpoint_id());
            s_->deps_.coordinator->NoteCheckpointAborted(
                req->job_id(), req->checkpoint_id(), m.ok() ? m->step() : 0,
                std::string(r.status().message()));
            if (m.ok()) {
              s_->RemoveAbortedDirectory(req->job_id(), s_->CheckpointRoot(req->job_id()),
                                         req->checkpoint_id(), m->directory());
            }
          }
          return r.status();
        }
        if (before != v1::CHECKPOINT_STATE_COMMITTED &&
            r->state() == v1::CHECKPOINT_STATE_COMMITTED) {
          s_->NoteCommitted(req->job_id(), *r);
        }
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status AbortCheckpoint(grpc::ServerContext* ctx, const v1::AbortCheckpointRequest* req,
                                 v1::CheckpointSummary* resp) override {
      return s_->Run("CheckpointService/AbortCheckpoint", [&]() -> absl::Status {
        absl::StatusOr<Principal> who = s_->Authorize(*ctx, Access::kWorker, req->job_id());
        if (!who.ok()) return who.status();
        if (absl::Status st = RequireJobId(req->job_id(), "job_id"); !st.ok()) return st;
        if (!who->is_admin() && !req->has_fence()) {
          return absl::InvalidArgumentError(
              "fence is required when aborting with a worker token");
        }
        if (req->has_fence()) {
          if (req->fence().worker().job_id() != req->job_id()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "fence.worker.job_id='", req->fence().worker().job_id(), "' differs from job_id='",
                req->job_id(), "'"));
          }
          absl::StatusOr<FencedWorker> fw = s_->deps_.coordinator->CheckFence(req->fence());
          if (!fw.ok()) return fw.status();
        }
        if (absl::Status st = RequireJob(req->job_id()); !st.ok()) return st;
        const std::optional<v1::CheckpointState> before =
            StateOf(req->job_id(), req->checkpoint_id());
        const std::string reason =
            req->reason().empty() ? std::string("aborted by request") : req->reason();
        absl::StatusOr<v1::CheckpointSummary> r =
            s_->deps_.checkpoints->Abort(req->job_id(), req->checkpoint_id(), reason);
        if (!r.ok()) return r.status();
        if (before != v1::CHECKPOINT_STATE_ABORTED &&
            r->state() == v1::CHECKPOINT_STATE_ABORTED) {
          Log(absl::StrCat("checkpoint aborted job=", req->job_id(),
                           " generation=", r->generation(), " checkpoint=", r->checkpoint_id(),
                           " reason=\"", reason, "\""));
          s_->deps_.coordinator->NoteCheckpointAborted(req->job_id(), r->checkpoint_id(),
                                                       r->step(), reason);
          s_->RemoveAbortedDirectory(req->job_id(), s_->CheckpointRoot(req->job_id()),
                                     r->checkpoint_id(), r->directory());
        }
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status ListCheckpoints(grpc::ServerContext* ctx, const v1::ListCheckpointsRequest* req,
                                 v1::ListCheckpointsResponse* resp) override {
      return s_->Run("CheckpointService/ListCheckpoints", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kWorker, req->job_id()); !p.ok()) {
          return p.status();
        }
        if (absl::Status st = RequireJob(req->job_id()); !st.ok()) return st;
        absl::StatusOr<v1::ListCheckpointsResponse> r = s_->deps_.checkpoints->List(
            req->job_id(), req->include_aborted(), req->page_size(), req->page_token());
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

    grpc::Status GetManifest(grpc::ServerContext* ctx, const v1::GetManifestRequest* req,
                             v1::Manifest* resp) override {
      return s_->Run("CheckpointService/GetManifest", [&]() -> absl::Status {
        if (auto p = s_->Authorize(*ctx, Access::kWorker, req->job_id()); !p.ok()) {
          return p.status();
        }
        if (absl::Status st = RequireJob(req->job_id()); !st.ok()) return st;
        const std::vector<std::string> tensors(req->tensors().begin(), req->tensors().end());
        absl::StatusOr<v1::Manifest> r =
            s_->deps_.checkpoints->GetManifest(req->job_id(), req->checkpoint_id(), tensors);
        if (!r.ok()) return r.status();
        *resp = *std::move(r);
        return absl::OkStatus();
      });
    }

   private:
    absl::StatusOr<FencedWorker> FenceAndJob(const grpc::ServerContext& ctx,
                                             const v1::Fence& fence) {
      return s_->AuthorizeFence(ctx, fence);
    }

    // InvalidArgument for an empty job_id, NotFound for an unknown job.
    absl::Status RequireJob(const std::string& job_id) {
      if (absl::Status st = RequireJobId(job_id, "job_id"); !st.ok()) return st;
      return s_->deps_.coordinator->GetJob(job_id).status();
    }

    std::optional<v1::CheckpointState> StateOf(const std::string& job_id,
                                               const std::string& checkpoint_id) {
      if (checkpoint_id.empty()) return std::nullopt;
      absl::StatusOr<v1::Manifest> m =
          s_->deps_.checkpoints->GetManifest(job_id, checkpoint_id, {});
      if (!m.ok()) return std::nullopt;
      return m->state();
    }

    Services* const s_;
  };

  // One Session stream on the callback API: the coordinator's waker posts
  // it to the pool, which pulls the next message (NextSessionMessage with a
  // past deadline) and starts its write; at most one write is in flight.
  // A cancelled stream (the client went away) or a failed write calls
  // CloseSession (the worker is LOST at once) unless the server is shutting
  // down. Lock order: mu_, then the coordinator's lock (Advance); the
  // coordinator's lock is never held while taking mu_ (the waker only posts).
  class SessionStream : public std::enable_shared_from_this<SessionStream> {
   public:
    SessionStream(Services* s, v1::WorkerIdentity w,
                  grpc::ServerWriteReactor<v1::SessionMessage>* reactor)
        : s_(s), w_(std::move(w)), reactor_(reactor), start_(absl::Now()) {}

    Services* services() const { return s_; }

    // Any thread, even with the coordinator's lock held: schedule Advance.
    void Wake() {
      if (queued_.exchange(true)) return;
      std::weak_ptr<SessionStream> weak = weak_from_this();
      s_->pool_->Post([weak] {
        if (auto st = weak.lock()) st->Advance();
      });
    }

    // The waker handed to Coordinator::OpenSession.
    Coordinator::SessionWaker Waker() {
      std::weak_ptr<SessionStream> weak = weak_from_this();
      return [weak] {
        if (auto st = weak.lock()) st->Wake();
      };
    }

    // The handler, once OpenSession returned.
    void Opened(uint64_t session_id) {
      {
        absl::MutexLock lock(&mu_);
        session_id_ = session_id;
        if (cancelled_ && finished_ && !s_->shutting_down()) {
          // The client went away before the session was recorded.
          s_->PassOn(s_->deps_.coordinator->CloseSession(w_, session_id_));
          return;
        }
      }
      Wake();
    }

    // Ends a stream that never opened (bad request, unknown worker ...).
    void FinishEarly(const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      FinishLocked(status);
    }

    // Pool thread: writes the next queued message, or ends the stream.
    void Advance() {
      queued_.store(false);
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_ || session_id_ == 0) return;
      if (s_->shutting_down()) {
        FinishLocked(absl::UnavailableError("the coordinator is shutting down; reconnect"));
        return;
      }
      absl::StatusOr<std::optional<v1::SessionMessage>> msg =
          s_->deps_.coordinator->NextSessionMessage(w_, session_id_, absl::InfinitePast());
      if (!msg.ok()) {
        // Replaced by a newer stream, closed, or the member is gone.
        if (s_->HasLeft(w_)) {
          Log(absl::StrCat("session ended ", Who(w_), " session=", session_id_, " (left)"));
          FinishLocked(absl::OkStatus());
          return;
        }
        Log(absl::StrCat("session ended ", Who(w_), " session=", session_id_, " status=\"",
                         msg.status().ToString(), "\""));
        FinishLocked(msg.status());
        return;
      }
      if (!msg->has_value()) return;
      current_ = **std::move(msg);
      writing_ = true;
      reactor_->StartWrite(&current_);
    }

    // gRPC: a write finished (ok = false: the stream is broken).
    void WriteDone(bool ok) {
      bool more = false;
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        if (finished_) return;
        if (s_->shutting_down()) {
          FinishLocked(absl::UnavailableError("the coordinator is shutting down; reconnect"));
          return;
        }
        if (!ok || cancelled_) {
          BrokenLocked(cancelled_ ? "cancelled by the client or the connection broke"
                                  : "write failed");
          return;
        }
        if (current_.has_directive() && current_.directive().has_stop()) {
          Log(absl::StrCat("session ended ", Who(w_), " session=", session_id_, " (stop)"));
          FinishLocked(absl::OkStatus());
          return;
        }
        more = true;
      }
      if (more) Wake();  // more messages may be queued
    }

    // gRPC: the client cancelled or the connection broke.
    void Cancelled() {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (finished_ || writing_) return;  // WriteDone finishes a pending write
      if (s_->shutting_down()) {
        FinishLocked(absl::UnavailableError("the coordinator is shutting down; reconnect"));
        return;
      }
      BrokenLocked("cancelled by the client or the connection broke");
    }

    // gRPC: the stream is over; the reactor is deleted after this.
    void Done() {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
      if (s_->deps_.metrics != nullptr) {
        s_->deps_.metrics->ObserveRpc("WorkerService/Session", absl::Now() - start_, final_code_);
      }
      absl::MutexLock streams(&s_->streams_mu_);
      s_->streams_.erase(this);
    }

   private:
    void BrokenLocked(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (session_id_ != 0) {
        std::vector<GenerationEnded> ended = s_->deps_.coordinator->CloseSession(w_, session_id_);
        Log(absl::StrCat("session broken ", Who(w_), " session=", session_id_, " why=\"", why,
                         "\""));
        s_->PassOn(ended);
      }
      FinishLocked(absl::UnavailableError("the session stream broke"));
    }

    void FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (finished_ || reactor_ == nullptr) return;
      finished_ = true;
      if (!status.ok() && s_->shutting_down()) {
        status = absl::UnavailableError("the coordinator is shutting down; reconnect");
      }
      final_code_ = status.code();
      if (status.code() == absl::StatusCode::kInternal) {
        Log(absl::StrCat("internal error method=WorkerService/Session status=\"",
                         status.ToString(), "\""));
      }
      reactor_->Finish(ToGrpcStatus(status));
    }

    Services* const s_;
    const v1::WorkerIdentity w_;
    const absl::Time start_;
    std::atomic<bool> queued_{false};
    absl::Mutex mu_;
    grpc::ServerWriteReactor<v1::SessionMessage>* reactor_ ABSL_GUARDED_BY(mu_);
    uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
    v1::SessionMessage current_ ABSL_GUARDED_BY(mu_);  // the message being written
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    absl::StatusCode final_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  };

  class SessionReactor final : public grpc::ServerWriteReactor<v1::SessionMessage> {
   public:
    SessionReactor(Services* s, const v1::WorkerIdentity& w)
        : stream_(std::make_shared<SessionStream>(s, w, this)) {
      absl::MutexLock lock(&s->streams_mu_);
      s->streams_[stream_.get()] = stream_;
    }
    SessionStream& stream() { return *stream_; }
    // Both may take the coordinator's lock: on the pool, off gRPC's thread.
    void OnWriteDone(bool ok) override {
      stream_->services()->pool_->Post([st = stream_, ok] { st->WriteDone(ok); });
    }
    void OnCancel() override {
      stream_->services()->pool_->Post([st = stream_] { st->Cancelled(); });
    }
    void OnDone() override {
      stream_->Done();
      delete this;
    }

   private:
    const std::shared_ptr<SessionStream> stream_;
  };

  const ServiceDeps deps_;
  const absl::Duration poll_interval_;
  // KvGet calls waiting for a key, each on a thread of its own: at most
  // max_waiting_gets_ (beyond: RESOURCE_EXHAUSTED), so a flood of waits
  // cannot exhaust the process's threads.
  const int max_waiting_gets_;
  std::atomic<int> waiting_gets_{0};
  // Shared with the wakers the coordinator holds, which may outlive us.
  const std::shared_ptr<HandlerPool> pool_ = std::make_shared<HandlerPool>(4);
  absl::Mutex streams_mu_;
  std::map<SessionStream*, std::weak_ptr<SessionStream>> streams_ ABSL_GUARDED_BY(streams_mu_);
  const Authenticator auth_;
  std::atomic<bool> shutting_down_{false};
  // Serializes the checkpoint file work (LATEST writers race otherwise).
  absl::Mutex files_mu_;


  JobServiceImpl job_;
  WorkerServiceImpl worker_;
  RendezvousServiceImpl rendezvous_;
  CheckpointServiceImpl checkpoint_;
};

// ---------------------------------------------------------------------------
// CoordinatorServer.

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    ServiceDeps deps, ServerOptions options) {
  if (deps.coordinator == nullptr || deps.rendezvous == nullptr || deps.checkpoints == nullptr) {
    return absl::InvalidArgumentError(
        "CoordinatorServer needs a coordinator, a rendezvous and a checkpoint registry");
  }
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->services_ = std::make_unique<Services>(deps, options);
  server->services_->RecoverCheckpointFiles();

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
  // The sync server starts a thread per concurrent call (blocking waits
  // included): bounded, so a flood of calls gets RESOURCE_EXHAUSTED instead
  // of exhausting the process's threads (which left calls unanswered and
  // shutdown hanging). Sized for 4096 workers each waiting in
  // GetAssignment, plus room for everything else.
  grpc::ResourceQuota quota("shardline-coordinator");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  server->services_->Register(&builder);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen_address,
                     "' (address in use, not a local address, or bad TLS files?)"));
  }
  server->port_ = port;
  const size_t colon = options.listen_address.rfind(':');
  const std::string host =
      colon == std::string::npos ? options.listen_address : options.listen_address.substr(0, colon);
  server->address_ = absl::StrCat(host, ":", port);
  if (options.tick_interval > absl::ZeroDuration()) {
    CoordinatorServer* raw = server.get();
    const absl::Duration interval = options.tick_interval;
    server->tick_thread_ = std::thread([raw, interval] { raw->TickLoop(interval); });
  }
  Log(absl::StrCat("serving address=", server->address_,
                   " tls=", options.credentials != nullptr ? "on" : "off",
                   " auth=", options.admin_token.empty() ? "off" : "on"));
  return server;
}

void CoordinatorServer::TickLoop(absl::Duration interval) {
  Coordinator* coordinator = nullptr;
  while (!stop_tick_.WaitForNotificationWithTimeout(interval)) {
    if (coordinator == nullptr) coordinator = services_->coordinator();
    PassOn(coordinator->Tick());
  }
}

void CoordinatorServer::PassOn(const std::vector<GenerationEnded>& ended) {
  services_->PassOn(ended);
}

void CoordinatorServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    Log(absl::StrCat("shutting down address=", address_));
    services_->BeginShutdown();
    if (!stop_tick_.HasBeenNotified()) stop_tick_.Notify();
    if (tick_thread_.joinable()) tick_thread_.join();
    services_->DropAllRendezvous();
    if (server_ != nullptr) {  // null when Start failed to listen
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
    }
    Log("shut down");
  });
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace shardline::server

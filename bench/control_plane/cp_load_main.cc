// cp_load: the control-plane load generator of bench/control_plane (items
// 2-4 of the benchmark set). Every mode prints one JSON object on stdout;
// progress goes to stderr. The Python scripts beside it start the servers
// (shardline-coordinator, etcd) and turn the JSON into CSV rows.
//
//   cp_load kv         --target shardline|etcd --address A --clients N --seconds S
//   cp_load barrier    --address A --clients N --rounds R
//   cp_load rendezvous --address A --workers N [--processes P] [--connections C]
//                      [--compact-groups 0|1]
//                      (P processes share the workers, each with C channels
//                      shared round-robin, 0: one per worker; compact groups
//                      (default 1): JoinJobRequest.compact_groups)
//   cp_load heartbeats --address A --workers N --seconds S --interval-ms I --timeout-ms T
//                      [--progress-groups G]   (each heartbeat carries a RankProgress
//                      with G communicators, as a training rank's does; 0: none)
//   cp_load leases     --address A --workers N --seconds S --interval-ms I --ttl-s T   (etcd)
//   cp_load jobs       --address A --jobs N --clients C   (CreateJob, then CancelJob, of N jobs)
//
// Every simulated worker or client has its own gRPC channel and TCP
// connection, as separate processes would. Shardline workers do what a real
// shardline-worker does before training: JoinJob, open the Session stream,
// wait for SessionOpened, GetAssignment(wait). The coordinator runs without
// an admin token (no auth), so no metadata is sent.
//
// Thread-safety: not a library; each mode owns its threads.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "etcd/v3/rpc.grpc.pb.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "bench/control_plane/cp_load.h"

namespace shardline::bench {

namespace v1 = ::shardline::v1;

// L=2, h=8, 2 heads, V=256 (bytes), s=4, tp=pp=1, dp = `workers` exactly (global batch
// = workers, micro-batch 1), so every worker gets a rank.
v1::JobSpec FleetSpec(int workers, absl::Duration heartbeat_interval,
                      absl::Duration heartbeat_timeout) {
  v1::JobSpec spec;
  spec.set_name("cp-bench");
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(8);
  m->set_num_heads(2);
  m->set_vocab_size(256);
  m->set_seq_length(4);
  spec.mutable_parallel()->set_tp(1);
  spec.mutable_parallel()->set_pp(1);
  spec.mutable_training()->set_global_batch(workers);
  spec.mutable_training()->set_micro_batch(1);
  spec.mutable_training()->set_train_steps(1000000);
  spec.mutable_data()->set_dataset_path("/data/tinyshakespeare.txt");  // never read: no training
  v1::ElasticPolicy* e = spec.mutable_elastic();
  e->set_min_workers(workers);
  e->set_max_workers(workers);
  *e->mutable_heartbeat_interval() = ProtoDuration(heartbeat_interval);
  *e->mutable_heartbeat_timeout() = ProtoDuration(heartbeat_timeout);
  e->mutable_last_call()->set_seconds(1);
  e->mutable_join_timeout()->set_seconds(1800);
  return spec;
}

namespace {

namespace etcd = ::etcdserverpb;

// Up to the hard limit: every simulated worker's channel is a socket.
void RaiseFdLimit() {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// --- Shardline: a job and a fleet of simulated workers ----------------------

// The coordinator's defaults (spec/job_spec.h): workers not under test
// heartbeat at this pace.
constexpr absl::Duration kDefaultInterval = absl::Seconds(5);
constexpr absl::Duration kDefaultTimeout = absl::Seconds(30);

bool CreateJob(const std::string& address, const std::string& job_id, const v1::JobSpec& spec) {
  auto jobs = v1::JobService::NewStub(NewChannel(address, -1));
  v1::CreateJobRequest req;
  req.set_job_id(job_id);
  *req.mutable_spec() = spec;
  v1::CreateJobResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(30));
  grpc::Status s = jobs->CreateJob(&ctx, req, &resp);
  if (!s.ok()) Log(absl::StrCat("CreateJob: ", s.error_message()));
  return s.ok();
}

struct Worker;
struct Tag {
  enum Kind { kJoin, kSessionStart, kSessionRead, kSessionFinish, kAssign, kHeartbeat, kAlarm };
  Worker* w;
  Kind kind;
};

// One simulated worker: its channel, and the state of its three chains of
// asynchronous calls (join -> assignment; the Session stream; heartbeats
// every interval from the join on). Each chain has at most one call in
// flight.
struct Worker {
  int index = 0;
  std::string id;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WorkerService::Stub> stub;
  std::atomic<uint64_t> generation{0};

  Tag join_tag, start_tag, read_tag, finish_tag, assign_tag, hb_tag, alarm_tag;

  std::unique_ptr<grpc::ClientContext> unary_ctx;
  grpc::Status unary_status;
  v1::JoinJobResponse join_resp;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JoinJobResponse>> join_rpc;
  v1::Assignment assignment;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::Assignment>> assign_rpc;
  // The heartbeat chain, from JoinJob on (as a real worker's agent).
  std::unique_ptr<grpc::ClientContext> hb_ctx;
  grpc::Status hb_status;
  v1::HeartbeatResponse hb_resp;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> hb_rpc;
  uint64_t hb_count = 0;  // heartbeats sent: the simulated step
  absl::Time hb_sent;
  absl::Time hb_next;
  grpc::Alarm alarm;

  grpc::ClientContext session_ctx;
  std::unique_ptr<grpc::ClientAsyncReader<v1::SessionMessage>> session;
  v1::SessionMessage session_msg;
  grpc::Status session_status;
  bool session_opened = false;

  absl::Time join_start, joined, assigned;
  std::atomic<bool> ok{false};  // holds its assignment
  grpc::CompletionQueue* cq = nullptr;  // its calls' queue (Fleet::cqs_)

  v1::Fence Fence() const {
    v1::Fence f;
    f.mutable_worker()->set_job_id(job_id);
    f.mutable_worker()->set_worker_id(id);
    f.mutable_worker()->set_incarnation(1);
    f.set_generation(generation.load());
    return f;
  }
  std::string job_id;
};

// N simulated workers driven by completion queues and a few threads each.
class Fleet {
 public:
  // Workers heartbeat every `heartbeat_interval` from their JoinJob on.
  // Workers first_index .. first_index + workers - 1 (named w<index>).
  // `connections` > 0: the workers share that many channels (TCP
  // connections) round-robin, which real workers (one process each) would
  // not; 0: one channel each.
  Fleet(std::string address, std::string job_id, int workers, int poll_threads,
        absl::Duration heartbeat_interval, int first_index = 0, int connections = 0)
      : address_(std::move(address)), job_id_(std::move(job_id)) {
    interval_ns_.store(absl::ToInt64Nanoseconds(heartbeat_interval));
    std::vector<std::shared_ptr<grpc::Channel>> shared;
    for (int c = 0; c < connections && c < workers; ++c) {
      shared.push_back(NewChannel(address_, first_index + c));
    }
    for (int j = 0; j < workers; ++j) {
      const int i = first_index + j;
      auto w = std::make_unique<Worker>();
      w->index = i;
      w->id = absl::StrCat("w", i);
      w->job_id = job_id_;
      w->channel = shared.empty() ? NewChannel(address_, i) : shared[j % shared.size()];
      w->stub = v1::WorkerService::NewStub(w->channel);
      w->join_tag = {w.get(), Tag::kJoin};
      w->start_tag = {w.get(), Tag::kSessionStart};
      w->read_tag = {w.get(), Tag::kSessionRead};
      w->finish_tag = {w.get(), Tag::kSessionFinish};
      w->assign_tag = {w.get(), Tag::kAssign};
      w->hb_tag = {w.get(), Tag::kHeartbeat};
      w->alarm_tag = {w.get(), Tag::kAlarm};
      workers_.push_back(std::move(w));
    }
    // Debian's libgrpc is built without NDEBUG: a completion queue scans
    // the list of its outstanding operations at every completion, so one
    // queue for 25k workers (three calls each in flight) made the load
    // generator O(N^2). A queue per kWorkersPerQueue workers, each served by
    // `poll_threads` threads, keeps each list short; up to that many workers
    // (every benchmark but the largest rendezvous) this is one queue, as
    // before.
    const int queues = (workers + kWorkersPerQueue - 1) / kWorkersPerQueue;
    for (int q = 0; q < std::max(1, queues); ++q) {
      cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
    }
    for (size_t j = 0; j < workers_.size(); ++j) workers_[j]->cq = cqs_[j % cqs_.size()].get();
    for (auto& cq : cqs_) {
      for (int i = 0; i < poll_threads; ++i) {
        threads_.emplace_back([this, cq = cq.get()] { Poll(cq); });
      }
    }
  }

  // Joins every worker at once and waits until each holds its assignment or
  // failed, or `timeout` passed. Returns the seconds from the first JoinJob
  // to the last assignment.
  // Heartbeats of ranked workers carry a progress report with `groups`
  // communicators (0: none). Before Rendezvous.
  void set_progress_groups(int groups) { progress_groups_ = std::max(0, groups); }

  double Rendezvous(absl::Duration timeout) {
    start_ = absl::Now();
    for (auto& w : workers_) StartJoin(w.get());
    return AwaitAssignments(timeout);
  }
  // The first JoinJob's time (Rendezvous) and the last assignment's.
  absl::Time start() const { return start_; }
  absl::Time last_assigned() const {
    absl::Time last = start_;
    for (auto& w : workers_) {
      if (w->ok) last = std::max(last, w->assigned);
    }
    return last;
  }
  // Workers ask for compact process groups (GetAssignmentRequest,
  // JoinJobRequest.compact_groups). Before Rendezvous.
  void set_compact_groups(bool on) { compact_groups_ = on; }

 private:
  double AwaitAssignments(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return assigned_ + failed_ >= static_cast<int>(workers_.size());
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
    absl::Time last = start_;
    for (auto& w : workers_) {
      if (w->ok) last = std::max(last, w->assigned);
    }
    return absl::ToDoubleSeconds(last - start_);
  }

 public:
  int assigned() {
    absl::MutexLock lock(&mu_);
    return assigned_;
  }
  int failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  std::string first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_.empty() ? setup_hb_error_ : first_error_;
  }
  Latencies JoinLatencies() {
    Latencies l;
    for (auto& w : workers_) {
      if (w->ok) l.Add(w->joined - w->join_start);
    }
    return l;
  }
  Worker* worker(int i) { return workers_[i].get(); }
  int size() const { return static_cast<int>(workers_.size()); }

  // Counts the heartbeats answered during `duration`, every worker now
  // sending one every `interval` (0: the next as soon as the previous is
  // answered, a closed loop).
  void MeasureHeartbeats(absl::Duration interval, absl::Duration duration) {
    const absl::Duration previous = absl::Nanoseconds(interval_ns_.exchange(
        absl::ToInt64Nanoseconds(interval)));
    // Time for every worker's chain to pick up the new pace.
    absl::SleepFor(previous + absl::Milliseconds(200));
    {
      absl::MutexLock lock(&mu_);
      hb_ = HeartbeatStats();
      hb_start_ = absl::Now();
    }
    measuring_.store(true);
    absl::SleepFor(duration);
    measuring_.store(false);
    absl::MutexLock lock(&mu_);
    hb_end_ = absl::Now();
  }

  struct HeartbeatStats {
    int64_t ok = 0, errors = 0, aborted = 0, restart_directives = 0;
    double seconds = 0;
    Latencies latency;
    std::string first_error;
  };
  HeartbeatStats heartbeat_stats() {
    absl::MutexLock lock(&mu_);
    HeartbeatStats s = hb_;
    s.seconds = absl::ToDoubleSeconds(hb_end_ - hb_start_);
    return s;
  }
  int sessions_ended() {
    absl::MutexLock lock(&mu_);
    return sessions_ended_;
  }

 private:
  void Fail(Worker* w, const std::string& what, const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    ++failed_;
    if (first_error_.empty()) {
      first_error_ = absl::StrCat(w->id, " ", what, ": code ", s.error_code(), " ", s.error_message());
    }
  }

  void StartJoin(Worker* w) {
    v1::JoinJobRequest req;
    req.mutable_worker()->set_job_id(job_id_);
    req.mutable_worker()->set_worker_id(w->id);
    req.mutable_worker()->set_incarnation(1);
    req.set_host(absl::StrCat("host-", w->index));
    req.set_device("cpu");
    req.set_compact_groups(compact_groups_);
    w->unary_ctx = std::make_unique<grpc::ClientContext>();
    SetDeadline(w->unary_ctx.get(), absl::Seconds(600));
    w->join_start = absl::Now();
    w->join_rpc = w->stub->PrepareAsyncJoinJob(w->unary_ctx.get(), req, w->cq);
    w->join_rpc->StartCall();
    w->join_rpc->Finish(&w->join_resp, &w->unary_status, &w->join_tag);
  }

  void StartAssignment(Worker* w) {
    v1::GetAssignmentRequest req;
    *req.mutable_fence() = w->Fence();
    req.set_wait(true);
    req.mutable_timeout()->set_seconds(600);
    w->unary_ctx = std::make_unique<grpc::ClientContext>();
    SetDeadline(w->unary_ctx.get(), absl::Seconds(610));
    w->assign_rpc = w->stub->PrepareAsyncGetAssignment(w->unary_ctx.get(), req, w->cq);
    w->assign_rpc->StartCall();
    w->assign_rpc->Finish(&w->assignment, &w->unary_status, &w->assign_tag);
  }

  void SendHeartbeat(Worker* w) {
    v1::HeartbeatRequest req;
    *req.mutable_fence() = w->Fence();
    req.set_state(w->ok.load() ? v1::WORKER_STATE_TRAINING : v1::WORKER_STATE_WAITING);
    ++w->hb_count;
    if (progress_groups_ > 0 && w->ok.load()) {
      // What a training rank reports (worker/rank_progress.h): a step done
      // per heartbeat, in compute, each communicator's last collective.
      static const char* const kKinds[] = {"dp", "tp", "pp"};
      v1::RankProgress* p = req.mutable_progress();
      p->set_activity(v1::ACTIVITY_COMPUTE);
      p->set_step(w->hb_count);
      req.set_step(w->hb_count);
      p->mutable_step_time()->set_nanos(40'000'000);
      p->mutable_compute_time()->set_nanos(30'000'000 + (w->index % 7) * 100'000);
      for (int g = 0; g < progress_groups_; ++g) {
        v1::CollectiveProgress* c = p->add_collectives();
        c->set_group(absl::StrCat(kKinds[g % 3], "/", g / 3));
        c->set_operation(g % 3 == 2 ? "send" : "all_reduce");
        c->set_sequence(w->hb_count * 4 + g);
        c->set_count(1 << 20);
        c->set_dtype("float32");
        c->set_in_flight(false);
        c->mutable_elapsed()->set_nanos(2'000'000);
        if (g % 3 == 2) c->set_peer_rank(static_cast<uint32_t>((w->index + 1) % workers_.size()));
      }
    }
    w->hb_ctx = std::make_unique<grpc::ClientContext>();
    SetDeadline(w->hb_ctx.get(), absl::Seconds(30));
    w->hb_sent = absl::Now();
    w->hb_rpc = w->stub->PrepareAsyncHeartbeat(w->hb_ctx.get(), req, w->cq);
    w->hb_rpc->StartCall();
    w->hb_rpc->Finish(&w->hb_resp, &w->hb_status, &w->hb_tag);
  }

  // Schedules w's next heartbeat: at once in a closed loop, else one
  // interval after the previous one was due.
  void NextHeartbeat(Worker* w, absl::Time now) {
    const absl::Duration interval = absl::Nanoseconds(interval_ns_.load());
    if (interval <= absl::ZeroDuration()) {
      w->hb_next = now;
      return SendHeartbeat(w);
    }
    w->hb_next += interval;
    if (w->hb_next <= now) {
      w->hb_next = now;  // behind schedule: send at once
      return SendHeartbeat(w);
    }
    w->alarm.Set(w->cq, absl::ToChronoTime(w->hb_next), &w->alarm_tag);
  }

  void Handle(Tag* tag, bool ok) {
    Worker* w = tag->w;
    switch (tag->kind) {
      case Tag::kJoin:
        if (!w->unary_status.ok()) return Fail(w, "JoinJob", w->unary_status);
        w->joined = absl::Now();
        w->generation.store(w->join_resp.generation());
        {
          // The first heartbeat within one interval, spread as independent
          // workers' would be.
          const absl::Duration interval = absl::Nanoseconds(interval_ns_.load());
          w->hb_next = w->joined + interval * (static_cast<double>(w->index % 997) / 997.0);
          w->alarm.Set(w->cq, absl::ToChronoTime(w->hb_next), &w->alarm_tag);
        }
        {
          v1::SessionRequest req;
          req.mutable_worker()->set_job_id(job_id_);
          req.mutable_worker()->set_worker_id(w->id);
          req.mutable_worker()->set_incarnation(1);
          w->session = w->stub->PrepareAsyncSession(&w->session_ctx, req, w->cq);
          w->session->StartCall(&w->start_tag);
        }
        return;
      case Tag::kSessionStart:
        if (!ok) {
          w->session->Finish(&w->session_status, &w->finish_tag);
          return;
        }
        w->session->Read(&w->session_msg, &w->read_tag);
        return;
      case Tag::kSessionRead:
        if (!ok) {
          w->session->Finish(&w->session_status, &w->finish_tag);
          return;
        }
        if (w->session_msg.has_opened() && !w->session_opened) {
          w->session_opened = true;
          StartAssignment(w);
        }
        w->session->Read(&w->session_msg, &w->read_tag);
        return;
      case Tag::kSessionFinish: {
        absl::MutexLock lock(&mu_);
        ++sessions_ended_;
        if (!w->session_opened) {
          ++failed_;
          if (first_error_.empty()) {
            first_error_ = absl::StrCat(w->id, " Session: ", w->session_status.error_message());
          }
        }
        return;
      }
      case Tag::kAssign: {
        if (!w->unary_status.ok()) return Fail(w, "GetAssignment", w->unary_status);
        w->generation.store(w->assignment.generation());
        w->assigned = absl::Now();
        w->ok = true;
        w->assignment.Clear();  // thousands of them add up
        absl::MutexLock lock(&mu_);
        ++assigned_;
        return;
      }
      case Tag::kHeartbeat: {
        const absl::Time now = absl::Now();
        {
          absl::MutexLock lock(&mu_);
          if (!w->hb_status.ok() && setup_hb_error_.empty()) {
            setup_hb_error_ = absl::StrCat(w->id, ": ", w->hb_status.error_message());
          }
          if (measuring_.load()) {
            if (w->hb_status.ok()) {
              ++hb_.ok;
              hb_.latency.Add(now - w->hb_sent);
              if (w->hb_resp.has_directive() &&
                  w->hb_resp.directive().has_restart_at_generation()) {
                ++hb_.restart_directives;
              }
            } else {
              ++hb_.errors;
              if (w->hb_status.error_code() == grpc::StatusCode::ABORTED) ++hb_.aborted;
              if (hb_.first_error.empty()) hb_.first_error = w->hb_status.error_message();
            }
          }
        }
        return NextHeartbeat(w, now);
      }
      case Tag::kAlarm:
        if (ok) SendHeartbeat(w);
        return;
    }
  }

  void Poll(grpc::CompletionQueue* cq) {
    void* tag;
    bool ok;
    while (cq->Next(&tag, &ok)) Handle(static_cast<Tag*>(tag), ok);
  }

  static constexpr int kWorkersPerQueue = 4096;

  const std::string address_;
  const std::string job_id_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  absl::Time start_;
  std::atomic<int64_t> interval_ns_{0};
  std::atomic<bool> measuring_{false};
  int progress_groups_ = 0;
  bool compact_groups_ = false;

  absl::Mutex mu_;
  int assigned_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_ ABSL_GUARDED_BY(mu_) = 0;
  int sessions_ended_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_error_ ABSL_GUARDED_BY(mu_);
  HeartbeatStats hb_ ABSL_GUARDED_BY(mu_);
  absl::Time hb_start_ ABSL_GUARDED_BY(mu_), hb_end_ ABSL_GUARDED_BY(mu_);
  std::string setup_hb_error_ ABSL_GUARDED_BY(mu_);
};

// The job's members as ListMembers shows them: how many are not ACTIVE
// (LOST, FENCED, LEFT...), how many of those are LOST (declared dead), and the
// generation.
struct MemberCounts {
  int not_active = -1;
  int lost = -1;
  uint64_t generation = 0;
};
MemberCounts NotActive(const std::string& address, const std::string& job_id,
                       std::string* example) {
  auto jobs = v1::JobService::NewStub(NewChannel(address, -2));
  v1::ListMembersRequest req;
  req.set_job_id(job_id);
  v1::ListMembersResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  grpc::Status s = jobs->ListMembers(&ctx, req, &resp);
  if (!s.ok()) {
    *example = s.error_message();
    return {};
  }
  MemberCounts c;
  c.not_active = 0;
  c.lost = 0;
  c.generation = resp.generation();
  for (const v1::Member& m : resp.members()) {
    if (m.state() == v1::MEMBER_STATE_LOST) {
      if (c.lost++ == 0) *example = absl::StrCat(m.worker_id(), " ", m.detail());
    }
    if (m.state() != v1::MEMBER_STATE_ACTIVE) ++c.not_active;
  }
  return c;
}

// Forms a job of `n` workers; exits the process on failure.
std::unique_ptr<Fleet> FormFleet(const std::string& address, const std::string& job_id, int n,
                                 absl::Duration hb_interval, absl::Duration hb_timeout,
                                 double* seconds) {
  if (!CreateJob(address, job_id, FleetSpec(n, hb_interval, hb_timeout))) std::exit(1);
  auto fleet = std::make_unique<Fleet>(address, job_id, n, 2, hb_interval);
  *seconds = fleet->Rendezvous(absl::Seconds(900));
  if (fleet->assigned() != n) {
    std::printf("{\"error\": \"%d of %d workers hold an assignment; first error: %s\"}\n",
                fleet->assigned(), n, Esc(fleet->first_error()).c_str());
    std::fflush(stdout);
    std::_Exit(1);
  }
  return fleet;
}

// --- mode kv ----------------------------------------------------------------

// Each client: set key c<i>/k<j> (value_bytes bytes), then get it, j cycling
// over 64 keys; both calls count as operations.
int RunKv(const Flags& f) {
  const std::string target = f.Str("target", "shardline");
  const std::string address = f.Str("address", "127.0.0.1:7070");
  const int clients = static_cast<int>(f.Int("clients", 1, 1, 65536));
  const absl::Duration duration = absl::Seconds(f.Double("seconds", 3));
  const std::string value(static_cast<size_t>(f.Int("value-bytes", 64)), 'v');

  std::unique_ptr<Fleet> fleet;
  if (target == "shardline") {
    double unused;
    fleet = FormFleet(address, f.Str("job", absl::StrCat("kv-", clients)), clients,
                      kDefaultInterval, kDefaultTimeout, &unused);
  }
  std::vector<Latencies> lat(clients);
  std::vector<int64_t> errors(clients, 0);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::string first_error;
  absl::Mutex error_mu;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<v1::RendezvousService::Stub> rdv;
      std::unique_ptr<etcd::KV::Stub> kv;
      v1::Fence fence;
      if (fleet != nullptr) {
        rdv = v1::RendezvousService::NewStub(fleet->worker(c)->channel);
        fence = fleet->worker(c)->Fence();
      } else {
        kv = etcd::KV::NewStub(NewChannel(address, c));
      }
      auto error = [&](const grpc::Status& s) {
        ++errors[c];
        absl::MutexLock lock(&error_mu);
        if (first_error.empty()) first_error = s.error_message();
      };
      ++ready;
      while (!go.load()) absl::SleepFor(absl::Microseconds(100));
      for (int64_t j = 0; !stop.load(); ++j) {
        const std::string key = absl::StrCat("c", c, "/k", j % 64);
        {
          grpc::ClientContext ctx;
          SetDeadline(&ctx, absl::Seconds(30));
          const absl::Time t0 = absl::Now();
          grpc::Status s;
          if (rdv != nullptr) {
            v1::KvSetRequest req;
            *req.mutable_fence() = fence;
            req.set_scope("bench");
            req.set_key(key);
            req.set_value(value);
            v1::KvSetResponse resp;
            s = rdv->KvSet(&ctx, req, &resp);
          } else {
            etcd::PutRequest req;
            req.set_key(key);
            req.set_value(value);
            etcd::PutResponse resp;
            s = kv->Put(&ctx, req, &resp);
          }
          if (s.ok()) lat[c].Add(absl::Now() - t0); else error(s);
        }
        {
          grpc::ClientContext ctx;
          SetDeadline(&ctx, absl::Seconds(30));
          const absl::Time t0 = absl::Now();
          grpc::Status s;
          bool found = false;
          if (rdv != nullptr) {
            v1::KvGetRequest req;
            *req.mutable_fence() = fence;
            req.set_scope("bench");
            req.set_key(key);
            v1::KvGetResponse resp;
            s = rdv->KvGet(&ctx, req, &resp);
            found = resp.found() && resp.value().size() == value.size();
          } else {
            etcd::RangeRequest req;
            req.set_key(key);
            etcd::RangeResponse resp;
            s = kv->Range(&ctx, req, &resp);
            found = resp.kvs_size() == 1 && resp.kvs(0).value().size() == value.size();
          }
          if (s.ok() && !found) s = grpc::Status(grpc::StatusCode::NOT_FOUND, "key not found");
          if (s.ok()) lat[c].Add(absl::Now() - t0); else error(s);
        }
      }
    });
  }
  while (ready.load() < clients) absl::SleepFor(absl::Milliseconds(1));
  const absl::Time t0 = absl::Now();
  go.store(true);
  absl::SleepFor(duration);
  stop.store(true);
  for (auto& t : threads) t.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  Latencies all;
  int64_t errs = 0;
  for (int c = 0; c < clients; ++c) {
    all.Merge(lat[c]);
    errs += errors[c];
  }
  std::printf(
      "{\"target\": \"%s\", \"clients\": %d, \"ops\": %zu, \"seconds\": %.3f, \"ops_per_s\": %.1f, "
      "\"p50_us\": %.1f, \"p99_us\": %.1f, \"errors\": %" PRId64 ", \"first_error\": \"%s\"}\n",
      target.c_str(), clients, all.us.size(), secs, all.us.size() / secs, all.Percentile(50),
      all.Percentile(99), errs, Esc(first_error).c_str());
  std::fflush(stdout);
  std::_Exit(0);  // skip tearing down thousands of streams
}

// --- mode barrier -----------------------------------------------------------

// `clients` workers pass `rounds` barriers (participants = clients) one
// after the other; reports rounds per second and each client's wait per
// round.
int RunBarrier(const Flags& f) {
  const std::string address = f.Str("address", "127.0.0.1:7070");
  const int clients = static_cast<int>(f.Int("clients", 2, 1, 65536));
  const int rounds = static_cast<int>(f.Int("rounds", 50));
  double unused;
  std::unique_ptr<Fleet> fleet =
      FormFleet(address, f.Str("job", absl::StrCat("barrier-", clients)), clients,
                kDefaultInterval, kDefaultTimeout, &unused);
  std::vector<Latencies> lat(clients);
  std::atomic<int64_t> errors{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto rdv = v1::RendezvousService::NewStub(fleet->worker(c)->channel);
      const v1::Fence fence = fleet->worker(c)->Fence();
      ++ready;
      while (!go.load()) absl::SleepFor(absl::Microseconds(100));
      for (int r = 0; r < rounds; ++r) {
        v1::BarrierRequest req;
        *req.mutable_fence() = fence;
        req.set_scope("bench");
        req.set_name(absl::StrCat("round", r));
        req.set_participants(clients);
        req.mutable_timeout()->set_seconds(120);
        v1::BarrierResponse resp;
        grpc::ClientContext ctx;
        SetDeadline(&ctx, absl::Seconds(130));
        const absl::Time t0 = absl::Now();
        grpc::Status s = rdv->Barrier(&ctx, req, &resp);
        if (s.ok()) lat[c].Add(absl::Now() - t0); else ++errors;
      }
    });
  }
  while (ready.load() < clients) absl::SleepFor(absl::Milliseconds(1));
  const absl::Time t0 = absl::Now();
  go.store(true);
  for (auto& t : threads) t.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  Latencies all;
  for (auto& l : lat) all.Merge(l);
  std::printf(
      "{\"target\": \"shardline\", \"clients\": %d, \"rounds\": %d, \"seconds\": %.3f, "
      "\"rounds_per_s\": %.2f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"errors\": %" PRId64 "}\n",
      clients, rounds, secs, rounds / secs, all.Percentile(50), all.Percentile(99),
      errors.load());
  std::fflush(stdout);
  std::_Exit(0);
}

// --- modes rendezvous and heartbeats -----------------------------------------

// One process's share of a rendezvous (mode rendezvous-part, started by
// RunRendezvous with --processes > 1): workers first .. first+workers-1 of
// an existing job start joining at --start-unix-ms; prints its counts and
// the absolute times of its first JoinJob and last assignment.
int RunRendezvousPart(const Flags& f) {
  const std::string address = f.Str("address", "127.0.0.1:7070");
  const int n = static_cast<int>(f.Int("workers", 64, 1, 131072));
  const int first = static_cast<int>(f.Int("first", 0));
  Fleet fleet(address, f.Str("job", "rdv"), n, 2,
              absl::Milliseconds(f.Int("interval-ms", 5000, 100, 600000)), first,
              static_cast<int>(f.Int("connections", 0)));
  fleet.set_compact_groups(f.Int("compact-groups", 1) != 0);
  const absl::Time go =
      absl::FromUnixMillis(f.Int("start-unix-ms", 0, 0, int64_t{1} << 50));
  if (go > absl::Now()) absl::SleepFor(go - absl::Now());
  fleet.Rendezvous(absl::Seconds(f.Double("timeout-s", 600)));
  Latencies join = fleet.JoinLatencies();
  std::printf(
      "{\"workers\": %d, \"assigned\": %d, \"failed\": %d, \"start_unix_us\": %lld, "
      "\"last_unix_us\": %lld, \"join_p50_us\": %.1f, \"join_p99_us\": %.1f, "
      "\"first_error\": \"%s\"}\n",
      n, fleet.assigned(), fleet.failed(),
      static_cast<long long>(absl::ToUnixMicros(fleet.start())),
      static_cast<long long>(absl::ToUnixMicros(fleet.last_assigned())), join.Percentile(50),
      join.Percentile(99), Esc(fleet.first_error()).c_str());
  std::fflush(stdout);
  // Stay connected until every part has reported (the parent closes our
  // stdin): a part that exits early breaks its workers' Session streams,
  // which ends the generation for the parts still waiting.
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  std::_Exit(0);
}

// A number field of the one-line JSON object a part printed (0 if absent).
double JsonNumber(const std::string& json, const std::string& key) {
  const std::string k = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(k);
  if (at == std::string::npos) return 0;
  return std::strtod(json.c_str() + at + k.size(), nullptr);
}
std::string JsonString(const std::string& json, const std::string& key) {
  const std::string k = absl::StrCat("\"", key, "\": \"");
  const size_t at = json.find(k);
  if (at == std::string::npos) return "";
  const size_t end = json.find('"', at + k.size());
  return json.substr(at + k.size(), end == std::string::npos ? std::string::npos
                                                              : end - at - k.size());
}

int RunRendezvous(const Flags& f) {
  const std::string address = f.Str("address", "127.0.0.1:7070");
  // Up to the coordinator's 131072 members per job (server/coordinator_records.h).
  const int n = static_cast<int>(f.Int("workers", 64, 1, 131072));
  const std::string job = f.Str("job", absl::StrCat("rdv-", n));
  // At most one process per worker, and 256 (each a process of its own).
  const int processes = static_cast<int>(f.Int("processes", 1, 1, std::min(n, 256)));
  // Per process; 0: one per worker.
  const int connections = static_cast<int>(f.Int("connections", 0, 0, 65536));
  const bool compact = f.Int("compact-groups", 1) != 0;
  // The heartbeat interval a fleet of N would be given: at least 5 s, and
  // N / 5000 s above 25000 workers, so that the fleet offers at most 5000
  // heartbeats/s while it forms (about a third of what one coordinator
  // answers on these 2 shared cores, docs/benchmarks.md heartbeats); the
  // timeout is 6 intervals (30 s at 5 s).
  const int64_t interval_ms =
      f.Int("interval-ms", std::max<int64_t>(5000, n / 5), 100, 600000);
  const absl::Duration interval = absl::Milliseconds(interval_ms);
  if (!CreateJob(address, job, FleetSpec(n, interval, 6 * interval))) return 1;
  if (processes == 1) {
    Fleet fleet(address, job, n, 2, interval, 0, connections);
    fleet.set_compact_groups(compact);
    const double secs = fleet.Rendezvous(absl::Seconds(f.Double("timeout-s", 600)));
    Latencies join = fleet.JoinLatencies();
    std::printf(
        "{\"workers\": %d, \"processes\": 1, \"connections\": %d, \"interval_ms\": %lld, "
        "\"assigned\": %d, \"failed\": %d, \"seconds\": %.4f, \"join_p50_us\": %.1f, "
        "\"join_p99_us\": %.1f, \"first_error\": \"%s\"}\n",
        n, connections > 0 ? std::min(connections, n) : n, static_cast<long long>(interval_ms),
        fleet.assigned(), fleet.failed(), secs, join.Percentile(50), join.Percentile(99), Esc(fleet.first_error()).c_str());
    std::fflush(stdout);
    std::_Exit(0);
  }
  // Several processes (posix_spawn of this binary; gRPC does not survive a
  // fork), each with its share of the workers, all starting at one moment
  // after their channels are made.
  const absl::Time go = absl::Now() + absl::Seconds(1) + absl::Microseconds(50) * n;
  struct Part {
    pid_t pid = -1;
    FILE* out = nullptr;
    int in = -1;  // its stdin: closed once every part has reported
  };
  std::vector<Part> parts;
  int total_connections = 0;
  for (int p = 0; p < processes; ++p) {
    const int first = static_cast<int>(int64_t{n} * p / processes);
    const int count = static_cast<int>(int64_t{n} * (p + 1) / processes) - first;
    total_connections += connections > 0 ? std::min(connections, count) : count;
    std::vector<std::string> args = {
        "cp_load", "rendezvous-part", "--address", address, "--job", job,
        "--workers", std::to_string(count), "--first", std::to_string(first),
        "--connections", std::to_string(connections),
        "--compact-groups", compact ? "1" : "0",
        "--interval-ms", std::to_string(interval_ms),
        "--start-unix-ms", std::to_string(absl::ToUnixMillis(go)),
        "--timeout-s", f.Str("timeout-s", "600")};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2], in[2];
    // Close-on-exec: a later part must not inherit an earlier one's ends.
    if (pipe2(fds, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) return 1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    Part part;
    if (posix_spawn(&part.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ) != 0) {
      Log("cp_load: cannot start a rendezvous-part process");
      return 1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    close(in[0]);
    part.in = in[1];
    part.out = fdopen(fds[0], "r");
    parts.push_back(part);
  }
  int assigned = 0, failed = 0;
  double p50 = 0, p99 = 0;
  int64_t first_us = INT64_MAX, last_us = 0;
  std::string first_error;
  std::vector<std::string> lines;
  for (Part& part : parts) {
    std::string line;
    char buf[4096];
    if (std::fgets(buf, sizeof(buf), part.out) != nullptr) line = buf;
    lines.push_back(line);
  }
  for (Part& part : parts) {
    close(part.in);
    std::fclose(part.out);
    int status = 0;
    waitpid(part.pid, &status, 0);
  }
  for (const std::string& line : lines) {
    assigned += static_cast<int>(JsonNumber(line, "assigned"));
    failed += static_cast<int>(JsonNumber(line, "failed"));
    p50 = std::max(p50, JsonNumber(line, "join_p50_us"));
    p99 = std::max(p99, JsonNumber(line, "join_p99_us"));
    const int64_t s0 = static_cast<int64_t>(JsonNumber(line, "start_unix_us"));
    const int64_t s1 = static_cast<int64_t>(JsonNumber(line, "last_unix_us"));
    if (s0 > 0) first_us = std::min(first_us, s0);
    last_us = std::max(last_us, s1);
    if (first_error.empty()) first_error = JsonString(line, "first_error");
    if (line.empty() && first_error.empty()) first_error = "a rendezvous-part process printed nothing";
  }
  const double secs = first_us == INT64_MAX ? 0 : (last_us - first_us) / 1e6;
  // join percentiles: the largest of the parts' (an upper bound).
  std::printf(
      "{\"workers\": %d, \"processes\": %d, \"connections\": %d, \"interval_ms\": %lld, "
      "\"assigned\": %d, \"failed\": %d, \"seconds\": %.4f, \"join_p50_us\": %.1f, "
      "\"join_p99_us\": %.1f, \"first_error\": \"%s\"}\n",
      n, processes, total_connections, static_cast<long long>(interval_ms), assigned, failed, secs, p50, p99,
      Esc(first_error).c_str());
  std::fflush(stdout);
  return 0;
}

// Forms a job of N workers heartbeating every interval-ms (heartbeat_timeout
// timeout-ms), then measures two phases one after the other: `seconds` paced
// at the interval, then `closed-seconds` in a closed loop (each worker sends
// its next heartbeat as soon as the last is answered: the capacity; skipped
// when 0). Evictions are counted after each phase.
int RunHeartbeats(const Flags& f) {
  const std::string address = f.Str("address", "127.0.0.1:7070");
  const int n = static_cast<int>(f.Int("workers", 1024, 1, 131072));
  const absl::Duration interval = absl::Milliseconds(f.Int("interval-ms", 1000));
  const absl::Duration timeout = absl::Milliseconds(f.Int("timeout-ms", 10000));
  const absl::Duration paced = absl::Seconds(f.Double("seconds", 5));
  const absl::Duration closed = absl::Seconds(f.Double("closed-seconds", 0));
  const std::string job = f.Str("job", absl::StrCat("hb-", n));
  if (!CreateJob(address, job, FleetSpec(n, interval, timeout))) return 1;
  auto fleet = std::make_unique<Fleet>(address, job, n, 2, interval);
  fleet->set_progress_groups(static_cast<int>(f.Int("progress-groups", 0)));
  const double formed = fleet->Rendezvous(absl::Seconds(f.Double("form-timeout-s", 600)));
  if (fleet->assigned() != n) {
    // Not formed: report how many members the coordinator dropped meanwhile
    // (false evictions too: every simulated worker was alive).
    std::string example;
    const MemberCounts c = NotActive(address, job, &example);
    std::printf(
        "{\"workers\": %d, \"formation_failed\": true, \"assigned\": %d, \"not_active\": %d, "
        "\"lost\": %d, \"sessions_ended\": %d, \"generation\": %llu, \"seconds\": %.3f, "
        "\"first_error\": \"%s\", \"example\": \"%s\"}\n",
        n, fleet->assigned(), c.not_active, c.lost, fleet->sessions_ended(),
        static_cast<unsigned long long>(c.generation), formed, Esc(fleet->first_error()).c_str(),
        Esc(example).c_str());
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::string out = absl::StrFormat(
      "{\"workers\": %d, \"interval_ms\": %d, \"progress_groups\": %d, \"formed_s\": %.3f", n,
      absl::ToInt64Milliseconds(interval), static_cast<int>(f.Int("progress-groups", 0)), formed);
  auto phase = [&](const std::string& name, absl::Duration pace, absl::Duration duration) {
    fleet->MeasureHeartbeats(pace, duration);
    Fleet::HeartbeatStats s = fleet->heartbeat_stats();
    std::string example;
    const MemberCounts c = NotActive(address, job, &example);
    absl::StrAppend(
        &out, absl::StrFormat(
                  ", \"%s\": {\"seconds\": %.3f, \"heartbeats\": %d, \"per_s\": %.1f, "
                  "\"p50_us\": %.1f, \"p99_us\": %.1f, \"errors\": %d, \"aborted\": %d, "
                  "\"restart_directives\": %d, \"sessions_ended\": %d, \"not_active\": %d, "
                  "\"lost\": %d, \"generation\": %d, \"first_error\": \"%s\", \"example\": \"%s\"}",
                  name, s.seconds, s.ok, s.ok / s.seconds, s.latency.Percentile(50),
                  s.latency.Percentile(99), s.errors, s.aborted, s.restart_directives,
                  fleet->sessions_ended(), c.not_active, c.lost, c.generation, Esc(s.first_error), Esc(example)));
  };
  phase("paced", interval, paced);
  if (closed > absl::ZeroDuration()) phase("closed", absl::ZeroDuration(), closed);
  std::printf("%s}\n", out.c_str());
  std::fflush(stdout);
  std::_Exit(0);
}

int Main(int argc, char** argv) {
  // Deadlock detection (on in Debian's Abseil) took a fifth of this
  // process's CPU at 4096 workers, in GraphCycles on every lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  RaiseFdLimit();
  constexpr char kUsage[] =
      "usage: cp_load kv|barrier|rendezvous|heartbeats|leases|jobs --flag value ...\n"
      "  (each mode's flags: the comments of bench/control_plane/cp_load_main.cc)\n";
  const std::string mode = argc < 2 ? "" : argv[1];
  if (mode.empty() || mode == "--help" || mode == "-h" || mode == "help") {
    std::fputs(kUsage, mode.empty() ? stderr : stdout);
    return mode.empty() ? 2 : 0;
  }
  Flags flags(argc, argv);
  if (mode == "kv") return RunKv(flags);
  if (mode == "barrier") return RunBarrier(flags);
  if (mode == "rendezvous") return RunRendezvous(flags);
  if (mode == "rendezvous-part") return RunRendezvousPart(flags);
  if (mode == "heartbeats") return RunHeartbeats(flags);
  if (mode == "leases") return RunLeases(flags);
  if (mode == "jobs") return RunJobs(flags);
  std::fprintf(stderr, "cp_load: unknown mode '%s'\n%s", mode.c_str(), kUsage);
  return 2;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) { return shardline::bench::Main(argc, argv); }

// cp_load's mode "jobs": the rate of durable state writes through the job
// API. `--clients C` threads (each its own gRPC channel, a closed loop: the
// next call when the last is answered) create `--jobs N` jobs between them
// (CreateJob, one state write each), then cancel them (CancelJob, one write
// each). Prints
//   {"create": {"per_s", "p50_us", "p99_us", "ok", "errors", "seconds"},
//    "cancel": {...}, "first_error": "..."}
// N must stay under the coordinator's max_jobs (1024 unfinished jobs).
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/control_plane/cp_load.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::bench {

namespace v1 = ::shardline::v1;

int RunJobs(const Flags& f) {
  const std::string address = f.Str("address", "127.0.0.1:7070");
  const int clients = static_cast<int>(f.Int("clients", 4, 1, 65536));
  const int jobs = static_cast<int>(f.Int("jobs", 500));
  const std::string prefix = f.Str("prefix", "cj");
  if (clients < 1 || jobs < 1) {
    Log("--clients and --jobs must be >= 1");
    return 2;
  }
  const v1::JobSpec spec = FleetSpec(1, absl::Seconds(5), absl::Seconds(30));
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (int i = 0; i < clients; ++i) stubs.push_back(v1::JobService::NewStub(NewChannel(address, i)));

  struct Phase {
    Latencies lat;
    int ok = 0, errors = 0;
    double seconds = 0;
  };
  absl::Mutex mu;
  std::string first_error;
  auto run = [&](bool cancel) {
    Phase phase;
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        Latencies lat;
        int ok = 0, errors = 0;
        for (int i = next++; i < jobs; i = next++) {
          const std::string id = absl::StrCat(prefix, "-", i);
          grpc::ClientContext ctx;
          SetDeadline(&ctx, absl::Seconds(30));
          const absl::Time t0 = absl::Now();
          grpc::Status s;
          if (cancel) {
            v1::CancelJobRequest req;
            req.set_job_id(id);
            v1::Job resp;
            s = stubs[c]->CancelJob(&ctx, req, &resp);
          } else {
            v1::CreateJobRequest req;
            req.set_job_id(id);
            *req.mutable_spec() = spec;
            v1::CreateJobResponse resp;
            s = stubs[c]->CreateJob(&ctx, req, &resp);
          }
          if (s.ok()) {
            lat.Add(absl::Now() - t0);
            ++ok;
          } else {
            ++errors;
            absl::MutexLock l(&mu);
            if (first_error.empty()) {
              first_error = absl::StrCat(cancel ? "CancelJob " : "CreateJob ", id, ": ",
                                         s.error_message());
            }
          }
        }
        absl::MutexLock l(&mu);
        phase.lat.Merge(lat);
        phase.ok += ok;
        phase.errors += errors;
      });
    }
    for (std::thread& t : threads) t.join();
    phase.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return phase;
  };
  Phase create = run(false);
  Phase cancel = run(true);
  auto json = [](Phase& p) {
    return absl::StrFormat(
        "{\"per_s\": %.1f, \"p50_us\": %.0f, \"p99_us\": %.0f, \"ok\": %d, \"errors\": %d, "
        "\"seconds\": %.3f}",
        p.seconds > 0 ? p.ok / p.seconds : 0, p.lat.Percentile(50), p.lat.Percentile(99), p.ok,
        p.errors, p.seconds);
  };
  std::printf("{\"create\": %s, \"cancel\": %s, \"first_error\": \"%s\"}\n", json(create).c_str(),
              json(cancel).c_str(), Esc(first_error).c_str());
  return create.ok > 0 ? 0 : 1;
}

}  // namespace shardline::bench

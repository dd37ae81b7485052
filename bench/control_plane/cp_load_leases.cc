// cp_load's mode "leases": the etcd way to say "alive" at fleet size, the
// peer of the heartbeats mode (cp_load_main.cc).
#include <atomic>
#include <cinttypes>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/control_plane/cp_load.h"
#include "etcd/v3/rpc.grpc.pb.h"

namespace shardline::bench {

namespace etcd = ::etcdserverpb;

// The etcd way to say "alive": one lease per worker (TTL ttl-s), kept alive
// over a LeaseKeepAlive stream every interval. A keep-alive answered with
// TTL <= 0 means the lease had expired: a false eviction.
int RunLeases(const Flags& f) {
  const std::string address = f.Str("address", "127.0.0.1:2379");
  const int n = static_cast<int>(f.Int("workers", 1024, 1, 131072));
  const absl::Duration interval = absl::Milliseconds(f.Int("interval-ms", 1000));
  const int64_t ttl = f.Int("ttl-s", 10);
  const absl::Duration duration = absl::Seconds(f.Double("seconds", 5));

  struct Lease;
  struct LTag {
    Lease* l;
    int kind;  // 0 start, 1 write, 2 read, 3 alarm
  };
  struct Lease {
    int index;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcd::Lease::Stub> stub;
    int64_t id = 0;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<etcd::LeaseKeepAliveRequest,
                                                  etcd::LeaseKeepAliveResponse>>
        stream;
    etcd::LeaseKeepAliveResponse resp;
    LTag start{this, 0}, write{this, 1}, read{this, 2}, alarm_tag{this, 3};
    grpc::Alarm alarm;
    absl::Time sent, next;
    bool dead = false;
  };
  std::vector<std::unique_ptr<Lease>> leases;
  // Grant the leases (a few threads; not timed).
  for (int i = 0; i < n; ++i) {
    auto l = std::make_unique<Lease>();
    l->index = i;
    l->channel = NewChannel(address, i);
    l->stub = etcd::Lease::NewStub(l->channel);
    leases.push_back(std::move(l));
  }
  {
    std::vector<std::thread> granters;
    std::atomic<int> next{0};
    std::atomic<int> failed{0};
    absl::Mutex error_mu;
    std::string first_error;
    for (int t = 0; t < 16; ++t) {
      granters.emplace_back([&] {
        for (int i; (i = next++) < n;) {
          // Setup, not measured: a grant refused while etcd is busy with
          // thousands of new connections is retried (3 tries).
          grpc::Status s;
          for (int attempt = 0; attempt < 3 && leases[i]->id == 0; ++attempt) {
            etcd::LeaseGrantRequest req;
            req.set_ttl(ttl);
            etcd::LeaseGrantResponse resp;
            grpc::ClientContext ctx;
            SetDeadline(&ctx, absl::Seconds(60));
            s = leases[i]->stub->LeaseGrant(&ctx, req, &resp);
            if (s.ok() && resp.id() != 0) leases[i]->id = resp.id();
          }
          if (leases[i]->id == 0) {
            ++failed;
            absl::MutexLock lock(&error_mu);
            if (first_error.empty()) {
              first_error = absl::StrCat("code ", s.error_code(), " ", s.error_message());
            }
          }
        }
      });
    }
    for (auto& t : granters) t.join();
    if (failed.load() > 0) {
      std::printf("{\"error\": \"%d LeaseGrant calls failed (3 tries each); first: %s\"}\n",
                  failed.load(), Esc(first_error).c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
  grpc::CompletionQueue cq;
  std::atomic<bool> running{true};
  absl::Mutex mu;
  int64_t ok_count = 0, expired = 0, errors = 0;
  Latencies lat;
  auto send = [&](Lease* l) {
    etcd::LeaseKeepAliveRequest req;
    req.set_id(l->id);
    l->sent = absl::Now();
    l->stream->Write(req, &l->write);
  };
  auto handle = [&](LTag* tag, bool ok) {
    Lease* l = tag->l;
    switch (tag->kind) {
      case 0:
        if (!ok) {
          absl::MutexLock lock(&mu);
          ++errors;
          return;
        }
        if (l->next <= absl::Now()) {
          send(l);
        } else {
          l->alarm.Set(&cq, absl::ToChronoTime(l->next), &l->alarm_tag);
        }
        return;
      case 1:
        if (!ok) {
          absl::MutexLock lock(&mu);
          ++errors;
          return;
        }
        l->stream->Read(&l->resp, &l->read);
        return;
      case 2: {
        const absl::Time now = absl::Now();
        if (!ok) {
          absl::MutexLock lock(&mu);
          ++errors;
          return;
        }
        if (running.load()) {
          absl::MutexLock lock(&mu);
          if (l->resp.ttl() > 0) {
            ++ok_count;
            lat.Add(now - l->sent);
          } else if (!l->dead) {
            l->dead = true;
            ++expired;
          }
        }
        if (!running.load()) return;
        if (interval <= absl::ZeroDuration()) return send(l);
        l->next += interval;
        if (l->next <= now) {
          l->next = now;
          return send(l);
        }
        l->alarm.Set(&cq, absl::ToChronoTime(l->next), &l->alarm_tag);
        return;
      }
      case 3:
        if (running.load()) send(l);
        return;
    }
  };
  std::vector<std::thread> pollers;
  for (int t = 0; t < 2; ++t) {
    pollers.emplace_back([&] {
      void* tag;
      bool ok;
      while (cq.Next(&tag, &ok)) handle(static_cast<LTag*>(tag), ok);
    });
  }
  const absl::Time start = absl::Now();
  for (auto& l : leases) {
    l->next = start + interval * (static_cast<double>(l->index) / n);
    l->stream = l->stub->PrepareAsyncLeaseKeepAlive(&l->ctx, &cq);
    l->stream->StartCall(&l->start);
  }
  absl::SleepFor(duration);
  running.store(false);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  absl::SleepFor(std::max(interval, absl::Milliseconds(200)));
  absl::MutexLock lock(&mu);
  std::printf(
      "{\"workers\": %d, \"interval_ms\": %lld, \"seconds\": %.3f, \"heartbeats\": %" PRId64
      ", \"per_s\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"expired\": %" PRId64
      ", \"errors\": %" PRId64 "}\n",
      n, static_cast<long long>(absl::ToInt64Milliseconds(interval)), secs, ok_count,
      ok_count / secs, lat.Percentile(50), lat.Percentile(99), expired, errors);
  std::fflush(stdout);
  std::_Exit(0);
}

}  // namespace shardline::bench

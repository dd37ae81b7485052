// What the modes of cp_load (cp_load_main.cc, cp_load_leases.cc) share: the
// flag reader, JSON escaping, latency percentiles, one gRPC channel per
// simulated process. Not a library: only cp_load includes it.
#ifndef SHARDLINE_BENCH_CONTROL_PLANE_CP_LOAD_H_
#define SHARDLINE_BENCH_CONTROL_PLANE_CP_LOAD_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "shardline/v1/job.pb.h"

namespace shardline::bench {

class Flags {
 public:
  // cp_load MODE --name value ...: every flag takes a value; a flag without
  // one, or an argument that is not a --flag, exits 2 naming it.
  Flags(int argc, char** argv) {
    for (int i = 2; i < argc; i += 2) {
      std::string k = argv[i];
      if (k.rfind("--", 0) != 0 || k.size() == 2) {
        std::fprintf(stderr, "cp_load: '%s' is not a --flag (flags are --name value)\n",
                     k.c_str());
        std::exit(2);
      }
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cp_load: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      values_[k.substr(2)] = argv[i + 1];
    }
  }
  std::string Str(const std::string& k, const std::string& def) const {
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  // An integer in [lo, hi] (default: 0 .. 2^31-1, as most are counts read
  // into an int); anything else exits 2 naming the flag and the range.
  int64_t Int(const std::string& k, int64_t def, int64_t lo = 0,
              int64_t hi = 2147483647) const {
    auto it = values_.find(k);
    int64_t v = def;
    if (it != values_.end() && (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi)) {
      std::fprintf(stderr, "cp_load: --%s=%s: want a whole number in %lld..%lld\n", k.c_str(),
                   it->second.c_str(), static_cast<long long>(lo), static_cast<long long>(hi));
      std::exit(2);
    }
    return v;
  }
  double Double(const std::string& k, double def) const {
    auto it = values_.find(k);
    double v = def;
    if (it != values_.end() && (!absl::SimpleAtod(it->second, &v) || !(v >= 0) || v > 1e9)) {
      std::fprintf(stderr, "cp_load: --%s=%s: want a number in 0..1e9\n", k.c_str(),
                   it->second.c_str());
      std::exit(2);
    }
    return v;
  }

 private:
  std::map<std::string, std::string> values_;
};

inline void Log(const std::string& s) { std::fprintf(stderr, "cp_load: %s\n", s.c_str()); }

// `s` as the inside of a JSON string.
inline std::string Esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// Latencies in microseconds; Percentile sorts on first use.
struct Latencies {
  std::vector<double> us;
  void Add(absl::Duration d) { us.push_back(absl::ToDoubleMicroseconds(d)); }
  void Merge(const Latencies& o) { us.insert(us.end(), o.us.begin(), o.us.end()); }
  double Percentile(double p) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    size_t i = static_cast<size_t>(p / 100.0 * (us.size() - 1) + 0.5);
    return us[std::min(i, us.size() - 1)];
  }
};

// Each channel gets a distinct argument so that gRPC does not share one
// subchannel (TCP connection) between them.
inline std::shared_ptr<grpc::Channel> NewChannel(const std::string& address, int id) {
  grpc::ChannelArguments args;
  args.SetInt("cp_load.channel_id", id);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

inline void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

inline google::protobuf::Duration ProtoDuration(absl::Duration d) {
  google::protobuf::Duration p;
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  p.set_seconds(ns / 1000000000);
  p.set_nanos(static_cast<int32_t>(ns % 1000000000));
  return p;
}

// The job of the fleet modes (cp_load_main.cc): a tiny GPT whose dp is
// `workers` exactly (every worker gets a rank), never trained.
::shardline::v1::JobSpec FleetSpec(int workers, absl::Duration heartbeat_interval,
                                   absl::Duration heartbeat_timeout);

// Mode "leases": etcd's own liveness (cp_load_leases.cc).
int RunLeases(const Flags& f);

// Mode "jobs": the rate of state writes through the job API (cp_load_jobs.cc).
int RunJobs(const Flags& f);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_CONTROL_PLANE_CP_LOAD_H_

// The Gloo backend's transport choice (State::SetUpTransport) and its
// collectives over several hosts whose ranks share memory (State::Hier*).
// backend.h ("Shared memory") describes them as callers see them;
// shm_group.h the collectives inside one host.
//
// Bootstrap, through the group's store (keys under "shardline/shm/"):
//   1. host/<r>: every rank's host identity and whether it allows shared
//      memory; ranks with equal identities share a host.
//   2. segment/<leader>: on each host with >= 2 such ranks its lowest rank
//      (the leader) creates the segment and publishes its name and nonce
//      (or why it could not); the others map it.
//   3. mapped/<r>: every rank says whether it mapped its host's segment. A
//      host shares memory when all its ranks did; the others' ranks count
//      as one host each (TCP). Then the name is unlinked: every local rank
//      has it mapped.
//   4. With several hosts, their leaders connect a Gloo context of their
//      own (prefix "shardline/shm/leaders/").
#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "worker/comm/gloo_internal.h"
#include "worker/comm/gloo_state.h"
#include "worker/comm/reduce_kernels.h"
#include "worker/comm/shm_group.h"
#include "worker/comm/shm_segment.h"

namespace shardline::worker::gloo_internal {

namespace {

constexpr char kKeys[] = "shardline/shm/";

uint64_t RandomNonce() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) {
    // No entropy source: time and address still differ between segments.
    v = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^
        reinterpret_cast<uintptr_t>(&v) ^ (static_cast<uint64_t>(::getpid()) << 32);
  }
  return v;
}

int UsableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Unlinks a segment name when it goes out of scope (every path out of the
// bootstrap, successful or not, once the segment exists).
struct Unlinker {
  std::string name;
  ~Unlinker() {
    if (!name.empty()) (void)shm::Segment::Unlink(name);
  }
};

// GlooOptions::shm_buffer_bytes 0: 1 MiB over the local ranks, in [64 KiB,
// 1 MiB], whole pages. Measured on 2 cores (bench/collectives.py): with
// more ranks than cores, larger chunks leave the caches between the ranks
// sharing a core (64 MiB all_reduce of 4 ranks: ~40 ms CPU with 256 KiB
// buffers, ~60 ms with 1 MiB); two ranks are the same from 256 KiB to 1 MiB.
size_t AutomaticBufferBytes(int local_ranks) {
  const size_t per = (size_t{1} << 20) / static_cast<size_t>(std::max(local_ranks, 1));
  return std::clamp<size_t>(per / 4096 * 4096, size_t{64} << 10, size_t{1} << 20);
}

// The Gloo timeout for what is left of `ctx`.
std::chrono::milliseconds Left(const shm::OpContext& ctx) {
  return ToMs(std::max(ctx.deadline - absl::Now(), absl::Milliseconds(1)));
}

}  // namespace

absl::Status State::SetUpTransport(std::shared_ptr<gloo::transport::Device> device) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  auto left = [&] { return std::max(deadline - absl::Now(), absl::ZeroDuration()); };
  const bool off = options.shared_memory == GlooOptions::SharedMemory::kOff;

  // 1. Hosts.
  std::string identity;
  if (!options.host.empty()) {
    identity = absl::StrCat("name ", options.host);
  } else {
    identity = shm::ThisHostIdentity();
    identity = identity.empty() ? absl::StrCat("unknown rank ", rank) : "machine " + identity;
  }
  const std::string record = absl::StrCat(off ? "off " : "on ", identity);
  if (absl::Status s = store->Set(absl::StrCat(kKeys, "host/", rank), record); !s.ok()) return s;
  std::vector<std::string> identities(size);
  std::vector<bool> allows(size);
  for (int r = 0; r < size; ++r) {
    std::string v = record;
    if (r != rank) {
      absl::StatusOr<std::string> got = store->Get(absl::StrCat(kKeys, "host/", r), left());
      if (!got.ok()) return got.status();
      v = *std::move(got);
    }
    allows[r] = absl::StartsWith(v, "on ");
    const size_t space = v.find(' ');
    identities[r] = space == std::string::npos ? v : v.substr(space + 1);
  }
  std::vector<std::vector<int>> by_host;
  std::map<std::string, int> index;
  for (int r = 0; r < size; ++r) {
    auto it = index.emplace(identities[r], static_cast<int>(by_host.size())).first;
    if (it->second == static_cast<int>(by_host.size())) by_host.emplace_back();
    by_host[it->second].push_back(r);
  }
  const int my_host = index[identity];
  const std::vector<int>& mates = by_host[my_host];
  transport.hosts = static_cast<int>(by_host.size());
  transport.local_ranks = static_cast<int>(mates.size());
  // A host shares memory only if every rank there allows it.
  auto candidate = [&](int h) {
    if (by_host[h].size() < 2) return false;
    for (int r : by_host[h])
      if (!allows[r]) return false;
    return true;
  };
  bool any_candidate = false;
  for (int h = 0; h < static_cast<int>(by_host.size()); ++h) any_candidate |= candidate(h);
  if (mates.size() >= 2 && !candidate(my_host)) {
    for (int r : mates) {
      if (!allows[r]) {
        transport.note = absl::StrCat("shared memory is off (GlooOptions::shared_memory) on rank ",
                                      r);
        break;
      }
    }
  }
  if (!any_candidate) {
    mode = Mode::kTcp;
    hosts.clear();
    for (int r = 0; r < size; ++r) hosts.push_back({r});
    host = rank;
    local = 0;
    return absl::OkStatus();
  }

  // 2. This host's segment.
  Unlinker unlink;
  std::unique_ptr<shm::ShmGroup> group;
  absl::Status mapped;
  if (candidate(my_host)) {
    const int leader = mates[0];
    const int m = static_cast<int>(mates.size());
    const std::string key = absl::StrCat(kKeys, "segment/", leader);
    std::unique_ptr<shm::Segment> segment;
    if (rank == leader) {
      shm::ReapStaleSegments();
      const uint64_t nonce = RandomNonce();
      const std::string name = shm::SegmentName(options.group_name, nonce);
      const size_t buffer_bytes =
          options.shm_buffer_bytes != 0 ? options.shm_buffer_bytes : AutomaticBufferBytes(m);
      absl::StatusOr<std::unique_ptr<shm::Segment>> created =
          shm::Segment::Create(name, m, buffer_bytes, nonce);
      std::string value;
      if (created.ok()) {
        segment = *std::move(created);
        unlink.name = name;
        value = absl::StrCat("ok ", nonce, " ", buffer_bytes, " ", name);
      } else {
        mapped = created.status();
        value = absl::StrCat("error ", mapped.message());
      }
      if (absl::Status s = store->Set(key, value); !s.ok()) return s;
    } else {
      absl::StatusOr<std::string> got = store->Get(key, left());
      if (!got.ok()) return got.status();
      absl::string_view v = *got;
      // "ok <nonce> <buffer bytes> <name>" or "error <why>".
      std::vector<std::string> parts = absl::StrSplit(v, absl::MaxSplits(' ', 3));
      uint64_t nonce = 0;
      size_t buffer_bytes = 0;
      if (parts.size() == 4 && parts[0] == "ok" && absl::SimpleAtoi(parts[1], &nonce) &&
          absl::SimpleAtoi(parts[2], &buffer_bytes)) {
        absl::StatusOr<std::unique_ptr<shm::Segment>> opened =
            shm::Segment::Open(parts[3], m, buffer_bytes, nonce);
        if (opened.ok()) {
          segment = *std::move(opened);
          unlink.name = parts[3];
        } else {
          mapped = opened.status();
        }
      } else {
        absl::ConsumePrefix(&v, "error ");
        mapped = absl::FailedPreconditionError(
            absl::StrCat("rank ", leader, " could not create the segment: ", v));
      }
    }
    if (segment != nullptr) {
      shm::ShmGroup::Options o;
      o.local_rank = static_cast<int>(std::find(mates.begin(), mates.end(), rank) - mates.begin());
      o.group_ranks = mates;
      o.group_size = size;
      o.timeout = options.timeout;
      o.spin = m <= UsableCpus();
      group = std::make_unique<shm::ShmGroup>(
          std::move(segment), std::move(o), names,
          [this](const std::string& what) { return PropagateLoss(what); });
      group->Join();
    }
  }

  // 3. Who mapped it.
  const std::string result = !candidate(my_host) ? "-"
                             : mapped.ok()       ? "ok"
                                                 : absl::StrCat("error ", mapped.message());
  if (absl::Status s = store->Set(absl::StrCat(kKeys, "mapped/", rank), result); !s.ok()) return s;
  std::vector<std::string> results(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      results[r] = result;
      continue;
    }
    // Only the ranks of hosts that try need to be heard.
    if (!candidate(index[identities[r]])) continue;
    absl::StatusOr<std::string> got = store->Get(absl::StrCat(kKeys, "mapped/", r), left());
    if (!got.ok()) return got.status();
    results[r] = *std::move(got);
  }
  hosts.clear();
  for (int h = 0; h < static_cast<int>(by_host.size()); ++h) {
    bool shared = candidate(h);
    for (int r : by_host[h]) {
      if (!shared || results[r] == "ok") continue;
      shared = false;
      if (h == my_host) {
        absl::string_view why = results[r];
        absl::ConsumePrefix(&why, "error ");
        transport.note = absl::StrCat("rank ", r, " could not map the shared memory segment: ", why);
      }
    }
    if (shared) {
      hosts.push_back(by_host[h]);
    } else {
      for (int r : by_host[h]) hosts.push_back({r});
    }
  }
  std::sort(hosts.begin(), hosts.end());
  for (int h = 0; h < static_cast<int>(hosts.size()); ++h) {
    auto it = std::find(hosts[h].begin(), hosts[h].end(), rank);
    if (it != hosts[h].end()) {
      host = h;
      local = static_cast<int>(it - hosts[h].begin());
    }
  }
  bool any_shared = false;
  for (const auto& h : hosts) any_shared |= h.size() >= 2;
  mode = hosts.size() == 1 ? Mode::kShm : any_shared ? Mode::kHierarchical : Mode::kTcp;
  if (hosts[host].size() >= 2) {
    group->WatchPeers();
    shm = std::move(group);
    transport.shared_memory = true;
  }

  // 4. The hosts' leaders.
  if (mode == Mode::kHierarchical && local == 0) {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(host, static_cast<int>(hosts.size()));
    ctx->setTimeout(ToMs(left()));
    StoreAdapter adapter(PrefixStore(store, absl::StrCat(kKeys, "leaders/")), left());
    ctx->connectFullMesh(adapter, device);
    ctx->setTimeout(ToMs(options.timeout));
    AddPeerNames(*ctx, adapter, [this](int h) { return hosts[h][0]; }, &peer_names);
    leaders = std::move(ctx);
  }
  return absl::OkStatus();
}

absl::Status State::HierAllReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const shm::OpContext ctx = Ctx("all_reduce");
  const bool leader = local == 0;
  float* acc = static_cast<float*>(data);
  if (leader && dtype != DType::kFloat32) {
    fp32_scratch.resize(count);
    acc = fp32_scratch.data();
  }
  if (shm != nullptr) {
    if (absl::Status s = shm->ReduceToLeader(data, count, dtype, op, acc, ctx); !s.ok()) return s;
  } else if (dtype != DType::kFloat32) {
    kernels::ToFloat32(data, count, dtype, acc);
  }
  if (leader) {
    try {
      gloo::AllreduceOptions opts(leaders);
      opts.setOutput(acc, count);
      opts.setReduceFunction(Fp32Reducer(op));
      opts.setTag(leader_tag++);
      opts.setTimeout(Left(ctx));
      gloo::allreduce(opts);
    } catch (...) {
      return MapException("all_reduce");
    }
    kernels::FromFloat32(acc, count, dtype, op == ReduceOp::kAvg ? size : 1, data);
  }
  if (shm != nullptr) return shm->BroadcastLocal(data, count * ElementSize(dtype), 0, ctx);
  return absl::OkStatus();
}

absl::Status State::HierAllGather(const void* in, size_t count, void* out, DType dtype) {
  const shm::OpContext ctx = Ctx("all_gather");
  const size_t bytes = count * ElementSize(dtype);
  char* base = static_cast<char*>(out);
  char* own = base + static_cast<size_t>(rank) * bytes;
  if (in != own) std::memmove(own, in, bytes);
  const std::vector<int>& mates = hosts[host];
  if (shm != nullptr) {
    std::vector<char*> dst(mates.size());
    for (size_t j = 0; j < mates.size(); ++j) dst[j] = base + mates[j] * bytes;
    if (absl::Status s = shm->GatherToLeader(own, bytes, dst, ctx); !s.ok()) return s;
  }
  if (local == 0) {
    // Each host's pieces, packed in host order, through the leaders.
    std::vector<size_t> block(hosts.size());
    std::vector<size_t> offset(hosts.size());
    for (size_t h = 0; h < hosts.size(); ++h) {
      block[h] = hosts[h].size() * bytes;
      offset[h] = h == 0 ? 0 : offset[h - 1] + block[h - 1];
    }
    host_scratch.resize(static_cast<size_t>(size) * bytes);
    for (size_t j = 0; j < mates.size(); ++j) {
      std::memcpy(host_scratch.data() + offset[host] + j * bytes, base + mates[j] * bytes, bytes);
    }
    try {
      gloo::AllgathervOptions opts(leaders);
      opts.setOutput(host_scratch.data(), block);
      opts.setTag(leader_tag++);
      opts.setTimeout(Left(ctx));
      gloo::allgatherv(opts);
    } catch (...) {
      return MapException("all_gather");
    }
    for (size_t h = 0; h < hosts.size(); ++h) {
      if (static_cast<int>(h) == host) continue;
      for (size_t j = 0; j < hosts[h].size(); ++j) {
        std::memcpy(base + hosts[h][j] * bytes, host_scratch.data() + offset[h] + j * bytes, bytes);
      }
    }
  }
  if (shm != nullptr) return shm->BroadcastLocal(out, static_cast<size_t>(size) * bytes, 0, ctx);
  return absl::OkStatus();
}

absl::Status State::HierReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                      DType dtype, ReduceOp op) {
  const shm::OpContext ctx = Ctx("reduce_scatter");
  const size_t es = ElementSize(dtype);
  const bool leader = local == 0;
  std::vector<size_t> offsets(size);
  size_t total = 0;
  for (int p = 0; p < size; ++p) {
    offsets[p] = total;
    total += counts[p];
  }
  float* acc = nullptr;
  if (leader) {
    reduce_scatter_acc.resize(total);
    acc = reduce_scatter_acc.data();
  }
  if (shm != nullptr) {
    if (absl::Status s = shm->ReduceToLeader(in, total, dtype, op, acc, ctx); !s.ok()) return s;
  } else {
    kernels::ToFloat32(in, total, dtype, acc);
  }
  const std::vector<int>& mates = hosts[host];
  std::vector<const char*> src(mates.size());
  std::vector<size_t> bytes(mates.size());
  for (size_t j = 0; j < mates.size(); ++j) bytes[j] = counts[mates[j]] * es;
  if (leader) {
    // The whole reduction among leaders (each host needs its ranks' pieces
    // only, but they may lie anywhere in the group's order).
    try {
      gloo::AllreduceOptions opts(leaders);
      opts.setOutput(acc, total);
      opts.setReduceFunction(Fp32Reducer(op));
      opts.setTag(leader_tag++);
      opts.setTimeout(Left(ctx));
      gloo::allreduce(opts);
    } catch (...) {
      return MapException("reduce_scatter");
    }
    const int divisor = op == ReduceOp::kAvg ? size : 1;
    kernels::FromFloat32(acc + offsets[rank], counts[rank], dtype, divisor, out);
    size_t packed = 0;
    for (size_t j = 1; j < mates.size(); ++j) packed += bytes[j];
    host_scratch.resize(packed);
    size_t at = 0;
    for (size_t j = 1; j < mates.size(); ++j) {
      kernels::FromFloat32(acc + offsets[mates[j]], counts[mates[j]], dtype, divisor,
                           host_scratch.data() + at);
      src[j] = host_scratch.data() + at;
      at += bytes[j];
    }
  }
  if (shm != nullptr) return shm->ScatterFromLeader(src, bytes, out, ctx);
  return absl::OkStatus();
}

absl::Status State::HierBroadcast(void* data, size_t count, DType dtype, int root) {
  const shm::OpContext ctx = Ctx("broadcast");
  const size_t bytes = count * ElementSize(dtype);
  int root_host = 0, root_local = 0;
  for (int h = 0; h < static_cast<int>(hosts.size()); ++h) {
    auto it = std::find(hosts[h].begin(), hosts[h].end(), root);
    if (it != hosts[h].end()) {
      root_host = h;
      root_local = static_cast<int>(it - hosts[h].begin());
    }
  }
  if (host == root_host && shm != nullptr) {
    if (absl::Status s = shm->BroadcastLocal(data, bytes, root_local, ctx); !s.ok()) return s;
  }
  if (local == 0) {
    try {
      gloo::BroadcastOptions opts(leaders);
      opts.setOutput(static_cast<char*>(data), bytes);
      opts.setRoot(root_host);
      opts.setTag(leader_tag++);
      opts.setTimeout(Left(ctx));
      gloo::broadcast(opts);
    } catch (...) {
      return MapException("broadcast");
    }
  }
  if (host != root_host && shm != nullptr) return shm->BroadcastLocal(data, bytes, 0, ctx);
  return absl::OkStatus();
}

}  // namespace shardline::worker::gloo_internal

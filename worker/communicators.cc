#include "worker/communicators.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spec/plan_proto.h"
#include "worker/coordinator_store.h"

namespace shardline::worker {

namespace v1 = ::shardline::v1;

absl::StatusOr<std::unique_ptr<Communicators>> Communicators::Build(
    const v1::Assignment& assignment, std::shared_ptr<client::RendezvousClient> rendezvous,
    const Clock* clock, const v1::Fence& fence, GlooOptions options,
    std::shared_ptr<client::CancelToken> cancel, std::optional<NcclOptions> nccl) {
  if (assignment.spare()) {
    return absl::InvalidArgumentError("a spare has no communicators");
  }
  auto comms = std::make_unique<Communicators>();
  comms->generation_ = assignment.generation();
  comms->nccl_ = nccl;
  v1::Fence f = fence;
  f.set_generation(assignment.generation());
  const uint32_t rank = assignment.rank();
  for (const v1::ProcessGroup& pg : assignment.groups()) {
    absl::StatusOr<std::vector<uint32_t>> ranks = spec::GroupRanks(pg, assignment.world_size());
    if (!ranks.ok()) {
      comms->Abort();
      return ranks.status();
    }
    auto it = std::find(ranks->begin(), ranks->end(), rank);
    if (it == ranks->end()) continue;
    Group g;
    g.name = pg.name();
    g.kind = pg.kind();
    g.group_rank = static_cast<int>(it - ranks->begin());
    g.ranks = *std::move(ranks);
    auto store = std::make_shared<CoordinatorStore>(rendezvous, clock, f, pg.name(), cancel);
    GlooOptions named = options;  // errors name "rank 3 (dp/0 rank 1)"
    named.group_name = pg.name();
    named.global_ranks.assign(g.ranks.begin(), g.ranks.end());
    absl::StatusOr<std::unique_ptr<Backend>> backend;
    if (nccl.has_value()) {
      NcclOptions o = *nccl;
      o.timeout = options.timeout;
      o.connect_timeout = options.connect_timeout;
      o.p2p_channels = pg.kind() == v1::GROUP_KIND_PP;
      backend = CreateNcclBackend(store, g.group_rank, static_cast<int>(g.ranks.size()), o);
    } else {
      backend = CreateGlooBackend(store, g.group_rank, static_cast<int>(g.ranks.size()), named);
    }
    if (!backend.ok()) {
      comms->Abort();
      // Once the generation is known to be over, whatever broke is Aborted.
      const absl::StatusCode code = cancel != nullptr && cancel->cancelled()
                                        ? absl::StatusCode::kAborted
                                        : backend.status().code();
      return absl::Status(code,
                          absl::StrCat("group ", pg.name(), " (generation ",
                                       assignment.generation(), ", group rank ", g.group_rank,
                                       " of ", g.ranks.size(), "): ", backend.status().message()));
    }
    g.backend = *std::move(backend);
    comms->groups_.push_back(std::move(g));
  }
  return comms;
}

absl::Status Communicators::Check(absl::Duration timeout) {
  const Group* dp = nullptr;
  for (const Group& g : groups_) {
    absl::Status s = g.backend->Barrier()->Wait(timeout);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("barrier ", g.name, ": ", s.message()));
    if (g.kind == v1::GROUP_KIND_DP) dp = &g;
  }
  if (dp == nullptr) return absl::OkStatus();
  const int global_rank = static_cast<int>(dp->ranks[dp->group_rank]);
  float value = static_cast<float>(global_rank + 1);
  float expected = 0;
  for (uint32_t r : dp->ranks) expected += static_cast<float>(r + 1);
  absl::Status s;
  if (dp->backend->device_memory() && nccl_.has_value()) {
    // NCCL reads device memory: the value goes through a float on the GPU.
    absl::StatusOr<DeviceMemory> memory = DeviceMemory::Load(nccl_->plugin_path);
    if (!memory.ok()) return memory.status();
    absl::StatusOr<void*> on_device = memory->Alloc(nccl_->device, sizeof(float));
    if (!on_device.ok()) return on_device.status();
    s = memory->CopyToDevice(nccl_->device, *on_device, &value, sizeof(float));
    if (s.ok()) {
      s = dp->backend->AllReduce(*on_device, 1, DType::kFloat32, ReduceOp::kSum)->Wait(timeout);
    }
    if (s.ok()) s = memory->CopyToHost(nccl_->device, &value, *on_device, sizeof(float));
    memory->Free(nccl_->device, *on_device);
  } else {
    s = dp->backend->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum)->Wait(timeout);
  }
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("all_reduce ", dp->name, ": ", s.message()));
  if (value != expected) {
    return absl::InternalError(
        absl::StrCat("all_reduce ", dp->name, " check: got ", value, ", expected ", expected));
  }
  return absl::OkStatus();
}

std::unique_ptr<Communicators> Communicators::FromGroups(uint64_t generation,
                                                        std::vector<Group> groups) {
  auto comms = std::make_unique<Communicators>();
  comms->generation_ = generation;
  comms->groups_ = std::move(groups);
  return comms;
}

namespace {

void ToProgress(const Communicators::Group& g, const OpProgress& op, v1::CollectiveProgress* out) {
  out->set_group(g.name);
  out->set_operation(op.operation);
  out->set_sequence(op.sequence);
  out->set_count(op.count);
  out->set_dtype(DTypeName(op.dtype));
  out->set_in_flight(op.in_flight);
  const int64_t ns = absl::ToInt64Nanoseconds(std::max(op.elapsed, absl::ZeroDuration()));
  out->mutable_elapsed()->set_seconds(ns / 1000000000);
  out->mutable_elapsed()->set_nanos(static_cast<int32_t>(ns % 1000000000));
  if (op.peer >= 0 && static_cast<size_t>(op.peer) < g.ranks.size()) {
    out->set_peer_rank(g.ranks[static_cast<size_t>(op.peer)]);
  }
}

}  // namespace

void Communicators::Progress(v1::RankProgress* out) const {
  for (const Group& g : groups_) {
    if (g.backend == nullptr) continue;
    const BackendProgress p = g.backend->Progress();
    if (!p.collective.operation.empty() &&
        static_cast<size_t>(out->collectives_size()) < kMaxProgressEntries) {
      ToProgress(g, p.collective, out->add_collectives());
    }
    if (p.p2p.has_value() && !p.p2p->operation.empty() &&
        static_cast<size_t>(out->collectives_size()) < kMaxProgressEntries) {
      ToProgress(g, *p.p2p, out->add_collectives());
    }
  }
}

std::string Communicators::TransportSummary() const {
  std::vector<std::string> parts;
  for (const Group& g : groups_) {
    if (g.backend == nullptr || g.ranks.size() < 2) continue;
    const TransportInfo t = g.backend->Transport();
    if (t.hosts == 0) continue;  // the backend does not say (NCCL)
    std::string part = absl::StrCat(g.name, " ");
    if (t.shared_memory) {
      absl::StrAppend(&part, "shared memory (", t.local_ranks, " ranks on this host");
      if (t.hosts > 1) absl::StrAppend(&part, ", TCP to ", t.hosts - 1, " other hosts");
      absl::StrAppend(&part, ")");
    } else if (t.local_ranks > 1) {
      absl::StrAppend(&part, "TCP (", t.local_ranks, " ranks on this host",
                      t.note.empty() ? "" : ": ", t.note, ")");
    } else {
      absl::StrAppend(&part, "TCP (", t.hosts, " hosts)");
    }
    parts.push_back(std::move(part));
  }
  return absl::StrJoin(parts, "; ");
}

void Communicators::Abort() {
  for (Group& g : groups_) {
    if (g.backend != nullptr) g.backend->Abort();
  }
}

}  // namespace shardline::worker

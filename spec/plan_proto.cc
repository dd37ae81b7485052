#include "spec/plan_proto.h"

#include "absl/strings/str_cat.h"

namespace shardline::spec {
namespace {

v1::GroupKind KindToProto(plan::GroupKind kind) {
  switch (kind) {
    case plan::GroupKind::kTp:
      return v1::GROUP_KIND_TP;
    case plan::GroupKind::kDp:
      return v1::GROUP_KIND_DP;
    case plan::GroupKind::kPp:
      return v1::GROUP_KIND_PP;
    case plan::GroupKind::kEmbedding:
      return v1::GROUP_KIND_EMBEDDING;
  }
  return v1::GROUP_KIND_UNSPECIFIED;
}

const char* ScopePrefix(plan::GroupKind kind) {
  return kind == plan::GroupKind::kEmbedding ? "emb" : plan::GroupKindName(kind).data();
}

v1::Schedule ScheduleToProto(plan::ScheduleKind kind) {
  switch (kind) {
    case plan::ScheduleKind::kGpipe:
      return v1::SCHEDULE_GPIPE;
    case plan::ScheduleKind::kOneFOneB:
      return v1::SCHEDULE_ONE_F_ONE_B;
    case plan::ScheduleKind::kInterleaved:
      return v1::SCHEDULE_INTERLEAVED;
  }
  return v1::SCHEDULE_UNSPECIFIED;
}

v1::PipelineChunk ChunkToProto(const plan::Chunk& c, int pp) {
  v1::PipelineChunk out;
  out.set_chunk(c.index);
  out.set_pp_rank(c.pp_rank);
  out.set_virtual_index(c.index / pp);
  out.set_first_layer(c.first_layer);
  out.set_last_layer(c.last_layer);
  out.set_holds_embedding(c.has_embedding);
  out.set_holds_head(c.has_head);
  return out;
}

}  // namespace

v1::ParallelConfig ParallelToProto(const plan::ParallelConfig& p) {
  v1::ParallelConfig out;
  out.set_tp(p.tp);
  out.set_pp(p.pp);
  out.set_vpp(p.vpp);
  out.set_zero_stage(p.zero_stage);
  out.set_schedule(ScheduleToProto(p.schedule));
  out.set_zero_alignment(p.zero_alignment);
  return out;
}

namespace {

void SetRange(v1::ElementRange* out, const plan::ShardRange& r) {
  out->set_begin(r.begin);
  out->set_end(r.end);
}

const plan::ParameterSpec* FindSpec(const plan::Plan& plan, const std::string& name) {
  for (const plan::ParameterSpec& s : plan.parameters) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

}  // namespace

v1::TensorSlice SliceOf(const plan::ParameterSpec& spec, int tp, int tp_rank) {
  v1::TensorSlice slice;
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    v1::DimSlice* dim = slice.add_dims();
    const bool split = static_cast<int>(d) == spec.tp_split_dim;
    const int64_t length = split ? spec.shape[d] / tp : spec.shape[d];
    dim->set_offset(split ? length * tp_rank : 0);
    dim->set_length(length);
  }
  return slice;
}

std::vector<v1::ProcessGroup> GroupsToProto(const plan::Topology& topology) {
  std::vector<v1::ProcessGroup> out;
  int per_kind[4] = {0, 0, 0, 0};
  for (const plan::Group& g : topology.GroupsInCreationOrder()) {
    v1::ProcessGroup group;
    group.set_name(absl::StrCat(ScopePrefix(g.kind), "/", per_kind[static_cast<int>(g.kind)]++));
    group.set_kind(KindToProto(g.kind));
    group.set_index(static_cast<uint32_t>(out.size()));
    for (int r : g.ranks) group.add_ranks(r);
    out.push_back(std::move(group));
  }
  return out;
}

v1::Plan PlanToProto(const plan::Plan& p, const std::string& job_id, uint64_t generation) {
  v1::Plan out;
  out.set_job_id(job_id);
  out.set_generation(generation);
  v1::ModelConfig* m = out.mutable_model();
  m->set_num_layers(p.model.num_layers);
  m->set_hidden_size(p.model.hidden_size);
  m->set_num_heads(p.model.num_heads);
  m->set_ffn_hidden_size(p.model.ffn());
  m->set_vocab_size(p.model.vocab_size);
  m->set_seq_length(p.model.seq_length);
  *out.mutable_parallel() = ParallelToProto(p.parallel);
  out.set_dp(p.parallel.dp);
  out.set_world_size(p.parallel.world_size());
  out.set_num_parameters(p.parameter_count);
  out.set_micro_batch(p.parallel.micro_batch_size);
  out.set_gradient_accumulation_steps(p.parallel.micro_batches);
  for (v1::ProcessGroup& g : GroupsToProto(p.topology)) *out.add_groups() = std::move(g);
  for (int r = 0; r < p.pipeline.pp; ++r) {
    v1::PipelineStage* stage = out.add_stages();
    stage->set_pp_rank(r);
    for (int c : p.pipeline.ChunksOfRank(r)) {
      *stage->add_chunks() = ChunkToProto(p.pipeline.chunks[c], p.pipeline.pp);
    }
  }
  v1::PipelineSchedule* s = out.mutable_schedule();
  s->set_schedule(ScheduleToProto(p.schedule.kind));
  s->set_num_micro_batches(p.schedule.micro_batches);
  s->set_makespan(static_cast<double>(p.schedule.simulation.makespan));
  s->set_ideal(static_cast<double>(p.schedule.simulation.ideal));
  s->set_bubble_ratio(p.schedule.simulation.bubble_ratio);
  for (int r = 0; r < p.schedule.pp; ++r) {
    const plan::RankSchedule& rs = p.schedule.ranks[r];
    v1::RankSchedule* rank = s->add_ranks();
    rank->set_pp_rank(r);
    rank->set_warmup(rs.warmup);
    rank->set_steady(static_cast<uint32_t>(rs.actions.size() / 2) - rs.warmup);
    for (const plan::Action& a : rs.actions) {
      v1::PipelineAction* action = rank->add_actions();
      action->set_kind(a.kind == plan::Action::Kind::kForward ? v1::ACTION_KIND_FORWARD
                                                              : v1::ACTION_KIND_BACKWARD);
      action->set_micro_batch_index(a.micro_batch);
      action->set_chunk(a.chunk);
    }
  }
  for (const plan::Unit& u : p.zero.units) {
    v1::ZeroUnit* unit = out.add_units();
    unit->set_unit(u.name);
    unit->set_tp_rank(u.tp_rank);
    unit->set_pp_rank(u.pp_rank);
    unit->set_chunk(u.chunk);
    unit->set_numel(u.numel);
    unit->set_padded(u.padded);
    unit->set_shard(u.padded / p.zero.dp);
    for (const plan::ShardRange& r : u.shards) SetRange(unit->add_dp_shards(), r);
    for (const plan::UnitPiece& piece : u.pieces) {
      v1::ZeroPiece* z = unit->add_pieces();
      z->set_parameter(piece.parameter);
      z->set_unit_offset(piece.offset);
      z->set_numel(piece.numel);
      z->set_tied_copy(piece.tied_copy);
      if (const plan::ParameterSpec* spec = FindSpec(p, piece.parameter)) {
        for (int64_t d : spec->shape) z->add_global_shape(d);
        *z->mutable_slice() = SliceOf(*spec, p.parallel.tp, u.tp_rank);
      }
    }
  }
  for (size_t r = 0; r < p.memory.size(); ++r) {
    v1::RankMemory* m = out.add_memory();
    m->set_rank(r);
    m->set_param_bytes(p.memory[r].params);
    m->set_grad_bytes(p.memory[r].grads);
    m->set_optimizer_bytes(p.memory[r].optimizer);
    m->set_total_bytes(p.memory[r].total());
  }
  return out;
}

PlanGroups GroupsOfPlan(const plan::Plan& p) {
  PlanGroups out;
  out.groups = GroupsToProto(p.topology);
  out.of_rank.resize(static_cast<size_t>(p.parallel.world_size()));
  out.compact.reserve(out.groups.size());
  for (size_t i = 0; i < out.groups.size(); ++i) {
    const v1::ProcessGroup& g = out.groups[i];
    for (uint32_t r : g.ranks()) out.of_rank[r].push_back(static_cast<int>(i));
    const int n = g.ranks_size();
    const uint32_t stride = n >= 2 ? g.ranks(1) - g.ranks(0) : 1;
    bool progression = n >= 1;
    for (int k = 1; k < n && progression; ++k) {
      progression = g.ranks(k) - g.ranks(k - 1) == stride;
    }
    v1::ProcessGroup c;
    if (progression) {
      c.set_name(g.name());
      c.set_kind(g.kind());
      c.set_index(g.index());
      c.set_first_rank(g.ranks(0));
      c.set_rank_stride(stride);
      c.set_size(static_cast<uint32_t>(n));
    } else {
      c = g;
    }
    out.compact.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<std::vector<uint32_t>> GroupRanks(const v1::ProcessGroup& pg, uint32_t world_size) {
  std::vector<uint32_t> ranks;
  if (pg.ranks_size() > 0 || pg.size() == 0) {
    ranks.assign(pg.ranks().begin(), pg.ranks().end());
  } else {
    const uint64_t last =
        pg.first_rank() + static_cast<uint64_t>(pg.size() - 1) * pg.rank_stride();
    if (last >= world_size || (pg.size() > 1 && pg.rank_stride() == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", pg.name(), ": compact form first_rank=", pg.first_rank(), " rank_stride=",
          pg.rank_stride(), " size=", pg.size(), " does not fit world_size=", world_size));
    }
    ranks.resize(pg.size());
    for (uint32_t i = 0; i < pg.size(); ++i) ranks[i] = pg.first_rank() + i * pg.rank_stride();
  }
  for (uint32_t r : ranks) {
    if (r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat("group ", pg.name(), " lists rank ", r,
                                                     " outside world_size=", world_size));
    }
  }
  return ranks;
}

v1::Assignment AssignmentFor(const plan::Plan& p, const PlanGroups& groups, int rank,
                             bool compact_groups) {
  v1::Assignment a;
  const plan::RankCoordinates c = p.topology.CoordinatesOf(rank);
  a.set_rank(rank);
  a.set_world_size(p.parallel.world_size());
  a.mutable_coordinates()->set_tp_rank(c.tp_rank);
  a.mutable_coordinates()->set_pp_rank(c.pp_rank);
  a.mutable_coordinates()->set_dp_rank(c.dp_rank);
  *a.mutable_parallel() = ParallelToProto(p.parallel);
  a.set_dp(p.parallel.dp);
  const std::vector<v1::ProcessGroup>& from = compact_groups ? groups.compact : groups.groups;
  for (int i : groups.of_rank[static_cast<size_t>(rank)]) *a.add_groups() = from[i];
  for (int ch : p.pipeline.ChunksOfRank(c.pp_rank)) {
    *a.add_chunks() = ChunkToProto(p.pipeline.chunks[ch], p.pipeline.pp);
  }
  for (const plan::Unit& u : p.zero.units) {
    if (u.tp_rank != c.tp_rank || u.pp_rank != c.pp_rank) continue;
    v1::ZeroShard* z = a.add_zero_shards();
    z->set_unit(u.name);
    z->set_chunk(u.chunk);
    z->set_numel(u.numel);
    z->set_padded(u.padded);
    z->set_shard(u.padded / p.zero.dp);
    SetRange(z->mutable_owned(), u.shards[c.dp_rank]);
  }
  a.set_gradient_accumulation_steps(p.parallel.micro_batches);
  a.set_micro_batch(p.parallel.micro_batch_size);
  return a;
}

v1::ShardHolder HolderToProto(const plan::Holder& h, const plan::ParameterSpec& spec, int tp) {
  v1::ShardHolder out;
  out.set_kind(h.kind == plan::StateKind::kParam  ? v1::HOLDER_KIND_PARAM
               : h.kind == plan::StateKind::kGrad ? v1::HOLDER_KIND_GRAD
                                                  : v1::HOLDER_KIND_OPTIMIZER_STATE);
  out.set_rank(h.rank);
  out.set_tp_rank(h.coordinates.tp_rank);
  out.set_pp_rank(h.coordinates.pp_rank);
  out.set_dp_rank(h.coordinates.dp_rank);
  out.set_unit(h.unit);
  SetRange(out.mutable_unit_range(), h.unit_range);
  *out.mutable_slice() = SliceOf(spec, tp, h.coordinates.tp_rank);
  SetRange(out.mutable_slice_range(), h.local_range);
  return out;
}

}  // namespace shardline::spec

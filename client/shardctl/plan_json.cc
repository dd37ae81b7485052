#include "client/shardctl/plan_json.h"

namespace shardline::shardctl {
namespace {

// Keys keep the order written here (model first), not alphabetical.
using json = nlohmann::ordered_json;

json Range(const plan::ShardRange& r) { return {{"begin", r.begin}, {"end", r.end}}; }

json Bytes(const plan::MemoryEstimate& m) {
  return {{"params", m.params},
          {"grads", m.grads},
          {"optimizer", m.optimizer},
          {"total", m.total()}};
}

json Parallel(const plan::ParallelConfig& p) {
  return {{"tp", p.tp},
          {"pp", p.pp},
          {"dp", p.dp},
          {"vpp", p.vpp},
          {"world_size", p.world_size()},
          {"zero_stage", p.zero_stage},
          {"zero_alignment", p.zero_alignment},
          {"micro_batches", p.micro_batches},
          {"micro_batch_size", p.micro_batch_size},
          {"global_batch", p.global_batch()},
          {"schedule", std::string(plan::ScheduleName(p.schedule))},
          {"precision", std::string(plan::PrecisionName(p.precision))}};
}

}  // namespace

json PlanToJson(const plan::Plan& p) {
  json out;
  const plan::GptConfig& m = p.model;
  out["model"] = {{"num_layers", m.num_layers},
                  {"hidden_size", m.hidden_size},
                  {"num_heads", m.num_heads},
                  {"ffn_hidden_size", m.ffn()},
                  {"vocab_size", m.vocab_size},
                  {"seq_length", m.seq_length},
                  {"parameters", p.parameter_count},
                  {"flops_per_iteration", p.flops_per_iteration},
                  {"flops_per_iteration_recompute", p.flops_per_iteration_recompute}};
  out["parallel"] = Parallel(p.parallel);

  json params = json::array();
  for (const plan::ParameterSpec& s : p.parameters) {
    params.push_back({{"name", s.name},
                      {"shape", s.shape},
                      {"numel", s.numel()},
                      {"tp_split_dim", s.tp_split_dim},
                      {"layer", s.layer}});
  }
  out["parameters"] = std::move(params);

  const plan::Topology& t = p.topology;
  json ranks = json::array();
  for (int r = 0; r < t.world_size(); ++r) {
    const plan::RankCoordinates c = t.CoordinatesOf(r);
    ranks.push_back({{"rank", r}, {"tp_rank", c.tp_rank}, {"dp_rank", c.dp_rank},
                     {"pp_rank", c.pp_rank}});
  }
  out["topology"] = {{"world_size", t.world_size()},
                     {"groups",
                      {{"tp", t.tp_groups()},
                       {"dp", t.dp_groups()},
                       {"pp", t.pp_groups()},
                       {"embedding", t.embedding_groups()}}},
                     {"ranks", std::move(ranks)}};

  json stages = json::array();
  for (int r = 0; r < p.pipeline.pp; ++r) {
    json chunks = json::array();
    for (int c : p.pipeline.ChunksOfRank(r)) {
      const plan::Chunk& chunk = p.pipeline.chunks[c];
      chunks.push_back({{"index", chunk.index},
                        {"layers", {chunk.first_layer, chunk.last_layer}},
                        {"embedding", chunk.has_embedding},
                        {"head", chunk.has_head}});
    }
    stages.push_back({{"pp_rank", r}, {"chunks", std::move(chunks)}});
  }
  out["pipeline"] = {{"pp", p.pipeline.pp}, {"vpp", p.pipeline.vpp}, {"stages", std::move(stages)}};

  const plan::PipelineSchedule& s = p.schedule;
  json schedule_ranks = json::array();
  for (int r = 0; r < s.pp; ++r) {
    json actions = json::array();
    for (const plan::Action& a : s.ranks[r].actions) actions.push_back(a.ToString());
    schedule_ranks.push_back(
        {{"pp_rank", r}, {"warmup", s.ranks[r].warmup}, {"actions", std::move(actions)}});
  }
  out["schedule"] = {{"kind", std::string(plan::ScheduleName(s.kind))},
                     {"micro_batches", s.micro_batches},
                     {"t_forward", s.simulation.t_forward},
                     {"t_backward", s.simulation.t_backward},
                     {"makespan", s.simulation.makespan},
                     {"ideal", s.simulation.ideal},
                     {"bubble_ratio", s.simulation.bubble_ratio},
                     {"ranks", std::move(schedule_ranks)}};

  json units = json::array();
  for (const plan::Unit& u : p.zero.units) {
    json shards = json::array();
    for (const plan::ShardRange& r : u.shards) shards.push_back(Range(r));
    json pieces = json::array();
    for (const plan::UnitPiece& piece : u.pieces) {
      pieces.push_back({{"parameter", piece.parameter},
                        {"offset", piece.offset},
                        {"numel", piece.numel},
                        {"tied_copy", piece.tied_copy}});
    }
    units.push_back({{"name", u.name},
                     {"tp_rank", u.tp_rank},
                     {"pp_rank", u.pp_rank},
                     {"chunk", u.chunk},
                     {"numel", u.numel},
                     {"padded", u.padded},
                     {"shards", std::move(shards)},
                     {"pieces", std::move(pieces)}});
  }
  out["zero"] = {{"stage", p.zero.zero_stage},
                 {"alignment", p.zero.alignment},
                 {"dp", p.zero.dp},
                 {"units", std::move(units)}};

  json memory_ranks = json::array();
  for (size_t r = 0; r < p.memory.size(); ++r) {
    json entry = Bytes(p.memory[r]);
    entry["rank"] = r;
    memory_ranks.push_back(std::move(entry));
  }
  out["memory"] = {{"precision", std::string(plan::PrecisionName(p.parallel.precision))},
                   {"per_rank_bytes", Bytes(p.memory[p.max_memory_rank])},
                   {"max_rank", p.max_memory_rank},
                   {"ranks", std::move(memory_ranks)}};
  return out;
}

json MemoryEstimateToJson(int64_t parameters, const plan::ParallelConfig& parallel,
                          const plan::MemoryEstimate& memory) {
  return {{"parallel", Parallel(parallel)},
          {"memory",
           {{"parameters", parameters},
            {"precision", std::string(plan::PrecisionName(parallel.precision))},
            {"per_rank_bytes", Bytes(memory)}}}};
}

json OwnersToJson(const std::string& parameter, std::optional<int64_t> element, int zero_stage,
                  const std::vector<plan::Holder>& holders) {
  json list = json::array();
  for (const plan::Holder& h : holders) {
    list.push_back({{"kind", std::string(plan::StateKindName(h.kind))},
                    {"rank", h.rank},
                    {"tp_rank", h.coordinates.tp_rank},
                    {"dp_rank", h.coordinates.dp_rank},
                    {"pp_rank", h.coordinates.pp_rank},
                    {"unit", h.unit},
                    {"unit_range", Range(h.unit_range)},
                    {"local_range", Range(h.local_range)},
                    {"tied_copy", h.tied_copy}});
  }
  json out = {{"parameter", parameter}, {"zero_stage", zero_stage}, {"holders", std::move(list)}};
  out["element"] = element.has_value() ? json(*element) : json(nullptr);
  return out;
}

}  // namespace shardline::shardctl

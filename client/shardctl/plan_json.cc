#include "client/shardctl/plan_json.h"

#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace shardline::shardctl {
namespace {

// Writes JSON text as it goes, laid out as nlohmann::json's dump(2) lays it
// out (two-space indent, one member or element a line, "key": value, {} and
// [] when empty), without building a document first: the plan of Megatron's
// 1T layout is 4 MB of JSON, and a document of it took 5x the planning.
// Keys keep the order they are written in (model first).
class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : out_(out) {}

  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }

  // In an object: the member's key; the next Begin*/Value is its value.
  void Key(absl::string_view key) {
    NextItem();
    String(key);
    out_->append(": ");
    after_key_ = true;
  }

  void Value(bool b) {
    NextItem();
    out_->append(b ? "true" : "false");
  }
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  void Value(T n) {
    NextItem();
    absl::StrAppend(out_, n);
  }
  // nlohmann's shortest round-trip form ("0.5", "2.0", "1e-05").
  void Value(double x) {
    NextItem();
    out_->append(nlohmann::json(x).dump());
  }
  void Value(absl::string_view s) {
    NextItem();
    String(s);
  }
  void Value(const char* s) { Value(absl::string_view(s)); }
  void Value(const std::string& s) { Value(absl::string_view(s)); }
  void Null() {
    NextItem();
    out_->append("null");
  }
  template <typename T>
  void Value(const std::vector<T>& list) {
    BeginArray();
    for (const T& x : list) Value(x);
    EndArray();
  }

  template <typename T>
  void Field(absl::string_view key, const T& value) {
    Key(key);
    Value(value);
  }

 private:
  void Open(char bracket) {
    NextItem();
    out_->push_back(bracket);
    empty_.push_back(true);
  }
  void Close(char bracket) {
    const bool empty = empty_.back();
    empty_.pop_back();
    if (!empty) NewLine();
    out_->push_back(bracket);
  }
  // Before an array element or an object key: the comma and the new line;
  // nothing before the value of a key.
  void NextItem() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (empty_.empty()) return;  // the top-level value
    if (!empty_.back()) out_->push_back(',');
    empty_.back() = false;
    NewLine();
  }
  void NewLine() {
    out_->push_back('\n');
    out_->append(2 * empty_.size(), ' ');
  }
  // Quoted, with JSON's escapes for '"', '\' and control characters.
  void String(absl::string_view s) {
    out_->push_back('"');
    // Names and keys rarely need an escape: copy runs without one whole.
    while (!s.empty()) {
      size_t plain = 0;
      while (plain < s.size() && s[plain] != '"' && s[plain] != '\\' &&
             static_cast<unsigned char>(s[plain]) >= 0x20) {
        ++plain;
      }
      out_->append(s.data(), plain);
      if (plain == s.size()) break;
      const char c = s[plain];
      s.remove_prefix(plain + 1);
      switch (c) {
        case '"':
          out_->append("\\\"");
          break;
        case '\\':
          out_->append("\\\\");
          break;
        case '\b':
          out_->append("\\b");
          break;
        case '\f':
          out_->append("\\f");
          break;
        case '\n':
          out_->append("\\n");
          break;
        case '\r':
          out_->append("\\r");
          break;
        case '\t':
          out_->append("\\t");
          break;
        default: {  // another control character
          static constexpr char kHex[] = "0123456789abcdef";
          out_->append("\\u00");
          out_->push_back(kHex[(c >> 4) & 0xf]);
          out_->push_back(kHex[c & 0xf]);
        }
      }
    }
    out_->push_back('"');
  }

  std::string* out_;
  std::vector<bool> empty_;  // per open container: nothing written in it yet
  bool after_key_ = false;
};

void Range(JsonWriter& w, absl::string_view key, const plan::ShardRange& r) {
  w.Key(key);
  w.BeginObject();
  w.Field("begin", r.begin);
  w.Field("end", r.end);
  w.EndObject();
}

// The members of a MemoryEstimate, in the object being written.
void BytesFields(JsonWriter& w, const plan::MemoryEstimate& m) {
  w.Field("params", m.params);
  w.Field("grads", m.grads);
  w.Field("optimizer", m.optimizer);
  w.Field("total", m.total());
}

void Bytes(JsonWriter& w, absl::string_view key, const plan::MemoryEstimate& m) {
  w.Key(key);
  w.BeginObject();
  BytesFields(w, m);
  w.EndObject();
}

void Parallel(JsonWriter& w, const plan::ParallelConfig& p) {
  w.Key("parallel");
  w.BeginObject();
  w.Field("tp", p.tp);
  w.Field("pp", p.pp);
  w.Field("dp", p.dp);
  w.Field("vpp", p.vpp);
  w.Field("world_size", p.world_size());
  w.Field("zero_stage", p.zero_stage);
  w.Field("zero_alignment", p.zero_alignment);
  w.Field("micro_batches", p.micro_batches);
  w.Field("micro_batch_size", p.micro_batch_size);
  w.Field("global_batch", p.global_batch());
  w.Field("schedule", plan::ScheduleName(p.schedule));
  w.Field("precision", plan::PrecisionName(p.precision));
  w.EndObject();
}

void Model(JsonWriter& w, const plan::Plan& p) {
  const plan::GptConfig& m = p.model;
  w.Key("model");
  w.BeginObject();
  w.Field("num_layers", m.num_layers);
  w.Field("hidden_size", m.hidden_size);
  w.Field("num_heads", m.num_heads);
  w.Field("ffn_hidden_size", m.ffn());
  w.Field("vocab_size", m.vocab_size);
  w.Field("seq_length", m.seq_length);
  w.Field("parameters", p.parameter_count);
  w.Field("flops_per_iteration", p.flops_per_iteration);
  w.Field("flops_per_iteration_recompute", p.flops_per_iteration_recompute);
  w.EndObject();
}

void Parameters(JsonWriter& w, const std::vector<plan::ParameterSpec>& parameters) {
  w.Key("parameters");
  w.BeginArray();
  for (const plan::ParameterSpec& s : parameters) {
    w.BeginObject();
    w.Field("name", s.name);
    w.Field("shape", s.shape);
    w.Field("numel", s.numel());
    w.Field("tp_split_dim", s.tp_split_dim);
    w.Field("layer", s.layer);
    w.EndObject();
  }
  w.EndArray();
}

void Topology(JsonWriter& w, const plan::Topology& t) {
  w.Key("topology");
  w.BeginObject();
  w.Field("world_size", t.world_size());
  w.Key("groups");
  w.BeginObject();
  w.Field("tp", t.tp_groups());
  w.Field("dp", t.dp_groups());
  w.Field("pp", t.pp_groups());
  w.Field("embedding", t.embedding_groups());
  w.EndObject();
  w.Key("ranks");
  w.BeginArray();
  for (int r = 0; r < t.world_size(); ++r) {
    const plan::RankCoordinates c = t.CoordinatesOf(r);
    w.BeginObject();
    w.Field("rank", r);
    w.Field("tp_rank", c.tp_rank);
    w.Field("dp_rank", c.dp_rank);
    w.Field("pp_rank", c.pp_rank);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

void Pipeline(JsonWriter& w, const plan::PipelinePlan& pipeline) {
  w.Key("pipeline");
  w.BeginObject();
  w.Field("pp", pipeline.pp);
  w.Field("vpp", pipeline.vpp);
  w.Key("stages");
  w.BeginArray();
  for (int r = 0; r < pipeline.pp; ++r) {
    w.BeginObject();
    w.Field("pp_rank", r);
    w.Key("chunks");
    w.BeginArray();
    for (int c : pipeline.ChunksOfRank(r)) {
      const plan::Chunk& chunk = pipeline.chunks[c];
      w.BeginObject();
      w.Field("index", chunk.index);
      w.Field("layers", std::vector<int64_t>{chunk.first_layer, chunk.last_layer});
      w.Field("embedding", chunk.has_embedding);
      w.Field("head", chunk.has_head);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

void Schedule(JsonWriter& w, const plan::PipelineSchedule& s) {
  w.Key("schedule");
  w.BeginObject();
  w.Field("kind", plan::ScheduleName(s.kind));
  w.Field("micro_batches", s.micro_batches);
  w.Field("t_forward", s.simulation.t_forward);
  w.Field("t_backward", s.simulation.t_backward);
  w.Field("makespan", s.simulation.makespan);
  w.Field("ideal", s.simulation.ideal);
  w.Field("bubble_ratio", s.simulation.bubble_ratio);
  w.Key("ranks");
  w.BeginArray();
  for (int r = 0; r < s.pp; ++r) {
    w.BeginObject();
    w.Field("pp_rank", r);
    w.Field("warmup", s.ranks[r].warmup);
    w.Key("actions");
    w.BeginArray();
    for (const plan::Action& a : s.ranks[r].actions) w.Value(a.ToString());
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

void Zero(JsonWriter& w, const plan::ZeroPlan& zero) {
  w.Key("zero");
  w.BeginObject();
  w.Field("stage", zero.zero_stage);
  w.Field("alignment", zero.alignment);
  w.Field("dp", zero.dp);
  w.Key("units");
  w.BeginArray();
  for (const plan::Unit& u : zero.units) {
    w.BeginObject();
    w.Field("name", u.name);
    w.Field("tp_rank", u.tp_rank);
    w.Field("pp_rank", u.pp_rank);
    w.Field("chunk", u.chunk);
    w.Field("numel", u.numel);
    w.Field("padded", u.padded);
    w.Key("shards");
    w.BeginArray();
    for (const plan::ShardRange& r : u.shards) {
      w.BeginObject();
      w.Field("begin", r.begin);
      w.Field("end", r.end);
      w.EndObject();
    }
    w.EndArray();
    w.Key("pieces");
    w.BeginArray();
    for (const plan::UnitPiece& piece : u.pieces) {
      w.BeginObject();
      w.Field("parameter", piece.parameter);
      w.Field("offset", piece.offset);
      w.Field("numel", piece.numel);
      w.Field("tied_copy", piece.tied_copy);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

void Memory(JsonWriter& w, const plan::Plan& p) {
  w.Key("memory");
  w.BeginObject();
  w.Field("precision", plan::PrecisionName(p.parallel.precision));
  Bytes(w, "per_rank_bytes", p.memory[p.max_memory_rank]);
  w.Field("max_rank", p.max_memory_rank);
  w.Key("ranks");
  w.BeginArray();
  for (size_t r = 0; r < p.memory.size(); ++r) {
    w.BeginObject();
    BytesFields(w, p.memory[r]);
    w.Field("rank", r);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

}  // namespace

std::string PlanToJson(const plan::Plan& p) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  Model(w, p);
  Parallel(w, p.parallel);
  Parameters(w, p.parameters);
  Topology(w, p.topology);
  Pipeline(w, p.pipeline);
  Schedule(w, p.schedule);
  Zero(w, p.zero);
  Memory(w, p);
  w.EndObject();
  out.push_back('\n');
  return out;
}

std::string MemoryEstimateToJson(int64_t parameters, const plan::ParallelConfig& parallel,
                                 const plan::MemoryEstimate& memory) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  Parallel(w, parallel);
  w.Key("memory");
  w.BeginObject();
  w.Field("parameters", parameters);
  w.Field("precision", plan::PrecisionName(parallel.precision));
  Bytes(w, "per_rank_bytes", memory);
  w.EndObject();
  w.EndObject();
  out.push_back('\n');
  return out;
}

std::string OwnersToJson(const std::string& parameter, std::optional<int64_t> element,
                         int zero_stage, const std::vector<plan::Holder>& holders) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Field("parameter", parameter);
  w.Field("zero_stage", zero_stage);
  w.Key("holders");
  w.BeginArray();
  for (const plan::Holder& h : holders) {
    w.BeginObject();
    w.Field("kind", plan::StateKindName(h.kind));
    w.Field("rank", h.rank);
    w.Field("tp_rank", h.coordinates.tp_rank);
    w.Field("dp_rank", h.coordinates.dp_rank);
    w.Field("pp_rank", h.coordinates.pp_rank);
    w.Field("unit", h.unit);
    Range(w, "unit_range", h.unit_range);
    Range(w, "local_range", h.local_range);
    w.Field("tied_copy", h.tied_copy);
    w.EndObject();
  }
  w.EndArray();
  w.Key("element");
  if (element.has_value()) {
    w.Value(*element);
  } else {
    w.Null();
  }
  w.EndObject();
  out.push_back('\n');
  return out;
}

}  // namespace shardline::shardctl

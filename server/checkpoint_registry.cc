#include "server/checkpoint_registry.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "checkpoint/geometry.h"
#include "google/protobuf/util/message_differencer.h"

namespace shardline::server {
namespace {

namespace v1 = ::shardline::v1;

constexpr char kRestartReason[] = "coordinator restarted while the checkpoint was pending";
constexpr char kDataLossPrefix[] = "DATA_LOSS: ";

google::protobuf::Timestamp ToProto(absl::Time t) {
  google::protobuf::Timestamp ts;
  const int64_t s = absl::ToUnixSeconds(t);
  ts.set_seconds(s);
  ts.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(s))));
  return ts;
}

std::string StoreKey(absl::string_view job_id, absl::string_view checkpoint_id) {
  return absl::StrCat(job_id, "/", checkpoint_id);
}

std::string JoinDir(absl::string_view dir, absl::string_view id) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, id);
  return absl::StrCat(dir, "/", id);
}

// The content of a report that must be identical on a repeat: no fence, no
// checkpoint_id, piece ranks set to the reporting rank.
v1::ReportShardRequest Normalized(const v1::ReportShardRequest& r, uint32_t rank) {
  v1::ReportShardRequest n = r;
  n.clear_fence();
  n.clear_checkpoint_id();
  for (v1::SavedTensor& t : *n.mutable_tensors()) {
    for (v1::SavedPiece& p : *t.mutable_pieces()) p.set_rank(rank);
  }
  return n;
}

}  // namespace

std::string CheckpointRegistry::CheckpointId(uint64_t generation, uint64_t step) {
  return absl::StrFormat("ckpt-step%012d-gen%d", step, generation);
}

std::optional<std::pair<uint64_t, uint64_t>> CheckpointRegistry::ParseCheckpointId(
    absl::string_view id) {
  uint64_t step = 0, generation = 0;
  if (!absl::ConsumePrefix(&id, "ckpt-step")) return std::nullopt;
  const size_t dash = id.find("-gen");
  if (dash != 12 || !absl::SimpleAtoi(id.substr(0, dash), &step) ||
      !absl::SimpleAtoi(id.substr(dash + 4), &generation) ||
      CheckpointId(generation, step) != absl::StrCat("ckpt-step", id)) {
    return std::nullopt;
  }
  return std::make_pair(step, generation);
}

absl::StatusOr<std::unique_ptr<CheckpointRegistry>> CheckpointRegistry::Create(
    StateStore* store, const Clock* clock, CheckpointRegistryOptions options) {
  std::unique_ptr<CheckpointRegistry> reg(new CheckpointRegistry(store, clock, std::move(options)));
  absl::StatusOr<std::vector<Record>> records = store->Scan(kCheckpointKind);
  if (!records.ok()) return records.status();
  absl::StatusOr<std::vector<Record>> latest = store->Scan(kCheckpointLatestKind);
  if (!latest.ok()) return latest.status();
  absl::StatusOr<std::vector<Record>> marks = store->Scan(kCheckpointUnusableKind);
  if (!marks.ok()) return marks.status();

  std::vector<Mutation> rewrites;
  {
    // Nobody else sees `reg` yet; the lock is for the annotations' sake.
    absl::MutexLock lock(&reg->mu_);
    for (const Record& rec : *records) {
      auto m = std::make_shared<v1::Manifest>();
      if (!m->ParseFromString(rec.value)) {
        return absl::DataLossError(
            absl::StrFormat("checkpoint record \"%s\" does not parse as a Manifest", rec.key));
      }
      if (rec.key != StoreKey(m->job_id(), m->checkpoint_id()) || m->checkpoint_id().empty()) {
        return absl::DataLossError(
            absl::StrFormat("checkpoint record \"%s\" holds checkpoint \"%s\" of job \"%s\"",
                            rec.key, m->checkpoint_id(), m->job_id()));
      }
      JobCheckpoints& job = reg->jobs_[m->job_id()];
      Entry& e = job.entries[m->checkpoint_id()];
      switch (m->state()) {
        case v1::CHECKPOINT_STATE_COMMITTED:
          e.phase = Phase::kCommitted;
          e.reported = m->ranks_size();
          for (const v1::RankRecord& r : m->ranks()) {
            for (const v1::ShardFile& f : r.files()) e.total_bytes += f.size_bytes();
          }
          break;
        case v1::CHECKPOINT_STATE_PENDING:
          e.phase = Phase::kAborted;
          m->set_state(v1::CHECKPOINT_STATE_ABORTED);
          m->set_abort_reason(kRestartReason);
          rewrites.push_back(
              Mutation::Put(std::string(kCheckpointKind), rec.key, m->SerializeAsString()));
          break;
        case v1::CHECKPOINT_STATE_ABORTED:
          e.phase = Phase::kAborted;
          break;
        default:
          return absl::DataLossError(
              absl::StrFormat("checkpoint record \"%s\" has state %d", rec.key, m->state()));
      }
      e.reports.resize(m->world_size());
      e.manifest = std::move(m);
    }
    for (const Record& rec : *marks) {
      const size_t slash = rec.key.find('/');
      if (slash == std::string::npos || slash == 0 || slash + 1 == rec.key.size()) {
        return absl::DataLossError(absl::StrFormat(
            "checkpoint_unusable record \"%s\" is not \"<job_id>/<checkpoint_id>\"", rec.key));
      }
      reg->jobs_[rec.key.substr(0, slash)].unusable[rec.key.substr(slash + 1)] = rec.value;
    }
    for (const Record& rec : *latest) {
      v1::CheckpointRef ref;
      if (!ref.ParseFromString(rec.value)) {
        return absl::DataLossError(
            absl::StrFormat("checkpoint_latest record \"%s\" does not parse", rec.key));
      }
      auto job = reg->jobs_.find(rec.key);
      const Entry* e =
          job == reg->jobs_.end() ? nullptr : reg->FindLocked(rec.key, ref.checkpoint_id());
      if (e == nullptr || e->phase != Phase::kCommitted || e->manifest->step() != ref.step()) {
        return absl::DataLossError(
            absl::StrFormat("checkpoint_latest of job \"%s\" names checkpoint "
                            "\"%s\" (step %d), which is not a "
                            "committed checkpoint in the store",
                            rec.key, ref.checkpoint_id(), ref.step()));
      }
      job->second.latest_id = ref.checkpoint_id();
    }
    // Jobs with committed checkpoints but no pointer (not written by this
    // registry, but harmless): the newest committed step.
    for (auto& [job_id, job] : reg->jobs_) {
      if (job.latest_id.empty()) job.latest_id = job.NewestUsableCommitted();
    }
    // A pointer that names a marked checkpoint (the state of a previous
    // version whose pointer write failed after its mark): moved and
    // rewritten.
    for (auto& [job_id, job] : reg->jobs_) {
      if (job.latest_id.empty() || job.unusable.count(job.latest_id) == 0) continue;
      job.latest_id = job.NewestUsableCommitted();
      rewrites.push_back(reg->LatestPointerLocked(job_id, job));
    }
  }
  if (!rewrites.empty()) {
    absl::Status s = store->Write(rewrites);
    if (!s.ok()) return s;
  }
  return reg;
}

CheckpointRegistry::Entry* CheckpointRegistry::FindLocked(absl::string_view job_id,
                                                          absl::string_view id) {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return nullptr;
  auto it = job->second.entries.find(std::string(id));
  return it == job->second.entries.end() ? nullptr : &it->second;
}

const CheckpointRegistry::Entry* CheckpointRegistry::FindLocked(absl::string_view job_id,
                                                                absl::string_view id) const {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return nullptr;
  auto it = job->second.entries.find(std::string(id));
  return it == job->second.entries.end() ? nullptr : &it->second;
}

CheckpointRegistry::Entry* CheckpointRegistry::WaitSettledLocked(const std::string& job_id,
                                                                 const std::string& id) {
  for (;;) {
    Entry* e = FindLocked(job_id, id);
    if (e == nullptr || (e->phase != Phase::kOpening && e->phase != Phase::kCommitting)) {
      return e;
    }
    settled_.Wait(&mu_);
  }
}

Mutation CheckpointRegistry::AbortLocked(JobCheckpoints& job, Entry& e, absl::string_view reason) {
  auto m = std::make_shared<v1::Manifest>(*e.manifest);
  m->set_state(v1::CHECKPOINT_STATE_ABORTED);
  m->set_abort_reason(std::string(reason));
  m->clear_commit_time();
  e.manifest = m;
  e.phase = Phase::kAborted;
  if (job.active_id == m->checkpoint_id()) job.active_id.clear();
  settled_.SignalAll();
  return Mutation::Put(std::string(kCheckpointKind), StoreKey(m->job_id(), m->checkpoint_id()),
                       m->SerializeAsString());
}

void CheckpointRegistry::WriteBestEffort(const std::vector<Mutation>& mutations) {
  if (mutations.empty()) return;
  // A failed abort write leaves PENDING in the store, which recovery turns
  // into ABORTED: the same outcome, so the error is dropped.
  (void)store_->Write(mutations);
}

v1::CheckpointSummary CheckpointRegistry::SummaryLocked(const Entry& e) const {
  const v1::Manifest& m = *e.manifest;
  v1::CheckpointSummary s;
  s.set_checkpoint_id(m.checkpoint_id());
  s.set_step(m.step());
  s.set_generation(m.generation());
  s.set_state(e.phase == Phase::kCommitted ? v1::CHECKPOINT_STATE_COMMITTED
              : e.phase == Phase::kAborted ? v1::CHECKPOINT_STATE_ABORTED
                                           : v1::CHECKPOINT_STATE_PENDING);
  s.set_directory(m.directory());
  s.set_world_size(m.world_size());
  s.set_reported_ranks(e.reported);
  s.set_total_bytes(e.total_bytes);
  *s.mutable_create_time() = m.create_time();
  if (e.phase == Phase::kCommitted) *s.mutable_commit_time() = m.commit_time();
  s.set_abort_reason(m.abort_reason());
  return s;
}

v1::Manifest CheckpointRegistry::BuildManifestLocked(const Entry& e) const {
  if (e.phase == Phase::kCommitted) return *e.manifest;
  v1::Manifest m = *e.manifest;
  if (e.phase != Phase::kAborted) m.set_state(v1::CHECKPOINT_STATE_PENDING);
  if (e.data_cursor) m.set_data_cursor(*e.data_cursor);
  std::map<std::string, v1::SavedTensor> tensors;
  for (const std::optional<ShardReport>& r : e.reports) {
    if (!r) continue;
    v1::RankRecord* rr = m.add_ranks();
    rr->set_rank(r->rank);
    *rr->mutable_coordinates() = r->coordinates;
    rr->set_worker_id(r->worker_id);
    rr->set_rng_state(r->request.rng_state());
    *rr->mutable_files() = r->request.files();
    std::map<std::string, int> file_index;
    for (int i = 0; i < r->request.files_size(); ++i) file_index[r->request.files(i).path()] = i;
    for (const v1::SavedTensor& t : r->request.tensors()) {
      v1::SavedTensor& out = tensors[t.name()];
      if (out.name().empty()) {
        out.set_name(t.name());
        out.set_dtype(t.dtype());
        *out.mutable_global_shape() = t.global_shape();
      }
      std::vector<const v1::SavedPiece*> pieces;
      for (const v1::SavedPiece& p : t.pieces()) pieces.push_back(&p);
      std::stable_sort(pieces.begin(), pieces.end(),
                       [&](const v1::SavedPiece* a, const v1::SavedPiece* b) {
                         return std::make_pair(file_index[a->file()], a->byte_offset()) <
                                std::make_pair(file_index[b->file()], b->byte_offset());
                       });
      for (const v1::SavedPiece* p : pieces) *out.add_pieces() = *p;  // rank already set
    }
  }
  for (auto& [name, t] : tensors) *m.add_tensors() = std::move(t);
  return m;
}

absl::StatusOr<v1::BeginCheckpointResponse> CheckpointRegistry::Begin(
    const CheckpointBeginParams& params) {
  if (params.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (params.directory.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "job \"%s\" has no checkpoint directory (spec.checkpoint.directory)", params.job_id));
  }
  if (params.generation == 0) return absl::InvalidArgumentError("generation must be >= 1");
  if (params.world_size == 0) return absl::InvalidArgumentError("world_size must be >= 1");
  const std::string id = CheckpointId(params.generation, params.step);
  const std::string directory = JoinDir(params.directory, id);
  v1::BeginCheckpointResponse response;
  response.set_checkpoint_id(id);
  response.set_directory(directory);

  absl::ReleasableMutexLock lock(&mu_);
  std::vector<Mutation> writes;
  for (;;) {
    JobCheckpoints& job = jobs_[params.job_id];
    auto it = job.entries.find(id);
    if (it != job.entries.end()) {
      Entry& e = it->second;
      switch (e.phase) {
        case Phase::kOpening:
        case Phase::kCommitting:
          settled_.Wait(&mu_);
          continue;
        case Phase::kPending:
          if (e.manifest->world_size() != params.world_size) {
            return absl::FailedPreconditionError(
                absl::StrFormat("checkpoint %s was opened with world_size %d, not %d", id,
                                e.manifest->world_size(), params.world_size));
          }
          return response;
        case Phase::kCommitted:
          return absl::FailedPreconditionError(absl::StrFormat(
              "checkpoint %s (step %d) is already committed; save a later step", id, params.step));
        case Phase::kAborted:
          return absl::FailedPreconditionError(
              absl::StrFormat("checkpoint %s (generation %d, step %d) was aborted (%s); save a "
                              "later step",
                              id, params.generation, params.step, e.manifest->abort_reason()));
      }
    }
    if (!job.latest_id.empty()) {
      const uint64_t latest_step = job.entries.at(job.latest_id).manifest->step();
      if (params.step <= latest_step) {
        return absl::FailedPreconditionError(
            absl::StrFormat("step %d <= step %d of the newest committed "
                            "checkpoint %s; save a later step",
                            params.step, latest_step, job.latest_id));
      }
    }
    if (!job.active_id.empty()) {
      Entry& a = job.entries.at(job.active_id);
      if (a.phase == Phase::kOpening || a.phase == Phase::kCommitting) {
        settled_.Wait(&mu_);
        continue;
      }
      if (a.manifest->generation() >= params.generation) {
        return absl::FailedPreconditionError(
            absl::StrFormat("checkpoint %s (step %d, generation %d) is PENDING; wait for it to "
                            "commit or "
                            "abort",
                            job.active_id, a.manifest->step(), a.manifest->generation()));
      }
      writes.push_back(
          AbortLocked(job, a, absl::StrFormat("superseded by generation %d", params.generation)));
    }
    auto m = std::make_shared<v1::Manifest>();
    m->set_checkpoint_id(id);
    m->set_job_id(params.job_id);
    m->set_step(params.step);
    m->set_generation(params.generation);
    m->set_state(v1::CHECKPOINT_STATE_PENDING);
    m->set_directory(directory);
    *m->mutable_model() = params.model;
    *m->mutable_parallel() = params.parallel;
    m->set_dp(params.dp);
    m->set_world_size(params.world_size);
    m->set_seed(params.seed);
    *m->mutable_create_time() = ToProto(clock_->Now());
    Entry& e = job.entries[id];
    e.phase = Phase::kOpening;
    e.manifest = m;
    e.keep_last = params.keep_last;
    e.expected_tensors = params.expected_tensors;
    e.reports.resize(params.world_size);
    job.active_id = id;
    writes.push_back(Mutation::Put(std::string(kCheckpointKind), StoreKey(params.job_id, id),
                                   m->SerializeAsString()));
    break;
  }
  lock.Release();
  const absl::Status written = store_->Write(writes);
  absl::MutexLock relock(&mu_);
  JobCheckpoints& job = jobs_[params.job_id];
  if (!written.ok()) {
    job.entries.erase(id);
    if (job.active_id == id) job.active_id.clear();
    settled_.SignalAll();
    return absl::UnavailableError(absl::StrFormat(
        "could not record checkpoint %s in the state store (%s); retry", id, written.ToString()));
  }
  job.entries.at(id).phase = Phase::kPending;
  settled_.SignalAll();
  return response;
}

absl::StatusOr<ReportShardResult> CheckpointRegistry::ReportShard(absl::string_view job_id,
                                                                  uint64_t generation,
                                                                  const ShardReport& report) {
  const std::string& id = report.request.checkpoint_id();
  if (absl::Status s = checkpoint::ValidateShardReport(report.request); !s.ok()) return s;
  ShardReport normalized = report;
  normalized.request = Normalized(report.request, report.rank);

  absl::MutexLock lock(&mu_);
  Entry* e = WaitSettledLocked(std::string(job_id), id);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrFormat("no checkpoint \"%s\" in job \"%s\"", id, job_id));
  }
  const v1::Manifest& head = *e->manifest;
  if (head.generation() != generation) {
    return absl::FailedPreconditionError(
        absl::StrFormat("checkpoint %s belongs to generation %d, not %d; call "
                        "BeginCheckpoint in this "
                        "generation",
                        id, head.generation(), generation));
  }
  if (report.rank >= head.world_size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("rank %d is not a rank of checkpoint %s (world_size %d)", report.rank, id,
                        head.world_size()));
  }
  ReportShardResult result;
  if (e->reports.size() > report.rank && e->reports[report.rank]) {
    if (google::protobuf::util::MessageDifferencer::Equals(e->reports[report.rank]->request,
                                                           normalized.request)) {
      result.checkpoint = SummaryLocked(*e);
      return result;
    }
    return absl::AlreadyExistsError(absl::StrFormat(
        "rank %d already reported different content for checkpoint %s", report.rank, id));
  }
  if (e->phase == Phase::kAborted) {
    return absl::FailedPreconditionError(
        absl::StrFormat("checkpoint %s was aborted: %s", id, head.abort_reason()));
  }
  if (e->phase == Phase::kCommitted) {
    // The raw reports are gone (a newer commit or a coordinator restart),
    // but the manifest keeps each rank's files: a repeat naming the same
    // files (path, size, CRC-32C) is a retry whose first answer was lost,
    // e.g. sent just before the coordinator restarted.
    for (const v1::RankRecord& r : head.ranks()) {
      if (r.rank() != report.rank) continue;
      bool same = r.files_size() == normalized.request.files_size();
      for (int i = 0; same && i < r.files_size(); ++i) {
        same = google::protobuf::util::MessageDifferencer::Equals(r.files(i),
                                                                normalized.request.files(i));
      }
      if (same) {
        result.checkpoint = SummaryLocked(*e);
        return result;
      }
    }
    return absl::FailedPreconditionError(absl::StrFormat("checkpoint %s is already committed", id));
  }
  // Cross-rank consistency.
  const v1::ReportShardRequest& r = normalized.request;
  size_t pieces = 0;
  for (const v1::SavedTensor& t : r.tensors()) pieces += static_cast<size_t>(t.pieces_size());
  if (e->pieces + pieces > checkpoint::kMaxPiecesPerCheckpoint) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensors[].pieces: checkpoint %s already holds %d pieces from %d ranks; this report's %d "
        "would pass %d (kMaxPiecesPerCheckpoint)",
        id, e->pieces, e->reported, pieces, checkpoint::kMaxPiecesPerCheckpoint));
  }
  if (e->data_cursor && *e->data_cursor != r.data_cursor()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data_cursor %d disagrees with %d reported by other "
                        "ranks of checkpoint %s",
                        r.data_cursor(), *e->data_cursor, id));
  }
  for (const v1::SavedTensor& t : r.tensors()) {
    auto meta = e->tensor_meta.find(t.name());
    if (meta == e->tensor_meta.end()) continue;
    const std::vector<uint64_t> shape(t.global_shape().begin(), t.global_shape().end());
    if (meta->second.dtype != t.dtype() || meta->second.global_shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s\": dtype %s global_shape %s disagrees with rank %d's "
                          "dtype %s "
                          "global_shape [%s]",
                          t.name(), v1::DType_Name(t.dtype()), checkpoint::ShapeString(t.global_shape()),
                          meta->second.first_rank, v1::DType_Name(meta->second.dtype),
                          absl::StrJoin(meta->second.global_shape, ",")));
    }
  }
  for (const v1::SavedTensor& t : r.tensors()) {
    e->tensor_meta.emplace(t.name(), TensorMeta{t.dtype(),
                                                std::vector<uint64_t>(t.global_shape().begin(),
                                                                      t.global_shape().end()),
                                                report.rank});
  }
  e->data_cursor = r.data_cursor();
  e->pieces += pieces;
  for (const v1::ShardFile& f : r.files()) e->total_bytes += f.size_bytes();
  e->reports[report.rank] = std::move(normalized);
  ++e->reported;
  if (e->reported < head.world_size()) {
    result.checkpoint = SummaryLocked(*e);
    return result;
  }
  absl::Status commit = CommitLocked(std::string(job_id), id, &result);
  (void)commit;  // a failed commit shows as ABORTED in the summary
  return result;
}

absl::Status CheckpointRegistry::CommitLocked(const std::string& job_id, const std::string& id,
                                              ReportShardResult* result) {
  JobCheckpoints& job = jobs_.find(job_id)->second;
  Entry* e = &job.entries.at(id);
  e->phase = Phase::kCommitting;
  auto manifest = std::make_shared<v1::Manifest>(BuildManifestLocked(*e));
  const std::vector<std::string> expected = e->expected_tensors;
  // Retention: committed checkpoints cannot change while this one is the
  // job's active checkpoint, so the set computed now is the set at commit.
  std::vector<std::pair<uint64_t, std::string>> committed;
  // Newest first, checkpoints marked unusable after every usable one (they
  // expire first).
  std::vector<std::tuple<bool, uint64_t, std::string>> ranked;
  for (const auto& [cid, c] : job.entries) {
    if (c.phase == Phase::kCommitted) {
      ranked.emplace_back(job.unusable.count(cid) == 0, c.manifest->step(), cid);
    }
  }
  std::sort(ranked.rbegin(), ranked.rend());
  for (auto& [usable, step, cid] : ranked) committed.emplace_back(step, cid);
  std::vector<ExpiredCheckpoint> expired;
  if (e->keep_last > 0) {
    // The new checkpoint takes slot 0; existing ones from slot 1.
    for (size_t i = 0; i < committed.size(); ++i) {
      if (i + 1 < e->keep_last) continue;
      const v1::Manifest& old = *job.entries.at(committed[i].second).manifest;
      ExpiredCheckpoint x;
      x.ref.set_checkpoint_id(old.checkpoint_id());
      x.ref.set_step(old.step());
      x.directory = old.directory();
      expired.push_back(std::move(x));
    }
  }
  const std::string previous_latest = job.latest_id;
  mu_.Unlock();

  // Exactly the expected tensors, each covered exactly once; never none.
  absl::Status status;
  if (manifest->tensors_size() == 0) {
    status = absl::DataLossError(
        "no rank saved any tensor; a checkpoint must hold every tensor of the job's plan");
  }
  for (const std::string& name : expected) {
    if (!status.ok()) break;
    const bool found = std::any_of(manifest->tensors().begin(), manifest->tensors().end(),
                                   [&](const v1::SavedTensor& t) { return t.name() == name; });
    if (!found) {
      status = absl::DataLossError(absl::StrFormat("tensor \"%s\" was saved by no rank", name));
    }
  }
  if (status.ok() && !expected.empty()) {
    const std::set<std::string> planned(expected.begin(), expected.end());
    for (const v1::SavedTensor& t : manifest->tensors()) {
      if (planned.count(t.name()) == 0) {
        status = absl::DataLossError(
            absl::StrFormat("tensor \"%s\" is not one the job's plan saves", t.name()));
        break;
      }
    }
  }
  for (const v1::SavedTensor& t : manifest->tensors()) {
    if (!status.ok()) break;
    status = checkpoint::CheckExactCover(t);
  }
  if (status.ok() && options_.verify_files) status = options_.verify_files(*manifest);
  if (status.ok()) {
    manifest->set_state(v1::CHECKPOINT_STATE_COMMITTED);
    *manifest->mutable_commit_time() = ToProto(clock_->Now());
    v1::CheckpointRef ref;
    ref.set_checkpoint_id(id);
    ref.set_step(manifest->step());
    std::vector<Mutation> batch;
    batch.push_back(Mutation::Put(std::string(kCheckpointKind), StoreKey(job_id, id),
                                  manifest->SerializeAsString()));
    batch.push_back(
        Mutation::Put(std::string(kCheckpointLatestKind), job_id, ref.SerializeAsString()));
    for (const ExpiredCheckpoint& x : expired) {
      batch.push_back(
          Mutation::Delete(std::string(kCheckpointKind), StoreKey(job_id, x.ref.checkpoint_id())));
    }
    absl::Status written = store_->Write(batch);
    if (!written.ok()) {
      status = absl::UnavailableError(
          absl::StrFormat("the commit could not be made durable (%s)", written.ToString()));
    }
  }

  mu_.Lock();
  JobCheckpoints& job2 = jobs_.find(job_id)->second;
  e = &job2.entries.at(id);
  if (!status.ok()) {
    const std::string reason =
        status.code() == absl::StatusCode::kDataLoss
            ? absl::StrCat(kDataLossPrefix, status.message())
            : absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
    std::vector<Mutation> w = {AbortLocked(job2, *e, reason)};
    result->checkpoint = SummaryLocked(*e);
    mu_.Unlock();
    WriteBestEffort(w);
    mu_.Lock();
    return status;
  }
  e->phase = Phase::kCommitted;
  e->manifest = manifest;
  job2.active_id.clear();
  job2.latest_id = id;
  if (!previous_latest.empty()) {
    auto prev = job2.entries.find(previous_latest);
    if (prev != job2.entries.end()) {
      // Retries of an older checkpoint's reports are answered from its
      // manifest's state alone; free the raw reports.
      prev->second.reports.assign(prev->second.reports.size(), std::nullopt);
      prev->second.tensor_meta.clear();
    }
  }
  for (const ExpiredCheckpoint& x : expired) job2.entries.erase(x.ref.checkpoint_id());
  result->checkpoint = SummaryLocked(*e);
  result->committed_manifest = manifest;
  result->expired = std::move(expired);
  settled_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointSummary> CheckpointRegistry::Commit(absl::string_view job_id,
                                                                 absl::string_view checkpoint_id) {
  const std::string id(checkpoint_id);
  absl::ReleasableMutexLock lock(&mu_);
  Entry* e = WaitSettledLocked(std::string(job_id), id);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrFormat("no checkpoint \"%s\" in job \"%s\"", id, job_id));
  }
  if (e->phase == Phase::kCommitted) return SummaryLocked(*e);
  if (e->phase == Phase::kAborted) {
    return absl::FailedPreconditionError(
        absl::StrFormat("checkpoint %s was aborted: %s", id, e->manifest->abort_reason()));
  }
  // PENDING: a PENDING checkpoint with every rank reported is committing, so
  // some ranks are missing.
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < e->reports.size(); ++r) {
    if (!e->reports[r]) missing.push_back(r);
  }
  if (missing.empty()) {
    ReportShardResult result;
    absl::Status s = CommitLocked(std::string(job_id), id, &result);
    if (!s.ok()) return s;
    return result.checkpoint;
  }
  const std::string why =
      absl::StrFormat("commit requested before ranks [%s] reported", absl::StrJoin(missing, ","));
  std::vector<Mutation> w = {AbortLocked(jobs_.find(job_id)->second, *e, why)};
  lock.Release();
  WriteBestEffort(w);
  return absl::FailedPreconditionError(
      absl::StrFormat("checkpoint %s: %s; it is now ABORTED", id, why));
}

absl::StatusOr<v1::CheckpointSummary> CheckpointRegistry::Abort(absl::string_view job_id,
                                                                absl::string_view checkpoint_id,
                                                                absl::string_view reason) {
  const std::string id(checkpoint_id);
  absl::ReleasableMutexLock lock(&mu_);
  Entry* e = WaitSettledLocked(std::string(job_id), id);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrFormat("no checkpoint \"%s\" in job \"%s\"", id, job_id));
  }
  if (e->phase == Phase::kCommitted) {
    return absl::FailedPreconditionError(
        absl::StrFormat("checkpoint %s is committed; it cannot be aborted", id));
  }
  if (e->phase == Phase::kAborted) return SummaryLocked(*e);
  std::vector<Mutation> w = {
      AbortLocked(jobs_.find(job_id)->second, *e, reason.empty() ? "aborted" : reason)};
  v1::CheckpointSummary s = SummaryLocked(*e);
  lock.Release();
  WriteBestEffort(w);
  return s;
}

std::optional<v1::CheckpointSummary> CheckpointRegistry::AbortPending(absl::string_view job_id,
                                                                      absl::string_view reason) {
  absl::ReleasableMutexLock lock(&mu_);
  for (;;) {
    auto job = jobs_.find(job_id);
    if (job == jobs_.end() || job->second.active_id.empty()) return std::nullopt;
    Entry* e = WaitSettledLocked(std::string(job_id), job->second.active_id);
    if (e == nullptr || e->phase != Phase::kPending) continue;  // re-read active_id
    std::vector<Mutation> w = {AbortLocked(job->second, *e, reason.empty() ? "aborted" : reason)};
    v1::CheckpointSummary s = SummaryLocked(*e);
    lock.Release();
    WriteBestEffort(w);
    return s;
  }
}

std::string CheckpointRegistry::JobCheckpoints::NewestUsableCommitted() const {
  std::string newest;
  for (const auto& [id, e] : entries) {
    if (e.phase != Phase::kCommitted || unusable.count(id) > 0) continue;
    if (newest.empty() || e.manifest->step() > entries.at(newest).manifest->step()) newest = id;
  }
  return newest;
}

Mutation CheckpointRegistry::LatestPointerLocked(const std::string& job_id,
                                                 const JobCheckpoints& job) const {
  if (job.latest_id.empty()) {
    return Mutation::Delete(std::string(kCheckpointLatestKind), job_id);
  }
  v1::CheckpointRef ref;
  ref.set_checkpoint_id(job.latest_id);
  ref.set_step(job.entries.at(job.latest_id).manifest->step());
  return Mutation::Put(std::string(kCheckpointLatestKind), job_id, ref.SerializeAsString());
}

absl::Status CheckpointRegistry::MarkUnusable(absl::string_view job_id,
                                              absl::string_view checkpoint_id,
                                              absl::string_view reason) {
  if (job_id.empty() || checkpoint_id.empty() || reason.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "an unusable mark needs a job_id, a checkpoint_id and a reason (got \"%s\", \"%s\", "
        "\"%s\")",
        job_id, checkpoint_id, reason));
  }
  std::vector<Mutation> writes;
  {
    absl::MutexLock lock(&mu_);
    JobCheckpoints& job = jobs_[std::string(job_id)];
    if (!job.unusable.emplace(std::string(checkpoint_id), std::string(reason)).second) {
      return absl::OkStatus();  // already marked: the first reason stands
    }
    writes.push_back(Mutation::Put(std::string(kCheckpointUnusableKind),
                                   StoreKey(job_id, checkpoint_id), std::string(reason)));
    if (job.latest_id == checkpoint_id) {
      job.latest_id = job.NewestUsableCommitted();
      writes.push_back(LatestPointerLocked(std::string(job_id), job));
    }
  }
  if (absl::Status s = store_->Write(writes); !s.ok()) {
    return absl::UnavailableError(absl::StrFormat(
        "checkpoint %s of job \"%s\" is marked unusable in memory, but the mark was not saved "
        "(%s)",
        checkpoint_id, job_id, s.ToString()));
  }
  return absl::OkStatus();
}

std::optional<std::string> CheckpointRegistry::UnusableReason(
    absl::string_view job_id, absl::string_view checkpoint_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return std::nullopt;
  auto mark = job->second.unusable.find(std::string(checkpoint_id));
  if (mark == job->second.unusable.end()) return std::nullopt;
  return mark->second;
}

std::map<std::string, std::string> CheckpointRegistry::UnusableCheckpoints(
    absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return {};
  return job->second.unusable;
}

std::optional<v1::CheckpointRef> CheckpointRegistry::Latest(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end() || job->second.latest_id.empty()) return std::nullopt;
  v1::CheckpointRef ref;
  ref.set_checkpoint_id(job->second.latest_id);
  ref.set_step(job->second.entries.at(job->second.latest_id).manifest->step());
  return ref;
}

std::vector<ExpiredCheckpoint> CheckpointRegistry::BeyondRetention(absl::string_view job_id,
                                                                   uint32_t keep_last) const {
  std::vector<ExpiredCheckpoint> out;
  if (keep_last == 0) return out;
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return out;
  std::vector<const v1::Manifest*> committed;
  for (const auto& [id, e] : job->second.entries) {
    if (e.phase == Phase::kCommitted) committed.push_back(e.manifest.get());
  }
  std::sort(committed.begin(), committed.end(),
            [](const v1::Manifest* a, const v1::Manifest* b) { return a->step() < b->step(); });
  if (committed.size() <= keep_last) return out;
  for (size_t i = 0; i + keep_last < committed.size(); ++i) {
    ExpiredCheckpoint x;
    x.ref.set_checkpoint_id(committed[i]->checkpoint_id());
    x.ref.set_step(committed[i]->step());
    x.directory = committed[i]->directory();
    out.push_back(std::move(x));
  }
  return out;
}

absl::Status CheckpointRegistry::ForgetJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::OkStatus();
  std::vector<Mutation> batch = {
      Mutation::Delete(std::string(kCheckpointLatestKind), std::string(job_id))};
  for (const auto& [id, e] : it->second.entries) {
    if (e.phase == Phase::kOpening || e.phase == Phase::kCommitting) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", id, " of job ", job_id, " is being opened or committed; retry later"));
    }
    batch.push_back(Mutation::Delete(std::string(kCheckpointKind), StoreKey(job_id, id)));
  }
  for (const auto& [id, reason] : it->second.unusable) {
    batch.push_back(Mutation::Delete(std::string(kCheckpointUnusableKind), StoreKey(job_id, id)));
  }
  // Under mu_, as MarkUnusable writes.
  if (absl::Status s = store_->Write(batch); !s.ok()) return s;
  jobs_.erase(it);
  return absl::OkStatus();
}

}  // namespace shardline::server

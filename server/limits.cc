#include "server/limits.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/geometry.h"
#include "server/rendezvous.h"
#include "shardline/v1/coordinator.pb.h"
#include "spec/job_spec.h"

namespace shardline::server {
namespace {

namespace pb = ::google::protobuf;

struct Limit {
  size_t max = 0;          // bytes of a string, entries of a repeated field
  const char* name = "";   // the constant's name, for messages
  size_t element_max = 0;  // repeated string: bytes of each entry
  const char* element_name = "";
};

// By the field's full name. Every string, bytes and repeated field of a
// message reachable from a request (RequestTypes()) is listed;
// bounds_test.cc checks that none is missing.
const absl::flat_hash_map<std::string, Limit>& Table() {
  static const auto* table = new absl::flat_hash_map<std::string, Limit>{
      // common.proto
      {"shardline.v1.WorkerIdentity.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.WorkerIdentity.worker_id", {kMaxWorkerIdBytes, "kMaxWorkerIdBytes"}},
      {"shardline.v1.TensorSlice.dims", {kMaxTensorDims, "kMaxTensorDims"}},
      // job.proto (the spec's own limits: spec/job_spec.h)
      {"shardline.v1.CreateJobRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.JobSpec.name", {spec::kMaxJobNameBytes, "kMaxJobNameBytes"}},
      {"shardline.v1.DataConfig.dataset_path", {spec::kMaxPathBytes, "kMaxPathBytes"}},
      {"shardline.v1.CheckpointConfig.directory", {spec::kMaxPathBytes, "kMaxPathBytes"}},
      {"shardline.v1.ExternalWorkload.framework",
       {spec::kMaxFrameworkBytes, "kMaxFrameworkBytes"}},
      {"shardline.v1.GetJobRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.ListJobsRequest.page_token", {kMaxPageTokenBytes, "kMaxPageTokenBytes"}},
      {"shardline.v1.ListJobsRequest.phases",
       {kMaxPhasesPerListRequest, "kMaxPhasesPerListRequest"}},
      {"shardline.v1.CancelJobRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.CancelJobRequest.reason", {kMaxReasonBytes, "kMaxReasonBytes"}},
      // events.proto
      {"shardline.v1.WatchJobRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      // plan.proto
      {"shardline.v1.GetPlanRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.GetShardOwnerRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.GetShardOwnerRequest.parameter", {kMaxTensorNameBytes, "kMaxTensorNameBytes"}},
      // session.proto
      {"shardline.v1.JoinJobRequest.host", {kMaxHostBytes, "kMaxHostBytes"}},
      {"shardline.v1.JoinJobRequest.device", {kMaxDeviceBytes, "kMaxDeviceBytes"}},
      {"shardline.v1.ReportErrorRequest.message", {kMaxErrorMessageBytes, "kMaxErrorMessageBytes"}},
      {"shardline.v1.ReportErrorRequest.operation", {kMaxOperationBytes, "kMaxOperationBytes"}},
      {"shardline.v1.LeaveJobRequest.reason", {kMaxReasonBytes, "kMaxReasonBytes"}},
      {"shardline.v1.CompleteJobRequest.reason", {kMaxReasonBytes, "kMaxReasonBytes"}},
      {"shardline.v1.RankProgress.collectives", {kMaxProgressGroups, "kMaxProgressGroups"}},
      {"shardline.v1.CollectiveProgress.group", {kMaxGroupNameBytes, "kMaxGroupNameBytes"}},
      {"shardline.v1.CollectiveProgress.operation",
       {kMaxCollectiveNameBytes, "kMaxCollectiveNameBytes"}},
      {"shardline.v1.CollectiveProgress.dtype", {kMaxDTypeNameBytes, "kMaxDTypeNameBytes"}},
      {"shardline.v1.WhatIfRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.WhatIfRequest.lose_worker_ids",
       {kMaxWhatIfWorkers, "kMaxWhatIfWorkers", kMaxWorkerIdBytes, "kMaxWorkerIdBytes"}},
      {"shardline.v1.ListMembersRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.DrainWorkerRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.DrainWorkerRequest.worker_id", {kMaxWorkerIdBytes, "kMaxWorkerIdBytes"}},
      {"shardline.v1.DrainWorkerRequest.reason", {kMaxReasonBytes, "kMaxReasonBytes"}},
      // rendezvous.proto (server/rendezvous.h)
      {"shardline.v1.KvSetRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvSetRequest.key", {kMaxKeyBytes, "kMaxKeyBytes"}},
      {"shardline.v1.KvSetRequest.value", {kMaxValueBytes, "kMaxValueBytes"}},
      {"shardline.v1.KvGetRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvGetRequest.key", {kMaxKeyBytes, "kMaxKeyBytes"}},
      {"shardline.v1.KvGetRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.KvAddRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvAddRequest.key", {kMaxKeyBytes, "kMaxKeyBytes"}},
      {"shardline.v1.KvCompareAndSetRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvCompareAndSetRequest.key", {kMaxKeyBytes, "kMaxKeyBytes"}},
      {"shardline.v1.KvCompareAndSetRequest.expected", {kMaxValueBytes, "kMaxValueBytes"}},
      {"shardline.v1.KvCompareAndSetRequest.desired", {kMaxValueBytes, "kMaxValueBytes"}},
      {"shardline.v1.KvWaitRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvWaitRequest.keys",
       {kMaxKeysPerRequest, "kMaxKeysPerRequest", kMaxKeyBytes, "kMaxKeyBytes"}},
      {"shardline.v1.KvDeleteRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvNumKeysRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.KvDeleteRequest.key", {kMaxKeyBytes, "kMaxKeyBytes"}},
      {"shardline.v1.BarrierRequest.scope", {kMaxScopeBytes, "kMaxScopeBytes"}},
      {"shardline.v1.BarrierRequest.name", {kMaxKeyBytes, "kMaxKeyBytes"}},
      // checkpoint.proto (checkpoint/geometry.h for pieces and rng_state)
      {"shardline.v1.ShardFile.path", {kMaxShardPathBytes, "kMaxShardPathBytes"}},
      {"shardline.v1.SavedPiece.file", {kMaxShardPathBytes, "kMaxShardPathBytes"}},
      {"shardline.v1.SavedTensor.name", {kMaxTensorNameBytes, "kMaxTensorNameBytes"}},
      {"shardline.v1.SavedTensor.global_shape", {kMaxTensorDims, "kMaxTensorDims"}},
      {"shardline.v1.SavedTensor.pieces",
       {checkpoint::kMaxPiecesPerReport, "kMaxPiecesPerReport"}},
      {"shardline.v1.ReportShardRequest.checkpoint_id",
       {kMaxCheckpointIdBytes, "kMaxCheckpointIdBytes"}},
      {"shardline.v1.ReportShardRequest.files", {kMaxFilesPerReport, "kMaxFilesPerReport"}},
      {"shardline.v1.ReportShardRequest.tensors", {kMaxTensorsPerReport, "kMaxTensorsPerReport"}},
      {"shardline.v1.ReportShardRequest.rng_state",
       {checkpoint::kMaxRngStateBytes, "kMaxRngStateBytes"}},
      {"shardline.v1.CommitCheckpointRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.CommitCheckpointRequest.checkpoint_id",
       {kMaxCheckpointIdBytes, "kMaxCheckpointIdBytes"}},
      {"shardline.v1.AbortCheckpointRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.AbortCheckpointRequest.checkpoint_id",
       {kMaxCheckpointIdBytes, "kMaxCheckpointIdBytes"}},
      {"shardline.v1.AbortCheckpointRequest.reason", {kMaxReasonBytes, "kMaxReasonBytes"}},
      {"shardline.v1.ListCheckpointsRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.ListCheckpointsRequest.page_token",
       {kMaxPageTokenBytes, "kMaxPageTokenBytes"}},
      {"shardline.v1.GetManifestRequest.job_id", {kMaxJobIdBytes, "kMaxJobIdBytes"}},
      {"shardline.v1.GetManifestRequest.checkpoint_id",
       {kMaxCheckpointIdBytes, "kMaxCheckpointIdBytes"}},
      {"shardline.v1.GetManifestRequest.tensors",
       {kMaxTensorsPerManifestRequest, "kMaxTensorsPerManifestRequest", kMaxTensorNameBytes,
        "kMaxTensorNameBytes"}},
  };
  return *table;
}

Limit LimitOf(const pb::FieldDescriptor& field) {
  const auto& table = Table();
  auto it = table.find(field.full_name());
  if (it != table.end()) return it->second;
  return {kMaxUnlistedFieldSize, "kMaxUnlistedFieldSize", kMaxUnlistedFieldSize,
          "kMaxUnlistedFieldSize"};
}

bool IsString(const pb::FieldDescriptor& field) {
  return field.cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING;
}

absl::Status TooLong(const std::string& path, size_t size, size_t max, const char* name) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, " is ", size, " bytes; at most ", max, " (", name, ")"));
}

absl::Status Check(const pb::Message& message, const std::string& prefix) {
  // A JobSpec's contents are spec::ResolveJobSpec's to check (spec/job_spec.h,
  // with the limits listed above), so that a spec has one set of messages.
  if (message.GetDescriptor()->full_name() == "shardline.v1.JobSpec") return absl::OkStatus();
  const pb::Reflection* reflection = message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  std::string scratch;
  for (const pb::FieldDescriptor* field : fields) {
    const std::string path = absl::StrCat(prefix, field->name());
    const Limit limit = LimitOf(*field);
    if (field->is_repeated()) {
      const size_t n = static_cast<size_t>(reflection->FieldSize(message, field));
      if (n > limit.max) {
        return absl::InvalidArgumentError(absl::StrCat(path, " has ", n, " entries; at most ",
                                                       limit.max, " (", limit.name, ")"));
      }
      for (size_t i = 0; i < n; ++i) {
        const int index = static_cast<int>(i);
        if (IsString(*field)) {
          const std::string& s = reflection->GetRepeatedStringReference(message, field, index,
                                                                         &scratch);
          if (s.size() > limit.element_max) {
            return TooLong(absl::StrCat(path, "[", i, "]"), s.size(), limit.element_max,
                           limit.element_name);
          }
        } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
          if (absl::Status s = Check(reflection->GetRepeatedMessage(message, field, index),
                                     absl::StrCat(path, "[", i, "]."));
              !s.ok()) {
            return s;
          }
        }
      }
    } else if (IsString(*field)) {
      const std::string& s = reflection->GetStringReference(message, field, &scratch);
      if (s.size() > limit.max) return TooLong(path, s.size(), limit.max, limit.name);
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (absl::Status s =
              Check(reflection->GetMessage(message, field), absl::StrCat(path, "."));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<size_t> FieldLimit(const pb::FieldDescriptor& field) {
  const auto& table = Table();
  auto it = table.find(field.full_name());
  if (it == table.end()) return std::nullopt;
  return it->second.max;
}

absl::Status CheckRequestLimits(const pb::Message& message) { return Check(message, ""); }

std::vector<const pb::ServiceDescriptor*> Services() {
  // Linked in by coordinator.grpc.pb.h's coordinator.pb.h.
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  std::vector<const pb::ServiceDescriptor*> out;
  for (const char* name : {"shardline.v1.JobService", "shardline.v1.WorkerService",
                           "shardline.v1.RendezvousService", "shardline.v1.CheckpointService"}) {
    if (const pb::ServiceDescriptor* service = pool->FindServiceByName(name)) {
      out.push_back(service);
    }
  }
  return out;
}

}  // namespace shardline::server

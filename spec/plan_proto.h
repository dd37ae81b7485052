// The planner's results as v1 API messages: the Plan of a generation, one
// rank's Assignment, and shard holders.
//
//   v1::Plan p = PlanToProto(plan, "job-1", /*generation=*/3);
//   PlanGroups groups = GroupsOfPlan(plan);          // once per generation
//   v1::Assignment a = AssignmentFor(plan, groups, /*rank=*/5);
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_SPEC_PLAN_PROTO_H_
#define SHARDLINE_SPEC_PLAN_PROTO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/plan.h"
#include "plan/zero.h"
#include "shardline/v1/plan.pb.h"
#include "shardline/v1/session.pb.h"

namespace shardline::spec {

// The layout with vpp, schedule and zero_alignment resolved.
v1::ParallelConfig ParallelToProto(const plan::ParallelConfig& parallel);

// Every group in creation order, named "<kind>/<index within kind>" ("tp/0",
// "dp/3", "pp/1", "emb/0"); the name is the group's rendezvous scope.
std::vector<v1::ProcessGroup> GroupsToProto(const plan::Topology& topology);

v1::Plan PlanToProto(const plan::Plan& plan, const std::string& job_id, uint64_t generation);

// A plan's groups in proto form (GroupsToProto) and, for each rank, the
// indices of the groups that contain it, ascending. Built once per
// generation so that each assignment costs O(its own groups), not
// O(every group): N assignments of a dp = N job would otherwise cost O(N^2).
struct PlanGroups {
  std::vector<v1::ProcessGroup> groups;
  // groups[i] in the compact form (first_rank, rank_stride, size; plan.proto
  // ProcessGroup) when its ranks are an arithmetic progression, else as is.
  std::vector<v1::ProcessGroup> compact;
  std::vector<std::vector<int>> of_rank;  // index = rank
};
PlanGroups GroupsOfPlan(const plan::Plan& plan);

// The global ranks of `pg` in group order (group rank i is element i): its
// listed ranks, or its compact form first_rank + i * rank_stride for
// i < size (the inverse of PlanGroups::compact; what an assignment carries
// for a worker that joined with JoinJobRequest.compact_groups).
// InvalidArgument, naming the group, when a rank is outside world_size or
// the compact form repeats a rank (stride 0 with size > 1).
absl::StatusOr<std::vector<uint32_t>> GroupRanks(const v1::ProcessGroup& pg, uint32_t world_size);

// Rank-specific fields of an assignment: rank, world_size, coordinates,
// parallel, dp, groups (only those containing `rank`), chunks, zero_shards,
// gradient_accumulation_steps, micro_batch. The caller sets generation,
// restore, data_cursor and start_step. Preconditions: 0 <= rank <
// world_size; `groups` = GroupsOfPlan(plan). `compact_groups`: the groups
// in their compact form where they have one (PlanGroups::compact), so that
// the assignment's size does not grow with dp.
v1::Assignment AssignmentFor(const plan::Plan& plan, const PlanGroups& groups, int rank,
                             bool compact_groups = false);

// The TP slice of `spec` held by tp rank `tp_rank` as a TensorSlice.
v1::TensorSlice SliceOf(const plan::ParameterSpec& spec, int tp, int tp_rank);

v1::ShardHolder HolderToProto(const plan::Holder& holder, const plan::ParameterSpec& spec,
                              int tp);

}  // namespace shardline::spec

#endif  // SHARDLINE_SPEC_PLAN_PROTO_H_

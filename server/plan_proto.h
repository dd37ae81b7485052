// The planner's results as v1 API messages: the Plan of a generation, one
// rank's Assignment, and shard holders.
//
//   v1::Plan p = PlanToProto(plan, "job-1", /*generation=*/3);
//   v1::Assignment a = AssignmentFor(plan, /*rank=*/5);
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_SERVER_PLAN_PROTO_H_
#define SHARDLINE_SERVER_PLAN_PROTO_H_

#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/zero.h"
#include "shardline/v1/plan.pb.h"
#include "shardline/v1/session.pb.h"

namespace shardline::server {

// The layout with vpp, schedule and zero_alignment resolved.
v1::ParallelConfig ParallelToProto(const plan::ParallelConfig& parallel);

// Every group in creation order, named "<kind>/<index within kind>" ("tp/0",
// "dp/3", "pp/1", "emb/0"); the name is the group's rendezvous scope.
std::vector<v1::ProcessGroup> GroupsToProto(const plan::Topology& topology);

v1::Plan PlanToProto(const plan::Plan& plan, const std::string& job_id, uint64_t generation);

// Rank-specific fields of an assignment: rank, world_size, coordinates,
// parallel, dp, groups, chunks, zero_shards, gradient_accumulation_steps,
// micro_batch. The caller sets generation, worker_ids, restore, data_cursor
// and start_step. Precondition: 0 <= rank < world_size.
v1::Assignment AssignmentFor(const plan::Plan& plan, int rank);

// The TP slice of `spec` held by tp rank `tp_rank` as a TensorSlice.
v1::TensorSlice SliceOf(const plan::ParameterSpec& spec, int tp, int tp_rank);

v1::ShardHolder HolderToProto(const plan::Holder& holder, const plan::ParameterSpec& spec,
                              int tp);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_PLAN_PROTO_H_

// Human-readable renderings of coordinator responses for shardctl: aligned
// tables for lists, "Key: value" blocks for one object, one line per event.
// --json output is protobuf's JSON of the response instead (ProtoToJson).
//
//   out << FormatJobList(response.jobs());
//   // JOB          NAME         PHASE    GEN  WORLD  STEP      CREATED
//   // shakespeare  shakespeare  RUNNING    2      4  120/2000  2024-05-01T10:00:00Z
//
// Pure functions; thread-safe.
#ifndef SHARDLINE_CLIENT_SHARDCTL_JOB_FORMAT_H_
#define SHARDLINE_CLIENT_SHARDCTL_JOB_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "google/protobuf/timestamp.pb.h"
#include "shardline/v1/coordinator.pb.h"
#include "plan/memory.h"

namespace shardline::shardctl {

// protobuf's JSON with the proto's field names and every primitive field
// (zeros included), so scripts see a stable set of keys. Pretty (2-space
// indent) unless `one_line`.
std::string ProtoToJson(const google::protobuf::Message& message, bool one_line = false);

// As ProtoToJson, with protobuf's refusal as InvalidArgument (e.g. a
// Duration outside its range) instead of an {"error": ...} object.
absl::StatusOr<std::string> ProtoToJsonOr(const google::protobuf::Message& message,
                                          bool one_line = false);

// `job list --json`: ProtoToJson of `all` without the jobs that protobuf's
// JSON printer refuses (e.g. a Duration outside its range, stored before the
// coordinator checked them): one such job must not hide the others. Each
// one left out is added to `*unprintable` as "<job_id>: <reason>".
std::string JobListJson(const v1::ListJobsResponse& all, std::vector<std::string>* unprintable);

// An enum value without its type prefix, as users type it:
// JOB_PHASE_RUNNING → "RUNNING", SCHEDULE_ONE_F_ONE_B → "ONE_F_ONE_B". An
// unknown number prints as the number.
std::string EnumName(const google::protobuf::EnumDescriptor* type, int value);

// RFC 3339 UTC, seconds ("2024-05-01T10:00:00Z"); "-" when unset. With
// `millis`, three fractional digits.
std::string FormatTimestamp(const google::protobuf::Timestamp& t, bool millis = false);

// "1.50 MiB"; below 1 KiB "812 B" (the planner's).
using ::shardline::plan::HumanBytes;

// `job get`, `job cancel`: one job, every field an operator needs. Before
// the first generation forms, `members` (the job's ListMembers, or null when
// not fetched) says how formation stands: how many workers have joined and,
// once enough have, until when the last call waits for more ("not formed
// yet; waiting for workers: 4 of 5 joined (max_workers), last call until
// 2024-05-01T10:00:10Z, ..."); a job cancelled or failed before it formed
// says so. With Job.last_hang set, a "Last hang:" line (its summary, then
// its generation, time and action); with stragglers, a "Stragglers:" line
// per flagged rank (rank, worker, ratio, since step), and how many more
// num_stragglers counts.
std::string FormatJob(const v1::Job& job, const v1::ListMembersResponse* members = nullptr);

// Text from the coordinator (names, reasons, details, paths) as it may be
// printed to a terminal: control characters (C0, DEL, C1 U+0080-U+009F) and
// malformed UTF-8 bytes written as \n, \t, \xNN or \u00NN, so a value can
// neither send terminal escapes nor fake an output line. Longer than
// `max_bytes` (after escaping): cut on a character boundary, "..." added.
//   Printable("x\x1b[2J\nPhase: COMPLETED") == "x\\x1b[2J\\nPhase: COMPLETED"
std::string Printable(absl::string_view text, size_t max_bytes = std::string::npos);

// `job create`: the job, then the worker token, labelled. When
// `already_existed` (the same --id and spec were created before; CreateJob
// is idempotent and returned that job), it says so first, and that the
// token is the one issued then.
std::string FormatCreatedJob(const v1::CreateJobResponse& response, bool already_existed = false);

// `job list`.
std::string FormatJobList(const google::protobuf::RepeatedPtrField<v1::Job>& jobs);

// `members`: one row per worker. WORKER STATE is what it said at its last
// heartbeat (Member.worker_state); ACTIVITY (compute, collective,
// checkpoint, idle) and COLLECTIVE come from its progress report
// (Member.progress): the collective it waits in ("all_reduce #66 dp/0
// (waiting 3.1s)"; the longest waiting when several are in flight), else
// the latest it completed (of its groups, the one with the highest
// sequence); STRAGGLER is Member.straggler's ratio ("1.9x"). Each shows "-"
// when there is nothing to show, and for a FENCED, LOST or LEFT member,
// whose last report belongs to a world it is no longer in.
std::string FormatMembers(const std::string& job_id, const v1::ListMembersResponse& response);

// `whatif`: what losing the requested workers would do (WhatIfResponse):
// the generation now, a table of the losses (worker, state, rank, tp / dp /
// pp coordinates, ZeRO shards and elements), whether the generation ends,
// the spares used and whether they cover every lost rank, the new world /
// dp / gradient accumulation and rank -> worker list (the first 32 ranks,
// then how many more), whether the job falls below what it needs, the
// checkpoint restored (id and step, or "from the seed") and the steps
// trained again, and the coordinator's summary.
std::string FormatWhatIf(const v1::WhatIfResponse& response);

// `topology`: the generation's layout, pipeline stages and process groups.
std::string FormatTopology(const v1::Plan& plan);

// `owner`.
std::string FormatShardOwner(const v1::GetShardOwnerResponse& response);

// `checkpoints`.
std::string FormatCheckpoints(const std::string& job_id,
                              const google::protobuf::RepeatedPtrField<v1::CheckpointSummary>& list);

// `checkpoint show`: one manifest summarized (step, generation, layout,
// data cursor, ranks / files / bytes, tensor and piece counts); with
// `tensors`, then a table of every tensor: dtype, global shape, pieces and
// saved bytes.
std::string FormatManifest(const v1::Manifest& manifest, bool tensors);

// `watch`: one line, no newline:
// "#12 2024-05-01T10:00:00.123Z g2 generation_formed initial: world 4 (dp 2), ranks w0 w1 w2 w3, spares w4".
// A hang_detected event shows the report's summary and what was done, a
// straggler_changed event the rank and its ratio (or that it was cleared).
std::string FormatEvent(const v1::JobEvent& event);

// `kv get`: whether a value can be shown as text (well-formed UTF-8 without
// control characters other than tab and newline), and the hex form for the
// rest ("0a 1b ...", 32 bytes a line).
bool IsPrintableText(const std::string& value);
std::string HexBytes(const std::string& value);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_JOB_FORMAT_H_

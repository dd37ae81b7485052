// shardctl's coordinator commands: everything that talks to a running
// shardline-coordinator over the v1 API.
//
//   shardctl job create SPEC_FILE [--id ID]      CreateJob (prints the worker token once)
//   shardctl job get ID                          GetJob
//   shardctl job list [--phase P[,P...]]         ListJobs (all pages)
//   shardctl job cancel ID [--reason TEXT]       CancelJob (GetJob first: an already
//                                                cancelled job prints so, exit 0)
//   shardctl members JOB                         ListMembers
//   shardctl drain JOB WORKER_ID [--reason TEXT] [--force] DrainWorker: leave at a step boundary
//   shardctl topology JOB                        GetPlan: groups and pipeline stages
//   shardctl owner JOB PARAMETER [--element I]   GetShardOwner
//   shardctl checkpoint list JOB [--all]         ListCheckpoints (all pages); the old
//   shardctl checkpoints JOB [--all]               spelling is an alias
//   shardctl checkpoint show JOB [ID] [--tensors] GetManifest (no ID: newest committed)
//   shardctl checkpoint verify JOB [ID]          GetManifest, then VerifyCheckpoint over
//   shardctl checkpoint verify --dir DIR           the files (DataLoss: exit 1); --dir
//                                                reads DIR/manifest.json, no coordinator
//   shardctl checkpoint consolidate JOB [ID] --out FILE [--optimizer]
//   shardctl checkpoint consolidate --dir DIR --out FILE [--optimizer]
//                                                one unsharded safetensors file
//                                                (client/shardctl/checkpoint_tools.h)
//   shardctl watch JOB [--after SEQ] [--count N] WatchJob, one line per event (a job
//                                                that has ended: its retained history
//                                                and a line with its final phase)
//   shardctl whatif JOB --lose WORKER[,WORKER...]
//                                                WhatIf: what losing those workers would
//                                                do (ranks, spares, new world / dp,
//                                                restore), changing nothing
//   shardctl kv get JOB --generation G [--scope S] KEY
//                                                KvGet through a live member's fence
//   shardctl status                              CoordinatorService.GetStatus from any
//                                                replica: replicas, leader, etcd health
//                                                (client/shardctl/status_command.h)
//
// Every command takes the connection flags of ConnectionFlags (--coordinator
// HOST:PORT, or every replica's HOST:PORT comma-separated; --token,
// --tls-ca, --tls-cert, --tls-key, --timeout), --json (the response as
// protobuf JSON with the proto's field names and zero values printed;
// `watch --json` prints one JSON object per line) and --help.
//
// Thread-compatible: writes only to the given stream.
#ifndef SHARDLINE_CLIENT_SHARDCTL_JOB_COMMANDS_H_
#define SHARDLINE_CLIENT_SHARDCTL_JOB_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardline::shardctl {

// True for the words above (job, members, drain, topology, owner,
// checkpoint, checkpoints, watch, whatif, kv, status).
bool IsCoordinatorCommand(const std::string& command);

// Runs `command` with `args` (everything after the command word) and writes
// the result to `out`; nothing is written on error (except the events
// `watch` printed before it). Errors:
//   InvalidArgument: bad usage, a flag or a spec file field (named); or the
//     coordinator rejected a field of the request (its message names it).
//   NotFound: no job / parameter / worker (whatif --lose) of that name; a
//     spec file that is missing.
//   OutOfRange: `watch --after` outside the retained events.
//   Unavailable: the coordinator cannot be reached ("cannot reach the
//     coordinator at HOST:PORT: connection refused; ...").
//   any other code the RPC returned (coordinator.proto lists them), with
//   the coordinator's message.
// With --help it writes the command's usage to `out` and returns OK.
absl::Status RunCoordinatorCommand(const std::string& command,
                                   const std::vector<std::string>& args, std::ostream& out);

// shardctl's exit code for a failed command: 2 when the input was wrong
// (InvalidArgument, NotFound, OutOfRange: a flag, a value, a name), 1
// otherwise; 0 for OK.
int ExitCodeFor(const absl::Status& status);

}  // namespace shardline::shardctl

#endif  // SHARDLINE_CLIENT_SHARDCTL_JOB_COMMANDS_H_
